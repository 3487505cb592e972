"""From decoded trace files to a rank's classified intervals (compact numpy arrays).

The events are read a chunk at a time (:mod:`overlapprof.trace.reader`) with their ``args`` left
raw; list comprehensions pull out of each chunk the complete events' ``ts``, ``dur``, category
code, name id and (GPU events and runtime calls, their args decoded in one batch) correlation,
and the chunk is dropped. Names are classified once per distinct name, and everything after that
is numpy. The result, :class:`RankEvents`, holds per class (comm, compute, memory) the interval
starts and ends, the *anchor* time that places each event in a step (the start of its launching
runtime call when the trace has it, else its own start: OVERLAP.md section 3), and whether its
launch was found. When asked, a :class:`~overlapprof.analysis.comm_records.CommRecorder` reads
the records of communication operations from the same chunks (``RankEvents.comm_ops``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import compress
from pathlib import Path

import numpy as np

from overlapprof.analysis import classify as C
from overlapprof.analysis.comm_ops import CommTable, Index, Values
from overlapprof.analysis.comm_records import CommRecorder, Records, comm_table
from overlapprof.errors import TraceError
from overlapprof.trace.decode import LAUNCH_ARGS, ROW_DECODER, THREAD_ROW_DECODER, TraceFile, decode_checked
from overlapprof.trace.reader import LayoutError, TraceReader


@dataclass
class EventSet:
    """Intervals of one class: ``[start, end)`` µs, step anchor, launch found, comm kind code."""

    start: np.ndarray
    end: np.ndarray
    anchor: np.ndarray
    launched: np.ndarray
    kind: np.ndarray  # index into classify.KINDS (comm only; zeros elsewhere)

    @classmethod
    def concat(cls, sets: list[EventSet]) -> EventSet:
        return cls(*(np.concatenate([getattr(s, f) for s in sets]) for f in cls.__dataclass_fields__))

    def select(self, mask: np.ndarray) -> EventSet:
        return EventSet(*(getattr(self, f)[mask] for f in self.__dataclass_fields__))

    def __len__(self) -> int:
        return self.start.size


@dataclass
class Steps:
    """``ProfilerStep#N`` spans, sorted by start: N, start and end (µs)."""

    number: np.ndarray
    start: np.ndarray
    end: np.ndarray

    def index_of(self, times: np.ndarray) -> np.ndarray:
        """The step each time falls in (``start <= t < end``), or -1."""
        if self.start.size == 0:
            return np.full(times.size, -1, dtype=np.int64)
        idx = np.searchsorted(self.start, times, side="right") - 1
        ok = idx >= 0
        ok[ok] = times[ok] < self.end[idx[ok]]
        return np.where(ok, idx, -1)


@dataclass
class RankEvents:
    """Everything the metrics of one rank need, from one or more trace files."""

    mode: str  # "gpu" or "cpu"
    comm: EventSet
    compute: EventSet
    memory: EventSet
    wrappers: EventSet  # CPU mode: the c10d::* communication wrappers (neither comm nor compute); else empty
    steps: Steps
    comm_ops: CommTable | None  # the communication operations, when asked for
    events: int  # complete ("X") events read
    negative_durations: int = 0
    files: list[str] = field(default_factory=list)
    headers: list[TraceFile] = field(default_factory=list)  # each file's top level, without events


class _Cache(dict):
    """A dict that computes missing values with ``func`` (one call per distinct key)."""

    def __init__(self, func):
        super().__init__()
        self.func = func

    def __missing__(self, key):
        value = self[key] = self.func(key)
        return value


_CATEGORY = _Cache(C.category_code)
_KIND_CODE = {kind: i for i, kind in enumerate(C.KINDS)}


def _launches(scan: _Scan, rows: np.ndarray) -> np.ndarray:
    """For GPU events ``rows``: the row of their launching runtime call (same correlation) or -1."""
    runtime = np.flatnonzero(scan.codes == C.RUNTIME)
    if runtime.size == 0 or rows.size == 0:
        return np.full(rows.size, -1, dtype=np.int64)
    corr, rt_corr = scan.corr[rows], scan.corr[runtime]
    order = np.argsort(rt_corr, kind="stable")  # NaN last
    rt_corr, runtime = rt_corr[order], runtime[order]
    pos = np.minimum(np.searchsorted(rt_corr, corr), rt_corr.size - 1)
    found = rt_corr[pos] == corr  # False for NaN
    return np.where(found, runtime[pos], -1)


