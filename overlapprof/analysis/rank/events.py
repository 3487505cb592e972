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

import functools
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
from overlapprof.analysis.records.table import CommTable, comm_table, innermost
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


def _name_property(names: list[str], func, dtype, ids: np.ndarray) -> np.ndarray:
    """``func(name)`` for the events of name ``ids``, computed once per distinct name (a trace
    has far fewer names than events)."""
    return np.array([func(n) for n in names], dtype=dtype)[ids]


def step_number(name: str) -> int:
    m = C.STEP_NAME.match(name)
    return int(m.group(1)) if m else -1


@functools.lru_cache(maxsize=1 << 16)
def _named_kind(test, name: str) -> int:
    """The kind code of ``name`` when ``test`` (a compiled pattern's search or match) finds it,
    else -1; kept per (pattern, name): a rank measured a time bucket at a time asks for the same
    names in every bucket, and the families' pattern is slow on long kernel names."""
    return KIND_CODE[C.comm_kind(name)] if test(name) else -1


def _kind_code(pattern_test):
    return functools.partial(_named_kind, pattern_test)


def inside_calls(calls: np.ndarray, scan: Scan, q_thread: np.ndarray, q_time: np.ndarray) -> np.ndarray:
    """Whether each query (thread, time) lies in [call.ts, call.ts + dur) of one of the call
    rows ``calls`` on that thread: per thread, the union of its calls and one sorted search."""
    out = np.zeros(q_time.size, dtype=bool)
    if calls.size == 0 or q_time.size == 0:
        return out
    c_thread = scan.thread[calls]
    for thread in np.flatnonzero(np.bincount(c_thread[c_thread >= 0])).tolist():
        queries = np.flatnonzero(q_thread == thread)
        if queries.size == 0:
            continue
        mine = calls[c_thread == thread]
        starts, ends = union(scan.ts[mine], scan.end(mine))
        t = q_time[queries]
        j = np.searchsorted(starts, t, "right") - 1
        out[queries] = (j >= 0) & (t < ends[np.maximum(j, 0)])
    return out


def _issuing_kind(scan: Scan, names: list[str], calls: np.ndarray, q_thread, q_time, fallback) -> np.ndarray:
    """The kind code of the collective each query was issued for (OVERLAP.md section 3): the
    ``Collective name`` of the innermost enclosing record_param_comms on its thread, else the
    name of the innermost enclosing ``c10d::*`` call, else ``fallback`` (its own name's kind)."""
    out = fallback.astype(np.int8).copy()
    if calls.size == 0 or q_time.size == 0:
        return out
    params = calls[scan.name_ids[calls] == names.index(C.PARAM_COMMS)] if C.PARAM_COMMS in names else calls[:0]
    c10d = calls[_name_property(names, C.is_comm_wrapper, bool, scan.name_ids[calls])]
    kind = np.full(q_time.size, -1, dtype=np.int8)
    for rows, codes in ((c10d, None), (params, scan.collective)):  # later sources win
        if rows.size == 0:
            continue
        # Half-open [ts, ts + dur): innermost() takes closed ends, so end at the float just below.
        found = innermost(scan.thread[rows], scan.ts[rows], np.nextafter(scan.end(rows), -np.inf), q_thread, q_time)
        ok = found >= 0
        if codes is None:
            value = _name_property(names, lambda n: KIND_CODE[C.comm_kind(n[6:])], np.int8, scan.name_ids[rows])
        else:
            value = codes[rows]
        got = np.where(ok, value[np.maximum(found, 0)], -1)
        kind = np.where(got >= 0, got, kind)
    return np.where(kind >= 0, kind, out).astype(np.int8)


# What a backend may run a collective as: gloo runs a reduce-scatter of one tensor
# (``c10d::_reduce_scatter_base_``, FSDP2's) as an all-reduce on its worker thread, and records it as
# ``gloo:all_reduce``. Span kind -> the kinds of the calls it may be part of (its own first).
RUN_AS = {KIND_CODE["all_reduce"]: (KIND_CODE["all_reduce"], KIND_CODE["reduce_scatter"])}


