"""From decoded trace files to a rank's classified intervals (compact numpy arrays).

Each file is read into columns by :mod:`overlapprof.analysis.rank.scan` (a chunk at a time, its
``args`` decoded only where needed). Names are classified once per distinct name, and
everything after that is numpy. The result, :class:`RankEvents`, holds per class (comm, compute,
memory) the interval starts and ends, the *anchor* time that places each event in a step (the
start of its launching runtime call when the trace has it, else its own start: OVERLAP.md
section 3), and whether its launch was found. When asked, a
:class:`~overlapprof.analysis.records.recorder.CommRecorder` reads the communication records from
the same chunks (``RankEvents.comm_records``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from overlapprof.analysis import heap
from overlapprof.analysis.columns import Index
from overlapprof.analysis.intervals import union
from overlapprof.analysis.rank import classify as C
from overlapprof.analysis.rank.classify import KIND_CODE
from overlapprof.analysis.rank.read import read_scan
from overlapprof.analysis.rank.scan import IS_GPU, Scan
from overlapprof.analysis.records.fields import Values
from overlapprof.analysis.records.recorder import CommRecorder
from overlapprof.analysis.rank.issuing import (NameTables, call_kind_code, call_union, encloses_calls, inside_calls,
                                              issuing_kind, kind_code, operations, own_kind_code)
from overlapprof.analysis.rank.waits import need_times, waited_for
from overlapprof.analysis.records.table import CommTable, comm_table
from overlapprof.trace.decode import TraceFile


@dataclass
class EventSet:
    """Intervals of one class: ``[start, end)`` µs, step anchor, launch found, comm kind code,
    and whether the event is an operation of its own (what per-kind counts count)."""

    start: np.ndarray
    end: np.ndarray
    anchor: np.ndarray
    launched: np.ndarray
    kind: np.ndarray  # index into classify.KINDS (comm only; zeros elsewhere)
    operation: np.ndarray  # comm: not part of another comm event's operation (see _operations); True elsewhere
    key: np.ndarray  # int32 name id (the rank's name index): a compute event's compute class (interference)
    thread: np.ndarray  # int32: (file index << 16) + the thread's code in its file (GPU: the stream's, or -1)

    @classmethod
    def concat(cls, sets: list[EventSet]) -> EventSet:
        if len(sets) == 1:
            return sets[0]
        return cls(*(np.concatenate([getattr(s, f) for s in sets]) for f in cls.__dataclass_fields__))

    def copy(self) -> EventSet:
        return EventSet(*(getattr(self, f).copy() for f in self.__dataclass_fields__))

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

    @classmethod
    def of_files(cls, parts: list[tuple]) -> Steps:
        """The steps of a rank's files (each file's (numbers, starts, ends)), sorted by start."""
        numbers, starts, ends = (np.concatenate([p[k] for p in parts]) for k in range(3))
        order = np.argsort(starts, kind="stable")
        return cls(numbers[order], starts[order], ends[order])

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
    comm_records: CommTable | None  # the communication records, when asked for
    events: int  # complete ("X") events read
    negative_durations: int = 0
    files: list[str] = field(default_factory=list)
    unclassified: dict[str, int] = field(default_factory=dict)  # device categories left out: event counts
    lookalikes: dict[str, int] = field(default_factory=dict)  # compute kernels named like communication: counts
    headers: list[TraceFile] = field(default_factory=list)  # each file's top level, without events
    host_sync: tuple = (np.empty(0), np.empty(0))  # union of the host synchronizations (classify.is_host_sync)
    names: list[str] = field(default_factory=list)  # the rank's name index: what EventSet.key codes
    notes: list[str] = field(default_factory=list)  # what the reader says of the files (an nsys export's schema ...)

    @property
    def calls(self):
        """CPU mode: the union of the rank's ``c10d::*`` calls (:func:`issuing.call_union`); GPU mode: None."""
        return call_union(self.comm, self.names) if self.mode == "cpu" else None


def step_number(name: str) -> int:
    m = C.STEP_NAME.match(name)
    return int(m.group(1)) if m else -1


def ends_at_peer(scan: Scan, rows: np.ndarray, ends: tuple[np.ndarray, np.ndarray] | None) -> None:
    """CPU mode: the send spans among ``rows`` (comm annotations of kind send_recv) that start at
    one of ``ends``' starts end at its end instead: their matched blocking receive showed that
    their transfer ended there (OVERLAP.md section 1; :mod:`overlapprof.analysis.crossrank.transfer_ends`).
    In place, in ``scan.dur``, so that the classes and the records both see it."""
    if ends is None or rows.size == 0 or ends[0].size == 0:
        return
    starts, new_ends = ends
    ts = scan.ts[rows]
    k = np.minimum(np.searchsorted(starts, ts), starts.size - 1)
    hit = starts[k] == ts
    if hit.any():
        scan.dur = scan.dur.copy()  # may be a view of a read-only buffer
        scan.dur[rows[hit]] = np.maximum(new_ends[k[hit]] - ts[hit], 0.0)