@dataclass
class _Scan:
    """One file's complete ("X") events as arrays, by row (in file order).

    ``corr``: the correlation of GPU events and runtime calls (NaN elsewhere). ``name_ids``: ids
    in the rank's name index. ``records``: what communication records need, when asked for.
    """

    path: str
    ts: np.ndarray
    end: np.ndarray
    dur: np.ndarray
    codes: np.ndarray
    corr: np.ndarray
    name_ids: np.ndarray
    negative: int
    header: TraceFile
    records: Records | None = None


_CORRELATED = (C.KERNEL, C.MEMCPY, C.MEMSET, C.RUNTIME)


def _correlations(path, events: list, rows: np.ndarray, index: np.ndarray) -> np.ndarray:
    """The ``correlation`` arg of ``events[rows]`` (NaN: none), their args decoded in one batch;
    TraceError (naming the event) when an args is not an object or its correlation not an int."""
    rows = rows.tolist()
    text = b"[" + b",".join([events[i].args or b"null" for i in rows]) + b"]"
    where = lambda k: f"traceEvents[{index[rows[k]]}].args"  # noqa: E731
    args = decode_checked(path, LAUNCH_ARGS, text, where)
    return np.array([a.correlation if a is not None else None for a in args], dtype=np.float64)


def _read_chunks(path, chunks, names: Index, recorder: CommRecorder | None):
    parts = []
    row0 = 0
    for chunk in chunks:
        events = chunk.events
        complete = [e.ph == "X" for e in events]
        if all(complete):
            xe, index = events, np.arange(chunk.start, chunk.start + len(events))
        else:
            xe, index = list(compress(events, complete)), np.flatnonzero(complete) + chunk.start
        if not xe:
            continue
        codes = np.array([_CATEGORY[e.cat] for e in xe], dtype=np.int8)
        name_ids = np.array([names[e.name] for e in xe], dtype=np.int32)
        corr = np.full(len(xe), np.nan)
        linked = np.flatnonzero(np.isin(codes, _CORRELATED))
        if linked.size:
            corr[linked] = _correlations(path, xe, linked, index)
        parts.append((
            index,
            np.array([e.ts for e in xe], dtype=np.float64),  # None -> NaN
            np.array([e.dur for e in xe], dtype=np.float64),
            codes,
            corr,
            name_ids,
        ))
        if recorder is not None:
            recorder.add(xe, codes, name_ids, row0)
        row0 += len(xe)
    if not parts:
        raise TraceError(path, "no complete ('X') events: nothing to measure")
    return [np.concatenate([p[k] for p in parts]) for k in range(6)]


def _scan(path, names: Index, recorder: CommRecorder | None = None) -> _Scan:
    """Read a file's events chunk by chunk (:mod:`overlapprof.trace.reader`) into arrays."""
    decoder = THREAD_ROW_DECODER if recorder is not None else ROW_DECODER
    reader = TraceReader(path, decoder)
    try:
        arrays = _read_chunks(path, reader.chunks(), names, recorder)
    except LayoutError:
        if recorder is not None:
            recorder = recorder.fresh()
        arrays = _read_chunks(path, reader.chunks(generic=True), names, recorder)
    index, ts, dur, codes, corr, name_ids = arrays
    for field_name, values in (("ts", ts), ("dur", dur)):
        bad = np.flatnonzero(np.isnan(values))
        if bad.size:
            raise TraceError(path, f"event {index[bad[0]]}: {field_name!r} is missing")
    end = ts + np.maximum(dur, 0.0)
    if not np.isfinite(end).all():
        raise TraceError(path, f"event {index[np.flatnonzero(~np.isfinite(end))[0]]}: 'ts' + 'dur' is out of range")
    negative = int(np.count_nonzero(dur < 0))
    records = recorder.records() if recorder is not None else None
    return _Scan(str(path), ts, end, dur, codes, corr, name_ids, negative, reader.header, records)


def _name_property(names: list[str], func, dtype, ids: np.ndarray) -> np.ndarray:
    """``func(name)`` for the events of name ``ids``, computed once per distinct name (a trace
    has far fewer names than events)."""
    return np.array([func(n) for n in names], dtype=dtype)[ids]


def _step_number(name: str) -> int:
    m = C.STEP_NAME.match(name)
    return int(m.group(1)) if m else -1


def _kind_code(pattern_test):
    return lambda name: _KIND_CODE[C.comm_kind(name)] if pattern_test(name) else -1


