"""One rank measured in bounded memory (``analyze --bounded-memory``): the same numbers as
:mod:`~overlapprof.analysis.rank.events` and :mod:`~overlapprof.analysis.rank.metrics` give,
with the per-event data on disk.

1. Each file is read (by several processes when it is large) into
   :class:`~overlapprof.analysis.rank.spilled.SpilledRows`: the steps in memory, the rest on disk.
2. The steps come from the rows kept in memory and, in CPU mode, so does the communication
   (classified by :func:`~overlapprof.analysis.rank.events.extract` on a scan of those rows).
3. GPU mode: each GPU event joined to its launch, a correlation bucket at a time, then each time
   bucket with every call that overlaps it, classified by ``extract`` as a whole file is. CPU
   mode: the CPU ops a window at a time against the calls.
4. Each classified interval goes to a :class:`~overlapprof.analysis.sweep.Sweep` under its step
   and under the whole rank; the sweep gives every metric as a time per coverage pattern.
5. For the cross-rank section and ``--comm-ops``, the files are read again for the rows the
   communication records need (:mod:`overlapprof.analysis.rank.bounded_records`).

Memory holds a chunk, one bucket or window, one slab of the sweep and what is per step (and in
CPU mode per operation); nothing per event. The records are per operation, as the cross-rank
section is. ``--like-hta`` and ``export``'s lanes need every event or every step's unions:
``analyze`` refuses them here.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field

import numpy as np

from overlapprof.analysis.columns import Index
from overlapprof.analysis.rank import classify as C
from overlapprof.analysis.rank.events import (EventSet, Steps, extract, inside_calls, filtered, last_step_dropped,
                                              merged_counts)
from overlapprof.analysis.rank.metrics import TIMELINE_CAP, make_metrics, timeline_pairs, assemble, timeline_step
from overlapprof.analysis.rank.scan import Scan
from overlapprof.analysis.rank import spilled
from overlapprof.analysis.rank.spilled import SpilledFile, calls_by_time, joined_by_time, read_spilled
from overlapprof.analysis.spill import Sample, SpillFailed, new_folder
from overlapprof.analysis.intervals import Intervals
from overlapprof.analysis.records.table import CommTable
from overlapprof.analysis.sweep import Sweep
from overlapprof.errors import SpillError
from overlapprof.report import KindMetrics, Metrics, Partition, RankReport, StepMetrics, Timeline

SLAB_ROWS = 1 << 20  # boundaries swept at once (a slab)

# Sweep classes (bits of a pattern): the three classes, a step's window, then one per comm kind.
COMM, COMPUTE, MEMORY, WINDOW, KIND0 = 0, 1, 2, 3, 4
_BIT = {c: 1 << c for c in (COMM, COMPUTE, MEMORY, WINDOW)}


@dataclass
class BoundedRank:
    """What :func:`measure` gives: the report and what ``analyze`` checks and words."""

    report: RankReport
    mode: str
    events: int
    negative_durations: int
    unclassified: dict
    headers: list
    bounds: tuple[float, float] | None  # the events' earliest start and latest end, before any filter (µs)
    warnings: list[str] = field(default_factory=list)
    table: CommTable | None = None  # the communication records (cross-rank section, --comm-ops)
    comm: Intervals | None = None  # U(comm) (cross-rank section)
    exposed: Intervals | None = None  # U(comm) − U(compute) (cross-rank section)


class _Feed:
    """Classified intervals into the sweep, with the counts the report needs (the filters of
    ``analyze`` applied by :func:`~overlapprof.analysis.rank.events.filtered`)."""

    def __init__(self, steps: Steps, require_launch: bool, cutoff: float | None):
        self.steps, self.require_launch, self.cutoff = steps, require_launch, cutoff
        n = steps.start.size
        self.last_end = steps.end.astype(np.float64, copy=True)
        self.counts = [0, 0, 0]
        self.kinds = np.zeros(len(C.KINDS), dtype=np.int64)  # comm events of each kind
        self.operations = np.zeros(len(C.KINDS), dtype=np.int64)
        self.bounds = [np.inf, -np.inf]  # before the filters
        self.spans = [[np.inf, -np.inf] for _ in range(3)]  # per class, after them
        self.rank_seg = n
        self.sweep: Sweep | None = None  # set once the files are read (its slabs are cut at their times)
        self.comm_corr: list[np.ndarray] | None = None  # GPU mode, records asked for: the comm events' correlations

    def add(self, s: EventSet, cls: int) -> None:
        if len(s) == 0:
            return
        self.bounds = [min(self.bounds[0], float(s.start.min())), max(self.bounds[1], float(s.end.max()))]
        s = filtered(s, self.require_launch, self.cutoff)
        if len(s) == 0:
            return
        self.counts[cls] += len(s)
        span = self.spans[cls]
        span[0], span[1] = min(span[0], float(s.start.min())), max(span[1], float(s.end.max()))
        seg = self.steps.index_of(s.anchor)
        inside = seg >= 0
        np.maximum.at(self.last_end, seg[inside], s.end[inside])
        self.sweep.add(s.start, s.end, self.rank_seg, cls)
        self.sweep.add(s.start[inside], s.end[inside], seg[inside], cls)
        if cls == COMM:
            self.kinds += np.bincount(s.kind, minlength=len(C.KINDS))
            self.operations += np.bincount(s.kind[s.operation], minlength=len(C.KINDS))
            for code in np.flatnonzero(np.bincount(s.kind)).tolist():
                mine = s.kind == code
                self.sweep.add(s.start[mine], s.end[mine], self.rank_seg, KIND0 + code)


def _classify_gpu(f: SpilledFile, comm_re, comm_ann, names: list[str], feed: _Feed, edges: np.ndarray, folder: str):
    """The GPU events of a time bucket with the calls around it, classified as a whole file is:
    a small scan of the calls, a runtime row per launch found, and the events."""
    joined, calls = joined_by_time(f, edges, folder), calls_by_time(f, edges, folder)
    for events, around in zip(joined, calls):
        ev, c = events.read(), around.read()
        events.remove()
        around.remove()
        if ev.size == 0:
            continue
        found = np.flatnonzero(~np.isnan(ev["launch_ts"]))
        n_calls, n_launch = c.size, found.size
        cols = {
            "ts": np.concatenate((c["ts"], ev["launch_ts"][found], ev["ts"])),
            "dur": np.concatenate((c["dur"], np.zeros(n_launch), ev["dur"])),
            "codes": np.concatenate((np.full(n_calls, C.CPU_OP, np.int8), np.full(n_launch, C.RUNTIME, np.int8),
                                     ev["codes"])),
            "name_ids": np.concatenate((c["name_ids"], np.zeros(n_launch, np.int32), ev["name_ids"])),
            "thread": np.concatenate((c["thread"], ev["launch_thread"][found], np.full(ev.size, -1, np.int32))),
            "collective": np.concatenate((c["collective"], np.full(n_launch + ev.size, -1, np.int8))),
        }
        launch = np.full(ev.size, -1, dtype=np.int64)
        launch[found] = n_calls + np.arange(n_launch)
        corr = ev["corr"]
        del ev, c
        scan = Scan.of_columns(f.path, cols, launch)
        del cols
        sets, _, _, comm_rows, _ = extract(scan, True, comm_re, comm_ann, names, None)
        if feed.comm_corr is not None:  # what the communication records are read again for
            feed.comm_corr.append(np.unique(corr[comm_rows - n_calls - n_launch]))
        for cls, s in zip((COMM, COMPUTE, MEMORY), sets):
            feed.add(s, cls)


def _classify_cpu_ops(f: SpilledFile, names: list[str], feed: _Feed) -> None:
    """CPU mode: the CPU ops kept are compute unless inside a communication call (a window at a time)."""
    few = f.rows.few_scan(f.path)
    calls = np.flatnonzero((few.codes == C.CPU_OP)
                           & np.array([C.is_comm_call(n) for n in names], dtype=bool)[few.name_ids])
    c = {k: getattr(few, k)[calls] for k in ("ts", "dur", "thread")}
    for rec in f.rows.cpu.windows(spilled.BUCKET_ROWS):
        scan = Scan.of_columns(f.path, {"ts": np.concatenate((c["ts"], rec["ts"])),
                                        "dur": np.concatenate((c["dur"], rec["dur"])),
                                        "thread": np.concatenate((c["thread"], rec["thread"]))})
        rows = np.arange(calls.size, calls.size + rec.size)
        out = ~inside_calls(np.arange(calls.size), scan, scan.thread[rows], scan.ts[rows])
        start = rec["ts"][out]
        end = scan.end(rows[out])
        n = start.size
        feed.add(EventSet(start, end, start, np.zeros(n, dtype=bool), np.zeros(n, dtype=np.int8),
                          np.ones(n, dtype=bool)), COMPUTE)


def _has(*bits: int, without: int = 0):
    """A pattern test: every bit of ``bits`` set, none of ``without``."""
    want = sum(bits)
    return lambda p: ((p & want) == want) & ((p & without) == 0)


_C, _K, _M, _W = (_BIT[c] for c in (COMM, COMPUTE, MEMORY, WINDOW))


def measure(files: list[str], comm_re, comm_ann, options, label: str, workers: int = 1) -> BoundedRank:
    """Read, classify and measure one rank's files in bounded memory (see the module
    docstring); the report is :func:`~overlapprof.analysis.rank.metrics.rank_report`'s of the
    same files, to float rounding. ``options``: the analysis options (their two filters);
    ``workers``: processes that read a large file (the result is the same with any number)."""
    folder = None
    try:
        folder = new_folder()
        for k in range(len(files)):
            os.mkdir(os.path.join(folder, f"file{k}"))
        os.mkdir(os.path.join(folder, "sweep"))
        return _measure(files, comm_re, comm_ann, options, label, folder, workers)
    except (SpillFailed, OSError) as exc:
        if isinstance(exc, OSError) and folder is not None:
            raise  # not the spill's: the trace's read words its own errors
        error = exc.error if isinstance(exc, SpillFailed) else exc
        base = os.environ.get("TMPDIR") or "/tmp"
        raise SpillError(f"--bounded-memory: cannot keep the events of {label} in {base} "
                         f"({error.strerror or error}); set TMPDIR to a folder with room") from None
    finally:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


def _measure(files, comm_re, comm_ann, options, label, folder, workers) -> BoundedRank:
    names = Index()
    read = []
    for k, path in enumerate(files):
        read.append(read_spilled(path, names, comm_ann, os.path.join(folder, f"file{k}"), workers))
    gpu = any(f.rows.kernels for f in read)
    order = names.order
    few_sets, step_parts = [], []
    for f in read:
        sets, steps, _, _, _ = extract(f.rows.few_scan(f.path), gpu, comm_re, comm_ann, order, None)
        few_sets.append(sets[0])
        step_parts.append(steps)
    steps = Steps.of_files(step_parts)
    all_steps, records = steps, options.crossrank or options.comm_records  # the records' steps: before filters
    warnings = []
    steps, cutoff = last_step_dropped(steps, options.drop_last_step, label, warnings)
    feed = _Feed(steps, options.require_launch and gpu, cutoff)
    on_disk = sum(f.rows.cpu.rows + sum(b.rows for b in f.rows.gpu) for f in read)
    sample = Sample()
    for f in read:
        sample.add(f.rows.sample.values)
    edges = sample.quantiles(max(1, -(-4 * on_disk // SLAB_ROWS)))
    feed.sweep = Sweep(os.path.join(folder, "sweep"), edges, steps.start.size + 1, KIND0 + len(C.KINDS))
    comm_corr = [] if records and gpu else None
    for k, (f, comm) in enumerate(zip(read, few_sets)):
        if gpu:
            feed.comm_corr = [] if records else None
            buckets = sample.quantiles(len(f.rows.gpu))
            _classify_gpu(f, comm_re, comm_ann, order, feed, buckets, os.path.join(folder, f"file{k}"))
            if records:
                comm_corr.append(np.concatenate([np.empty(0), *feed.comm_corr]))
        else:
            feed.add(comm, COMM)
            _classify_cpu_ops(f, order, feed)
        f.rows.remove()
    n = steps.start.size
    feed.sweep.add(steps.start.astype(np.float64), feed.last_end, np.arange(n, dtype=np.int32), WINDOW)
    shown = timeline_step(steps.number.tolist())
    seg = shown if shown is not None else feed.rank_seg
    follow = {"comm": (seg, _has(_C), TIMELINE_CAP), "compute": (seg, _has(_K), TIMELINE_CAP),
              "both": (seg, _has(_C, _K), TIMELINE_CAP)}
    if options.crossrank:  # U(comm) − U(compute): what the cross-rank section attributes to operations
        follow["exposed"] = (feed.rank_seg, _has(_C, without=_K), None)
        follow["all comm"] = (feed.rank_seg, _has(_C), None)
    runs = feed.sweep.run(follow)
    bounds = tuple(feed.bounds) if np.isfinite(feed.bounds[0]) else None
    table = None
    if records:
        from overlapprof.analysis.rank.bounded_records import comm_table

        table = comm_table([f.path for f in read], gpu, comm_re, comm_ann, options.comm_records, comm_corr, all_steps,
                           workers)
    mode, events = "gpu" if gpu else "cpu", sum(f.rows.size for f in read)
    return BoundedRank(
        table=table, comm=runs.get("all comm"), exposed=runs.get("exposed"),
        report=_report(feed, steps, [f.path for f in read], mode, events, shown, runs), mode=mode, events=events,
        negative_durations=sum(f.rows.negative for f in read), unclassified=merged_counts([f.unclassified for f in read]),
        headers=[f.header for f in read], bounds=bounds, warnings=warnings)


def _report(feed: _Feed, steps: Steps, files, mode, events, shown, runs) -> RankReport:
    sweep, rank = feed.sweep, feed.rank_seg
    comm, compute, memory, both = (sweep.totals(_has(*b)).tolist() for b in ((_C,), (_K,), (_M,), (_C, _K)))
    in_window = sweep.totals(_has(_K, _W)).tolist()
    exposed = sweep.totals(_has(_C, _W, without=_K)).tolist()
    exposed_memory = sweep.totals(_has(_M, _W, without=_K | _C)).tolist()
    idle = sweep.totals(_has(_W, without=_K | _C | _M)).tolist()
    out_steps = []
    for k, (number, start, end) in enumerate(zip(steps.number.tolist(), steps.start.astype(np.float64).tolist(),
                                                 feed.last_end.tolist())):
        step_us = float(end - start)
        m = make_metrics(comm[k], compute[k], both[k], memory[k], StepMetrics, step=number, start_us=start,
                     step_us=step_us, exposed_share=None,
                     partition=Partition(compute_us=in_window[k], exposed_comm_us=exposed[k],
                                         exposed_memory_us=exposed_memory[k], idle_us=idle[k], step_us=end - start))
        m.exposed_share = m.exposed_comm_us / step_us if step_us > 0 else None
        out_steps.append(m)
    kinds = []
    for code in np.flatnonzero(feed.kinds).tolist():
        bit = 1 << (KIND0 + code)
        kinds.append(make_metrics(float(sweep.totals(_has(bit))[rank]), compute[rank], float(sweep.totals(_has(bit, _K))[rank]), 0.0,
                              KindMetrics, kind=C.KINDS[code], count=int(feed.operations[code])))
    if shown is not None:
        origin, span, number = out_steps[shown].start_us, out_steps[shown].step_us, out_steps[shown].step
    elif feed.counts[COMM] or feed.counts[COMPUTE]:
        spans = [feed.spans[c] for c in (COMM, COMPUTE) if feed.counts[c]]
        origin = min(s[0] for s in spans)
        span, number = max(s[1] for s in spans) - origin, None
    else:
        origin = None
    timeline = None
    if origin is not None:
        lists = [timeline_pairs(runs[name], origin) for name in ("comm", "compute", "both")]
        timeline = Timeline(step=number, start_us=origin, span_us=span, comm=lists[0][0], compute=lists[1][0],
                            overlapped=lists[2][0], truncated=any(cut for _, cut in lists))
    return assemble(files, mode, make_metrics(comm[rank], compute[rank], both[rank], memory[rank], Metrics), out_steps,
                    kinds, events, feed.counts, timeline)
