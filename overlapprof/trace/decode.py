"""Trace structs and decoding: what overlapprof reads of a PyTorch profiler (Kineto) trace.

msgspec decodes JSON straight into the structs below; every field they do not name is skipped
without building Python objects. :class:`RowEvent` is what the analyzer reads of every event
(``ph``, ``cat``, ``name``, ``ts``, ``dur``, and ``args`` as raw JSON); :class:`ThreadRowEvent`
adds the process and thread, for the records of communication operations. Arguments are decoded
only for the rows that read them, a batch at a time: :class:`LaunchArgs` (the ``correlation``
of GPU events and runtime calls), :class:`EventArgs` (the collective parameters of the
communication records) and :class:`RowArgs` (both: a record row's args, decoded once).
:class:`ScanEvent`, with its args typed, is the reader's default.
:mod:`overlapprof.trace.reader` reads a file's events a chunk at a time with these.

Gzip is detected from the magic bytes, not the file name, and inflated a bounded piece at a time
(with ISA-L when the ``isal`` package is installed: ~3x faster than zlib). A UTF-8 byte-order
mark before the JSON is skipped, and the trace-event format's "JSON Array Format" (a top-level
array of events, its closing ``]`` optional) is read as the events of a trace with nothing else
(both :mod:`overlapprof.trace.kineto`'s layouts). A trace is data:
nothing in it is executed or unpickled. Every failure becomes a
:class:`~overlapprof.errors.TraceError` whose message names the file and the problem in one line
(``bad.json: event 12: 'ts' is not a number``).
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar, Union

import msgspec

from overlapprof.errors import TraceError
from overlapprof.trace import kineto as K
from overlapprof.trace.kineto import is_array_layout, without_bom

try:  # ISA-L's inflate: same format, faster; optional
    from isal.igzip_lib import DECOMP_GZIP, IgzipDecompressor
except ImportError:  # pragma: no cover - depends on the environment
    IgzipDecompressor = None

GZIP_PIECE = 1 << 20  # compressed bytes fed per call
_INFLATE_MAX = 1 << 22  # most output bytes per call: bounds the transient buffers

_RAW = msgspec.Raw()  # an absent raw field


class EventArgs(msgspec.Struct, gc=False):
    """The ``args`` of an event, restricted to what overlapprof reads."""

    correlation: int | None = msgspec.field(default=None, name=K.CORRELATION)
    external_id: int | None = msgspec.field(default=None, name=K.EXTERNAL_ID)
    stream: int | str | None = msgspec.field(default=None, name=K.STREAM)
    device: int | str | None = msgspec.field(default=None, name=K.DEVICE)
    # record_param_comms' collective parameters. An event whose values do not fit these types is
    # read without its args: records of communication are informative.
    collective: str | None = msgspec.field(default=None, name=K.COLLECTIVE_NAME)
    in_nelems: int | None = msgspec.field(default=None, name=K.IN_NELEMS)
    out_nelems: int | None = msgspec.field(default=None, name=K.OUT_NELEMS)
    dtype: str | None = msgspec.field(default=None, name=K.DTYPE)
    group_size: int | None = msgspec.field(default=None, name=K.GROUP_SIZE)
    pg_name: str | int | None = msgspec.field(default=None, name=K.PG_NAME)
    pg_desc: str | None = msgspec.field(default=None, name=K.PG_DESC)
    pg_ranks: str | list[int] | None = msgspec.field(default=None, name=K.PG_RANKS)  # "[0, 1]"
    seq: int | None = msgspec.field(default=None, name=K.SEQ)
    seq_lower: int | None = msgspec.field(default=None, name=K.SEQ_LOWER)
    # Shapes and dtypes (record_shapes): any JSON, decoded when read.
    input_dims: msgspec.Raw = msgspec.field(default=_RAW, name=K.INPUT_DIMS)
    input_type: msgspec.Raw = msgspec.field(default=_RAW, name=K.INPUT_TYPE)
    # Point-to-point peers: record_param_comms' global ranks, and c10d::send/recv_'s arguments.
    src_rank: msgspec.Raw = msgspec.field(default=_RAW, name=K.SRC_RANK)
    dst_rank: msgspec.Raw = msgspec.field(default=_RAW, name=K.DST_RANK)
    concrete_inputs: msgspec.Raw = msgspec.field(default=_RAW, name=K.CONCRETE_INPUTS)


class LaunchArgs(msgspec.Struct, gc=False):
    """The arguments the metrics read: ``correlation`` pairs a GPU event with its runtime call;
    a CUDA sync event's ``wait_on_cuda_event_record_corr_id`` names the ``cudaEventRecord`` call
    of the event its stream waited for (recorded with ``enable_cuda_sync_events``)."""

    correlation: int | None = msgspec.field(default=None, name=K.CORRELATION)
    wait_on_cuda_event_record_corr_id: int | None = msgspec.field(default=None, name=K.WAIT_CORRELATION)


class RowArgs(EventArgs, gc=False):
    """What every reader of a communication record row's args reads: :class:`EventArgs` and, like
    :class:`LaunchArgs`, ``wait_on_cuda_event_record_corr_id`` (so that args that decode as a
    RowArgs decode as either, to the same values)."""

    wait_on_cuda_event_record_corr_id: int | None = msgspec.field(default=None, name=K.WAIT_CORRELATION)


class _Basic(msgspec.Struct, gc=False):
    ph: str = ""
    cat: str = ""
    name: str = ""
    ts: float | None = None
    dur: float | None = None


class ScanEvent(_Basic, gc=False):
    """One trace event as the metrics read it. ``ts``/``dur``: µs (int or float in the file)."""

    args: LaunchArgs | None = None


class RowEvent(_Basic, gc=False):
    """One trace event as the analyzer reads it: ``args`` stays raw JSON until a row needs it."""

    args: msgspec.Raw = _RAW


class ThreadRowEvent(RowEvent, gc=False):
    """A RowEvent with where it ran (any JSON: only compared, never interpreted)."""

    pid: Any = None
    tid: Any = None


class ShapeArgs(msgspec.Struct, gc=False):
    """An op's recorded input shapes (``record_shapes=True``), decoded."""

    input_dims: Any = msgspec.field(default=None, name=K.INPUT_DIMS)


