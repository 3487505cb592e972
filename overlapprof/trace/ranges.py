"""One trace file as byte ranges of whole events, for decoding it in several processes.

A trace in Kineto's line layout (see :mod:`overlapprof.trace.reader`) starts every event of
``traceEvents`` with ``\\n  {``; JSON strings cannot hold a raw newline, so that text is never
inside a string, whatever braces, quotes or escaped quotes the strings hold. A *range*
``[a, b)`` of the (decompressed) text holds the events whose ``\\n  {`` starts at an offset
``p`` with ``a <= p < b``: any offsets tile the file's events exactly, with no coordination
between the readers of neighbouring ranges. :class:`RangeText` reads one range:

- plain JSON: it seeks to ``a`` and reads only as far as the first event start at or after ``b``;
- gzip: it inflates from the start and drops the text before ``a`` (gzip has no random access).

Each range comes out as JSON-array texts of a few MB (``[event, event, ...]``). The range holding
the file's last event start also keeps the text from there to the end (``tail``): decoded after
the header (:func:`probe`) it gives the last events and the top level (``distributedInfo`` ...),
as the streaming reader does. A cut at a ``\\n  {`` that is not an event start (another layout)
makes some piece unbalanced, so it fails to decode: callers then read the file another way.
"""

from __future__ import annotations

import os

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from overlapprof.trace import decode as D
from overlapprof.trace import reader as R
from overlapprof.trace.reader import EVENT_START, FirstEvent, LayoutError, split_array

PIECE_BYTES = 1 << 22  # text per decoded piece: bounds a reader's buffer and the objects it decodes into
_PROBE_STEP = 1 << 16
_KEEP = len(EVENT_START) - 1  # bytes kept while looking for an event start: it may straddle two reads


@dataclass
class Probe:
    """What is known of a file before its events are read: gzip or not, the text before its
    first event (``header``, ending with ``"traceEvents": [``), where that event starts in the
    decompressed text (``first``), and the size of that text (``size``; for gzip, the trailer's
    ISIZE: the size modulo 4 GiB of the last member, only a hint)."""

    gzip: bool
    header: bytes
    first: int
    size: int


def is_gzip(path) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == b"\x1f\x8b"


GZIP_RATIO = 16  # Kineto's JSON shrinks about 16 times in gzip (the generated 2 GB trace, mtia: 16-28)


def text_bytes(path) -> int:
    """About how many bytes of text a trace file holds: its size; for a gzip, the length its
    trailer records (ISIZE: the text's length modulo 4 GiB, of the last member), plus the
    multiple of 4 GiB that brings it nearest to :data:`GZIP_RATIO` times the file. Raises
    OSError as ``open`` does."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        if f.read(2) != b"\x1f\x8b" or size < 18:
            return size
        f.seek(-4, os.SEEK_END)
        isize = int.from_bytes(f.read(4), "little")
    laps = max(0, round((GZIP_RATIO * size - isize) / 2**32))
    return isize + laps * 2**32


def text_stream(path, start: int = 0, step: int | None = None) -> Iterator[tuple[int, bytes]]:
    """(offset, bytes) of the file's decompressed text, a few MB (or ``step`` bytes) at a time,
    from ``start`` on (plain: by seeking; gzip: the text before ``start`` is inflated and
    dropped, not yielded)."""
    path = Path(path)
    with path.open("rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
        if not gz:
            f.seek(start)
            pos = start
            while piece := f.read(step or R._READ):
                yield pos, piece
                pos += len(piece)
            return
        f.seek(0)
        pos = 0
        feed = min(D.GZIP_PIECE, step or D.GZIP_PIECE)
        for piece in D.inflate(iter(lambda: f.read(feed), b""), path, step):
            end = pos + len(piece)
            if end > start:
                yield (pos, piece) if pos >= start else (start, piece[start - pos :])
            pos = end


def probe(path) -> Probe:
    """The header and first event of a file in the line layout; LayoutError otherwise (and
    TraceError for a damaged gzip)."""
    buf = bytearray()
    finder = FirstEvent()
    for _, piece in text_stream(path, step=_PROBE_STEP):  # a header is small: read what it needs
        buf += piece
        first = finder.find(buf)  # LayoutError when it is not the line layout
        if first is not None:
            break
    else:
        raise LayoutError
    path = Path(path)
    gz = is_gzip(path)
    if gz:
        with path.open("rb") as f:
            f.seek(-4, 2)
            size = int.from_bytes(f.read(4), "little")
    else:
        size = path.stat().st_size
    return Probe(gz, bytes(buf[:first]), first, max(size, first))


def split(probe_: Probe, count: int, skip_cost: float = 0.0) -> list[tuple[int, int | None]]:
    """``count`` ranges from the first event to the end (the last one open-ended, so a wrong
    size hint loses nothing) that take their readers equal time when reaching a range's start
    costs ``skip_cost`` of decoding per byte before it (gzip: inflated and dropped): range ``k``
    starting at ``a_k`` is ``L - skip_cost * a_k`` long (offsets from the first event), so the
    ranges shorten towards the end; ``skip_cost`` 0: equal ranges."""
    span = max(probe_.size - probe_.first, 1)
    starts, a = [], 0.0
    for _ in range(count):
        starts.append(a)
        a = a * (1 - skip_cost) + 1.0  # L = 1, scaled to the span below
    cuts = [probe_.first + int(span * s / a) for s in starts]
    return [(a, b) for a, b in zip(cuts, [*cuts[1:], None])]


class RangeText:
    """The events of range ``[a, b)`` (``b`` None: to the end) of a trace's text as JSON-array
    texts (:meth:`pieces`); ``tail`` is set when the range holds the file's last event start."""

    def __init__(self, path, a: int, b: int | None = None, piece_bytes: int | None = None):
        self.path, self.a, self.b, self.piece_bytes = str(path), a, b, piece_bytes or PIECE_BYTES
        self.tail: bytes | None = None

    def pieces(self) -> Iterator[bytearray]:
        a, b = self.a, self.b
        buf = bytearray()
        pos = a  # offset of buf[0]
        started = False
        searched = 0  # buf[:searched] holds no event start at or after b
        for piece in _steps(text_stream(self.path, a), self.piece_bytes // 2):  # a piece is 1-1.5 piece_bytes: a reader's last is not much longer
            buf += piece
            if not started:
                i = buf.find(EVENT_START)
                if i < 0:
                    drop = max(len(buf) - _KEEP, 0)
                    del buf[:drop]
                    pos += drop
                    continue
                del buf[:i]
                pos += i
                started = True
                if b is not None and pos >= b:
                    return  # no event starts in this range
            if b is not None and pos + len(buf) > b:
                lo = max(b - pos, 1, searched)
                end = buf.find(EVENT_START, lo)
                if end >= 0:
                    yield split_array(buf, end, rest=False)[0]
                    return
                searched = max(len(buf) - _KEEP, lo)
            if len(buf) >= self.piece_bytes and (cut := buf.rfind(EVENT_START)) > 0:
                text, buf = split_array(buf, cut)
                yield text
                del text
                pos += cut
                searched = max(searched - cut, 0)
        if started:
            self.tail = bytes(buf)


def _steps(text, most: int) -> Iterator[memoryview]:
    """The text of ``(offset, bytes)`` pairs in slices of at most ``most`` bytes."""
    for _, piece in text:
        view = memoryview(piece)
        for k in range(0, len(view), most):
            yield view[k : k + most]
