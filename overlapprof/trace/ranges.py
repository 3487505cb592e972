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
from itertools import chain
from pathlib import Path

from overlapprof.trace import decode as D
from overlapprof.trace import reader as R
from overlapprof.trace.kineto import EVENT_START
from overlapprof.trace.reader import FirstEvent, LayoutError, split_array

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


def text_stream(path, start: int = 0, kept: Kept | None = None, step: int | None = None) -> Iterator[tuple[int, bytes]]:
    """(offset, bytes) of the file's decompressed text, a few MB (or ``step`` bytes) at a time,
    from ``start`` on (plain: by seeking; gzip: the text before ``start`` is inflated and
    dropped, not yielded, but what falls in ``kept``'s windows is kept there)."""
    path = Path(path)
    with path.open("rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
        if not gz:
            f.seek(start)
            pos = start
            while piece := f.read(step or R.READ_BYTES):
                yield pos, piece
                pos += len(piece)
            return
        f.seek(0)
        pos = 0
        feed = min(D.GZIP_PIECE, step or D.GZIP_PIECE)
        for piece in D.inflate(iter(lambda: f.read(feed), b""), path, step):
            if kept is not None:
                kept.offer(pos, piece)
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


class Kept:
    """gzip text inflated on the way to a range and kept for another reader: the text of each
    window ``(lo, hi)`` of offsets (work stealing, :mod:`overlapprof.analysis.engine.parallel`:
    the end of a range the pool reads, where a thief of it begins). A thief that begins in a
    window reads from memory instead of inflating the whole stream up to it (mtia: 20 ms of
    inflation for 15 ms of decoding). The windows are filled by the text :func:`text_stream`
    passes, in order."""

    def __init__(self, windows: list[tuple[int, int]]):
        self.windows = windows
        # Per window, the stream's pieces that overlap it (references, not copies: the inflater's
        # bytes; copying 16 MB into a growing buffer took mtia's reader 10 ms), and how far from
        # its start they hold it.
        self.pieces: list[list[tuple[int, bytes]]] = [[] for _ in windows]
        self.upto = [lo for lo, _ in windows]

    def offer(self, pos: int, piece: bytes) -> None:
        end = pos + len(piece)
        for k, (lo, hi) in enumerate(self.windows):
            if pos <= self.upto[k] < min(end, hi):  # the next text of the window
                self.pieces[k].append((pos, piece))
                self.upto[k] = min(end, hi)

    def _full(self, a: int) -> int | None:
        """The first full window that holds offset ``a`` (None: none does)."""
        for k, (lo, hi) in enumerate(self.windows):
            if lo <= a < hi and self.upto[k] == hi:
                return k
        return None

    def start_of(self, a: int) -> int | None:
        """Where the full window that holds offset ``a`` begins (None: none does)."""
        k = self._full(a)
        return None if k is None else self.windows[k][0]

    def text_from(self, a: int) -> tuple[list[tuple[int, memoryview]], int] | None:
        """The kept text from offset ``a`` to the end of the full window that holds it, as
        ``(offset, text)`` steps, and that end; None when no full window holds ``a``."""
        k = self._full(a)
        if k is None:
            return None
        hi = self.windows[k][1]
        steps = []
        for pos, piece in self.pieces[k]:
            s, e = max(a, pos), min(hi, pos + len(piece))
            if s < e:
                steps.append((s, memoryview(piece)[s - pos : e - pos]))
        return steps, hi


class RangeText:
    """The events of range ``[a, b)`` (``b`` None: to the end) of a trace's text as JSON-array
    texts (:meth:`pieces`); ``tail`` is set when the range holds the file's last event start.

    ``claim`` lets another reader take the end of the range while it is read (work stealing,
    :mod:`overlapprof.analysis.engine.parallel`): before each piece, holding the event starts
    up to offset ``hi``, is given out, ``claim(hi)`` records it as read and returns the range's
    end then (``b``, or lower once a thief took ``[end, b)``); the piece is cut there, and the
    range ends. A range with a thief always has a ``b``, so it never holds the tail."""

    def __init__(self, path, a: int, b: int | None = None, piece_bytes: int | None = None, claim=None,
                 kept: Kept | None = None):
        self.path, self.a, self.b, self.piece_bytes = str(path), a, b, piece_bytes or PIECE_BYTES
        self.claim = claim
        self.kept = kept  # text kept on the way (gzip): filled as the stream passes, or read from
        self.tail: bytes | None = None

    def _text(self):
        """(offset, text) from ``a`` on: from the kept text when it holds ``a`` (then, past it,
        from the file), else from the file (passing the kept text's windows)."""
        held = self.kept.text_from(self.a) if self.kept is not None else None
        if held is None:
            return text_stream(self.path, self.a, self.kept)
        steps, end = held
        return chain(steps, text_stream(self.path, end))

    def _give(self, buf: bytearray, pos: int, cut: int, rest: bool = True) -> tuple[bytearray | None, bytearray, bool]:
        """The piece of the event starts in ``buf[:cut]`` (``buf[0]`` is at offset ``pos``), cut
        at the range's end if a thief lowered it; the text after it (``rest`` False: not kept, the
        range ends there anyway); whether the range ends with it. ``buf`` is consumed
        (:func:`~overlapprof.trace.reader.split_array`)."""
        if self.claim is not None:
            end = self.claim(pos + cut)
            if end <= pos:
                return None, bytearray(), True
            if pos + cut > end:
                return *split_array(buf, buf.find(EVENT_START, end - pos), rest=False), True
        return *split_array(buf, cut, rest), False

    def pieces(self) -> Iterator[bytearray]:
        a, b = self.a, self.b
        buf = bytearray()
        pos = a  # offset of buf[0]
        started = False
        searched = 0  # buf[:searched] holds no event start at or after b
        for piece in _steps(self._text(), self.piece_bytes // 2):  # a piece is 1-1.5 piece_bytes: a reader's last is not much longer
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
                    text, _, _ = self._give(buf, pos, end, rest=False)
                    if text is not None:
                        yield text
                    return
                searched = max(len(buf) - _KEEP, lo)
            if len(buf) >= self.piece_bytes and (cut := buf.rfind(EVENT_START)) > 0:
                text, buf, last = self._give(buf, pos, cut)
                if text is not None:
                    yield text
                    del text
                if last:
                    return
                pos += cut
                searched = max(searched - cut, 0)
        if started:
            if self.claim is not None and self.claim(pos + len(buf)) < pos + len(buf):
                # the text ended before b (a size hint too high) and a thief took some of it: let
                # one process read the file rather than sort out which of the two holds the tail
                raise LayoutError
            self.tail = bytes(buf)


def _steps(text, most: int) -> Iterator[memoryview]:
    """The text of ``(offset, bytes)`` pairs in slices of at most ``most`` bytes."""
    for _, piece in text:
        view = memoryview(piece)
        for k in range(0, len(view), most):
            yield view[k : k + most]
