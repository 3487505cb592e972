"""Prototype of the single engine's core (docs/engine.md): a rank's metrics from one sweep over
coverage patterns, fed a batch of classified intervals at a time, in memory up to a budget.

Not wired into ``analyze``: :func:`measure` takes a rank's classified events
(:class:`~overlapprof.analysis.rank.events.RankEvents`, after any filter) and gives the
:class:`~overlapprof.report.RankReport` that :func:`~overlapprof.analysis.rank.metrics.rank_report`
gives, float for float (the rank metrics, the steps with their partition, the kinds, the
timeline).

Each interval ``[start, end)`` becomes two *boundaries* (position, segment, class bit, ±1),
under its step's segment and under the whole rank's, held in memory up to a budget and on disk
past it (:class:`~overlapprof.analysis.boundaries.Boundaries`), and swept a window of
consecutive positions at a time. A window's boundaries, sorted by (segment, position), give by a
cumulative sum per class the classes that cover each piece of time between two boundaries: the
piece's *pattern*. Every metric is a predicate on the pattern (:data:`PREDICATES`); the maximal
*runs* of pieces that satisfy it are the intervals of the set it names, with the same float ends
as the union, clip or difference that :mod:`overlapprof.analysis.intervals` builds, so their
lengths summed the same way give the same floats.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from overlapprof.analysis.boundaries import BUDGET_BYTES, WINDOW_ROWS, Boundaries
from overlapprof.analysis.rank.classify import KINDS
from overlapprof.analysis.rank.events import EventSet, RankEvents
from overlapprof.analysis.rank.metrics import assemble, make_metrics, timeline_pairs, timeline_step
from overlapprof.analysis.sweep import in_segment_order
from overlapprof.report import KindMetrics, Metrics, Partition, RankReport, StepMetrics, Timeline

# Class bits of a pattern: communication, compute, memory, the step's window, then one per kind.
C, K, M, W = 1, 2, 4, 8
KIND0 = 4  # bit index of the first kind's class
CLASSES = KIND0 + len(KINDS)

BATCH_ROWS = 1 << 16  # intervals fed at once (what a batch of a streaming read would hold)


# -- the metrics, one predicate each (pattern bits -> whether the piece counts) ----------------

def comm(p):
    """U(comm): time under communication. Bits: C. µs."""
    return (p & C) != 0


def compute(p):
    """U(compute): time under compute. Bits: K. µs."""
    return (p & K) != 0


def memory(p):
    """U(memory): time under copies and memsets. Bits: M. µs."""
    return (p & M) != 0


def comm_or_compute(p):
    """U(comm) ∪ U(compute), for overlapped = |C| + |K| − |C ∨ K|. Bits: C ∨ K. µs."""
    return (p & (C | K)) != 0


def comm_and_compute(p):
    """U(comm) ∩ U(compute), the timeline's overlapped intervals. Bits: C ∧ K. µs."""
    return (p & (C | K)) == (C | K)


def window_compute(p):
    """Partition ``compute_us``: |U(compute) ∩ W|. Bits: K ∧ W. µs."""
    return (p & (K | W)) == (K | W)


def window_exposed_comm(p):
    """Partition ``exposed_comm_us``: |(U(comm) ∩ W) \\ U(compute)|. Bits: C ∧ W ∧ ¬K. µs."""
    return (p & (C | W | K)) == (C | W)


def window_exposed_memory(p):
    """Partition ``exposed_memory_us``: |(U(memory) ∩ W) \\ (U(compute) ∪ U(comm))|. Bits: M ∧ W ∧ ¬K ∧ ¬C. µs."""
    return (p & (M | W | K | C)) == (M | W)


def window_idle(p):
    """Partition ``idle_us``: |W \\ (U(compute) ∪ U(comm) ∪ U(memory))|. Bits: W ∧ ¬K ∧ ¬C ∧ ¬M. µs."""
    return (p & (W | K | C | M)) == W


def kind(code: int):
    """U(comm of kind ``code``). Bits: G(code). µs."""
    bit = 1 << (KIND0 + code)
    return lambda p: (p & bit) != 0


def kind_or_compute(code: int):
    """U(comm of the kind) ∪ U(compute), for the kind's overlapped. Bits: G(code) ∨ K. µs."""
    bits = (1 << (KIND0 + code)) | K
    return lambda p: (p & bits) != 0