def _operations(scan: Scan, comm_rows: np.ndarray, kinds: np.ndarray, calls: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """CPU mode: whether each comm row is an operation of its own, so that a rank's count of a
    kind is the number of operations issued, not of spans recorded for them; and the call each
    comm row is part of (a row of the scan, -1: none), whose start is when it was issued.
    ``kinds`` (of the comm rows) is updated in place: a span that is part of a call takes its kind.

    Each ``c10d::*`` call ``calls`` is one operation. A ``<backend>:<op>`` span that starts
    inside one on its thread is part of it (gloo's send/recv: ``c10d::recv_`` then
    ``gloo:recv`` on the calling thread). A span on another thread (gloo runs a collective on a
    worker thread) is part of the earliest call not yet taken that started no later than it and
    that its backend may run as the span's kind (:data:`RUN_AS`: gloo's work queue is first in,
    first out), the spans taken in the order they start; or else an operation of its own.
    """
    is_span = scan.codes[comm_rows] == C.ANNOTATION
    out = ~is_span
    holder_row = np.full(comm_rows.size, -1, dtype=np.int64)
    spans = np.flatnonzero(is_span)
    if spans.size == 0 or calls.size == 0:
        out[spans] = True
        return out, holder_row
    ends = np.nextafter(scan.end(calls), -np.inf)  # innermost() takes closed ends
    rows = comm_rows[spans]
    holder = innermost(scan.thread[calls], scan.ts[calls], ends, scan.thread[rows], scan.ts[rows])
    holder_row[spans[holder >= 0]] = calls[holder[holder >= 0]]
    taken = np.zeros(calls.size, dtype=bool)
    taken[holder[holder >= 0]] = True
    order = np.argsort(comm_rows, kind="stable")  # calls are comm rows: their kinds by row
    call_kind = kinds[order[np.searchsorted(comm_rows[order], calls)]]
    loose = spans[holder < 0]
    loose = loose[np.argsort(scan.ts[comm_rows[loose]], kind="stable")]
    free = {}  # call kind -> (its free calls by start, their starts, how many are taken)
    for kind in np.flatnonzero(np.bincount(call_kind[~taken])).tolist() if (~taken).any() else []:
        mine = calls[(call_kind == kind) & ~taken]
        mine = mine[np.argsort(scan.ts[mine], kind="stable")]
        free[kind] = [mine.tolist(), scan.ts[mine].tolist(), 0]
    for q, t in zip(loose.tolist(), scan.ts[comm_rows[loose]].tolist()):
        heads = [(f[1][f[2]], k) for k in RUN_AS.get(int(kinds[q]), (int(kinds[q]),))
                 if (f := free.get(k)) is not None and f[2] < len(f[0]) and f[1][f[2]] <= t]
        if not heads:
            out[q] = True
            continue
        _, k = min(heads)  # the earliest issued (first in, first out)
        holder_row[q] = free[k][0][free[k][2]]  # part of that call
        free[k][2] += 1
        kinds[q] = k
    return out, holder_row


def _waited_for(scan: Scan, names: list[str], gpu_rows: np.ndarray, launch: np.ndarray, comm: np.ndarray,
                comm_launch: np.ndarray) -> np.ndarray:
    """GPU mode: when the program needed each communication event's result (``comm``: GPU rows,
    ``comm_launch``: their launching runtime rows, -1 none; NaN: not known), from the CUDA sync
    events of ``enable_cuda_sync_events``. A "Stream Wait Event" on stream W waits on a
    ``cudaEventRecord`` call: the event covers the communication launched last, at or before that
    call, from the call's thread. The first GPU event launched on W after the wait depends on it:
    its result was needed when that event could otherwise have run, the later of its launch and
    the end of the work W had before the wait."""
    need = np.full(comm.size, np.nan)
    sync = np.flatnonzero(scan.codes == C.SYNC)
    if sync.size == 0 or scan.sync_record.size != sync.size or comm.size == 0:
        return need
    is_wait = np.array([n == C.STREAM_WAIT for n in names], dtype=bool)[scan.name_ids[sync]] & (scan.sync_record >= 0)
    waits, records = sync[is_wait], scan.sync_record[is_wait]
    launched = comm_launch >= 0
    c_rows, c_thread, c_ts = np.flatnonzero(launched), scan.thread[comm_launch[launched]], scan.ts[comm_launch[launched]]
    order = np.lexsort((c_ts, c_thread))
    c_rows, c_thread, c_ts = c_rows[order], c_thread[order], c_ts[order]
    # Per wait, vectorized by the records' threads and the waiting streams (a loop per wait over
    # every GPU event was quadratic: minutes on a trace with tens of thousands of waits).
    rec_thread, rec_ts = scan.thread[records], scan.ts[records]
    k = np.full(waits.size, -1, dtype=np.int64)
    for thread in np.flatnonzero(np.bincount(rec_thread)).tolist() if rec_thread.size else []:
        q = np.flatnonzero(rec_thread == thread)
        lo, hi = np.searchsorted(c_thread, thread, "left"), np.searchsorted(c_thread, thread, "right")
        got = lo + np.searchsorted(c_ts[lo:hi], rec_ts[q], "right") - 1
        k[q] = np.where(got >= lo, got, -1)
    g_launched = launch >= 0
    g_rows, g_launch = gpu_rows[g_launched], scan.ts[launch[g_launched]]
    g_stream, g_end = scan.thread[g_rows], scan.end(g_rows)
    ready = np.full(waits.size, np.nan)
    w_stream, w_ts = scan.thread[waits], scan.ts[waits]
    for stream in np.flatnonzero(np.bincount(w_stream[k >= 0])).tolist() if (k >= 0).any() else []:
        q = np.flatnonzero((w_stream == stream) & (k >= 0))
        on_w = g_stream == stream
        order = np.argsort(g_launch[on_w], kind="stable")
        starts, reach = g_launch[on_w][order], np.maximum.accumulate(g_end[on_w][order]) if order.size else order
        idx = np.searchsorted(starts, w_ts[q], "right")  # the GPU events on W launched at or before each wait
        after = idx < starts.size
        q, idx = q[after], idx[after]
        before = np.where(idx > 0, reach[np.maximum(idx - 1, 0)], -np.inf)
        ready[q] = np.maximum(starts[idx], before)  # the first launched after it, or W's work before it ends
    found = ~np.isnan(ready)
    np.fmin.at(need, c_rows[k[found]], ready[found])
    return need


def thread_reach(thread: np.ndarray, start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Host activity ``[start, end]`` per thread, compressed for :func:`need_times`: each
    thread's connected runs (closed intervals: touching ones join, zero-length ones count), as
    (thread, start, end) sorted by thread and start. The latest end of the activity that starts
    before a time t is the end of the last run that starts before t, or t itself is inside that
    run: so the need times of the runs are those of the activity (and runs of runs are the runs)."""
    if thread.size == 0:
        return thread, start, end
    order = np.lexsort((start, thread))
    thread, start, end = thread[order], start[order], end[order]
    reach = np.empty_like(end)
    new = np.ones(thread.size, dtype=bool)
    for t in np.flatnonzero(np.bincount(thread)).tolist():  # (np.unique imports numpy.ma)
        a, b = np.searchsorted(thread, (t, t + 1))
        reach[a:b] = np.maximum.accumulate(end[a:b])
        new[a + 1 : b] = start[a + 1 : b] > reach[a : b - 1]
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, thread.size - 1)
    return thread[first], start[first], reach[last]


def need_times(activity: tuple, thread: np.ndarray, issue: np.ndarray, end: np.ndarray) -> np.ndarray:
    """CPU mode: when the program needed each operation's result: the end of the last host
    ``activity`` ((thread, start, end): compute cpu_ops and communication calls, or their
    :func:`thread_reach`) on its issuing ``thread`` that started between its ``issue`` and its
    ``end``, clipped to ``[issue, end]``; its issue when the thread did nothing else (a blocking call)."""
    need = issue.copy()
    a_thread, a_start, a_end = activity
    if a_thread.size == 0 or issue.size == 0:
        return need
    order = np.lexsort((a_start, a_thread))
    a_thread, a_start, a_end = a_thread[order], a_start[order], a_end[order]
    lo, hi = np.searchsorted(a_thread, thread, "left"), np.searchsorted(a_thread, thread, "right")
    for t in np.flatnonzero(np.bincount(thread[hi > lo])).tolist():
        q = np.flatnonzero(thread == t)
        a, b = int(lo[q[0]]), int(hi[q[0]])
        reach = np.maximum.accumulate(a_end[a:b])  # the latest end so far on the thread
        j = np.searchsorted(a_start[a:b], end[q], "left") - 1  # the last activity starting before the end
        found = j >= 0
        last = np.where(found, reach[np.maximum(j, 0)], issue[q])
        need[q] = np.clip(last, issue[q], end[q])
    return need


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
            ends=None, waited=None):
    """Classify one file's complete events (the scan's thread, collective and launch columns
    are dropped once read). Returns (EventSets, steps arrays, CommTable or None, the rows of
    the comm EventSet, the union of the host synchronizations, the compute kernels whose names
    look like communication: name -> count, see :func:`comm_lookalikes`). ``activity``: CPU mode, the
    host activity of the file's compute cpu_ops as (thread, start, end), when the scan does not
    hold them (default: the scan's; see :func:`need_times`). ``ends``: CPU mode, the sends whose
    communication ends at their partner's receive (see :func:`ends_at_peer`). ``waited(rows)``:
    GPU mode, the need times of the communication rows ``rows``, when the scan does not hold
    what measures them (default: :func:`_waited_for` on the scan's CUDA sync events).

    Rows are picked with masks over the file's rows and per-name tables (one lookup per row),
    and the launch and anchor of GPU events are kept per GPU event (the CommTable takes its
    rows' from them): no full-length column is made beyond the masks."""
    ts, end, codes, name_ids = scan.ts, scan.end, scan.codes, scan.name_ids  # end(rows): computed (from scan.dur)

    def prop(func, dtype, rows):
        return _name_property(names, func, dtype, name_ids[rows])

    is_cpu = codes == C.CPU_OP
    step_of_name = np.array([step_number(n) for n in names], dtype=np.int64)
    step_named = (step_of_name >= 0)[name_ids]
    step_rows = np.concatenate((np.flatnonzero(step_named & (codes == C.ANNOTATION)),
                                np.flatnonzero(step_named & is_cpu)))
    step_numbers = step_of_name[name_ids[step_rows]]
    del step_named
    calls = np.flatnonzero(is_cpu & np.array([C.is_comm_call(n) for n in names], dtype=bool)[name_ids])
    del is_cpu

    if gpu:
        gpu_rows = np.flatnonzero(IS_GPU[codes])
        launch = scan_launch = scan.launch
        launched = launch >= 0
        in_call = np.zeros(gpu_rows.size, dtype=bool)
        in_call[launched] = inside_calls(calls, scan, scan.thread[launch[launched]], ts[launch[launched]])
        is_kernel = codes[gpu_rows] == C.KERNEL
        named = np.zeros(gpu_rows.size, dtype=np.int8) - 1
        named[is_kernel] = prop(_kind_code(comm_re.search), np.int8, gpu_rows[is_kernel])
        is_comm = (named >= 0) | in_call
        picks = (is_comm, is_kernel & ~is_comm, ~is_kernel & ~is_comm)  # comm, compute, memory: of the GPU rows
        comm_rows, compute_rows, memory_rows = (gpu_rows[m] for m in picks)
        lookalikes = comm_lookalikes(names, name_ids[compute_rows])
        own_kind = np.where(named >= 0, named, prop(lambda n: KIND_CODE[C.comm_kind(n)], np.int8, gpu_rows))[is_comm]
        clr = launch[is_comm]
        has = clr >= 0
        kind_codes = own_kind.copy()
        kind_codes[has] = _issuing_kind(scan, names, calls, scan.thread[clr[has]], ts[clr[has]], own_kind[has])
        operation = np.ones(comm_rows.size, dtype=bool)
        gpu_anchor = ts[gpu_rows]
        gpu_anchor[launched] = ts[launch[launched]]
        anchors = [gpu_anchor[m] for m in picks]
        launches = [launched[m] for m in picks]
    else:
        cpu_rows = np.flatnonzero(codes == C.CPU_OP)
        ann_rows = np.flatnonzero(codes == C.ANNOTATION)
        ann_kinds = prop(_kind_code(comm_ann.match), np.int8, ann_rows)
        comm_ann_rows = ann_rows[ann_kinds >= 0]
        ends_at_peer(scan, comm_ann_rows[ann_kinds[ann_kinds >= 0] == KIND_CODE["send_recv"]], ends)
        c10d_rows = calls[prop(C.is_comm_wrapper, bool, calls)]
        comm_rows = np.concatenate((comm_ann_rows, c10d_rows))
        own_kind = np.concatenate((ann_kinds[ann_kinds >= 0],
                                   prop(lambda n: KIND_CODE[C.comm_kind(n[6:])], np.int8, c10d_rows)))
        kind_codes = _issuing_kind(scan, names, calls, scan.thread[comm_rows], ts[comm_rows], own_kind)
        order = np.argsort(comm_rows, kind="stable")  # file order, as the records are
        comm_rows, kind_codes = comm_rows[order], kind_codes[order]
        operation, holders = _operations(scan, comm_rows, kind_codes, c10d_rows)
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
    sync_rows = np.flatnonzero(np.array([C.is_host_sync(n) for n in names], dtype=bool)[name_ids]
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
            need_ts = (_waited_for(scan, names, gpu_rows, scan_launch, rows, launch) if waited is None
                       else waited(rows))
        else:  # a span on a worker thread was issued by its c10d call (gloo's FIFO); one on the
            # calling thread opens inside its call, whose overhead before it is not a wait
            holder = holders[ops]
            issuer = np.where(holder >= 0, holder, rows)
            elsewhere = scan.thread[issuer] != scan.thread[rows]
            issue_ts = np.where(elsewhere, ts[issuer], ts[rows])
            if activity is None:
                activity = (scan.thread[compute_rows], ts[compute_rows], end(compute_rows))
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
