"""A host's cores shared by its ranks in the replay (overlapprof/analysis/replay/sharing.py): on
hand-made lanes with an exact answer, and on the README's command 1 (4 ranks on 2 cores), whose
async run computed 1.29x what its sync trace did (2026-12-07)."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from overlapprof.analysis.replay.engine import replay
from overlapprof.analysis.replay.sharing import CoreSharing
from overlapprof.analysis.replay.timeline import BOUND, Lane, Traced


def _lanes(starts: dict[int, float], compute: float = 400.0) -> Traced:
    """Ranks with one step each: ``compute`` µs of compute from their start, nothing else."""
    z, zi = np.empty(0), np.empty(0, dtype=np.int64)
    lanes = {r: Lane(r, [t, t + compute], [BOUND, BOUND], [0, 1], [compute, 0.0], [compute, 0.0], [1],
                     [compute]) for r, t in starts.items()}
    return Traced(lanes, zi, zi, z, z, z, z, z, zi, zi, zi, z, z, zi, z, [], np.empty(0, dtype=bool), "cpu")


def _steps(out):
    return {r: rs.step_us for r, rs in out.ranks.items()}


def test_ranks_that_computed_in_turn_share_one_core_when_a_change_runs_them_at_once():
    """One core: rank 0 computed [0, 400), rank 1 [500, 900), each alone (a share of 1). Moved to
    start together, each gets half the core: 800 µs each, twice the work's wall time."""
    traced = _lanes({0: 0.0, 1: 500.0})
    sharing = CoreSharing(traced, {"vm": (1, [0, 1])})
    together = _lanes({0: 0.0, 1: 0.0})
    out, notes = sharing(together)
    assert _steps(out) == {0: [pytest.approx(800.0)], 1: [pytest.approx(800.0)]}
    assert together.lanes[1].compute[0] == pytest.approx(800.0)
    assert len(notes) == 1 and "+100.0%" in notes[0] and "2 ranks on 1 cores" in notes[0]
    # nothing changed: the traced steps back, no note
    again = copy.deepcopy(traced)
    out, notes = sharing(again)
    assert _steps(out) == _steps(replay(traced)) and notes == []


def test_ranks_that_shared_the_core_in_the_trace_keep_their_time_when_they_still_do():
    """Traced together on one core (a share of ½ each), still together: no change."""
    traced = _lanes({0: 0.0, 1: 0.0})
    out, notes = CoreSharing(traced, {"vm": (1, [0, 1])})(_lanes({0: 0.0, 1: 0.0}))
    assert _steps(out) == {0: [pytest.approx(400.0)], 1: [pytest.approx(400.0)]} and notes == []
    # and apart where they were together: each alone now, the core-time it took at ½: 200 µs
    out, _ = CoreSharing(traced, {"vm": (1, [0, 1])})(_lanes({0: 0.0, 1: 1000.0}))
    assert _steps(out) == {0: [pytest.approx(200.0)], 1: [pytest.approx(200.0)]}


def test_a_host_with_a_core_per_rank_is_never_scaled():
    traced = _lanes({0: 0.0, 1: 500.0})
    sharing = CoreSharing(traced, {"vm": (2, [0, 1])})
    out, notes = sharing(_lanes({0: 0.0, 1: 0.0}))
    assert _steps(out) == {0: [pytest.approx(400.0)], 1: [pytest.approx(400.0)]} and notes == []
    # nor a run whose hosts are not known (a user's own traces, a GPU run)
    out, notes = CoreSharing(traced, {})(_lanes({0: 0.0, 1: 0.0}))
    assert _steps(out)[0] == [pytest.approx(400.0)] and notes == []
