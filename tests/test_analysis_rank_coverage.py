"""The engine's prototype core (``analysis/rank/coverage.py``, docs/engine.md): a rank's metrics,
steps with their partition, kinds and timeline from one sweep over coverage patterns are the
report's own, float for float, on every real trace (with the HTA filters too), in memory and with
the boundaries spilled to sorted run files and merged a small window at a time."""

from __future__ import annotations

import random
from pathlib import Path

import msgspec
import numpy as np
import pytest

import overlapprof
from overlapprof.analysis import intervals as iv
from overlapprof.analysis.boundaries import Boundaries
from overlapprof.analysis.rank import coverage
from overlapprof.analysis.rank.classify import compile_comm_annotations, compile_comm_kernels
from overlapprof.analysis.rank.events import filtered, last_step_dropped, rank_events

import real_data

REAL = real_data.jobs()

# What the rest of analyze adds to a rank's report (settled ranks, causes and bounds, records).
NOT_MEASURED_HERE = {"rank", "rank_source", "world_size", "backend", "exposure", "comm_free_bound_us",
                     "comm_free_speedup", "overlap_bound_us", "overlap_bound_speedup", "overlap_bound_form",
                     "hidden_of_hideable", "verdict", "operations", "comm_ops", "lanes", "device_not_measured",
                     "exposed_by_cause"}


def _fields(report) -> dict:
    def strip(d):
        if isinstance(d, dict):
            return {k: strip(v) for k, v in d.items() if k not in NOT_MEASURED_HERE}
        if isinstance(d, list):
            return [strip(v) for v in d]
        return d
    return strip(msgspec.to_builtins(report))


def _events(files, drop_last_step=False, require_launch=False):
    """A rank's classified events with the filters applied as analyze applies them."""
    ev = rank_events([Path(f) for f in files], compile_comm_kernels(()), comm_ann=compile_comm_annotations(()))
    ev.steps, cutoff = last_step_dropped(ev.steps, drop_last_step, str(files[0]), [])
    launch = require_launch and ev.mode == "gpu"
    for name in ("comm", "compute", "memory"):
        setattr(ev, name, filtered(getattr(ev, name), launch, cutoff))
    return ev


@pytest.mark.parametrize("folder", REAL, ids=[real_data.name(d) for d in REAL])
def test_same_floats_as_the_report(folder):
    for kw in ({}, {"drop_last_step": True}, {"require_launch": True}):
        report = overlapprof.analyze(folder, workers=1, **kw)
        for rank in report.ranks:
            ev = _events(rank.files, **kw)
            mine = coverage.measure(ev)
            mine.files = rank.files
            assert _fields(mine) == _fields(rank), (folder, kw, rank.rank)


@pytest.mark.parametrize("folder", [d for d in REAL if d.name in ("mtia", "negative_queue_length", "trace_filter",
                                                                   "ddp-async")], ids=real_data.name)
def test_spilled_and_merged_in_small_windows(folder):
    """A budget of 20 kB: the boundaries go to many run files (merged into one past
    :data:`~overlapprof.analysis.boundaries.MAX_RUNS`), swept 4,096 rows at a time."""
    report = overlapprof.analyze(folder, workers=1)
    for rank in report.ranks:
        held = Boundaries(20_000)
        mine = coverage.measure(_events(rank.files), batch_rows=500, window_rows=4096, held=held)
        mine.files = rank.files
        assert held.made >= 2
        assert _fields(mine) == _fields(rank)


@pytest.mark.parametrize("folder", [d for d in REAL if d.name in ("mtia", "trace_filter", "ddp-async")],
                         ids=real_data.name)
def test_held_in_memory_and_swept_in_small_windows(folder):
    report = overlapprof.analyze(folder, workers=1)
    for rank in report.ranks:
        held = Boundaries()
        mine = coverage.measure(_events(rank.files), window_rows=1000, held=held)
        mine.files = rank.files
        assert held.made == 0
        assert _fields(mine) == _fields(rank)


@pytest.mark.parametrize("seed", range(5))
def test_runs_are_the_unions_and_differences(seed, tmp_path):
    """Random intervals of two classes in three segments, cut into windows of 7 boundaries: the
    runs of C, of C ∧ ¬K and of C ∨ K are intervals.py's union, difference and union of both,
    with the same ends."""
    rng = np.random.default_rng(seed)
    n = 400
    seg = rng.integers(0, 3, size=n).astype(np.int32)
    start = np.round(rng.uniform(0, 1000, size=n), 1)
    end = start + np.round(rng.exponential(5, size=n), 1)  # some zero-length, many touching
    is_comm = rng.random(n) < 0.5
    held = Boundaries(2_000)
    for a in range(0, n, 37):
        sl = slice(a, a + 37)
        c, k = is_comm[sl], ~is_comm[sl]
        held.add(start[sl][c], end[sl][c], seg[sl][c], 0)
        held.add(start[sl][k], end[sl][k], seg[sl][k], 1)
    sweep = coverage.PatternSweep(4, {"comm": (coverage.comm, "all"), "exposed": (lambda p: (p & 3) == 1, "all"),
                                      "either": (coverage.comm_or_compute, "all")},
                                     follow={"comm": "all", "exposed": "all", "either": "all"})
    for rec in held.windows(7):
        sweep.window(rec)
    sweep.finish()
    held.remove()
    assert held.made >= 5
    for s in range(3):
        mine = seg == s
        c = iv.union(start[mine & is_comm], end[mine & is_comm])
        k = iv.union(start[mine & ~is_comm], end[mine & ~is_comm])
        either = iv.union(start[mine], end[mine])
        for name, want in (("comm", c), ("exposed", iv.difference(c, k)), ("either", either)):
            got = coverage._runs_of(sweep.result(name), s)
            assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1]), (seed, s, name)
            assert coverage.lengths(sweep.result(name), 4)[0][s] == iv.length(want)
            assert sweep.lengths(name)[0][s] == iv.length(want)


def test_small_trace_never_touches_the_disk():
    held = Boundaries()
    coverage.measure(_events([str(p) for p in sorted((real_data.DATA / "trace_filter").glob("*.json.gz"))][:1]),
                     held=held)
    assert held.runs == [] and held.folder is None


def test_every_predicate_says_its_formula_and_unit():
    for test, _ in coverage.PREDICATES.values():
        assert "Bits:" in test.__doc__ and "µs" in test.__doc__
    rng = random.Random(0)
    p = np.array([rng.randrange(16) for _ in range(200)])
    C, K, M, W = coverage.C, coverage.K, coverage.M, coverage.W
    has = lambda b: (p & b) != 0  # noqa: E731
    # the partition's four parts are disjoint and cover the window
    parts = [coverage.window_compute(p), coverage.window_exposed_comm(p), coverage.window_exposed_memory(p),
             coverage.window_idle(p)]
    assert np.array_equal(sum(x.astype(int) for x in parts), has(W).astype(int))
    assert np.array_equal(coverage.window_exposed_comm(p), has(C) & has(W) & ~has(K))
    assert np.array_equal(coverage.window_exposed_memory(p), has(M) & has(W) & ~has(K) & ~has(C))
