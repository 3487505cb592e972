"""One rank measured in bounded memory (``analyze``, when its traces need more than the memory
budget: ``--memory-budget``): the same numbers as
:mod:`~overlapprof.analysis.rank.events` and :mod:`~overlapprof.analysis.rank.metrics` give,
with the per-event data in a store (:class:`~overlapprof.analysis.engine.store.Store`, handed in:
in memory up to its budget, on disk past it, a bin at a time).

1. Each file is read (by several processes when it is large) into
   :class:`~overlapprof.analysis.rank.spilled.SpilledRows`: the steps in memory, the rest in the store.
2. The steps come from the rows kept in memory and, in CPU mode, so does the communication
   (classified by :func:`~overlapprof.analysis.rank.events.extract` on a scan of those rows).
3. GPU mode: each GPU event joined to its launch, a correlation bucket at a time, then each time
   bucket with every call that overlaps it, classified by ``extract`` as a whole file is. CPU
   mode: the CPU ops a window at a time against the calls. With the records asked for, the
   GPU events of each bucket also measure when the communication's results were needed
   (:class:`~overlapprof.analysis.rank.waits.NeedTimes`, from the CUDA sync events).
4. Each bucket's classified intervals go, filtered, to the rank's
   :class:`~overlapprof.analysis.rank.unions.UnionsBuilder`, which keeps their unions (whole rank,
   per step, per kind): the union of the buckets' unions is the union of every interval, so
   :mod:`~overlapprof.analysis.rank.metrics` measures them as it measures a rank read in memory,
   to the same floats.
5. For the cross-rank section and ``--comm-ops``, the communication records come from the same
   read (:mod:`overlapprof.analysis.rank.bucket_records`): the args the recorder kept as the file
   was read, the calls and annotations kept beside the steps, and each bucket's communication
   events as it is classified, with the need times of step 3.

Memory holds a chunk, one bucket or window, the unions' runs (on an operation-dense trace about a
run per operation and set) and what is per step (and in CPU mode per operation); nothing per
event. The records are per operation, as the cross-rank section is.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from overlapprof.analysis.columns import Index
from overlapprof.analysis.rank import classify as C
from overlapprof.analysis.rank import bucket_records
from overlapprof.analysis.rank.bucket_records import CommEvents
from overlapprof.analysis.rank.events import (EventSet, Steps, extract, filtered, last_step_dropped, merged_counts,
                                              place_in_steps)
from overlapprof.analysis.rank.issuing import NameTables, call_union, encloses_calls, inside_calls
from overlapprof.analysis.rank.scan import Scan
from overlapprof.analysis.rank import spilled
from overlapprof.analysis.rank.spilled import SpilledFile, calls_by_time, joined_by_time, read_spilled
from overlapprof.analysis.spill import Sample, take
from overlapprof.analysis.intervals import Intervals, event_ends, union
from overlapprof.analysis.interference import InterferenceBuilder
from overlapprof.analysis.rank.unions import COMM, COMPUTE, MEMORY, RankUnions, UnionsBuilder, hold, merged
from overlapprof.analysis.rank.remeasure import Remeasure
from overlapprof.analysis.rank.waits import NeedTimes, thread_reach
from overlapprof.analysis.records.fields import Values
from overlapprof.analysis.records.recorder import CommRecorder
from overlapprof.analysis.records.table import CommTable, StoredTable


@dataclass
class BoundedRank:
    """What :func:`measure` gives: the rank's unions and what ``analyze`` checks and words."""

    unions: RankUnions
    mode: str
    files: list[str]
    events: int
    negative_durations: int
    unclassified: dict
    headers: list
    bounds: tuple[float, float] | None  # the events' earliest start and latest end, before any filter (µs)
    host_sync: Intervals  # the union of the host synchronizations (classify.is_host_sync)
    warnings: list[str] = field(default_factory=list)
    table: CommTable | None = None  # the communication records (cross-rank section, --comm-ops)
    interference: tuple | None = None  # (Interference, slowed µs per step): InterferenceBuilder.result's
    lookalikes: dict[str, int] = field(default_factory=dict)  # compute kernels named like communication: counts
    calls: Intervals | None = None  # CPU mode: the union of the c10d::* calls (issuing.call_union)
    op_shapes: list | None = None  # per file, its host ops with their shapes (op_shapes.OpRows), when asked
    remeasure: Remeasure | None = None  # CPU mode, asked: what measures it again with its sends' ends


