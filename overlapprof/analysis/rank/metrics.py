"""The metrics of OVERLAP.md sections 2 and 3 for one rank, from the unions of its classified
intervals (:class:`~overlapprof.analysis.rank.unions.RankUnions`): each metric is defined here, once.

Per rank: the formulas over every event (the whole trace, unless a filter option is on). Per
step: the same formulas over the events that belong to the step (by launch, else by start), plus
``step_us`` and ``exposed_share``. Per kind: each kind's own comm intervals against the rank's
whole compute union. All the interval work is in :mod:`overlapprof.analysis.intervals`.
"""

from __future__ import annotations

import numpy as np

from overlapprof.analysis import intervals as iv
from overlapprof.analysis.rank import unions as U
from overlapprof.analysis.rank.classify import KINDS
from overlapprof.analysis.rank.unions import COMM, COMPUTE, RankUnions
from overlapprof.analysis.stats import median, percentile
from overlapprof.report import KindMetrics, Metrics, Partition, RankReport, StepMetrics, Summary, Timeline

# At most this many intervals per class in a rank's timeline (keeps a report small).
TIMELINE_CAP = 2000


def metrics_of(comm: iv.Intervals, compute: iv.Intervals, memory: iv.Intervals = iv.EMPTY, cls=Metrics, **extra):
    """Metrics (or a subclass, with ``extra`` fields) of three unions."""
    return make_metrics(iv.length(comm), iv.length(compute), iv.overlap_length(comm, compute), iv.length(memory),
                    cls, **extra)


def make_metrics(comm_us: float, compute_us: float, overlap_us: float, memory_us: float, cls, **extra):
    """Metrics from |comm|, |compute|, |comm ∩ compute| and |memory| (µs)."""
    overlapped = min(overlap_us, comm_us)
    return cls(
        comm_us=comm_us,
        compute_us=compute_us,
        overlapped_us=overlapped,
        exposed_comm_us=comm_us - overlapped,
        overlap_ratio=overlapped / comm_us if comm_us > 0 else None,
        memory_us=memory_us,
        **extra,
    )


def mean_partition(steps: list[StepMetrics]) -> Partition | None:
    """The mean over steps of each part (None without steps)."""
    parts = [s.partition for s in steps if s.partition is not None]
    if not parts:
        return None
    return Partition(**{f: sum(getattr(p, f) for p in parts) / len(parts) for f in Partition.__struct_fields__})


def step_metrics(u: RankUnions, exposed_out: list | None = None) -> list[StepMetrics]:
    """One StepMetrics per ProfilerStep, in time order (see StepMetrics for ``step_us``).

    The same formulas as :func:`metrics_of` and :class:`~overlapprof.report.Partition` for each
    step's unions, computed for many steps at once with the segmented interval functions
    (segment = step), a group of steps of about ``unions.STEP_GROUP_INTERVALS`` runs at a time.
    ``exposed_out``: when a list, each group's U(comm) \\ U(compute) per step is appended to it
    (segmented, segment = the step's index), the sets whose lengths are the steps'
    ``exposed_comm_us``."""
    steps = u.steps
    count = steps.start.size
    if count == 0:
        return []
    total = np.cumsum(sum(np.bincount(s[0], minlength=count) for s in u.by_step))
    out, lo = [], 0
    while lo < count:
        group = U.STEP_GROUP_INTERVALS
        hi = max(lo + 1, int(np.searchsorted(total, (total[lo - 1] if lo else 0) + group, "right")))
        hi = min(hi, count)
        sets = []
        for seg, starts, ends in u.by_step:
            a, b = np.searchsorted(seg, (lo, hi))
            sets.append((seg[a:b] - lo, starts[a:b], ends[a:b]))
        out += _step_group(sets, steps.number[lo:hi], steps.start[lo:hi].astype(np.float64), u.last_end[lo:hi],
                           exposed_out, lo)
        lo = hi
    return out