def extract(scan: Scan, gpu: bool, comm_re, comm_ann, names: list[str], values: Values | None, activity=None,
            ends=None, waited=None, tables: NameTables | None = None):
    """Classify one file's complete events (the scan's thread, collective and launch columns
    are dropped once read). Returns (EventSets, steps arrays, CommTable or None, the rows of
    the comm EventSet, the union of the host synchronizations, the compute kernels whose names
    look like communication: name -> count, see :func:`comm_lookalikes`). ``activity``: CPU mode, the
    host activity of the file's compute cpu_ops as (thread, start, end), when the scan does not
    hold them (default: the scan's; see :func:`~overlapprof.analysis.rank.waits.need_times`). ``ends``: CPU mode, the sends whose
    communication ends at their partner's receive (see :func:`ends_at_peer`). ``waited(rows)``:
    GPU mode, the need times of the communication rows ``rows``, when the scan does not hold
    what measures them (default: :func:`~overlapprof.analysis.rank.waits.waited_for` on the scan's CUDA sync events).
    ``tables``: the per-name tables of ``names``, when the caller classifies them batch after batch.

    Rows are picked with masks over the file's rows and per-name tables (one lookup per row),
    and the launch and anchor of GPU events are kept per GPU event (the CommTable takes its
    rows' from them): no full-length column is made beyond the masks."""
    ts, end, codes, name_ids = scan.ts, scan.end, scan.codes, scan.name_ids  # end(rows): computed (from scan.dur)

    tables = tables if tables is not None else NameTables(names)

    def prop(func, dtype, rows):
        return tables.of(func, dtype, name_ids[rows])

    is_cpu = codes == C.CPU_OP
    step_of_name = tables.table(step_number, np.int64)
    step_named = (step_of_name >= 0)[name_ids]
    step_rows = np.concatenate((np.flatnonzero(step_named & (codes == C.ANNOTATION)),
                                np.flatnonzero(step_named & is_cpu)))
    step_numbers = step_of_name[name_ids[step_rows]]
    del step_named
    calls = np.flatnonzero(is_cpu & tables.of(C.is_comm_call, bool, name_ids))
    del is_cpu

    if gpu:
        gpu_rows = np.flatnonzero(IS_GPU[codes])
        launch = scan_launch = scan.launch
        launched = launch >= 0
        in_call = np.zeros(gpu_rows.size, dtype=bool)
        in_call[launched] = inside_calls(calls, scan, scan.thread[launch[launched]], ts[launch[launched]])
        is_kernel = codes[gpu_rows] == C.KERNEL
        named = np.zeros(gpu_rows.size, dtype=np.int8) - 1
        named[is_kernel] = prop(kind_code(comm_re.search), np.int8, gpu_rows[is_kernel])
        is_comm = (named >= 0) | in_call
        picks = (is_comm, is_kernel & ~is_comm, ~is_kernel & ~is_comm)  # comm, compute, memory: of the GPU rows
        comm_rows, compute_rows, memory_rows = (gpu_rows[m] for m in picks)
        lookalikes = comm_lookalikes(names, name_ids[compute_rows])
        own_kind = np.where(named >= 0, named, prop(own_kind_code, np.int8, gpu_rows))[is_comm]
        clr = launch[is_comm]
        has = clr >= 0
        kind_codes = own_kind.copy()
        kind_codes[has] = issuing_kind(scan, tables, calls, scan.thread[clr[has]], ts[clr[has]], own_kind[has])
        operation = np.ones(comm_rows.size, dtype=bool)
        gpu_anchor = ts[gpu_rows]
        gpu_anchor[launched] = ts[launch[launched]]
        anchors = [gpu_anchor[m] for m in picks]
        launches = [launched[m] for m in picks]
    else:
        cpu_rows = np.flatnonzero(codes == C.CPU_OP)
        ann_rows = np.flatnonzero(codes == C.ANNOTATION)
        ann_kinds = prop(kind_code(comm_ann.match), np.int8, ann_rows)
        comm_ann_rows = ann_rows[ann_kinds >= 0]
        ends_at_peer(scan, comm_ann_rows[ann_kinds[ann_kinds >= 0] == KIND_CODE["send_recv"]], ends)
        c10d_rows = calls[prop(C.is_comm_wrapper, bool, calls)]
        comm_rows = np.concatenate((comm_ann_rows, c10d_rows))
        own_kind = np.concatenate((ann_kinds[ann_kinds >= 0],
                                   prop(call_kind_code, np.int8, c10d_rows)))
        kind_codes = issuing_kind(scan, tables, calls, scan.thread[comm_rows], ts[comm_rows], own_kind)
        order = np.argsort(comm_rows, kind="stable")  # file order, as the records are
        comm_rows, kind_codes = comm_rows[order], kind_codes[order]
        operation, holders = operations(scan, comm_rows, kind_codes, c10d_rows)
        candidates = cpu_rows[prop(C.is_cpu_compute, bool, cpu_rows)]
        compute_rows = candidates[~inside_calls(calls, scan, scan.thread[candidates], ts[candidates])]
        memory_rows = np.empty(0, dtype=np.int64)
        lookalikes = {}
        anchors = [ts[rows] for rows in (comm_rows, compute_rows, memory_rows)]  # no launches: their own start
        launches = [np.zeros(rows.size, dtype=bool) for rows in (comm_rows, compute_rows, memory_rows)]

    def event_set(k, rows, kind=None, own=None):
        zeros = np.zeros(rows.size, dtype=np.int8)
        return EventSet(ts[rows], end(rows), anchors[k], launches[k], zeros if kind is None else kind,
                        np.ones(rows.size, dtype=bool) if own is None else own, name_ids[rows].astype(np.int32),
                        scan.thread[rows].astype(np.int32))

    sets = (event_set(0, comm_rows, kind_codes, operation), event_set(1, compute_rows), event_set(2, memory_rows))
    steps = (step_numbers, ts[step_rows], end(step_rows))
    sync_rows = np.flatnonzero(tables.of(C.is_host_sync, bool, name_ids)
                               & ((codes == C.RUNTIME) | (codes == C.CPU_OP)))
    host_sync = union(ts[sync_rows], end(sync_rows))
    table = None
    scan.collective = scan.launch = None  # read only above: their memory is free for the table's
    if scan.records is not None:
        # CPU mode: the operations matched across ranks are the backend's spans (one per
        # operation, on the thread that does it); the c10d::* calls around them are not repeated.
        ops = np.ones(comm_rows.size, dtype=bool) if gpu else codes[comm_rows] == C.ANNOTATION
        rows, rec = comm_rows[ops], scan.records
        launch = clr[ops] if gpu else np.full(rows.size, -1, dtype=np.int64)  # comm rows are GPU rows: as above
        anchor = anchors[0][ops] if gpu else ts[rows]
        launched = launch >= 0
        launch_ts = np.where(launched, ts[np.maximum(launch, 0)], np.nan)
        host_thread = rec.thread_of(np.where(launched, launch, rows))
        if gpu:
            issue_ts = np.where(launched, launch_ts, ts[rows])
            need_ts = (waited_for(scan, names, gpu_rows, scan_launch, rows, launch) if waited is None
                       else waited(rows))
        else:  # a span on a worker thread was issued by its c10d call (gloo's FIFO); one on the
            # calling thread opens inside its call, whose overhead before it is not a wait
            holder = holders[ops]
            issuer = np.where(holder >= 0, holder, rows)
            elsewhere = scan.thread[issuer] != scan.thread[rows]
            issue_ts = np.where(elsewhere, ts[issuer], ts[rows])
            if activity is None:  # the callers of communication calls left out (issuing.encloses_calls)
                own = compute_rows[~encloses_calls(calls, scan, scan.thread[compute_rows], ts[compute_rows],
                                                   end(compute_rows))]
                activity = (scan.thread[own], ts[own], end(own))
            activity = tuple(np.concatenate(p) for p in zip(activity, (scan.thread[calls], ts[calls], end(calls))))
            need_ts = need_times(activity, scan.thread[issuer], issue_ts, end(rows))
        if gpu:  # GPU activity that is not communication is no record's (a table row's, or its call's)
            rec.drop(np.concatenate((compute_rows, memory_rows)))
        rec.gather(ts, scan.dur, codes, name_ids)
        # The file's columns are not needed any more: their memory is free for the table's.
        del ts, codes, name_ids
        scan.ts = scan.dur = scan.codes = scan.name_ids = None
        table = comm_table(rec, values, gpu=gpu, rows=rows, kinds=kind_codes[ops], launch_ts=launch_ts,
                           host_thread=host_thread, anchor=anchor, issue_ts=issue_ts, need_ts=need_ts)
    scan.thread = None
    return sets, steps, table, comm_rows, host_sync, lookalikes


