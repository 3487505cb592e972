"""Interference (OVERLAP.md section 6.4): the factor per compute class, slowed_us and
net_overlap_gain_us, on hand-made spans with exact answers, in memory against on disk in random
batches, and on the session's real async all-reduce run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import overlapprof
from overlapprof.analysis.engine.store import Store
from overlapprof.analysis.interference import MIN_SAMPLES, InterferenceBuilder, class_factors, top_level
from overlapprof.analysis.rank.events import EventSet, Steps
from overlapprof.renderers import csv, table
from overlapprof.report import Report

NAMES = ["aten::mm", "aten::add", "aten::matmul"]
MM, ADD, MATMUL = range(3)


def _spans(rows) -> EventSet:
    """(start, end, key, thread) rows as a compute EventSet (anchor = start)."""
    start, end, key, thread = (np.array(c) for c in zip(*rows))
    n = start.size
    return EventSet(start.astype(float), end.astype(float), start.astype(float), np.zeros(n, bool),
                    np.zeros(n, np.int8), np.ones(n, bool), key.astype(np.int32), thread.astype(np.int32))


STEPS = Steps(np.array([1, 2]), np.array([0.0, 100.0]), np.array([100.0, 200.0]))
COMM = (np.array([10.0, 110.0]), np.array([40.0, 140.0]))  # U(comm): 30 µs in each step


def _hand_made():
    rows = [(50 + 3 * k, 52 + 3 * k, MM, 0) for k in range(5)]  # mm outside: 2 µs each
    rows += [(11 + 5 * k, 14 + 5 * k, MM, 0) for k in range(5)]  # mm inside (step 1): 3 µs each: factor 1.5
    rows += [(135, 145, MM, 0)]  # mm in step 2, 5 of its 10 µs under comm
    rows += [(12, 13, ADD, 1), (150, 151, ADD, 1)]  # add: 1 inside, 1 outside: too few
    rows += [(110, 130, MATMUL, 2), (111, 129, MM, 2)]  # an mm inside a matmul: only the matmul is a span
    return _spans(rows)


def test_hand_made_spans_give_the_exact_factor_and_slowed_time():
    build = InterferenceBuilder(STEPS, nest=True)
    build.add(_hand_made())
    got, slowed = build.result(COMM, NAMES)
    by = {c.name: c for c in got.classes}
    mm = by["aten::mm"]
    assert (mm.inside, mm.outside, mm.inside_mean_us, mm.outside_mean_us) == (5, 5, 3.0, 2.0)
    assert mm.factor == pytest.approx(1.5)
    # 5 inside spans of 3 µs and 5 µs of the partial one, each paying 1 - 1/1.5 = 1/3 of it
    assert mm.overlapped_us == 20.0 and mm.slowed_us == pytest.approx(20 / 3)
    assert by["aten::add"].factor is None and by["aten::add"].overlapped_us == 1.0  # 1 inside, 1 outside
    assert by["aten::matmul"].factor is None and by["aten::matmul"].overlapped_us == 20.0
    assert got.slowed_us == pytest.approx(20 / 3) and got.unmeasured_us == 21.0 and got.min_samples == MIN_SAMPLES
    assert slowed == pytest.approx([5.0, 5 / 3])  # step 1: 15 µs inside; step 2: the partial span's 5
    assert [c.name for c in got.classes] == ["aten::matmul", "aten::mm", "aten::add"]  # most overlapped first
    assert got.factors() == {"aten::mm": pytest.approx(1.5)}


def test_without_nesting_every_span_counts():
    """GPU mode: kernels do not nest, so no span is dropped (the enclosed mm counts here)."""
    build = InterferenceBuilder(STEPS, nest=False)
    build.add(_hand_made())
    got, _ = build.result(COMM, NAMES)
    assert {c.name: c for c in got.classes}["aten::mm"].overlapped_us == 20.0 + 18.0


def test_top_level_carries_across_batches():
    rec = _hand_made()
    whole = top_level(_rows(rec), {})
    reach: dict = {}
    cut = 110.5  # a bucket edge between the matmul's start (110) and the enclosed mm's (111)
    first = rec.start < cut
    parts = np.concatenate([top_level(_rows(rec.select(first)), reach), top_level(_rows(rec.select(~first)), reach)])
    assert whole.sum() == len(rec) - 1
    assert list(parts) == list(np.concatenate([whole[first], whole[~first]]))


def _rows(s: EventSet):
    build = InterferenceBuilder(STEPS, nest=True)
    build.add(s)
    return build.held[0]


@pytest.mark.parametrize("seed", range(4))
def test_on_disk_in_random_batches_equals_in_memory(seed):
    rng = np.random.default_rng(seed)
    n = 3000
    start = np.round(rng.uniform(0, 1000, n), 3)
    end = start + np.round(rng.exponential(4.0, n), 3) * (rng.random(n) < 0.95)
    key, thread = rng.integers(0, 3, n), rng.integers(0, 4, n)
    spans = _spans(list(zip(start, end, key, thread)))
    comm = (np.arange(0, 1000, 50.0), np.arange(0, 1000, 50.0) + rng.uniform(5, 40, 20))
    steps = Steps(np.arange(10), np.arange(0, 1000, 100.0), np.arange(100, 1001, 100.0))
    memory = InterferenceBuilder(steps, nest=True)
    memory.add(spans)
    want = memory.result(comm, NAMES)
    edges = np.sort(rng.uniform(0, 1000, 7))
    with Store(0) as store:  # every bucket on disk
        disk = InterferenceBuilder(steps, nest=True, store=store, edges=edges)
        cuts = np.sort(rng.integers(0, n, 2))
        for a, b in zip([0, *cuts], [*cuts, n]):
            disk.add(spans.select(np.arange(n)[a:b]))
        got = disk.result(comm, NAMES)
        assert store.spilled == edges.size + 1
        assert store.log.live == 0  # the buckets are removed as read
    assert got[0] == want[0] and got[1] == want[1]


def test_real_async_all_reduce(runs, tmp_path):
    report = overlapprof.analyze(runs.allreduce, workers=1)
    for r in report.ranks:
        i = r.interference
        assert i is not None and r.metrics.overlapped_us > 0
        matmul = next(c for c in i.classes if c.name == "aten::matmul")
        # 16 profiled steps, 4 buckets each: the matmul runs both beside communication and not
        assert matmul.inside >= MIN_SAMPLES and matmul.outside >= MIN_SAMPLES and matmul.factor > 0
        assert matmul.factor == pytest.approx(matmul.inside_mean_us / matmul.outside_mean_us)
        assert i.slowed_us == pytest.approx(sum(c.slowed_us for c in i.classes if c.slowed_us is not None))
        assert i.net_overlap_gain_us == pytest.approx(r.metrics.overlapped_us - i.slowed_us)
        assert all(s.net_overlap_gain_us == pytest.approx(s.overlapped_us - s.slowed_us) for s in r.steps)
        assert not any(c.name.startswith(("c10d::", "ProfilerStep")) for c in i.classes)
    text = table.render(report)
    assert "slowed while overlapped" in text
    for r in report.ranks:
        m = next(c for c in r.interference.classes if c.name == "aten::matmul")
        if r.interference.classes.index(m) < 3:  # the table names the 3 most overlapped classes
            assert f"aten::matmul {m.factor:.2f}x (n={m.inside} in/{m.outside} out" in text
    head, *rows = csv.render(report, by="step").splitlines()
    assert head.endswith("slowed_us,net_overlap_gain_us") and len(rows) == sum(len(r.steps) for r in report.ranks)
    path = tmp_path / "r.json"
    report.save(path)
    again = Report.load(path)
    assert again.ranks[0].interference == report.ranks[0].interference
    assert class_factors(again) == {r.rank: r.interference.factors() for r in report.ranks}


def test_too_few_spans_are_said_and_give_no_factor():
    """tests/data/trace_filter: 2 steps of a real 128-rank NCCL job; most kernels run once or
    twice a step, too few to give a factor: their overlapped time is unmeasured, not slowed."""
    report = overlapprof.analyze(Path(__file__).parent / "data" / "trace_filter", workers=1)
    for r in report.ranks:
        i = r.interference
        few = [c for c in i.classes if c.inside < MIN_SAMPLES or c.outside < MIN_SAMPLES]
        assert few and all(c.factor is None and c.slowed_us is None for c in few)
        assert i.unmeasured_us == pytest.approx(sum(c.overlapped_us for c in few))
        assert i.unmeasured_us > 0.9 * r.metrics.overlapped_us
        assert i.net_overlap_gain_us == pytest.approx(r.metrics.overlapped_us - i.slowed_us)
    assert "(too few spans: n=1 in/1 out)" in table.render(report)
