"""From decoded trace files to a rank's classified intervals (compact numpy arrays).

The events are read a chunk at a time (:mod:`overlapprof.trace.reader`); list comprehensions
pull out of each chunk the complete events' ``ts``, ``dur``, category code, name id and (GPU
events and runtime calls) correlation, and the chunk is dropped. Names are classified once per
distinct name, and everything after that is numpy. The result, :class:`RankEvents`, holds per class (comm, compute, memory) the
interval starts and ends, the *anchor* time that places each event in a step (the start of its
launching runtime call when the trace has it, else its own start: OVERLAP.md section 3), and
whether its launch was found. The raw events are dropped once this is built.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from overlapprof.analysis import classify as C
from overlapprof.analysis.comm_ops import CommOp, make_comm_op
from overlapprof.errors import TraceError
from overlapprof.trace.decode import TraceFile
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
    steps: Steps
    comm_ops: list[CommOp]
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


class _Enclosing:
    """Finds the innermost of some host-side ops (one thread's ops nest) enclosing a time."""

    def __init__(self, xs, rows, ts, end):
        self.by_thread: dict = {}
        for i in rows[np.argsort(ts[rows], kind="stable")].tolist():
            starts, items = self.by_thread.setdefault((xs[i].pid, xs[i].tid), ([], []))
            starts.append(ts[i])
            items.append([end[i], xs[i], -1])
        for starts, items in self.by_thread.values():  # parent = the op enclosing each op's start
            open_ = []
            for j, item in enumerate(items):
                while open_ and items[open_[-1]][0] < starts[j]:
                    open_.pop()
                item[2] = open_[-1] if open_ else -1
                open_.append(j)
        self.empty = not self.by_thread

    def around(self, thread, t):
        if self.empty or thread not in self.by_thread:
            return None
        starts, items = self.by_thread[thread]
        j = bisect.bisect_right(starts, t) - 1
        while j >= 0 and items[j][0] < t:
            j = items[j][2]
        return items[j][1] if j >= 0 else None


class _Index(dict):
    """Gives each distinct key a small int id, in order of first appearance."""

    def __missing__(self, key):
        value = self[key] = len(self)
        return value


@dataclass
class _Scan:
    """One file's complete ("X") events as arrays, by row (in file order).

    ``corr``: the correlation of GPU events and runtime calls (NaN elsewhere). ``xs``: by row,
    the events communication records may need, when asked for: comm kernels, comm annotations,
    ``record_param_comms`` and ``c10d::*`` ops with their typed args, runtime calls without.
    """

    path: str
    ts: np.ndarray
    end: np.ndarray
    codes: np.ndarray
    corr: np.ndarray
    name_ids: np.ndarray
    names: list[str]
    negative: int
    header: TraceFile
    xs: dict = field(default_factory=dict)


_CORRELATED = (C.KERNEL, C.MEMCPY, C.MEMSET, C.RUNTIME)


def _kept_name(comm_re):
    """Names of the host/GPU events a communication record may refer to."""
    return _Cache(
        lambda n: bool(comm_re.search(n) or C.COMM_ANNOTATION.match(n) or n == C.PARAM_COMMS or n.startswith("c10d::"))
    )


def _read_chunks(path, chunks, comm_re, keep: bool):
    names = _Index()
    kept_name = _kept_name(comm_re) if keep else None
    parts, xs = [], {}
    row0 = 0
    for chunk in chunks:
        events = chunk.events
        xe = [e for e in events if e.ph == "X"]
        if not xe:
            continue
        if len(xe) == len(events):
            index = np.arange(chunk.start, chunk.start + len(xe))
        else:
            index = np.flatnonzero([e.ph == "X" for e in events]) + chunk.start
        codes = np.array([_CATEGORY[e.cat] for e in xe], dtype=np.int8)
        corr = np.full(len(xe), np.nan)
        linked = np.flatnonzero(np.isin(codes, _CORRELATED))
        if linked.size:
            corr[linked] = np.array(
                [a.correlation if (a := xe[i].args) is not None else None for i in linked.tolist()], dtype=np.float64
            )
        parts.append((
            index,
            np.array([e.ts for e in xe], dtype=np.float64),  # None -> NaN
            np.array([e.dur for e in xe], dtype=np.float64),
            codes,
            corr,
            np.array([names[e.name] for e in xe], dtype=np.int32),
        ))
        if keep:  # runtime calls: where they ran (a launch's thread); the others with their args
            code_list, offsets = codes.tolist(), (index - chunk.start).tolist()
            launches = [i for i, c in enumerate(code_list) if c == C.RUNTIME]
            named = [i for i, e in enumerate(xe) if kept_name[e.name] and code_list[i] != C.RUNTIME]
            for rows, with_args in ((launches, False), (named, True)):
                events_ = chunk.full_events([offsets[i] for i in rows], with_args)
                xs.update(zip((row0 + i for i in rows), events_))
        row0 += len(xe)
    if not parts:
        raise TraceError(path, "no complete ('X') events: nothing to measure")
    return [np.concatenate([p[k] for p in parts]) for k in range(6)], list(names), xs


def _scan(path, comm_re, keep: bool = False) -> _Scan:
    """Read a file's events chunk by chunk (:mod:`overlapprof.trace.reader`) into arrays."""
    reader = TraceReader(path)
    try:
        arrays, names, xs = _read_chunks(path, reader.chunks(), comm_re, keep)
    except LayoutError:
        arrays, names, xs = _read_chunks(path, reader.chunks(generic=True), comm_re, keep)
    index, ts, dur, codes, corr, name_ids = arrays
    for field_name, values in (("ts", ts), ("dur", dur)):
        bad = np.flatnonzero(np.isnan(values))
        if bad.size:
            raise TraceError(path, f"event {index[bad[0]]}: {field_name!r} is missing")
    end = ts + np.maximum(dur, 0.0)
    if not np.isfinite(end).all():
        raise TraceError(path, f"event {index[np.flatnonzero(~np.isfinite(end))[0]]}: 'ts' + 'dur' is out of range")
    negative = int(np.count_nonzero(dur < 0))
    return _Scan(str(path), ts, end, codes, corr, name_ids, names, negative, reader.header, xs)


class _Names:
    """The events' names as ids into the list of distinct names, whose properties are computed
    once per distinct name (a trace has far fewer names than events)."""

    def __init__(self, ids: np.ndarray, distinct: list[str]):
        self.ids, self.distinct = ids, distinct

    def property(self, func, dtype, rows: np.ndarray) -> np.ndarray:
        """``func(name)`` for the events ``rows``."""
        values = np.array([func(n) for n in self.distinct], dtype=dtype)
        return values[self.ids[rows]]


def _step_number(name: str) -> int:
    m = C.STEP_NAME.match(name)
    return int(m.group(1)) if m else -1


def _kind_code(pattern_test):
    return lambda name: _KIND_CODE[C.comm_kind(name)] if pattern_test(name) else -1


def _extract(scan: _Scan, gpu: bool, comm_re):
    """Classify one file's complete events. Returns (EventSets, steps arrays, comm-op builder)."""
    xs, ts, end, codes = scan.xs, scan.ts, scan.end, scan.codes
    names = _Names(scan.name_ids, scan.names)
    launch_row = np.full(ts.size, -1, dtype=np.int64)

    cpu_rows = np.flatnonzero(codes == C.CPU_OP)
    ann_rows = np.flatnonzero(codes == C.ANNOTATION)
    host_rows = np.concatenate((ann_rows, cpu_rows))
    step_numbers = names.property(_step_number, np.int64, host_rows)
    step_rows, step_numbers = host_rows[step_numbers >= 0], step_numbers[step_numbers >= 0]

    if gpu:
        gpu_rows = np.flatnonzero(np.isin(codes, C.GPU_CATEGORIES))
        launch_row[gpu_rows] = _launches(scan, gpu_rows)
        kernels = gpu_rows[codes[gpu_rows] == C.KERNEL]
        kinds = names.property(_kind_code(comm_re.search), np.int8, kernels)
        comm_rows, compute_rows = kernels[kinds >= 0], kernels[kinds < 0]
        memory_rows = gpu_rows[codes[gpu_rows] != C.KERNEL]
        source = "kernel"
    else:
        kinds = names.property(_kind_code(C.COMM_ANNOTATION.match), np.int8, ann_rows)
        comm_rows = ann_rows[kinds >= 0]
        compute_rows = cpu_rows[names.property(C.is_cpu_compute, bool, cpu_rows)]
        memory_rows = np.empty(0, dtype=np.int64)
        source = "annotation"
    kind_codes = kinds[kinds >= 0]

    launched = launch_row >= 0
    anchor = np.where(launched, ts[np.maximum(launch_row, 0)], ts)

    def event_set(rows, kind=None):
        zeros = np.zeros(rows.size, dtype=np.int8)
        return EventSet(ts[rows], end[rows], anchor[rows], launched[rows], zeros if kind is None else kind)

    sets = (event_set(comm_rows, kind_codes), event_set(compute_rows), event_set(memory_rows))
    steps = (step_numbers, ts[step_rows], end[step_rows])

    def comm_ops(step_of) -> list[CommOp]:
        def enclosing(rows, test):
            return _Enclosing(xs, rows[names.property(test, bool, rows)], ts, end)

        params = enclosing(cpu_rows, lambda n: n == C.PARAM_COMMS)
        calls = enclosing(cpu_rows, lambda n: n.startswith("c10d::"))
        # GPU mode: the nccl:<op> annotation around a launch names the collective of a generic kernel.
        annotations = enclosing(ann_rows if gpu else ann_rows[:0], lambda n: bool(C.COMM_ANNOTATION.match(n)))
        ops = []
        for i, kind, step in zip(comm_rows, kind_codes, step_of):
            e, lr = xs[i], launch_row[i]
            origin = xs[lr] if lr >= 0 else e
            launch_ts = float(ts[lr]) if lr >= 0 else None
            thread, t = (origin.pid, origin.tid), anchor[i]
            around = params.around(thread, t)
            ops.append(make_comm_op(e, C.KINDS[kind], source, step, launch_ts, around,
                                    annotations.around(thread, t), calls.around(thread, t)))
        return ops

    return sets, steps, comm_ops


def rank_events(files: list[str | Path], comm_re, comm_ops: bool = False) -> RankEvents:
    """Read and classify the complete events of one rank's trace files (one or several
    profiler cycles).

    The rank is in GPU mode when any of its files holds kernels. Launches are matched within a
    file (correlation ids are per process and per recording). ``comm_ops``: also build one
    CommOp per communication event (``RankEvents.comm_ops``; empty otherwise). The files' top
    levels (``distributedInfo`` ...) are in ``RankEvents.headers``.
    """
    scans = [_scan(path, comm_re, keep=comm_ops) for path in files]
    gpu = any(bool((s.codes == C.KERNEL).any()) for s in scans)
    parts = [_extract(scan, gpu, comm_re) for scan in scans]
    comm, compute, memory = (EventSet.concat([p[0][k] for p in parts]) for k in range(3))
    numbers, starts, ends = (np.concatenate([p[1][k] for p in parts]) for k in range(3))
    order = np.argsort(starts, kind="stable")
    steps = Steps(numbers[order], starts[order], ends[order])
    ops: list[CommOp] = []
    offset = 0
    for sets, _, build in parts if comm_ops else ():
        n = len(sets[0])
        idx = steps.index_of(comm.anchor[offset : offset + n])
        ops.extend(build([int(steps.number[j]) if j >= 0 else None for j in idx]))
        offset += n
    return RankEvents(
        mode="gpu" if gpu else "cpu",
        comm=comm,
        compute=compute,
        memory=memory,
        steps=steps,
        comm_ops=ops,
        events=sum(s.ts.size for s in scans),
        negative_durations=sum(s.negative for s in scans),
        files=[str(path) for path in files],
        headers=[scan.header for scan in scans],
    )