def comm_lookalikes(names: list[str], ids: np.ndarray) -> dict[str, int]:
    """Of compute kernels (their name ids), those whose names look like communication
    (:func:`~overlapprof.analysis.rank.classify.looks_like_comm`): name -> how many; what the
    report warns about (a library's collective OVERLAP.md does not know is compute unless the
    user names it with ``--comm-kernel``)."""
    if ids.size == 0:
        return {}
    counts = np.bincount(ids)
    return {names[i]: int(counts[i]) for i in np.flatnonzero(counts).tolist() if C.looks_like_comm(names[i])}


def merged_counts(counts: list[dict[str, int]]) -> dict[str, int]:
    """Counts by key (the device categories left out of each file) added up, in order of first appearance."""
    out: dict[str, int] = {}
    for c in counts:
        for k, v in c.items():
            out[k] = out.get(k, 0) + v
    return out


def last_step_dropped(steps: Steps, drop: bool, label: str, warnings: list[str]) -> tuple[Steps, float | None]:
    """``--drop-last-step``: the steps without the last, and the anchor time from which events
    are left out (None: nothing dropped, with a warning when there are fewer than 2 steps)."""
    if not drop:
        return steps, None
    if steps.start.size < 2:
        warnings.append(f"{label}: fewer than 2 ProfilerSteps, --drop-last-step changes nothing")
        return steps, None
    return Steps(steps.number[:-1], steps.start[:-1], steps.end[:-1]), steps.start[-1]


