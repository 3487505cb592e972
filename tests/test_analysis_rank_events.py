"""CPU mode's need times (when the program needed an operation's result) are the same measured
on the host activity itself or on its per-thread runs (:func:`waits.thread_reach`), which is
what a rank measured with its events on disk keeps of the compute cpu_ops, a window at a time."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from overlapprof.analysis.rank.waits import need_times, thread_reach


def _activity(rng, n: int, threads: int, grid: bool):
    thread = rng.integers(0, threads, n).astype(np.int32)
    start = rng.uniform(0.0, 200.0, n)
    dur = rng.exponential(4.0, n) * (rng.random(n) > 0.2)  # zero-length activity too
    if grid:  # touching and identical intervals
        start, dur = np.round(start), np.round(dur)
    return thread, start, start + dur


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(0, 120), ops=st.integers(1, 30), threads=st.integers(1, 4),
       grid=st.booleans(), windows=st.integers(1, 5))
def test_need_times_on_the_runs_equal_those_on_the_activity(seed, n, ops, threads, grid, windows):
    rng = np.random.default_rng(seed)
    activity = _activity(rng, n, threads, grid)
    issue = rng.uniform(-10.0, 210.0, ops)
    if grid:
        issue = np.round(issue)
    end = issue + rng.exponential(20.0, ops) * (rng.random(ops) > 0.1)
    thread = rng.integers(0, threads + 1, ops).astype(np.int32)  # a thread with no activity too
    expected = need_times(activity, thread, issue, end)
    runs = thread_reach(*activity)
    assert np.array_equal(need_times(runs, thread, issue, end), expected)
    # the runs of windows of the activity, then the runs of those runs (what a rank measured on disk keeps)
    cut = np.array_split(rng.permutation(n), windows)
    parts = [thread_reach(*(a[rows] for a in activity)) for rows in cut]
    merged = thread_reach(*(np.concatenate(p) for p in zip(*parts)))
    assert all(np.array_equal(a, b) for a, b in zip(merged, runs))
    assert np.array_equal(need_times(merged, thread, issue, end), expected)
    assert runs[0].size <= n and np.all(runs[2] >= runs[1])
