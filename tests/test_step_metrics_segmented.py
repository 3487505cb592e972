"""The per-step metrics computed for all steps at once (segmented interval functions) are,
float for float, those of the one-step formulas (metrics_of, partition_of) applied step by step."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from overlapprof.analysis import intervals as iv
from overlapprof.analysis.rank.events import EventSet, RankEvents, Steps
from overlapprof.analysis.rank.metrics import _by_step, metrics_of, partition_of, step_metrics
from overlapprof.report import StepMetrics


def _reference(ev: RankEvents) -> list[StepMetrics]:
    """The one-step formulas, one step at a time."""
    split = [_by_step(ev, s) for s in (ev.comm, ev.compute, ev.memory)]
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


def _event_set(rng, n: int, lo: float, hi: float, grid: bool) -> EventSet:
    start = rng.uniform(lo, hi, n)
    dur = rng.exponential(3.0, n)
    if grid:  # touching and identical intervals, zero lengths
        start, dur = np.round(start), np.round(dur)
    anchor = np.where(rng.random(n) < 0.7, start - rng.exponential(2.0, n), start)
    return EventSet(start, start + dur, anchor, np.ones(n, dtype=bool), np.zeros(n, dtype=np.int8),
                    np.ones(n, dtype=bool))


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), steps=st.integers(1, 12), sizes=st.tuples(*[st.integers(0, 60)] * 3),
       grid=st.booleans())
def test_segmented_step_metrics_equal_the_one_step_formulas(seed, steps, sizes, grid):
    rng = np.random.default_rng(seed)
    bounds = np.cumsum(rng.uniform(0.0, 20.0, steps + 1))  # zero-length steps, gaps between steps
    if grid:
        bounds = np.round(bounds)
    starts = bounds[:-1]
    ends = np.where(rng.random(steps) < 0.8, bounds[1:], starts + rng.uniform(0.0, 5.0, steps))
    lo, hi = float(bounds[0]) - 5.0, float(bounds[-1]) + 5.0  # some events outside every step
    sets = [_event_set(rng, n, lo, hi, grid) for n in sizes]
    ev = RankEvents(mode="gpu", comm=sets[0], compute=sets[1], memory=sets[2],
                    steps=Steps(np.arange(steps), starts, ends), comm_records=None, events=sum(sizes))
    assert step_metrics(ev) == _reference(ev)
