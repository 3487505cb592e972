"""One rank measured in bounded memory (``analyze --bounded-memory``): the same numbers as
:mod:`~overlapprof.analysis.rank.events` and :mod:`~overlapprof.analysis.rank.metrics` give,
with the per-event data on disk.

1. Each file is read a chunk at a time (:func:`~overlapprof.analysis.rank.scan.read_serially`)
   into :class:`SpilledRows`: in memory only the few rows every event's class may depend on
   (communication calls, ``ProfilerStep#N`` spans, CPU-mode communication annotations); on disk
   the GPU activity and runtime calls, in buckets of correlation ids, and the CPU ops that may be
   compute.
2. The few rows give the steps and, in CPU mode, the communication (classified as in memory,
   by :func:`~overlapprof.analysis.rank.events._extract` on a scan of those rows alone).
3. Each bucket holds every GPU event with its launching runtime call (same correlation), so one
   bucket and the calls classify its events exactly as the whole file does. CPU ops are
   classified a window at a time against the calls.
4. Each classified interval goes to a :class:`~overlapprof.analysis.sweep.Sweep` under its
   step and the whole rank; the sweep gives every metric as a time per coverage pattern.

Memory holds a chunk, one bucket or window, one slab of the sweep, and what is per operation
or per step (the few rows, the sweep's totals); nothing per event. The cross-rank section, the
per-operation records (``--comm-ops``), ``--like-hta`` and ``export``'s lanes need every
operation or event in memory: they are not computed here (``analyze`` says so).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field

import numpy as np

from overlapprof.analysis.columns import GrowingColumns, Index
from overlapprof.analysis.forks import make_folder
from overlapprof.analysis.rank import classify as C
from overlapprof.analysis.rank.events import EventSet, Steps, _extract, _inside, _step_number
from overlapprof.analysis.rank.metrics import TIMELINE_CAP, _metrics, _pairs, assemble, timeline_step
from overlapprof.analysis.rank.scan import _IS_CORRELATED, _IS_GPU, SCAN_COLUMNS, _launches, _Scan, read_serially, rows_hint
from overlapprof.analysis.spill import Buckets, Sample, SpillError, SpillFile
from overlapprof.analysis.sweep import Sweep
from overlapprof.errors import InputError, TraceError
from overlapprof.report import KindMetrics, Metrics, Partition, RankReport, StepMetrics, Timeline
from overlapprof.trace.ranges import is_gzip

# GPU events and runtime calls classified at once (a bucket), and CPU ops (a window); and the
# boundaries swept at once (a slab). Each row costs about 200 bytes while it is worked on.
BUCKET_ROWS = 1 << 19
SLAB_ROWS = 1 << 20
MAX_BUCKETS = 512  # open files: past ~50 GB of JSON the buckets grow instead

# Sweep classes (bits of a pattern): the three classes, a step's window, then one per comm kind.
COMM, COMPUTE, MEMORY, WINDOW, KIND0 = 0, 1, 2, 3, 4
_BIT = {c: 1 << c for c in (COMM, COMPUTE, MEMORY, WINDOW)}

_GPU_ROW = np.dtype([("corr", "<f8"), ("ts", "<f8"), ("dur", "<f8"), ("codes", "i1"), ("name_ids", "<i4"),
                     ("thread", "<i4")])
_CPU_ROW = np.dtype([("ts", "<f8"), ("dur", "<f8"), ("thread", "<i4")])
_CALL_ROW = np.dtype([("ts", "<f8"), ("dur", "<f8"), ("thread", "<i4"), ("name_ids", "<i4"), ("collective", "i1")])
_JOINED_ROW = np.dtype([("ts", "<f8"), ("dur", "<f8"), ("codes", "i1"), ("name_ids", "<i4"), ("launch_ts", "<f8"),
                        ("launch_thread", "<i4")])
# Roles of a name, for the few rows and the CPU ops kept (bits).
_CALL, _STEP, _COMM_ANN, _CPU_COMPUTE = 1, 2, 4, 8


def _role(name: str, comm_ann) -> int:
    return ((_CALL if C.is_comm_call(name) else 0) | (_STEP if _step_number(name) >= 0 else 0)
            | (_COMM_ANN if comm_ann.match(name) else 0) | (_CPU_COMPUTE if C.is_cpu_compute(name) else 0))


class SpilledRows:
    """A file's complete events as :func:`~overlapprof.analysis.rank.scan._read_chunks` gives
    them (its ``sink``), kept as the module docstring says: ``few`` (the scan's columns, in row
    order), ``gpu`` (GPU events and runtime calls, bucket ``corr mod len(gpu)``, row order within
    a bucket; no correlation: bucket 0) and ``cpu`` (CPU ops that may be compute)."""

    def __init__(self, folder: str, buckets: int, names: Index, comm_ann):
        self.folder, self.names, self.comm_ann = folder, names, comm_ann
        self.size = self.negative = 0
        self.kernels = False
        self.roles = np.zeros(0, dtype=np.int8)
        self.few = GrowingColumns(SCAN_COLUMNS, 1 << 12)
        self.gpu = Buckets(folder, "gpu", _GPU_ROW, buckets)
        self.cpu = SpillFile(os.path.join(folder, "cpu"), _CPU_ROW)
        self.calls = SpillFile(os.path.join(folder, "calls"), _CALL_ROW)
        self.sample = Sample()  # of the times kept on disk: where the sweep's slabs are cut

    def append(self, columns: dict, corr: np.ndarray) -> None:
        codes, name_ids = columns["codes"], columns["name_ids"]
        if len(self.names.order) > self.roles.size:
            new = [_role(n, self.comm_ann) for n in self.names.order[self.roles.size :]]
            self.roles = np.concatenate((self.roles, np.array(new, dtype=np.int8)))
        role = self.roles[name_ids]
        is_cpu, is_ann = codes == C.CPU_OP, codes == C.ANNOTATION
        self.kernels = self.kernels or bool((codes == C.KERNEL).any())
        is_call = is_cpu & ((role & _CALL) != 0)
        if is_call.any():
            rec = np.empty(int(np.count_nonzero(is_call)), dtype=_CALL_ROW)
            for k in _CALL_ROW.names:
                rec[k] = columns[k][is_call]
            self.calls.append(rec)
        # GPU mode (a kernel seen) reads the calls from disk and no annotation but the steps;
        # CPU mode needs its calls and communication annotations here
        few = (is_cpu | is_ann) & ((role & _STEP) != 0)
        if not self.kernels:
            few |= is_call | (is_ann & ((role & _COMM_ANN) != 0))
        if few.any():
            self.few.append(**{k: v[few] for k, v in columns.items()})
        linked = _IS_CORRELATED[codes]
        if corr.size:
            rec = np.empty(corr.size, dtype=_GPU_ROW)
            rec["corr"] = corr
            for k in ("ts", "dur", "codes", "name_ids", "thread"):
                rec[k] = columns[k][linked]
            bucket = np.where(np.isfinite(corr), np.remainder(np.floor(np.nan_to_num(corr)), len(self.gpu)), 0)
            self.gpu.route(bucket.astype(np.int64), rec)
            self.sample.add(rec["ts"])
        compute = is_cpu & ((role & _CPU_COMPUTE) != 0)
        if compute.any():
            rec = np.empty(int(np.count_nonzero(compute)), dtype=_CPU_ROW)
            for k in ("ts", "dur", "thread"):
                rec[k] = columns[k][compute]
            self.cpu.append(rec)
            self.sample.add(rec["ts"])
        self.negative += int(np.count_nonzero(columns["dur"] < 0))
        self.size += codes.size

    def result(self):
        return self if self.size else None

    def few_scan(self, path: str, extra: dict | None = None) -> _Scan:
        """A scan of the few rows (and ``extra``: more columns of rows after them)."""
        cols = self.few.arrays()
        if extra is not None:
            cols = {k: np.concatenate((cols[k], extra[k])) for k in SCAN_COLUMNS}
        return _Scan(path, **{k: cols[k] for k in SCAN_COLUMNS}, launch=np.empty(0, dtype=np.int64), negative=0,
                     events=0, header=None)

    def remove(self) -> None:
        self.gpu.remove()
        self.cpu.remove()
        self.calls.remove()


@dataclass
class _File:
    path: str
    rows: SpilledRows
    header: object
    unclassified: dict


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


def _buckets(path) -> int:
    try:
        text = os.path.getsize(path) * (10 if is_gzip(path) else 1)
    except OSError:
        text = 0
    return int(min(MAX_BUCKETS, max(1, -(-rows_hint(text) // BUCKET_ROWS))))


def _read(path: str, names: Index, comm_ann, folder: str, workers: int) -> _File:
    """A file read into :class:`SpilledRows`: by ``workers`` processes when it is large
    (:func:`~overlapprof.analysis.rank.parallel_scan.read`), else by this one."""
    made: list[SpilledRows] = []

    def sink():
        for old in made:  # read again (not the line layout): what was kept goes
            old.remove()
        sub = os.path.join(folder, str(len(made)))
        try:
            os.mkdir(sub)
        except OSError as exc:
            raise SpillError(sub, exc) from None
        made.append(SpilledRows(sub, _buckets(path), names, comm_ann))
        return made[-1]

    got = None
    if workers > 1:
        from overlapprof.analysis.rank import parallel_scan

        got = parallel_scan.read(path, names, None, workers, sink=sink)
    if got is not None:
        rows, unclassified, header, _ = got
    else:
        rows, unclassified, header, _, _ = read_serially(path, names, None, sink)
    if rows is None:
        raise TraceError(path, "no complete ('X') events: nothing to measure")
    return _File(str(path), rows, header, unclassified)


class _Feed:
    """Classified intervals into the sweep, with the counts the report needs (the filters of
    ``analyze`` applied as :func:`~overlapprof.analysis.analyzer._apply_filters` does)."""

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

    def add(self, s: EventSet, cls: int) -> None:
        if len(s) == 0:
            return
        self.bounds = [min(self.bounds[0], float(s.start.min())), max(self.bounds[1], float(s.end.max()))]
        if self.require_launch:
            s = s.select(s.launched)
        if self.cutoff is not None:
            s = s.select(s.anchor < self.cutoff)
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


def _joined(f: _File, edges: np.ndarray, folder: str) -> Buckets:
    """The file's GPU events with their launch (time and thread, NaN and -1: none), in buckets of
    the time that places them among the calls (the launch's, else their own start): each
    correlation bucket holds every event with its runtime call, so the join is exact."""
    out = Buckets(folder, "joined", _JOINED_ROW, edges.size + 1)
    for bucket in f.rows.gpu:
        rec = bucket.read()
        bucket.remove()
        launch = _launches(rec["codes"], rec["corr"])  # rows of rec, for its GPU rows
        gpu = rec[_IS_GPU[rec["codes"]]]
        joined = np.empty(gpu.size, dtype=_JOINED_ROW)
        for k in ("ts", "dur", "codes", "name_ids"):
            joined[k] = gpu[k]
        found = launch >= 0
        joined["launch_ts"] = np.where(found, rec["ts"][np.maximum(launch, 0)], np.nan)
        joined["launch_thread"] = np.where(found, rec["thread"][np.maximum(launch, 0)], -1)
        del rec, gpu
        out.route(np.searchsorted(edges, np.where(found, joined["launch_ts"], joined["ts"]), "right"), joined)
    return out


def _calls_by_time(f: _File, edges: np.ndarray, folder: str) -> Buckets:
    """The file's communication calls, each in every time bucket it overlaps (in file order)."""
    out = Buckets(folder, "calls", _CALL_ROW, edges.size + 1)
    for rec in f.rows.calls.windows(BUCKET_ROWS):
        first = np.searchsorted(edges, rec["ts"], "right")
        last = np.searchsorted(edges, rec["ts"] + np.maximum(rec["dur"], 0), "right")
        for k in range(int((last - first).max()) + 1):  # a call longer than a bucket: in each
            at = np.flatnonzero(last - first >= k)
            out.route(first[at] + k, rec[at])
    f.rows.calls.remove()
    return out


def _classify_gpu(f: _File, comm_re, comm_ann, names: list[str], feed: _Feed, edges: np.ndarray, folder: str):
    """The GPU events of a time bucket with the calls around it, classified as a whole file is:
    a small scan of the calls, a runtime row per launch found, and the events."""
    joined, calls = _joined(f, edges, folder), _calls_by_time(f, edges, folder)
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
        del ev, c
        scan = _Scan(f.path, **cols, launch=launch, negative=0, events=0, header=None)
        del cols
        sets, _, _ = _extract(scan, True, comm_re, comm_ann, names, None)
        for cls, s in zip((COMM, COMPUTE, MEMORY), sets):
            feed.add(s, cls)


def _classify_cpu_ops(f: _File, names: list[str], feed: _Feed) -> None:
    """CPU mode: the CPU ops kept are compute unless inside a communication call (a window at a time)."""
    few = f.rows.few_scan(f.path)
    calls = np.flatnonzero((few.codes == C.CPU_OP)
                           & np.array([C.is_comm_call(n) for n in names], dtype=bool)[few.name_ids])
    c = {k: getattr(few, k)[calls] for k in ("ts", "dur", "thread")}
    for rec in f.rows.cpu.windows(BUCKET_ROWS):
        scan = _Scan(f.path, ts=np.concatenate((c["ts"], rec["ts"])), dur=np.concatenate((c["dur"], rec["dur"])),
                     codes=None, launch=None, name_ids=None, thread=np.concatenate((c["thread"], rec["thread"])),
                     collective=None, negative=0, events=0, header=None)
        rows = np.arange(calls.size, calls.size + rec.size)
        out = ~_inside(np.arange(calls.size), scan, scan.thread[rows], scan.ts[rows])
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
        folder = make_folder()
        for k in range(len(files)):
            os.mkdir(os.path.join(folder, f"file{k}"))
        os.mkdir(os.path.join(folder, "sweep"))
        return _measure(files, comm_re, comm_ann, options, label, folder, workers)
    except (SpillError, OSError) as exc:
        if isinstance(exc, OSError) and folder is not None:
            raise  # not the spill's: the trace's read words its own errors
        error = exc.error if isinstance(exc, SpillError) else exc
        where = folder or os.environ.get("TMPDIR") or "/tmp"
        raise InputError(f"--bounded-memory: cannot keep the events of {label} in {where} "
                         f"({error.strerror or error}); set TMPDIR to a folder with room") from None
    finally:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


def _measure(files, comm_re, comm_ann, options, label, folder, workers) -> BoundedRank:
    names = Index()
    read = []
    for k, path in enumerate(files):
        read.append(_read(path, names, comm_ann, os.path.join(folder, f"file{k}"), workers))
    gpu = any(f.rows.kernels for f in read)
    order = names.order
    few_sets, step_parts = [], []
    for f in read:
        sets, steps, _ = _extract(f.rows.few_scan(f.path), gpu, comm_re, comm_ann, order, None)
        few_sets.append(sets[0])
        step_parts.append(steps)
    numbers, starts, ends = (np.concatenate([p[k] for p in step_parts]) for k in range(3))
    by_start = np.argsort(starts, kind="stable")
    steps = Steps(numbers[by_start], starts[by_start], ends[by_start])
    warnings, cutoff = [], None
    if options.drop_last_step:
        if steps.start.size < 2:
            warnings.append(f"{label}: fewer than 2 ProfilerSteps, --drop-last-step changes nothing")
        else:
            cutoff = steps.start[-1]
            steps = Steps(steps.number[:-1], steps.start[:-1], steps.end[:-1])
    feed = _Feed(steps, options.require_launch and gpu, cutoff)
    on_disk = sum(f.rows.cpu.rows + sum(b.rows for b in f.rows.gpu) for f in read)
    sample = Sample()
    for f in read:
        sample.add(f.rows.sample.values)
    edges = sample.quantiles(max(1, -(-4 * on_disk // SLAB_ROWS)))
    feed.sweep = Sweep(os.path.join(folder, "sweep"), edges, steps.start.size + 1, KIND0 + len(C.KINDS))
    for k, (f, comm) in enumerate(zip(read, few_sets)):
        if gpu:
            buckets = sample.quantiles(len(f.rows.gpu))
            _classify_gpu(f, comm_re, comm_ann, order, feed, buckets, os.path.join(folder, f"file{k}"))
        else:
            feed.add(comm, COMM)
            _classify_cpu_ops(f, order, feed)
        f.rows.remove()
    n = steps.start.size
    feed.sweep.add(steps.start.astype(np.float64), feed.last_end, np.arange(n, dtype=np.int32), WINDOW)
    shown = timeline_step(steps.number.tolist())
    seg = shown if shown is not None else feed.rank_seg
    runs = feed.sweep.run({"comm": (seg, _has(_C)), "compute": (seg, _has(_K)), "both": (seg, _has(_C, _K))},
                          cap=TIMELINE_CAP)
    bounds = tuple(feed.bounds) if np.isfinite(feed.bounds[0]) else None
    return BoundedRank(
        report=_report(feed, steps, [f.path for f in read], "gpu" if gpu else "cpu", sum(f.rows.size for f in read),
                       shown, runs),
        mode="gpu" if gpu else "cpu", events=sum(f.rows.size for f in read),
        negative_durations=sum(f.rows.negative for f in read), unclassified=_merged([f.unclassified for f in read]),
        headers=[f.header for f in read], bounds=bounds, warnings=warnings)


def _merged(counts: list[dict]) -> dict:
    out: dict = {}
    for c in counts:
        for k, v in c.items():
            out[k] = out.get(k, 0) + v
    return out


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
        m = _metrics(comm[k], compute[k], both[k], memory[k], StepMetrics, step=number, start_us=start,
                     step_us=step_us, exposed_share=None,
                     partition=Partition(compute_us=in_window[k], exposed_comm_us=exposed[k],
                                         exposed_memory_us=exposed_memory[k], idle_us=idle[k], step_us=end - start))
        m.exposed_share = m.exposed_comm_us / step_us if step_us > 0 else None
        out_steps.append(m)
    kinds = []
    for code in np.flatnonzero(feed.kinds).tolist():
        bit = 1 << (KIND0 + code)
        kinds.append(_metrics(float(sweep.totals(_has(bit))[rank]), compute[rank], float(sweep.totals(_has(bit, _K))[rank]), 0.0,
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
        lists = [_pairs(runs[name], origin) for name in ("comm", "compute", "both")]
        timeline = Timeline(step=number, start_us=origin, span_us=span, comm=lists[0][0], compute=lists[1][0],
                            overlapped=lists[2][0], truncated=any(cut for _, cut in lists))
    return assemble(files, mode, _metrics(comm[rank], compute[rank], both[rank], memory[rank], Metrics), out_steps,
                    kinds, events, feed.counts, timeline)