class ShapedEvent(_Basic, gc=False):
    """One trace event with its thread and its ops' input shapes (the what-if's gradients for
    ``bucket_cap_mb``: :mod:`overlapprof.analysis.replay.gradients`)."""

    tid: Any = None
    args: ShapeArgs | None = None


SHAPED_DECODER = msgspec.json.Decoder(list[ShapedEvent])


class DistributedInfo(msgspec.Struct, gc=False):
    """``distributedInfo`` as torch.profiler writes it for a rank of a process group."""

    rank: int | None = None
    world_size: int | None = None
    backend: str | None = None
    pg_config: msgspec.Raw = _RAW


class TraceFile(msgspec.Struct, gc=False):
    """The top level of a Kineto trace; ``traceEvents`` as raw slices (None once read)."""

    traceEvents: list[msgspec.Raw] | None = None
    distributedInfo: DistributedInfo | None = None
    baseTimeNanoseconds: int | None = None
    host_name: msgspec.Raw = _RAW  # the recording host (torch >= 2.4): ranks of one host share a clock


class CompleteRow(msgspec.Struct, tag_field="ph", tag="X", gc=False):
    """A complete (``"ph": "X"``) event, as a ThreadRowEvent reads it; with :data:`ROWS_DECODER`
    the events of other phases are :data:`_OTHER_PHASES` structs without fields, their keys
    skipped unread (MTIA traces hold hundreds of thousands of metadata events)."""

    ph: ClassVar[str] = "X"
    cat: str = ""
    name: str = ""
    ts: float | None = None
    dur: float | None = None
    args: msgspec.Raw = _RAW
    pid: Any = None
    tid: Any = None


# Every phase of the trace-event format but "X" (and ph as the class's attribute, like a field).
_OTHER_PHASES = tuple(
    msgspec.defstruct(f"Phase{ord(ph)}", [], tag_field="ph", tag=ph, gc=False, namespace={"ph": ph})
    for ph in ("B", "E", "i", "I", "C", "b", "n", "e", "s", "t", "f", "P", "N", "O", "D", "M", "V", "v", "R",
               "c", "(", ")")
)


class _RowsDecoder:
    """``list[CompleteRow | <other phase>]``; where that does not fit (a phase outside the
    format, a ``ph`` missing or not a string, an odd field), the list as ThreadRowEvents, whose
    errors are the ones reported. Either way each event has ``ph`` and, when complete, the
    fields of a ThreadRowEvent."""

    tagged = msgspec.json.Decoder(list[Union[(CompleteRow, *_OTHER_PHASES)]])

    def decode(self, data):
        try:
            return self.tagged.decode(data)
        except msgspec.ValidationError:
            return THREAD_ROW_DECODER.decode(data)


