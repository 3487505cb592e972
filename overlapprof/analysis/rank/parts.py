"""What one process reads of a large file read in parallel, and how the parts come together
(:mod:`overlapprof.analysis.engine.parallel` hands out the ranges).

A :class:`Job` is a byte range of the file's text (or one JSON array of events); :func:`read_part`
reads it as :mod:`overlapprof.analysis.rank.scan` reads a file, with tables of its own, into a
:class:`Part`: the event arrays (a few dozen bytes per complete event), never the events.
:class:`Merge` takes the parts in file order and renumbers each part's codes through the file's
tables (names, threads, record values), key by key in the order the part met them; codes are
given in order of first appearance, so they come out as one process reading the whole file
gives them, and so does everything computed from them.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from overlapprof.analysis.columns import Index
from overlapprof.analysis.rank.scan import FileColumns, Problems, read_chunks, Threads, rows_hint
from overlapprof.analysis.records.fields import Values
from overlapprof.analysis.records.recorder import CommRecorder
from overlapprof.errors import OverlapprofError
from overlapprof.trace import decode as D
from overlapprof.trace import ranges as TR
from overlapprof.trace.reader import Chunk, LayoutError


@dataclass
class Part:
    """What a worker read of some consecutive events: ``events`` (every phase) and, for the
    complete ones, the columns of :func:`~overlapprof.analysis.rank.scan.read_chunks`, with
    its own codes (None: none), whose keys are ``names`` and ``threads`` (by code); ``records``:
    its :meth:`~overlapprof.analysis.records.recorder.CommRecorder.export`; ``tail``: the text
    after the file's last event start, when the range held it; ``failed``: it could not."""

    events: int = 0
    arrays: dict | None = None
    names: list = field(default_factory=list)
    threads: list = field(default_factory=list)
    unclassified: dict = field(default_factory=dict)
    records: dict | None = None
    tail: bytes | None = None
    top: D.TraceFile | None = None  # ... or, read from it with the header, the top level
    last: Part | None = None  # ... and the events after the last cut (None: none)
    failed: bool = False
    spooled: list[str] | None = None  # where the parts are, when they came through files (pool_read)


@dataclass
class Job:
    path: str
    recording: bool  # collect communication records (the rank's CommRecorder is on)
    comm_re: object = None
    own: bool = False
    a: int = 0  # a byte range of the text ...
    b: int | None = None
    text: bytes | None = None  # ... or one JSON array of events
    bytes: int = 0  # about how much text the range holds (reserves room for its columns)
    number: int = 0  # its place in file order
    spool: str | None = None  # a folder for the parts read in the pool (see pool_read)
    slot: int | None = None  # its place in the shared claims (engine.claims), when a thief may take its end
    claims: str | None = None  # ... the path of their file
    kept: TR.Kept | None = None  # gzip text kept on the way (this process's ranges only: never sent)
    header: bytes | None = None  # the text before the first event: a range that holds the tail reads it
    record_rows: bool = True  # the recorder keeps its record rows (CommRecorder.record_rows)


SUBPART_BYTES = 64 << 20  # text per part a pool process sends back as it goes (see pool_read)


def pool_read(job: Job, between=None, claim=None) -> Part:
    """:func:`read_part` in a pool process. With ``job.spool``, the parts go through files there
    and only their names through the pool's pipe: this process reads the pipe only between its
    own pieces, and a part written to the pipe would hold the pool's process until then. A range
    goes back as a part per :data:`SUBPART_BYTES` of text, each written as soon as it is read:
    written at the end, the 1 GB range of the 2 GB trace took the pool's process 0.45 s after its
    last piece, while this process waited for it. ``claim``: see :func:`read_part`."""
    if job.spool is None:
        return read_part(job, between, claim=claim)
    paths = []

    def spool(part: Part) -> None:
        paths.append(os.path.join(job.spool, f"{job.number}.{len(paths)}.part"))
        with open(paths[-1], "wb") as f:
            pickle.dump(part, f, protocol=pickle.HIGHEST_PROTOCOL)

    last = read_part(job, between, flush=spool, claim=claim)
    if last.failed:
        return last
    spool(last)
    return Part(spooled=paths)


def unspool(part: Part) -> Iterator[Part]:
    """The parts themselves, read back one at a time (each file removed once read) when they
    came through files."""
    if part.spooled is None:
        yield part
        return
    for path in part.spooled:
        with open(path, "rb") as f:
            got = pickle.load(f)
        os.remove(path)
        yield got


