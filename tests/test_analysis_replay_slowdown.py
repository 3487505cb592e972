"""The charge for compute a change moves beside communication or away from it
(overlapprof/analysis/replay/slowdown.py), on a hand-made trace: a loopback rank with both a
measured factor and the copying of its transfers is charged at the larger rate, both ways."""

from __future__ import annotations

import copy

import pytest

from overlapprof.analysis.rank.classify import KINDS
from overlapprof.analysis.replay.cores import Crowded
from overlapprof.analysis.replay.predict import _load
from overlapprof.analysis.replay.slowdown import slow
from overlapprof.analysis.replay.timeline import BOUND, ISSUE, NEED

import synthetic as S


def _traced(tmp_path):
    """400 µs of compute, an async all_reduce of 4000 bytes (300 µs) with 299 µs of compute beside
    it, waited at its end, 300 µs more: one step of 1000 µs on each of 2 ranks."""
    events = [S.step(1, 0, 1000), S.cpu_op("aten::mm", 0, 400), S.cpu_op("c10d::allreduce_", 400, 1),
              S.annotation("gloo:all_reduce", 400, 300, tid=200,
                           args={"Input Dims": [[1000]], "Input type": ["float"]}),
              S.cpu_op("aten::mm", 401, 299), S.cpu_op("aten::mm", 700, 300)]
    for rank in (0, 1):
        S.write(tmp_path / f"rank{rank}.json", S.trace(events, rank=rank, world_size=2, backend="gloo"))
    return _load([str(tmp_path)], workers=1)[1]


def _waited_at_once(tr):
    """``tr`` with rank 0's wait moved to right after the issue: the compute beside the all_reduce
    now runs after it."""
    new = copy.deepcopy(tr)
    lane = new.lanes[0]
    assert (lane.kind, lane.work, lane.compute) == ([BOUND, ISSUE, NEED, BOUND], [400, 300, 300, 0], [400, 299, 300, 0])
    lane.work, lane.compute = [400.0, 0.0, 600.0, 0.0], [400.0, 0.0, 599.0, 0.0]
    return new


def test_a_loopback_rank_is_charged_and_given_back_at_the_larger_rate(tmp_path):
    """Rank 0 runs 2x as long beside communication (measured: 1 − 1/2 = 0.5 of each µs) and its
    transfers copy 80 bytes a µs (the all_reduce's 4000 bus bytes sent and received: 8000 bytes,
    100 µs of copying). Waited at once, the 299 µs beside the all_reduce leave it: the factor gives
    back 0.5 × 299 = 149.5 µs, the copying the 99.7 µs of them beside its first 100 µs; the larger,
    149.5, is given back (the compute goes from 999 to 849.5 µs), as 149.5 is charged the other way
    (the compute moved beside it again, from the rewritten lane back to the traced one)."""
    tr = _traced(tmp_path)
    new = _waited_at_once(tr)
    crowded = {0: Crowded(0, cores=2, ranks=2, share=0.05, rates={(KINDS.index("all_reduce"), 2): 80.0})}
    away = copy.deepcopy(new)
    notes = slow(tr, away, {0: 2.0}, crowded)
    assert sum(away.lanes[0].compute) == pytest.approx(999 - 149.5)
    assert len(notes) == 1 and "-0.149 ms a step for the compute this change moves away from it" in notes[0]
    beside = copy.deepcopy(tr)
    slow(new, beside, {0: 2.0}, crowded)
    assert sum(beside.lanes[0].compute) == pytest.approx(999 + 149.5)
