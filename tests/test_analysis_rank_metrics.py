"""The per-step metrics computed for all steps at once (segmented interval functions) are,
float for float, those of the one-step formulas (metrics_of, partition_of) applied step by step;
and a rank's whole report is the same float for float when its unions are built from the events
in one batch (a rank read in memory) or in many, merged a few at a time (a rank measured with
its events on disk, past the memory budget)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from overlapprof.analysis import intervals as iv
from overlapprof.analysis.rank import unions as U
from overlapprof.analysis.rank.events import EventSet, RankEvents, Steps
from overlapprof.analysis.rank.metrics import metrics_of, rank_report, step_metrics
from overlapprof.analysis.rank.unions import UnionsBuilder, rank_unions
from overlapprof.report import Partition, StepMetrics


def partition_of(comm: iv.Intervals, compute: iv.Intervals, memory: iv.Intervals, start: float,
                 end: float) -> Partition:
    """The Partition (see :class:`overlapprof.report.Partition` for the formulas) of the window
    [start, end) from the three class unions. Idle is measured as its own set, not as the
    remainder, so that the sum of the parts is a check, not a definition."""
    w = (np.array([start]), np.array([end]))
    comp = iv.intersection(compute, w)
    comm_w = iv.intersection(comm, w)
    mem_w = iv.intersection(memory, w)
    busy = iv.union(np.concatenate((comp[0], comm_w[0])), np.concatenate((comp[1], comm_w[1])))
    everything = iv.union(np.concatenate((busy[0], mem_w[0])), np.concatenate((busy[1], mem_w[1])))
    return Partition(
        compute_us=iv.length(comp),
        exposed_comm_us=iv.length(iv.difference(comm_w, comp)),
        exposed_memory_us=iv.length(iv.difference(mem_w, busy)),
        idle_us=iv.length(iv.difference(w, everything)),
        step_us=end - start,
    )


def by_step(ev: RankEvents, s: EventSet) -> list[EventSet]:
    """An event set split by step (index into ``ev.steps``); events outside steps dropped."""
    idx = ev.steps.index_of(s.anchor)
    return [s.select(idx == k) for k in range(ev.steps.start.size)]


def _reference(ev: RankEvents) -> list[StepMetrics]:
    """The one-step formulas, one step at a time."""
    split = [by_step(ev, s) for s in (ev.comm, ev.compute, ev.memory)]
    out = []
    for k in range(ev.steps.start.size):
        sets = [split[c][k] for c in range(3)]
        last_end = max([ev.steps.end[k]] + [float(s.end.max()) for s in sets if len(s)])
        step_us = float(last_end - ev.steps.start[k])
        unions = [iv.union(s.start, s.end) for s in sets]
        m = metrics_of(*unions, cls=StepMetrics, step=int(ev.steps.number[k]), start_us=float(ev.steps.start[k]),
                       step_us=step_us, exposed_share=None,
                       partition=partition_of(*unions, float(ev.steps.start[k]), float(last_end)))
        m.exposed_share = m.exposed_comm_us / step_us if step_us > 0 else None
        out.append(m)
    return out


def _event_set(rng, n: int, lo: float, hi: float, grid: bool, other_kinds: float = 0.5) -> EventSet:
    start = rng.uniform(lo, hi, n)
    dur = rng.exponential(3.0, n)
    if grid:  # touching and identical intervals, zero lengths
        start, dur = np.round(start), np.round(dur)
    anchor = np.where(rng.random(n) < 0.7, start - rng.exponential(2.0, n), start)
    kind = np.where(rng.random(n) < other_kinds, rng.integers(1, 3, n), 0).astype(np.int8)
    return EventSet(start, start + dur, anchor, np.ones(n, dtype=bool), kind, rng.random(n) < 0.8,
                    np.zeros(n, dtype=np.int32), np.zeros(n, dtype=np.int32))


def _in_batches(rng, ev: RankEvents):
    """The rank's unions built from its events cut into random batches, in random order."""
    build = UnionsBuilder(ev.steps)
    for cls, s in enumerate((ev.comm, ev.compute, ev.memory)):
        order = rng.permutation(len(s))
        cuts = np.sort(rng.integers(0, len(s) + 1, rng.integers(0, 6)))
        for part in np.split(order, cuts):
            build.add(s.select(part), cls)
    return build.result()


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), steps=st.integers(1, 12), sizes=st.tuples(*[st.integers(0, 60)] * 3),
       grid=st.booleans(), group=st.sampled_from([None, 1, 7, 40]), other_kinds=st.sampled_from([0.0, 0.05, 0.5]))
def test_segmented_step_metrics_equal_the_one_step_formulas(seed, steps, sizes, grid, group, other_kinds):
    """Also with the steps measured in groups of a few intervals (``group``; None: the default,
    one group here), as a large rank's are; with one kind of communication, a rare second kind
    (that arrives in a later batch) or several."""
    rng = np.random.default_rng(seed)
    bounds = np.cumsum(rng.uniform(0.0, 20.0, steps + 1))  # zero-length steps, gaps between steps
    if grid:
        bounds = np.round(bounds)
    starts = bounds[:-1]
    ends = np.where(rng.random(steps) < 0.8, bounds[1:], starts + rng.uniform(0.0, 5.0, steps))
    lo, hi = float(bounds[0]) - 5.0, float(bounds[-1]) + 5.0  # some events outside every step
    sets = [_event_set(rng, n, lo, hi, grid, other_kinds) for n in sizes]
    ev = RankEvents(mode="gpu", comm=sets[0], compute=sets[1], memory=sets[2],
                    steps=Steps(np.arange(steps), starts, ends), comm_records=None, events=sum(sizes))
    default, merge = U.STEP_GROUP_INTERVALS, U._MERGE_PARTS
    U.STEP_GROUP_INTERVALS, U._MERGE_PARTS = group or default, 2
    try:
        whole = rank_unions(ev)
        assert step_metrics(whole) == _reference(ev)
        report = rank_report(whole, ["f"], "gpu", ev.events)
        for _ in range(2):
            assert rank_report(_in_batches(rng, ev), ["f"], "gpu", ev.events) == report
        assert [k.count for k in report.kinds] == [int(np.count_nonzero(ev.comm.operation & (ev.comm.kind == c)))
                                                   for c in range(3) if (ev.comm.kind == c).any()]
    finally:
        U.STEP_GROUP_INTERVALS, U._MERGE_PARTS = default, merge
