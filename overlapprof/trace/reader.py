"""Reading a trace file's events a chunk at a time, without holding the whole file.

Two ways, same result:

- **Streaming** (Kineto's own layout: every event of ``traceEvents`` starts on a new line
  indented by two spaces, ``\\n  {``). The file is read (and gunzipped) a few MB at a time and
  cut at those line starts, which can only be whitespace between events: JSON strings cannot
  hold a raw newline. Each piece is decoded as a JSON array, so neither the file's text nor its
  events are ever all in memory. The top level (``distributedInfo`` ...) is decoded at the end
  from the text before the first event plus the text after the last cut.
- **Whole file** (any other layout, e.g. one line): the text is read, its top level decoded with
  ``traceEvents`` as raw slices, and the slices decoded a chunk at a time.

Streaming raises :class:`LayoutError` when the file turns out not to have that layout (or a
piece does not decode); the caller then starts again with ``generic=True``, which also gives
the precise error message for a bad file.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import msgspec

from overlapprof.trace import decode as D
from overlapprof.trace.kineto import EVENT_START, TRACE_EVENTS, is_array_layout, without_bom

READ_BYTES = 1 << 22  # bytes read (or inflated) per step
_CHUNK_BYTES = 1 << 22  # text decoded at a time when streaming
_HEADER_MAX = 1 << 26  # text allowed before the first event


class LayoutError(Exception):
    """The file is not in Kineto's line layout: read it whole instead (``generic=True``)."""


@dataclass
class Chunk:
    """Consecutive events: ``events[k]`` is event number ``start + k`` of the file."""

    start: int
    events: list


class TraceReader:
    """The events of one trace file in chunks, decoded with ``decoder`` (a ``list[<event
    struct>]`` decoder: :class:`~overlapprof.trace.decode.ScanEvent` by default); ``header`` (a
    TraceFile without events: the ``distributedInfo``, ``baseTimeNanoseconds``, ``host_name``)
    is set once they are read."""

    def __init__(self, path, decoder: msgspec.json.Decoder = D.CHUNK_DECODER):
        self.path = str(path)
        self.decoder = decoder
        self.header: D.TraceFile | None = None
        self._text: bytearray | None = None  # the whole text, when streaming read it before giving up

    def chunks(self, generic: bool = False) -> Iterator[Chunk]:
        return self._whole() if generic else self._stream()

    # -- whole file ---------------------------------------------------------------------------

    def _whole(self) -> Iterator[Chunk]:
        text, self._text = self._text, None
        trace = D.decode(self.path, text)
        raws, trace.traceEvents = trace.traceEvents, None
        self.header = trace
        for start in range(0, len(raws), D.CHUNK):
            text = b"[" + b",".join(raws[start : start + D.CHUNK]) + b"]"
            where = lambda k, s=start: f"traceEvents[{s + k}]"  # noqa: E731
            yield Chunk(start, D.decode_checked(self.path, self.decoder, text, where))

    # -- streaming ----------------------------------------------------------------------------

    def _pieces(self) -> Iterator[bytes]:
        path = Path(self.path)
        try:
            f = path.open("rb")
        except OSError:
            raise LayoutError from None  # the whole-file reader words the error
        with f:
            head = f.read(2)
            f.seek(0)
            if head != b"\x1f\x8b":
                while piece := f.read(READ_BYTES):
                    yield piece
                return
            yield from D.inflate(iter(lambda: f.read(D.GZIP_PIECE), b""), path)

    def _stream(self) -> Iterator[Chunk]:
        buf = bytearray()
        header = None
        count = 0
        pieces = self._pieces()
        finder = FirstEvent()
        for piece in pieces:
            buf += piece
            if header is None:
                try:
                    first = finder.find(buf)
                except LayoutError:  # keep what was read: the whole-file reader starts from it
                    for rest in pieces:
                        buf += rest
                    self._text = buf
                    raise
                if first is None:
                    continue
                header, buf = bytes(buf[:first]), buf[first:]
            if len(buf) >= _CHUNK_BYTES and (cut := buf.rfind(EVENT_START)) > 0:
                text, buf = split_array(buf, cut)
                chunk = Chunk(count, self._decode(text))
                del text
                count += len(chunk.events)
                yield chunk
        if header is None:
            raise LayoutError
        try:  # the document without its middle: the top level and the last events
            top = D.DECODER.decode(without_bom(header + bytes(buf)))
        except (msgspec.ValidationError, msgspec.DecodeError):
            raise LayoutError from None
        raws, top.traceEvents = top.traceEvents or [], None
        self.header = top
        if raws:
            text = b"[" + b",".join(raws) + b"]"
            yield Chunk(count, self._decode(text))

    def _decode(self, text: bytes) -> list:
        try:
            return self.decoder.decode(text)
        except (msgspec.ValidationError, msgspec.DecodeError):
            raise LayoutError from None  # re-read whole: an exact error message, or another layout


def split_array(buf: bytearray, end: int, rest: bool = True) -> tuple[bytearray, bytearray]:
    """``([`` + the events in ``buf[:end]`` + ``]``, ``buf[end:]``): whole events, each but maybe
    the last followed by a comma; ``rest`` False: the second is empty (the caller drops it).

    The array is made of ``buf`` itself, which it consumes: it starts with the whitespace before
    its first event (``\\n  {``), which becomes the ``[``, and the comma after its last becomes
    the ``]``. Only the rest (part of one event) is copied, not the text decoded: a copy of every
    piece (4 MB into fresh memory) cost a tenth of reading mtia's dense half."""
    after = buf[end:] if rest else bytearray()
    del buf[end:]
    while buf and buf[-1] in b" \t\r\n":
        del buf[-1]
    if buf and buf[-1] == ord(","):
        buf[-1] = ord("]")
    else:
        buf += b"]"
    if buf[:1] in (b"\n", b" ", b"\t", b"\r"):
        buf[0] = ord("[")
    else:
        buf[:0] = b"["  # a copy, but the line layout always has the newline
    return buf, after


class FirstEvent:
    """Where the first event of ``traceEvents`` starts (its ``\\n  {``), found as the text arrives
    in a growing buffer: ``find(buf)`` after each piece is None while unknown, LayoutError when
    the text is not in the line layout. Each byte is searched once, so finding it (or giving up
    at :data:`_HEADER_MAX`) takes time linear in what was read, however small the pieces."""

    def __init__(self):
        self.searched = 0  # bytes of the buffer already searched for the key
        self.key = -1  # where "traceEvents" is, once found

    def find(self, buf: bytearray) -> int | None:
        if self.key < 0:
            if self.searched == 0 and is_array_layout(buf):
                raise LayoutError  # the JSON Array Format: the events alone, no "traceEvents"
            self.key = buf.find(TRACE_EVENTS, max(0, self.searched - len(TRACE_EVENTS) + 1))
            self.searched = len(buf)
            if self.key < 0:
                if len(buf) > _HEADER_MAX:
                    raise LayoutError
                return None
        i, n = self.key + len(TRACE_EVENTS), len(buf)
        for expected in b":[":  # "traceEvents": [
            while i < n and buf[i] in b" \t\r\n":
                i += 1
            if i < n and buf[i] != expected:
                raise LayoutError
            i += 1
        while i < n and buf[i] in b" \t\r\n":
            i += 1
        if i >= n:
            return None  # wait for more text
        if buf[i] != ord("{") or buf[i - 3 : i] != b"\n  ":
            raise LayoutError
        return i - 3