DECODER = msgspec.json.Decoder(TraceFile)
CHUNK_DECODER = msgspec.json.Decoder(list[ScanEvent])
ROW_DECODER = msgspec.json.Decoder(list[RowEvent])
THREAD_ROW_DECODER = msgspec.json.Decoder(list[ThreadRowEvent])
ROWS_DECODER = _RowsDecoder()  # what the scan reads: ThreadRowEvents' fields, complete events only
LAUNCH_ARGS = msgspec.json.Decoder(list[LaunchArgs | None])
EVENT_ARGS = msgspec.json.Decoder(list[EventArgs | None])
ROW_ARGS = msgspec.json.Decoder(list[RowArgs | None])
_ONE_EVENT_ARGS = msgspec.json.Decoder(EventArgs | None)
CHUNK = 20_000  # events decoded at a time: bounds the Python objects alive at once
_AT = re.compile(r" - at `\$\.?(.*)`$")
_EVENT_FIELD = re.compile(r"^traceEvents\[(\d+)\]\.?(.*)$")
_EXPECTED = re.compile(r"Expected `([^`]*)`, got `([^`]*)`")


def read_bytes(path: str | Path) -> bytes:
    """The file's JSON bytes, gunzipped if the file is gzip (by magic bytes)."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise TraceError(path, "no such file") from None
    except IsADirectoryError:
        raise TraceError(path, "is a directory") from None
    except OSError as exc:
        raise TraceError(path, f"cannot read ({exc.strerror or exc})") from None
    if not data:
        raise TraceError(path, "empty file")
    return gunzip(data, path) if data[:2] == b"\x1f\x8b" else data


def inflate(pieces, path="<gzip>", out_max: int | None = None) -> Iterator[bytes]:
    """Inflate a gzip stream given as an iterable of compressed pieces (every member), yielding
    at most ``out_max`` bytes (default: a few MB) at a time. TraceError when it is truncated or
    damaged."""
    try:
        yield from _inflate(pieces, out_max or _INFLATE_MAX)
    except EOFError:
        raise TraceError(path, "truncated gzip (the file ends before the compressed stream)") from None
    except MemoryError:
        raise
    except Exception as exc:  # zlib.error, isal's IsalError: a damaged stream
        raise TraceError(path, f"corrupt gzip ({exc})") from None


def _inflate(pieces, out_max: int) -> Iterator[bytes]:
    pending = memoryview(b"")
    source = iter(pieces)
    member = _isal_member if IgzipDecompressor is not None else _zlib_member
    while True:
        if not pending:
            nxt = next(source, None)
            if nxt is None:
                return
            pending = memoryview(nxt)
        while pending and pending[0] == 0:  # padding after the last member
            pending = pending[1:]
        if not pending:
            continue
        rest = yield from member(pending, source, out_max)
        pending = memoryview(rest)  # the next member, if any


def _isal_member(data, source, out_max: int):
    """Inflate one gzip member (its start in ``data``, the rest from ``source``), yielding at
    most ``out_max`` bytes at a time; returns the text after it. ISA-L's decompressor object,
    not ``isal_zlib.decompressobj``: mtia's 87 MB inflated in 22 ms against 28 ms, and zlib's
    66 ms (best of 5, warm; fresh processes gained more: mtia end to end 0.36 -> 0.32 s)."""
    inflater = IgzipDecompressor(flag=DECOMP_GZIP)
    while not inflater.eof:
        if data is None:
            if inflater.needs_input:
                data = next(source, None)
                if data is None:
                    raise EOFError("gzip stream ends early")
            else:
                data = b""  # more output of the input already given
        out = inflater.decompress(data, out_max)
        data = None
        if out:
            yield out
    return inflater.unused_data


def _zlib_member(data, source, out_max: int):
    """:func:`_isal_member` with zlib (isal not installed)."""
    inflater = zlib.decompressobj(31)
    tail = data
    while not inflater.eof:
        if not tail:
            tail = next(source, None)
            if tail is None:
                raise EOFError("gzip stream ends early")
        out = inflater.decompress(tail, out_max)
        tail = inflater.unconsumed_tail
        if out:
            yield out
    return inflater.unused_data


def gunzip(data: bytes, path="<gzip>") -> bytearray:
    """Inflate gzip ``data`` into one growing buffer: the peak is the output plus a few MB, not
    twice the output (large buffers grow in place). TraceError when truncated or damaged."""
    out = bytearray()
    view = memoryview(data)
    for piece in inflate((view[i : i + GZIP_PIECE] for i in range(0, len(view), GZIP_PIECE)), path):
        out += piece
    return out


def _validation_problem(message: str) -> str:
    """Turn msgspec's validation message into ``event N: 'field' ...`` wording."""
    at = _AT.search(message)
    where = at.group(1) if at else ""
    expected = _EXPECTED.search(message)
    if not where:
        got = expected.group(2) if expected else "something else"
        return f"not a PyTorch profiler trace (top level is {'an' if got[0] in 'aeiou' else 'a'} {got}, expected an object with 'traceEvents')"
    event = _EVENT_FIELD.match(where)
    prefix, field = (f"event {event.group(1)}: ", event.group(2)) if event else ("", where)
    if expected is None:
        detail = message[: at.start()] if at else message
        return f"{prefix}{field!r}: {detail[:1].lower()}{detail[1:]}" if field else f"{prefix}{detail}"
    want, got = expected.groups()
    if not field:
        return f"{prefix}not an object (got {got})"
    if want.startswith("float"):
        return f"{prefix}{field!r} is not a number (got {got})"
    return f"{prefix}{field!r} has the wrong type (expected {want}, got {got})"


