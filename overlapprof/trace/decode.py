"""Decoding one PyTorch profiler (Kineto) trace file into typed structs.

Loading is the analyzer's main cost, so the JSON is decoded once, by msgspec, straight into the
structs below: only the fields the metrics and the cross-rank matching need are materialised,
every other field is skipped by the decoder without building Python objects. Gzip is detected
from the magic bytes, not the file name. A trace is data: nothing in it is executed or unpickled.

Every failure becomes a :class:`~overlapprof.errors.TraceError` whose message names the file and
the problem in one line (``bad.json: event 12: 'ts' is not a number``).
"""

from __future__ import annotations

import gzip
import re
import zlib
from pathlib import Path

import msgspec

from overlapprof.errors import TraceError

# Collective fields that only the communication records (CommOp) read: kept as raw JSON bytes
# and decoded leniently later, so an odd value there never makes a whole trace unreadable.
_RAW = msgspec.Raw()


class EventArgs(msgspec.Struct, gc=False):
    """The ``args`` of an event, restricted to what overlapprof reads."""

    correlation: int | None = None
    external_id: int | None = msgspec.field(default=None, name="External id")
    stream: int | str | None = None
    device: int | str | None = None
    collective: msgspec.Raw = msgspec.field(default=_RAW, name="Collective name")
    in_nelems: msgspec.Raw = msgspec.field(default=_RAW, name="In msg nelems")
    out_nelems: msgspec.Raw = msgspec.field(default=_RAW, name="Out msg nelems")
    dtype: msgspec.Raw = _RAW
    group_size: msgspec.Raw = msgspec.field(default=_RAW, name="Group size")
    pg_name: msgspec.Raw = msgspec.field(default=_RAW, name="Process Group Name")
    pg_desc: msgspec.Raw = msgspec.field(default=_RAW, name="Process Group Description")
    pg_ranks: msgspec.Raw = msgspec.field(default=_RAW, name="Process Group Ranks")
    seq: msgspec.Raw = msgspec.field(default=_RAW, name="Seq")
    seq_lower: msgspec.Raw = msgspec.field(default=_RAW, name="seq")
    input_dims: msgspec.Raw = msgspec.field(default=_RAW, name="Input Dims")
    input_type: msgspec.Raw = msgspec.field(default=_RAW, name="Input type")
    # Point-to-point peers: record_param_comms' global ranks, and c10d::send/recv_'s arguments.
    src_rank: msgspec.Raw = msgspec.field(default=_RAW, name="Src Rank")
    dst_rank: msgspec.Raw = msgspec.field(default=_RAW, name="Dst Rank")
    concrete_inputs: msgspec.Raw = msgspec.field(default=_RAW, name="Concrete Inputs")


class Event(msgspec.Struct, gc=False):
    """One trace event. ``ts`` and ``dur`` are microseconds (int or float in the file)."""

    ph: str = ""
    cat: str = ""
    name: str = ""
    ts: float | None = None
    dur: float | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    args: EventArgs | None = None


class DistributedInfo(msgspec.Struct, gc=False):
    """``distributedInfo`` as torch.profiler writes it for a rank of a process group."""

    rank: int | None = None
    world_size: int | None = None
    backend: str | None = None
    pg_config: msgspec.Raw = _RAW


class TraceFile(msgspec.Struct, gc=False):
    """The top level of a Kineto trace."""

    traceEvents: list[Event] | None = None
    distributedInfo: DistributedInfo | None = None
    baseTimeNanoseconds: int | None = None
    host_name: msgspec.Raw = _RAW  # the recording host (torch >= 2.4): ranks of one host share a clock


_DECODER = msgspec.json.Decoder(TraceFile)
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
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except EOFError:
            raise TraceError(path, "truncated gzip (the file ends before the compressed stream)") from None
        except (OSError, zlib.error) as exc:
            raise TraceError(path, f"corrupt gzip ({exc})") from None
    return data


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


def decode(path: str | Path, data: bytes | None = None) -> TraceFile:
    """Decode a trace file (``.json`` or gzip) into a :class:`TraceFile`.

    Raises TraceError for unreadable files, invalid JSON, JSON that is not a trace (no
    ``traceEvents``), an empty trace, and events whose ``ts``/``dur`` are missing or not numbers.
    """
    if data is None:
        data = read_bytes(path)
    try:
        trace = _DECODER.decode(data)
    except msgspec.ValidationError as exc:
        raise TraceError(path, _validation_problem(str(exc))) from None
    except msgspec.DecodeError as exc:
        text = str(exc)
        if "truncated" in text:
            raise TraceError(path, "not valid JSON (the text ends early: truncated file?)") from None
        raise TraceError(path, f"not valid JSON ({text})") from None
    except RecursionError:
        raise TraceError(path, "not valid JSON (nested too deeply)") from None
    if trace.traceEvents is None:
        raise TraceError(path, "not a PyTorch profiler trace (no 'traceEvents')")
    if not trace.traceEvents:
        raise TraceError(path, "empty trace ('traceEvents' has no events)")
    return trace