def _step_group(unions, numbers: np.ndarray, starts: np.ndarray, last_end: np.ndarray, exposed_out=None,
                first: int = 0) -> list[StepMetrics]:
    """The StepMetrics of consecutive steps (``numbers``, their windows ``[starts, last_end)``)
    from their comm, compute and memory unions (segmented: segment k = the k-th step);
    ``exposed_out``: see :func:`step_metrics` (``first``: the index of the group's first step)."""
    count = numbers.size
    comm, compute, memory = unions
    exposed = iv.difference_by(comm, compute)
    if exposed_out is not None:
        exposed_out.append((exposed[0] + first, exposed[1], exposed[2]))
    both = iv.union_by(*iv.concat_by(comm, compute))
    comp_w, mem_w = (iv.clip_by(u, starts, last_end) for u in (compute, memory))
    # the window's cuts: of U(comm, compute), U(comm_w, comp_w) (a cut of a union is the union of the
    # cuts); of comm − compute, comm_w − comp_w (likewise for a difference)
    busy = iv.clip_by(both, starts, last_end)
    everything = iv.union_by(*iv.concat_by(busy, mem_w)) if mem_w[0].size else busy
    window = (np.arange(count), starts, last_end)
    parts = (comm, compute, memory, both, comp_w, iv.clip_by(exposed, starts, last_end),
             iv.difference_by(mem_w, busy), iv.difference_by(window, everything))
    (comm_us, n_comm), (compute_us, n_compute), (memory_us, _), (both_us, _), *rest = (
        iv.lengths_by(u, count) for u in parts)
    comp_us, exposed_us, exposed_mem_us, idle_us = (r[0] for r in rest)
    out = []
    for k, (number, start, end) in enumerate(zip(numbers.tolist(), starts.tolist(), last_end.tolist())):
        step_us = float(end - start)
        overlap = max(0.0, comm_us[k] + compute_us[k] - both_us[k]) if n_comm[k] and n_compute[k] else 0.0
        m = make_metrics(comm_us[k], compute_us[k], overlap, memory_us[k], StepMetrics,
                     step=number, start_us=start, step_us=step_us, exposed_share=None,
                     partition=Partition(compute_us=comp_us[k], exposed_comm_us=exposed_us[k],
                                         exposed_memory_us=exposed_mem_us[k], idle_us=idle_us[k], step_us=end - start))
        m.exposed_share = m.exposed_comm_us / step_us if step_us > 0 else None
        out.append(m)
    return out


def kind_metrics(u: RankUnions, exposed_out: dict | None = None, rank: Metrics | None = None) -> list[KindMetrics]:
    """One KindMetrics per kind present, in the order of classify.KINDS: each kind's U(comm of
    the kind) against the rank's whole U(compute). ``count`` is the number of distinct operations
    of the kind (``EventSet.operation``: in CPU mode a ``c10d::*`` call and the backend span
    recorded for it are one operation), not of comm events. ``exposed_out``: when a dict, each
    kind's U(comm of the kind) \\ U(compute) is put in it under the kind's code. ``rank``: the
    rank's Metrics, those of a kind whose union is U(comm) itself (taken, not measured again)."""
    out = []
    for code in sorted(u.kinds):
        union = u.kinds[code]
        whole = union is u.comm  # one kind: its sets are the rank's
        if exposed_out is not None:
            exposed_out[code] = u.exposed if whole else iv.difference(union, u.compute)
        if whole and rank is not None:
            m = make_metrics(rank.comm_us, rank.compute_us, rank.overlapped_us, 0.0, KindMetrics, kind=KINDS[code],
                             count=u.operations[code])
        else:
            m = metrics_of(union, u.compute, cls=KindMetrics, kind=KINDS[code], count=u.operations[code])
        out.append(m)
    return out


def timeline_pairs(u: iv.Intervals, origin: float) -> tuple[list[tuple[float, float]], bool]:
    starts, ends = u
    cut = starts.size > TIMELINE_CAP
    starts, ends = starts[:TIMELINE_CAP] - origin, ends[:TIMELINE_CAP] - origin
    return list(zip(starts.tolist(), ends.tolist())), cut