def decode_checked(path, decoder, data, where=None):
    """``decoder.decode(data)``; errors as TraceError. ``where(k)`` names element k of a list."""
    try:
        return decoder.decode(data)
    except msgspec.ValidationError as exc:
        message = str(exc)
        if where is not None:
            message = _LIST_INDEX.sub(lambda m: f"`$.{where(int(m.group(1)))}{m.group(2)}", message)
        raise TraceError(path, _validation_problem(message)) from None
    except msgspec.DecodeError as exc:
        text = str(exc)
        if "truncated" in text:
            raise TraceError(path, "not valid JSON (the text ends early: truncated file?)") from None
        raise TraceError(path, f"not valid JSON ({text})") from None
    except RecursionError:
        raise TraceError(path, "not valid JSON (nested too deeply)") from None


_LIST_INDEX = re.compile(r"`\$\[(\d+)\]([^`]*)")


def decode(path: str | Path, data: bytes | None = None) -> TraceFile:
    """Decode the top level of a whole trace file (``.json`` or gzip) into a :class:`TraceFile`
    whose ``traceEvents`` are raw slices.

    Raises TraceError for unreadable files, invalid JSON, JSON that is not a trace (no
    ``traceEvents``) and an empty trace. Events are checked as they are decoded.
    """
    if data is None:
        data = read_bytes(path)
    elif not data:
        raise TraceError(path, "empty file")
    data = without_bom(data)
    if is_array_layout(data):
        trace = TraceFile(traceEvents=_array_events(path, data))
    else:
        trace = decode_checked(path, DECODER, data)
    if trace.traceEvents is None:
        raise TraceError(path, "not a PyTorch profiler trace (no 'traceEvents')")
    if not trace.traceEvents:
        raise TraceError(path, "empty trace ('traceEvents' has no events)")
    return trace


_ARRAY_DECODER = msgspec.json.Decoder(list[msgspec.Raw])


def _array_events(path, data) -> list:
    """The events of a trace in the JSON Array Format; its closing ``]`` may be missing (the
    format allows it, for a trace cut short)."""
    try:
        return _ARRAY_DECODER.decode(data)
    except msgspec.DecodeError:
        closed = bytes(data).rstrip().rstrip(b",") + b"]"
        try:
            return _ARRAY_DECODER.decode(closed)
        except msgspec.DecodeError:
            pass
    return decode_checked(path, _ARRAY_DECODER, data)  # the first error, worded


def event_args(raws: list, text: bytes | None = None) -> list[EventArgs | None]:
    """The typed args of events given as raw JSON (absent: None); ``text``: the JSON array of
    them, when already joined. Args that do not fit :class:`EventArgs` are left out (None):
    these records are informative, an odd value never fails an analysis."""
    if text is None:
        text = b"[" + b",".join([r or b"null" for r in raws]) + b"]"
    try:
        return EVENT_ARGS.decode(text)
    except (msgspec.ValidationError, msgspec.DecodeError):
        pass
    out = []
    for raw in raws:
        try:
            out.append(_ONE_EVENT_ARGS.decode(raw) if raw else None)
        except (msgspec.ValidationError, msgspec.DecodeError):
            out.append(None)
    return out