class _Feed:
    """Classified intervals into the rank's :class:`~overlapprof.analysis.rank.unions.UnionsBuilder`,
    the filters of ``analyze`` applied by :func:`~overlapprof.analysis.rank.events.filtered`."""

    def __init__(self, steps: Steps, require_launch: bool, cutoff: float | None, interference: InterferenceBuilder,
                 other_end: bool = False):
        self.require_launch, self.cutoff = require_launch, cutoff
        self.unions = UnionsBuilder(steps)
        # each step's end by its compute and memory events alone (other_end: see Remeasure)
        self.other_end = steps.end.astype(np.float64, copy=True) if other_end else None
        self.interference = interference
        self.bounds = [np.inf, -np.inf]  # before the filters
        self.lookalikes: list[dict[str, int]] = []  # per bucket: compute kernels named like communication

    def add(self, s: EventSet, cls: int) -> None:
        if len(s) == 0:
            return
        self.bounds = [min(self.bounds[0], float(s.start.min())), max(self.bounds[1], float(s.end.max()))]
        s = filtered(s, self.require_launch, self.cutoff)
        self.unions.add(s, cls)
        if self.other_end is not None and cls != COMM and len(s):
            seg = self.unions.steps.index_of(s.anchor)
            np.maximum.at(self.other_end, seg[seg >= 0], s.end[seg >= 0])
        if cls == COMPUTE:
            self.interference.add(s)


def _classify_gpu(f: SpilledFile, comm_re, comm_ann, tables: NameTables, feed: _Feed, edges: np.ndarray, store,
                  needs: NeedTimes | None = None, comm: CommEvents | None = None, each=None):
    """The GPU events of a time bucket with the calls around it, classified as a whole file is:
    a small scan of the calls, a runtime row per launch found, and the events (``tables``: of
    the rank's names). With the records asked for, ``needs`` measures the communication events'
    need times and ``comm`` keeps them. ``each(items, fn)``: how the buckets are classified
    (default :func:`map`; a parallel read's ``ahead``, the next one in a thread while this one
    feeds the unions); this thread reads the store and feeds, so the report is the same."""
    names = tables.names
    wait_id = names.index(C.STREAM_WAIT) if needs is not None and C.STREAM_WAIT in names else -1
    joined = joined_by_time(f, edges, store, needs, wait_id, each)
    calls = calls_by_time(f, edges, store)

    def buckets():
        for events, around in zip(joined, calls):
            ev, c = events.read(), around.read()
            events.remove()
            around.remove()
            if ev["ts"].size:
                yield ev, c

    def classified(bucket):
        ev, c = bucket
        n_ev, n_calls = ev["ts"].size, c.size
        found = np.flatnonzero(~np.isnan(ev["launch_ts"]))
        n_launch = found.size
        cols = {
            "ts": np.concatenate((c["ts"], ev["launch_ts"][found], ev["ts"])),
            "dur": np.concatenate((c["dur"], np.zeros(n_launch), ev["dur"])),
            "codes": np.concatenate((np.full(n_calls, C.CPU_OP, np.int8), np.full(n_launch, C.RUNTIME, np.int8),
                                     ev["codes"])),
            "name_ids": np.concatenate((c["name_ids"], np.zeros(n_launch, np.int32), ev["name_ids"])),
            "thread": np.concatenate((c["thread"], ev["launch_thread"][found], np.full(n_ev, -1, np.int32))),
            "collective": np.concatenate((c["collective"], np.full(n_launch + n_ev, -1, np.int8))),
        }
        launch = np.full(n_ev, -1, dtype=np.int64)
        launch[found] = n_calls + np.arange(n_launch)
        del c
        scan = Scan.of_columns(f.path, cols, launch)
        del cols
        sets, _, _, comm_rows, _, lookalikes = extract(scan, True, comm_re, comm_ann, names, None, tables=tables)
        return ev, found, sets, lookalikes, comm_rows - n_calls - n_launch

    # what outlives a bucket is made here, not in ``each``'s thread: glibc gives each thread its
    # own heap, whose pages an array kept from it would hold (30 MB more at 2 GB)
    for ev, found, sets, lookalikes, comm_at in each(buckets(), classified) if each else map(classified, buckets()):
        if needs is not None:
            needs.add_gpu(ev["thread"][found], ev["launch_ts"][found], event_ends(ev["ts"][found], ev["dur"][found]))
        feed.lookalikes.append(lookalikes)
        if comm is not None:  # its communication events' records wait here
            mine = take(ev, comm_at)
            comm.add(mine, sets[0].kind)
            needs.add_comm(mine["corr"], mine["ts"], mine["launch_thread"], mine["launch_ts"])
        del ev
        for cls, s in zip((COMM, COMPUTE, MEMORY), sets):
            feed.add(s.copy() if each is not None else s, cls)