def filtered(s: EventSet, require_launch: bool, cutoff: float | None) -> EventSet:
    """The events the HTA-style filters keep: launched ones (``require_launch``), anchored
    before ``cutoff`` (see :func:`last_step_dropped`)."""
    if require_launch:
        s = s.select(s.launched)
    if cutoff is not None:
        s = s.select(s.anchor < cutoff)
    return s


def place_in_steps(table: CommTable | None, steps: Steps) -> None:
    """Each record's step (``table.step``; -1: none), by its own anchor: its launch, else its
    start (the records are not the comm EventSet's rows: v2 also counts c10d calls and activity
    launched inside them)."""
    if table is not None and steps.start.size:
        idx = steps.index_of(np.where(np.isnan(table.launch_ts), table.ts, table.launch_ts))
        table.step = np.where(idx >= 0, steps.number[np.maximum(idx, 0)], -1)


def rank_events(files: list[str | Path], comm_re, records: bool = False, record_own_args: bool = False,
                comm_ann=None, parallel=None, ends=None, step_range: str | None = None,
                rank_map: dict | None = None) -> RankEvents:
    """Read and classify the complete events of one rank's trace files (one or several
    profiler cycles).

    The rank is in GPU mode when any of its files holds kernels. Launches are matched within a
    file (correlation ids are per process and per recording). ``records``: also build the
    rank's :class:`~overlapprof.analysis.records.table.CommTable` (``RankEvents.comm_records``;
    None otherwise), with the events' own args when ``record_own_args`` (for CommRecord
    structs). The files' top levels (``distributedInfo`` ...) are in ``RankEvents.headers``.
    ``parallel``: reads one large file in several processes (the result is the same with any
    number; see :func:`~overlapprof.analysis.rank.read.read_file`); ``ends``: see :func:`ends_at_peer`.
    ``step_range``: in an Nsight Systems export, the NVTX range that marks a step (None:
    ``ProfilerStep#N``); ``rank_map``: its processes' ranks by pid.
    """
    comm_ann = comm_ann if comm_ann is not None else C.compile_comm_annotations()
    values = Values() if records else None
    names = values.index if values is not None else Index()
    notes: list[str] = []
    scans = [read_scan(path, names, CommRecorder(comm_re, values, record_own_args) if records else None, parallel,
                       notes, step_range, rank_map) for path in files]
    gpu = any(bool((s.codes == C.KERNEL).any()) for s in scans)
    unclassified = merged_counts([s.unclassified for s in scans])
    events = sum(s.events for s in scans)
    negative = sum(s.negative for s in scans)
    headers = [scan.header for scan in scans]
    parts = []
    while scans:  # each file's columns are freed once classified: they are the largest arrays
        parts.append(extract(scans.pop(0), gpu, comm_re, comm_ann, names.order, values, ends=ends))
        for s in parts[-1][0]:
            s.thread += np.int32(len(parts) - 1) << 16  # threads are a file's own codes
        heap.release(events)
    comm, compute, memory = (EventSet.concat([p[0][k] for p in parts]) for k in range(3))
    steps = Steps.of_files([p[1] for p in parts])
    table = CommTable.concat([p[2] for p in parts]) if records else None
    place_in_steps(table, steps)
    host_sync = union(np.concatenate([p[4][0] for p in parts]), np.concatenate([p[4][1] for p in parts]))
    lookalikes = merged_counts([p[5] for p in parts])
    return RankEvents(
        mode="gpu" if gpu else "cpu",
        comm=comm,
        compute=compute,
        memory=memory,
        steps=steps,
        comm_records=table,
        events=events,
        negative_durations=negative,
        files=[str(path) for path in files],
        unclassified=unclassified,
        lookalikes=lookalikes,
        headers=headers,
        host_sync=host_sync,
        names=names.order,
        notes=notes,
    )