def read_part(job: Job, between=None, flush=None, claim=None) -> Part:
    """Read one range or piece as scan.py reads a file, with tables of its own; ``between()``
    is called before each piece of text is decoded. With ``flush``, the events are read in parts
    of about :data:`SUBPART_BYTES` of text, each with tables of its own, and each but the last
    given to ``flush`` as soon as it is read; the last is returned. ``claim(hi)``: records the
    text below ``hi`` as read and gives the range's end (its thief may have moved it; None: no
    thief, see :class:`~overlapprof.analysis.engine.claims.Claims`)."""
    source = TR.RangeText(job.path, job.a, job.b, claim=claim, kept=job.kept) if job.text is None else None
    texts = iter(source.pieces() if source is not None else [job.text])
    budget = SUBPART_BYTES if flush is not None else None
    ended = False

    def chunks(part: Part):
        nonlocal ended
        read = 0
        for text in texts:
            if between is not None:
                between()
            try:
                events = D.ROWS_DECODER.decode(text)
            except Exception:  # noqa: BLE001 - any decoding problem: the file is read again, in one process
                raise LayoutError from None
            yield Chunk(part.events, events)
            part.events += len(events)
            read += len(text)
            if budget is not None and read >= budget:
                return
        ended = True

    while True:
        values = Values() if job.recording else None
        names = values.index if values is not None else Index()
        recorder = CommRecorder(job.comm_re, values, job.own, job.record_rows) if job.recording else None
        threads = Threads()
        part = Part()
        try:
            rows = rows_hint(min(len(job.text) if job.text is not None else job.bytes, budget or 1 << 62))
            arrays, part.unclassified, problems = read_chunks(job.path, chunks(part), names, recorder, threads, rows)
        except (LayoutError, OverlapprofError, OSError):
            return Part(failed=True)
        if problems != Problems():  # a missing or odd time: worded by one process
            return Part(failed=True)
        part.arrays = arrays
        part.names = names.order
        part.threads = list(threads)
        part.records = recorder.export() if recorder is not None else None
        if ended:
            break
        flush(part)
    if source is not None and source.tail is not None:
        if job.header is None:
            part.tail = source.tail
            return part
        # Read here, as soon as the range is: not after the pool's ranges, when nothing else is left to do.
        read = read_tail(job, job.header, source.tail)
        if read is None:
            return Part(failed=True)
        part.top, part.last = read
    return part


def read_tail(job: Job, header: bytes, tail: bytes) -> tuple[D.TraceFile, Part | None] | None:
    """The top level and the last events (the text after the last cut), read as the streaming
    reader reads them: the document without its middle. None when that fails (one process then
    reads the file, and words the error)."""
    try:
        top = D.DECODER.decode(D.without_bom(header + tail))
    except Exception:  # noqa: BLE001
        return None
    raws, top.traceEvents = top.traceEvents or [], None
    if not raws:
        return top, None
    text = b"[" + b",".join(raws) + b"]"
    last = read_part(Job(**{**job.__dict__, "a": 0, "b": None, "text": text, "header": None, "slot": None,
                            "claims": None, "kept": None}))
    return (top, last) if not last.failed else None


class Merge:
    """Parts, in file order, renumbered into the file's tables (see the module docstring) and
    copied into the file's columns as they come."""

    def __init__(self, names: Index, recorder: CommRecorder | None, rows: int, sink=None):
        self.names, self.recorder, self.threads = names, recorder, Threads()
        self.columns = sink if sink is not None else FileColumns(rows)  # see scan.read_chunks
        self.unclassified: dict = {}
        self.events = 0

    def add(self, part: Part) -> None:
        if part.arrays is not None:
            a = part.arrays
            name_codes = np.array([self.names[n] for n in part.names], dtype=np.int32)
            thread_codes = np.array([self.threads[k] for k in part.threads] + [-1], dtype=np.int32)
            if self.recorder is not None:
                self.recorder.absorb(part.records, self.columns.size)
            self.columns.append(dict(ts=a["ts"], dur=a["dur"], codes=a["codes"], name_ids=name_codes[a["name_ids"]],
                                     thread=thread_codes[a["thread"]], collective=a["collective"]), a["corr"])
        self.events += part.events
        for cat, n in part.unclassified.items():
            self.unclassified[cat] = self.unclassified.get(cat, 0) + n

    def result(self):
        return self.columns.result(), self.unclassified