def _classify_cpu_ops(f: SpilledFile, names: list[str], feed: _Feed, thread_base: int) -> tuple:
    """CPU mode: the CPU ops kept are compute unless inside a communication call (a window at a
    time; ``thread_base``: the file's offset of its thread codes, as in memory). Returns their host activity per thread (:func:`~overlapprof.analysis.rank.waits.thread_reach`),
    what the records' need times are measured on."""
    few = f.rows.few_scan(f.path)
    calls = np.flatnonzero((few.codes == C.CPU_OP)
                           & np.array([C.is_comm_call(n) for n in names], dtype=bool)[few.name_ids])
    c = {k: getattr(few, k)[calls] for k in ("ts", "dur", "thread")}
    reach = [(np.empty(0, dtype=np.int32), np.empty(0), np.empty(0))]
    for rec in f.rows.cpu.windows(spilled.BUCKET_ROWS):
        scan = Scan.of_columns(f.path, {"ts": np.concatenate((c["ts"], rec["ts"])),
                                        "dur": np.concatenate((c["dur"], rec["dur"])),
                                        "thread": np.concatenate((c["thread"], rec["thread"]))})
        rows = np.arange(calls.size, calls.size + rec.size)
        out = ~inside_calls(np.arange(calls.size), scan, scan.thread[rows], scan.ts[rows])
        start = rec["ts"][out]
        end = scan.end(rows[out])
        own = ~encloses_calls(np.arange(calls.size), scan, rec["thread"][out], start, end)  # as events.extract
        reach = hold(reach, thread_reach(rec["thread"][out][own], start[own], end[own]), thread_reach)
        n = start.size
        feed.add(EventSet(start, end, start, np.zeros(n, dtype=bool), np.zeros(n, dtype=np.int8),
                          np.ones(n, dtype=bool), rec["name_ids"][out], rec["thread"][out] + thread_base), COMPUTE)
    return merged(reach, thread_reach)