def _extract(scan: _Scan, gpu: bool, comm_re, names: list[str], values: Values | None):
    """Classify one file's complete events. Returns (EventSets, steps arrays, CommTable or None)."""
    ts, end, codes = scan.ts, scan.end, scan.codes
    launch_row = np.full(ts.size, -1, dtype=np.int64)

    def prop(func, dtype, rows):
        return _name_property(names, func, dtype, scan.name_ids[rows])

    cpu_rows = np.flatnonzero(codes == C.CPU_OP)
    ann_rows = np.flatnonzero(codes == C.ANNOTATION)
    host_rows = np.concatenate((ann_rows, cpu_rows))
    step_numbers = prop(_step_number, np.int64, host_rows)
    step_rows, step_numbers = host_rows[step_numbers >= 0], step_numbers[step_numbers >= 0]

    if gpu:
        gpu_rows = np.flatnonzero(np.isin(codes, C.GPU_CATEGORIES))
        launch_row[gpu_rows] = _launches(scan, gpu_rows)
        kernels = gpu_rows[codes[gpu_rows] == C.KERNEL]
        kinds = prop(_kind_code(comm_re.search), np.int8, kernels)
        comm_rows, compute_rows = kernels[kinds >= 0], kernels[kinds < 0]
        memory_rows = gpu_rows[codes[gpu_rows] != C.KERNEL]
        wrapper_rows = np.empty(0, dtype=np.int64)
    else:
        kinds = prop(_kind_code(C.COMM_ANNOTATION.match), np.int8, ann_rows)
        comm_rows = ann_rows[kinds >= 0]
        compute_rows = cpu_rows[prop(C.is_cpu_compute, bool, cpu_rows)]
        memory_rows = np.empty(0, dtype=np.int64)
        wrapper_rows = cpu_rows[prop(C.is_comm_wrapper, bool, cpu_rows)]
    kind_codes = kinds[kinds >= 0]

    launched = launch_row >= 0
    anchor = np.where(launched, ts[np.maximum(launch_row, 0)], ts)

    def event_set(rows, kind=None):
        zeros = np.zeros(rows.size, dtype=np.int8)
        return EventSet(ts[rows], end[rows], anchor[rows], launched[rows], zeros if kind is None else kind)

    sets = (event_set(comm_rows, kind_codes), event_set(compute_rows), event_set(memory_rows), event_set(wrapper_rows))
    steps = (step_numbers, ts[step_rows], end[step_rows])
    table = None
    if scan.records is not None:
        table = comm_table(scan.records, values, gpu=gpu, rows=comm_rows, kinds=kind_codes, ts=ts, end=end,
                           dur=scan.dur, codes=codes, name_ids=scan.name_ids, launch_row=launch_row, anchor=anchor)
    return sets, steps, table


def rank_events(files: list[str | Path], comm_re, comm_ops: bool = False, own_args: bool = False) -> RankEvents:
    """Read and classify the complete events of one rank's trace files (one or several
    profiler cycles).

    The rank is in GPU mode when any of its files holds kernels. Launches are matched within a
    file (correlation ids are per process and per recording). ``comm_ops``: also build the
    rank's :class:`~overlapprof.analysis.comm_ops.CommTable` (``RankEvents.comm_ops``; None
    otherwise), with the events' own args when ``own_args`` (for CommOp records). The files'
    top levels (``distributedInfo`` ...) are in ``RankEvents.headers``.
    """
    values = Values() if comm_ops else None
    names = values.index if values is not None else Index()
    scans = [_scan(path, names, CommRecorder(comm_re, values, own_args) if comm_ops else None) for path in files]
    gpu = any(bool((s.codes == C.KERNEL).any()) for s in scans)
    parts = [_extract(scan, gpu, comm_re, names.order, values) for scan in scans]
    comm, compute, memory, wrappers = (EventSet.concat([p[0][k] for p in parts]) for k in range(4))
    numbers, starts, ends = (np.concatenate([p[1][k] for p in parts]) for k in range(3))
    order = np.argsort(starts, kind="stable")
    steps = Steps(numbers[order], starts[order], ends[order])
    table = CommTable.concat([p[2] for p in parts]) if comm_ops else None
    if table is not None and steps.start.size:
        idx = steps.index_of(comm.anchor)
        table.step = np.where(idx >= 0, steps.number[np.maximum(idx, 0)], -1)
    return RankEvents(
        mode="gpu" if gpu else "cpu",
        comm=comm,
        compute=compute,
        memory=memory,
        wrappers=wrappers,
        steps=steps,
        comm_ops=table,
        events=sum(s.ts.size for s in scans),
        negative_durations=sum(s.negative for s in scans),
        files=[str(path) for path in files],
        headers=[scan.header for scan in scans],
    )