def timeline_step(numbers: list[int]) -> int | None:
    """Which of the steps (their numbers, in time order) the timeline shows (see :func:`timeline`;
    None without steps)."""
    if not numbers:
        return None
    candidates = numbers[:-1] if len(numbers) >= 3 else numbers
    ranked = sorted(range(len(candidates)), key=lambda k: candidates[k])
    return ranked[(len(ranked) - 1) // 2]


def timeline(u: RankUnions, steps: list[StepMetrics]) -> Timeline | None:
    """The unions of the representative step: the middle one (by number) of the candidates.

    The candidates are every step but the last when there are three or more (the profiler may
    cut the last short). Chosen by step number, not by this rank's step times, so that every
    rank of one run draws the same ProfilerStep on the report's shared axis. Without steps, the
    whole trace (from the earliest start of a comm or compute event to the latest end).
    """
    k = timeline_step([s.step for s in steps])
    if k is not None:
        comm, compute = u.step(COMM, k), u.step(COMPUTE, k)
        origin, span, step = steps[k].start_us, steps[k].step_us, steps[k].step
    else:
        spans = [s for s in u.spans[:2] if s is not None]
        if not spans:
            return None
        comm, compute = u.comm, u.compute
        origin = min(s[0] for s in spans)
        span, step = max(s[1] for s in spans) - origin, None
    lists = [timeline_pairs(x, origin) for x in (comm, compute, iv.intersection(comm, compute))]
    return Timeline(
        step=step,
        start_us=origin,
        span_us=span,
        comm=lists[0][0],
        compute=lists[1][0],
        overlapped=lists[2][0],
        truncated=any(cut for _, cut in lists),
    )


def _percentile(values: list[float], q: float) -> float | None:
    return percentile(values, q) if values else None


def rank_report(u: RankUnions, files: list[str], mode: str, events: int, records=None,
                exposed_out: dict | None = None, both=None) -> RankReport:
    """A rank's report (rank number not yet settled: -1) from its unions (``events``: complete
    events read; ``records``: its communication records, when kept). ``median_step_us``
    interpolates like the Summary's (numpy's median). ``exposed_out``: when a dict, the
    exposed-communication sets the metrics measured are put in it (``"steps"``: a list of
    segmented sets, see :func:`step_metrics`; ``"kinds"``: kind code -> set). ``both(f, g)``:
    how the steps' metrics and the whole rank's and kinds' are made (default one after the
    other; a parallel read's ``both``, at once: they share nothing they write)."""
    step_sets, kind_sets = ([], {}) if exposed_out is not None else (None, None)

    def whole_and_kinds():
        rank = metrics_of(*u.whole)
        return rank, kind_metrics(u, kind_sets, rank)

    steps, (rank, kinds) = (both or _in_turn)(lambda: step_metrics(u, step_sets), whole_and_kinds)
    if both is not None and step_sets:  # made in another thread, kept: into this one's heap (bounded._classify_gpu)
        step_sets[:] = [tuple(np.array(a) for a in group) for group in step_sets]
    if exposed_out is not None:
        exposed_out.update(steps=step_sets, kinds=kind_sets)
    return assemble(files, mode, rank, steps, kinds, events, u.counts, timeline(u, steps), records)


def _in_turn(first, second) -> tuple:
    return first(), second()


def assemble(files, mode, metrics: Metrics, steps: list[StepMetrics], kinds: list[KindMetrics], events: int, counts,
             timeline: Timeline | None, records=None) -> RankReport:
    """A RankReport of these parts (``counts``: of comm, compute and memory events); the rank
    number is settled later (-1)."""
    return RankReport(
        rank=-1,
        rank_source="",
        files=files,
        mode=mode,
        metrics=metrics,
        steps=steps,
        kinds=kinds,
        events=events,
        comm_events=counts[0],
        compute_events=counts[1],
        memory_events=counts[2],
        timeline=timeline,
        comm_records=records,
        partition=mean_partition(steps),
        median_step_us=_percentile([s.step_us for s in steps], 50),
    )


def summarize(ranks) -> Summary:
    """The cross-rank summary of OVERLAP.md section 3 over RankReports."""
    with_ratio = [r for r in ranks if r.metrics.overlap_ratio is not None]
    comm = sum(r.metrics.comm_us for r in ranks)
    overlapped = sum(r.metrics.overlapped_us for r in ranks)
    steps = [s.step_us for r in ranks for s in r.steps]
    summary = Summary(
        ranks=len(ranks),
        ranks_with_comm=len(with_ratio),
        comm_us=comm,
        overlapped_us=overlapped,
        exposed_comm_us=sum(r.metrics.exposed_comm_us for r in ranks),
        pooled_ratio=overlapped / comm if comm > 0 else None,
        median_step_us=_percentile(steps, 50),
        p90_step_us=_percentile(steps, 90),
    )
    if with_ratio:
        lo = min(with_ratio, key=lambda r: r.metrics.overlap_ratio)
        hi = max(with_ratio, key=lambda r: r.metrics.overlap_ratio)
        summary.min_ratio, summary.min_ratio_rank = lo.metrics.overlap_ratio, lo.rank
        summary.max_ratio, summary.max_ratio_rank = hi.metrics.overlap_ratio, hi.rank
        summary.median_ratio = median([r.metrics.overlap_ratio for r in with_ratio])
    if comm > 0:
        worst = max(ranks, key=lambda r: r.metrics.exposed_comm_us)
        summary.most_exposed_rank, summary.most_exposed_us = worst.rank, worst.metrics.exposed_comm_us
    return summary