def measure(files: list[str], comm_re, comm_ann, options, label: str, store, parallel=None, ends=None,
            op_shapes: bool = False, remeasure: bool = False) -> BoundedRank:
    """Read, classify and measure one rank's files in bounded memory (see the module
    docstring); the report is :func:`~overlapprof.analysis.rank.metrics.rank_report`'s of the
    same files, float for float. ``options``: the analysis options (their two filters);
    ``store``: where the rows wait (an :class:`~overlapprof.analysis.engine.store.Store`: in
    memory up to its budget, on disk past it; the same report whatever its budget);
    ``parallel``: reads a large file in several processes (the result is the same with any
    number; see :func:`~overlapprof.analysis.rank.read.read_file`);
    ``ends``: CPU mode, the sends whose communication ends at their partner's receive
    (:func:`~overlapprof.analysis.rank.events.ends_at_peer`); ``op_shapes``: keep each file's
    host ops with their input shapes (:mod:`~overlapprof.analysis.rank.op_shapes`) from the same read;
    ``remeasure``: a CPU rank with send/recv, its records asked for, keeps what measures it again
    with its sends' ends (:class:`~overlapprof.analysis.rank.remeasure.Remeasure`)."""
    records = options.crossrank or options.comm_records
    values = Values() if records else None
    names = values.index if records else Index()
    read = [read_spilled(path, names, comm_ann, store, parallel,
                         CommRecorder(comm_re, values, options.comm_records, record_rows=False, store=store)
                         if records else None, op_shapes)
            for path in files]
    shaped = [f.rows.shapes.result() for f in read] if op_shapes else None
    gpu = any(f.rows.kernels for f in read)
    order = names.order
    name_tables = NameTables(order)  # every batch below is classified with the same names
    few_sets, step_parts = [], []
    for f in read:
        sets, steps, *_ = extract(f.rows.few_scan(f.path), gpu, comm_re, comm_ann, order, None, ends=ends,
                                  tables=name_tables)
        few_sets.append(sets[0])
        step_parts.append(steps)
    steps = Steps.of_files(step_parts)
    all_steps = steps  # the records' steps: before filters
    warnings = []
    steps, cutoff = last_step_dropped(steps, options.drop_last_step, label, warnings)
    sample = Sample()
    for f in read:
        sample.add(f.rows.sample.values)
    # the compute spans: in time buckets of the store when the rows did not fit in memory at once
    fits = store.spilled == 0 and all(len(f.rows.gpu) == 1 for f in read)
    keep = (remeasure and records and not gpu
            and any((s.kind == C.KIND_CODE["send_recv"]).any() for s in few_sets))
    interference = InterferenceBuilder(steps, not gpu, None if fits else store,
                                       InterferenceBuilder.bucket_edges(sample.values), keep=keep)
    feed = _Feed(steps, options.require_launch and gpu, cutoff, interference, other_end=keep)
    tables, kept = [], [] if keep else None
    few = [(f.path, f.rows.few.arrays()) for f in read] if keep else None
    for k, (f, comm) in enumerate(zip(read, few_sets)):
        if gpu:
            buckets = sample.quantiles(len(f.rows.gpu))
            waits, events = (NeedTimes(), CommEvents(store)) if records else (None, None)
            _classify_gpu(f, comm_re, comm_ann, name_tables, feed, buckets, store, waits, events,
                          parallel.ahead if parallel is not None else None)
            if records:
                past = store if store.spilled else None  # past its budget: the table into the store
                tables.append(bucket_records.gpu_table(f, events.result(), values, waits.result(), past))
        else:
            feed.add(comm, COMM)
            reach = _classify_cpu_ops(f, order, feed, k << 16)
            if records:
                tables.append(bucket_records.cpu_table(f, comm_re, comm_ann, order, values, reach, ends, kept))
        f.rows.remove()
    bounds = tuple(feed.bounds) if np.isfinite(feed.bounds[0]) else None
    unions = feed.unions.result()
    measured = interference.result(unions.comm, order)
    table = None
    if records:  # read back after the rows, the unions and the spans are let go of
        table = CommTable.concat([t.result() if isinstance(t, StoredTable) else t for t in tables])
        place_in_steps(table, all_steps)
    files = [f.path for f in read]
    host_sync = union(*(np.concatenate(times) for times in zip(*[f.rows.host_syncs(gpu) for f in read])))
    rank = BoundedRank(
        unions=unions, mode="gpu" if gpu else "cpu", files=files, events=sum(f.rows.size for f in read),
        negative_durations=sum(f.rows.negative for f in read),
        unclassified=merged_counts([f.unclassified for f in read]),
        headers=[f.header for f in read], bounds=bounds, host_sync=host_sync, warnings=warnings, table=table,
        interference=measured,
        lookalikes=merged_counts(feed.lookalikes),
        calls=call_union(EventSet.concat(few_sets), order) if not gpu and few_sets else None, op_shapes=shaped)
    if keep:
        rank.remeasure = Remeasure(replace(rank, op_shapes=None), few, kept, all_steps, cutoff, feed.other_end,
                                   interference.replayable(), comm_re, comm_ann, order, values)
    return rank