# name -> (predicate, where: "rank", "steps" or "all" segments)
PREDICATES: dict[str, tuple[Callable, str]] = {
    "comm": (comm, "all"), "compute": (compute, "all"), "memory": (memory, "all"),
    "comm_or_compute": (comm_or_compute, "all"), "comm_and_compute": (comm_and_compute, "all"),
    "window_compute": (window_compute, "steps"), "window_exposed_comm": (window_exposed_comm, "steps"),
    "window_exposed_memory": (window_exposed_memory, "steps"), "window_idle": (window_idle, "steps"),
}


# -- the sweep ---------------------------------------------------------------------------------

class PatternSweep:
    """Coverage patterns of ``segments`` segments, a window of boundaries at a time (counts
    carried from one window to the next), and the lengths of each predicate's runs.

    ``ends``: the last position each segment can have (a step: its window's end; the rank's:
    infinite). Once a window passes it, the segment's run lengths are summed and let go of, so
    what is kept is the rank's run lengths (8 bytes a run) and the steps still open. A run that
    ends at its segment's last boundary so far is *pending*: the next window may continue it.
    ``follow``: predicates whose runs are kept whole in one segment (an int) or all (``"all"``)."""

    def __init__(self, segments: int, predicates: dict[str, tuple[Callable, object]], ends: np.ndarray | None = None,
                 follow: dict | None = None):
        self.count = np.zeros((segments, CLASSES), dtype=np.int64)
        self.count_in = self.count.copy()  # the counts carried into the window being swept
        self.last = np.zeros(segments, dtype=np.float64)
        self.rank = segments - 1
        self.ends = np.full(segments, np.inf) if ends is None else np.append(ends[: segments - 1], np.inf)
        self.summed = np.zeros(segments, dtype=bool)
        self.predicates, self.follow = predicates, follow or {}
        empty = (np.empty(0, dtype=np.int32), np.empty(0), np.empty(0))
        self.pending = {name: empty for name in predicates}
        self.open_gaps = {name: [] for name in predicates}  # (segment, length) of closed runs of open steps
        self.rank_gaps: dict[str, list] = {name: [] for name in predicates}
        self.totals = {name: ([0.0] * segments, np.zeros(segments, dtype=np.int64)) for name in predicates}
        self.kept: dict[str, list] = {name: [] for name in self.follow}

    def window(self, rec: np.ndarray) -> None:
        if rec.size == 0:
            return
        carried = np.flatnonzero(self.count.any(axis=1))
        nc = carried.size
        order, pos, seg, _, heads, group = in_segment_order(rec, carried, self.last)
        n = pos.size
        head_segs = seg[heads]
        # A class's bit changes only at its own boundaries: each class's counts are summed over
        # its rows alone; a bit turning on adds it, turning off subtracts it, so the pattern is
        # the sum of the changes so far in the segment plus the pattern carried into it.
        cls = np.concatenate((np.full(nc, -1, dtype=np.int8), rec["cls"]))[order]
        delta = np.concatenate((np.zeros(nc, dtype=np.int8), rec["delta"]))[order]
        by_class = np.argsort(cls, kind="stable")  # rows of each class, in (segment, position) order
        bounds = np.searchsorted(cls[by_class], np.arange(-1, CLASSES + 1))
        flips = np.zeros(n, dtype=np.int32)
        for c in np.flatnonzero(np.diff(bounds)[1:]).tolist():
            rows = by_class[bounds[c + 1]:bounds[c + 2]]
            g = group[rows]
            d = delta[rows].astype(np.int32)
            cum = np.cumsum(d)
            new_group = np.empty(rows.size, dtype=bool)
            new_group[0] = True
            new_group[1:] = g[1:] != g[:-1]
            starts = np.flatnonzero(new_group)
            base = np.where(starts > 0, cum[np.maximum(starts - 1, 0)], 0)  # the sum before each group
            size = np.diff(np.append(starts, rows.size))
            after = cum - np.repeat(base, size) + self.count[seg[rows], c].astype(np.int32)
            changed = (after > 0) != (after - d > 0)
            flips[rows[changed]] = np.where(after[changed] > 0, 1 << c, -(1 << c))
            ends = np.append(starts[1:], rows.size) - 1
            self.count[seg[rows[ends]], c] = after[ends]
        acc = np.cumsum(flips, dtype=np.int32)
        before = np.where(heads > 0, acc[np.maximum(heads - 1, 0)], 0)
        initial = ((self.count_in[head_segs] > 0).astype(np.int32) << np.arange(CLASSES, dtype=np.int32)).sum(axis=1)
        pattern = acc + np.repeat((initial - before).astype(np.int32), np.diff(np.append(heads, n)))
        tails = np.append(heads[1:] - 1, n - 1)
        self.last[seg[tails]] = pos[tails]
        self.count_in = self.count.copy()
        # the pieces of positive length, [pos[k], pos[k + 1]) within a segment, and of those
        # the stretches of one pattern (consecutive pieces of a segment are adjacent)
        piece = np.flatnonzero((seg[1:] == seg[:-1]) & (pos[1:] > pos[:-1]))
        p_pat, p_seg = pattern[piece], seg[piece]
        same_prev = np.zeros(piece.size, dtype=bool)
        same_prev[1:] = p_seg[1:] == p_seg[:-1]
        stretch = np.flatnonzero(~same_prev | np.append(True, p_pat[1:] != p_pat[:-1])[: piece.size])
        last = np.append(stretch[1:] - 1, piece.size - 1) if piece.size else stretch
        p_start, p_end = pos[piece[stretch]], pos[piece[last] + 1]
        p_pat, p_seg, same_prev = p_pat[stretch], p_seg[stretch], same_prev[stretch]
        in_rank = p_seg == self.rank
        for name, (test, where) in self.predicates.items():
            hit = test(p_pat)
            if where == "rank":
                hit &= in_rank
            elif where == "steps":
                hit &= ~in_rank
            elif where is not None and where != "all":  # one segment
                hit &= p_seg == where
            joined = np.zeros(p_pat.size, dtype=bool)  # a hit stretch that continues the previous hit
            joined[1:] = hit[1:] & hit[:-1] & same_prev[1:]
            starts = hit & ~joined
            ends = hit & ~np.append(joined[1:], False)
            self._settle(name, (p_seg[starts], p_start[starts], p_end[ends]))
        self._sum(self.ends <= float(rec["pos"].max()))  # steps whose window the sweep has passed

    def _settle(self, name: str, runs) -> None:
        """A window's runs after the pending ones: a pending run the window continues is joined to
        it (runs of one window never touch: a stretch that fails lies between); those that may
        still go on stay pending; the others are closed."""
        seg, start, end = (np.concatenate((p, r)) for p, r in zip(self.pending[name], runs))
        if seg.size == 0:
            return
        if self.pending[name][0].size:
            order = np.argsort(seg, kind="stable")  # pending first within a segment: earlier
            seg, start, end = seg[order], start[order], end[order]
            touch = np.zeros(seg.size, dtype=bool)
            touch[1:] = (seg[1:] == seg[:-1]) & (start[1:] == end[:-1])
            if touch.any():
                keep = ~touch
                last = np.append(np.flatnonzero(keep)[1:] - 1, seg.size - 1)
                seg, start, end = seg[keep], start[keep], end[last]
        going = (end == self.last[seg]) & (end < self.ends[seg])
        self.pending[name] = (seg[going], start[going], end[going])
        self._close(name, seg[~going], start[~going], end[~going])

    def _close(self, name: str, seg, start, end) -> None:
        if seg.size == 0:
            return
        in_rank = seg == self.rank
        self.rank_gaps[name].append((end - start)[in_rank])
        self.open_gaps[name].append((seg[~in_rank], (end - start)[~in_rank]))
        where = self.follow.get(name)
        if where is not None:
            mine = np.ones(seg.size, dtype=bool) if where == "all" else seg == where
            self.kept[name].append((seg[mine], start[mine], end[mine]))

    def _sum(self, done: np.ndarray) -> None:
        """Sum the run lengths of the steps ``done`` (and not yet summed), as
        :func:`lengths` sums them, and let them go."""
        done = done & ~self.summed
        done[self.rank] = False
        if not done.any():
            return
        for name in self.predicates:
            parts = self.open_gaps[name]
            if not parts:
                continue
            seg = np.concatenate([p[0] for p in parts])
            gaps = np.concatenate([p[1] for p in parts])
            order = np.argsort(seg, kind="stable")  # closed in time order within a segment
            seg, gaps = seg[order], gaps[order]
            finished = done[seg]
            out, counts = self.totals[name]
            bounds = np.searchsorted(seg, np.flatnonzero(done)[:, None] + np.array([0, 1])).tolist()
            for k, (a, b) in zip(np.flatnonzero(done).tolist(), bounds):
                if b > a:
                    out[k] = float(gaps[a]) if b - a == 1 else float(np.add.reduce(gaps[a:b]))
                    counts[k] = b - a
            self.open_gaps[name] = [(seg[~finished], gaps[~finished])]
        self.summed |= done

    def finish(self) -> None:
        """Close what is pending and sum every segment (the rank's too), once every window is swept."""
        for name in self.predicates:
            seg, start, end = self.pending[name]
            self.pending[name] = (seg[:0], start[:0], end[:0])
            self._close(name, seg, start, end)
        self._sum(np.ones(self.summed.size, dtype=bool))
        r = self.rank
        for name in self.predicates:
            gaps = np.concatenate(self.rank_gaps[name]) if self.rank_gaps[name] else np.empty(0)
            out, counts = self.totals[name]
            out[r], counts[r] = (float(np.sum(gaps)) if gaps.size else 0.0), gaps.size
            self.rank_gaps[name] = []

    def lengths(self, name: str) -> tuple[list[float], np.ndarray]:
        """Per segment the total length of the predicate's runs and how many there are (after :meth:`finish`)."""
        return self.totals[name]

    def result(self, name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The runs kept of a followed predicate (segment, start, end), by segment then time."""
        parts = self.kept[name]
        if not parts:
            return np.empty(0, dtype=np.int32), np.empty(0), np.empty(0)
        seg, start, end = (np.concatenate([p[k] for p in parts]) for k in range(3))
        order = np.argsort(seg, kind="stable")
        return seg[order], start[order], end[order]


def lengths(runs, segments: int) -> tuple[list[float], np.ndarray]:
    """Per segment the total length of its runs, summed as :func:`~overlapprof.analysis.intervals.lengths_by`
    sums a segmented union (so the same floats), and how many runs it has."""
    seg, start, end = runs
    bounds = np.searchsorted(seg, np.arange(segments + 1))
    sizes = np.diff(bounds)
    gaps = end - start
    out = [0.0] * segments
    for k in np.flatnonzero(sizes).tolist():
        out[k] = float(gaps[bounds[k]]) if sizes[k] == 1 else float(np.add.reduce(gaps[bounds[k]:bounds[k + 1]]))
    return out, sizes


def _runs_of(runs, segment: int) -> tuple[np.ndarray, np.ndarray]:
    seg, start, end = runs
    a, b = np.searchsorted(seg, (segment, segment + 1))
    return start[a:b], end[a:b]


# -- one rank ----------------------------------------------------------------------------------

@dataclass
class _Feed:
    """What the batches leave besides boundaries: each step's last end, counts, spans."""

    last_end: np.ndarray
    counts: list
    operations: np.ndarray
    spans: list


def _batches(s: EventSet, rows: int) -> Iterator[EventSet]:
    for a in range(0, len(s), rows):
        yield EventSet(*(getattr(s, f)[a:a + rows] for f in EventSet.__dataclass_fields__))


def measure(ev: RankEvents, budget: int = BUDGET_BYTES, batch_rows: int = BATCH_ROWS,
            window_rows: int = WINDOW_ROWS, held: Boundaries | None = None) -> RankReport:
    """A rank's report from its classified events, as :func:`~overlapprof.analysis.rank.metrics.rank_report`
    gives it (without communication records), the intervals fed ``batch_rows`` at a time, held
    in ``held`` (default: a new :class:`Boundaries` of ``budget`` bytes)."""
    steps = ev.steps
    n = steps.start.size
    rank = n  # the whole rank's segment
    feed = _Feed(steps.end.astype(np.float64, copy=True), [0, 0, 0], np.zeros(len(KINDS), dtype=np.int64),
                 [[np.inf, -np.inf] for _ in range(3)])
    held = held if held is not None else Boundaries(budget)
    try:
        for k, (s, bit) in enumerate(((ev.comm, C), (ev.compute, K), (ev.memory, M))):
            cls = bit.bit_length() - 1
            feed.counts[k] = len(s)
            for b in _batches(s, batch_rows):
                span = feed.spans[k]
                span[0], span[1] = min(span[0], float(b.start.min())), max(span[1], float(b.end.max()))
                seg = steps.index_of(b.anchor)
                inside = seg >= 0
                np.maximum.at(feed.last_end, seg[inside], b.end[inside])
                held.add(b.start, b.end, rank, cls)
                held.add(b.start[inside], b.end[inside], seg[inside], cls)
                if bit == C:
                    feed.operations += np.bincount(b.kind[b.operation], minlength=len(KINDS))
                    for code in np.flatnonzero(np.bincount(b.kind)).tolist():
                        mine = b.kind == code
                        held.add(b.start[mine], b.end[mine], rank, KIND0 + code)
        held.add(steps.start.astype(np.float64), feed.last_end, np.arange(n, dtype=np.int32), W.bit_length() - 1)
        kinds = np.flatnonzero(np.bincount(ev.comm.kind, minlength=len(KINDS))).tolist() if len(ev.comm) else []
        predicates = dict(PREDICATES)
        shown = timeline_step(steps.number.tolist())
        predicates["comm_and_compute"] = (comm_and_compute, shown if shown is not None else rank)  # the timeline's
        for code in kinds:
            predicates[f"kind{code}"] = (kind(code), "rank")
            predicates[f"kind{code}_or_compute"] = (kind_or_compute(code), "rank")
        timeline = shown if shown is not None else rank
        sweep = PatternSweep(n + 1, predicates, feed.last_end,
                             follow={"comm": timeline, "compute": timeline, "comm_and_compute": timeline})
        for rec in held.windows(window_rows):
            sweep.window(rec)
        sweep.finish()
    finally:
        held.remove()
    return _report(ev, sweep, feed, kinds)


def _overlap(a: float, b: float, both: float, na: int, nb: int) -> float:
    """|A ∩ B| = |A| + |B| − |A ∪ B| (0 when either is empty), as intervals.overlap_length."""
    return max(0.0, a + b - both) if na and nb else 0.0


def _report(ev: RankEvents, sweep: PatternSweep, feed: _Feed, kinds: list[int]) -> RankReport:
    n = ev.steps.start.size
    got = {name: sweep.lengths(name) for name in sweep.predicates}
    (comm_us, n_comm), (compute_us, n_compute), (memory_us, _), (both_us, _) = (
        got[name] for name in ("comm", "compute", "memory", "comm_or_compute"))
    parts = [got[name][0] for name in ("window_compute", "window_exposed_comm", "window_exposed_memory", "window_idle")]
    out_steps = []
    for k, (number, start, end) in enumerate(zip(ev.steps.number.tolist(), ev.steps.start.astype(np.float64).tolist(),
                                                 feed.last_end.tolist())):
        step_us = float(end - start)
        overlap = _overlap(comm_us[k], compute_us[k], both_us[k], n_comm[k], n_compute[k])
        m = make_metrics(comm_us[k], compute_us[k], overlap, memory_us[k], StepMetrics, step=number, start_us=start,
                         step_us=step_us, exposed_share=None,
                         partition=Partition(compute_us=parts[0][k], exposed_comm_us=parts[1][k],
                                             exposed_memory_us=parts[2][k], idle_us=parts[3][k], step_us=end - start))
        m.exposed_share = m.exposed_comm_us / step_us if step_us > 0 else None
        out_steps.append(m)
    r = n  # the rank's segment
    metrics = make_metrics(comm_us[r], compute_us[r], _overlap(comm_us[r], compute_us[r], both_us[r], n_comm[r],
                                                               n_compute[r]), memory_us[r], Metrics)
    out_kinds = []
    for code in kinds:
        (kind_us, n_kind), (either_us, _) = got[f"kind{code}"], got[f"kind{code}_or_compute"]
        out_kinds.append(make_metrics(kind_us[r], compute_us[r], _overlap(kind_us[r], compute_us[r], either_us[r],
                                                                         n_kind[r], n_compute[r]),
                                      0.0, KindMetrics, kind=KINDS[code], count=int(feed.operations[code])))
    return assemble(ev.files, ev.mode, metrics, out_steps, out_kinds, ev.events, tuple(feed.counts),
                    _timeline(sweep, out_steps, feed, r))


def _timeline(sweep: PatternSweep, steps: list[StepMetrics], feed: _Feed, rank: int) -> Timeline | None:
    """The representative step's runs of C, K and C ∧ K (see metrics.timeline)."""
    k = timeline_step([s.step for s in steps])
    if k is not None:
        segment, origin, span, number = k, steps[k].start_us, steps[k].step_us, steps[k].step
    else:
        spans = [feed.spans[c] for c in (0, 1) if feed.counts[c]]
        if not spans:
            return None
        segment, origin, number = rank, min(s[0] for s in spans), None
        span = max(s[1] for s in spans) - origin
    lists = [timeline_pairs(_runs_of(sweep.result(name), segment), origin)
             for name in ("comm", "compute", "comm_and_compute")]
    return Timeline(step=number, start_us=origin, span_us=span, comm=lists[0][0], compute=lists[1][0],
                    overlapped=lists[2][0], truncated=any(cut for _, cut in lists))
