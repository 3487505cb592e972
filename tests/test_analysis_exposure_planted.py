"""Causes planted in real runs (issue 26): 2 gloo ranks, each cause put there on purpose by a
workload option, and the analysis names it. (Whether removing a cause saves the time attributed
to it is measured, not asserted: benchmarks/cause_bench.py.)

- a rank that sleeps before each step (``--opt slow_rank/slow_ms``): its peer's exposed
  communication is late_peer, named after it, and it was doing neither compute nor communication;
- a host synchronization in the async ring's window (``--opt host_sync=true``: a barrier on
  CPU): host_blocked is the largest cause;
- an extra all_reduce issued just before the buckets' (``--opt extra_numel``): more queued time
  than without it;
- blocking calls (the sync ring) are no_window and late_peer, never window_short; the async
  ring's are mostly window_short.
"""

from __future__ import annotations

import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

import overlapprof

REPO = Path(__file__).resolve().parent.parent
# Long enough that the sleep dominates the peer's late window: its own step compute, which a
# loaded machine stretches, stays a small share of it (at 30 ms, 'other' was 79.7% once, 80% asked;
# at 60 ms and the ring's default size, a loaded machine (load 6 on 2 cores, 2026-12-06 17:44 UTC)
# made the median wait 79.5 ms, past 1.3 x 60: its compute and the rounds after the sleep add a
# load-sized absolute amount, so the sleep is 150 ms and the sleeper's ring is small (size 320: 1/8
# of the default's matmul flops), each step's extra then a small share of the sleep).
SLOW_MS = 150.0
SLOW_SIZE = 320
STEPS = 4
# Over an emulated 1 Gbit/s link a transfer lasts long enough (8 ms a ring round) for a host sync
# or a collective in front of it to matter; on plain loopback it is over in a fraction of a ms.
LINK = ("--link-rate", "1gbit") if shutil.which("unshare") and shutil.which("tc") else ()


def _run(out: Path, workload: str, variant: str, run_id: str, *opts: str, link=()):
    args = [sys.executable, "-m", "overlapprof", "run", REPO / "workloads" / f"{workload}.py", "--nproc", "2",
            "--variant", variant, "--run-id", run_id, "--out", out, "--no-analyze", "--active", str(STEPS),
            "--warmup-steps", "1", *link]
    for opt in opts:
        args += ["--opt", opt]
    proc = subprocess.run(list(map(str, args)), capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return overlapprof.analyze(out / f"{run_id}-{variant}", workers=1)


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    out = tmp_path_factory.mktemp("planted")
    return {
        "slow": _run(out, "ring", "async", "slow", "slow_rank=1", f"slow_ms={SLOW_MS}", f"size={SLOW_SIZE}"),
        "host_sync": _run(out, "ring", "async", "hostsync", "host_sync=true", link=LINK),
        "extra": _run(out, "allreduce", "async", "extra", "extra_numel=262144", link=LINK),
        "plain": _run(out, "allreduce", "async", "plain", link=LINK),
    }


def _share(exposure, cause: str) -> float:
    return getattr(exposure, f"{cause}_us") / exposure.total_us()


def test_a_sleeping_rank_is_the_late_peer_its_peer_waited_for(planted):
    report = planted["slow"]
    waiting = report.rank(0)
    e = waiting.exposure
    per_step = sorted(s.exposure.late_peer_us for s in waiting.steps)
    # rank 0 waits out rank 1's sleep each step (less the matmul it runs meanwhile, plus the
    # sleep's overshoot and the rounds after it on a loaded machine)
    assert 0.7 * SLOW_MS * 1000 <= per_step[len(per_step) // 2] <= 1.3 * SLOW_MS * 1000, per_step
    assert e.late_peer_by_rank.get(1, 0.0) >= 0.95 * e.late_peer_us
    assert e.late_peer_activity.get("other", 0.0) >= 0.8 * e.late_peer_us  # rank 1 slept: neither
    assert e.largest()[0] == "late_peer"
    assert report.rank(1).exposure.late_peer_us < 0.2 * e.late_peer_us  # the sleeper hardly waits
    # the late rank is the lever: the verdict says so first, with what it was doing (issue 39 item 6)
    assert waiting.verdict.startswith("late-peer-limited: ") and re.search(
        r"waits for a late rank: (mostly )?rank 1\b[^:]*, doing other \d+%", waiting.verdict), waiting.verdict
    assert "; behind it, " in waiting.verdict, waiting.verdict


def test_a_host_sync_in_the_window_is_host_blocked(planted):
    """The barrier holds each rank until the link has drained: the rank that reached it first
    waited for the other there (late_peer), and the rest of its time is host_blocked."""
    ranks = planted["host_sync"].ranks
    exposed = sum(r.metrics.exposed_comm_us for r in ranks)
    host = sum(r.exposure.host_blocked_us for r in ranks)
    late = sum(r.exposure.late_peer_us for r in ranks)
    assert host > 0.3 * exposed and host + late > 0.8 * exposed, [r.exposure for r in ranks]
    assert any(r.exposure.largest()[0] == "host_blocked" for r in ranks)


def test_an_extra_collective_before_the_buckets_queues_them(planted):
    extra, plain = planted["extra"], planted["plain"]
    for rank in (0, 1):
        with_it, without = extra.rank(rank).exposure, plain.rank(rank).exposure
        per_step = lambda e, rep: e.queued_us / len(rep.rank(rank).steps)  # noqa: E731
        assert per_step(with_it, extra) > per_step(without, plain) + 500, (with_it, without)


def test_blocking_calls_are_no_window_and_async_ones_window_short(runs):
    sync = overlapprof.analyze(runs.ring["sync"], workers=1)
    async_ = overlapprof.analyze(runs.ring["async"], workers=1)
    for r in sync.ranks:
        e = r.exposure
        assert e.window_short_us == 0 and e.queued_us == 0 and e.host_blocked_us == 0
        assert e.no_window_us + e.late_peer_us == pytest.approx(r.metrics.exposed_comm_us)
        assert e.no_window_us > 0
    # what is not window_short is the posting calls' own time (a c10d call before its span opens):
    # in the median (rank, step), as a posting call that a busy core holds up for milliseconds in a
    # few steps can outweigh the rest (the totals failed so in one idle suite run, 2026-12-07)
    steps = [s.exposure for r in async_.ranks for s in r.steps]
    assert statistics.median(e.window_short_us for e in steps) > statistics.median(e.no_window_us for e in steps)
    assert all(r.exposure.host_blocked_us == 0 for r in async_.ranks)
    # the sync trace has no windows: its bound is first-order, and says so
    assert sync.ranks[0].overlap_bound_form.startswith("first-order")
    assert any("every call blocked" in n for n in sync.exposure_notes)
    assert async_.ranks[0].overlap_bound_form.startswith("windows")


def test_causes_add_up_on_real_runs(planted, runs):
    """The five causes split the exposed communication exactly on every rank, step and kind of
    real runs (planted or not), and late_peer is the cross-rank section's exposed wait."""
    reports = [*planted.values(), *(overlapprof.analyze(runs.ring[v], workers=1) for v in ("sync", "async")),
               overlapprof.analyze(runs.allreduce, workers=1)]
    for report in reports:
        for r in report.ranks:
            assert r.exposure.total_us() == pytest.approx(r.metrics.exposed_comm_us, rel=1e-9, abs=1e-6)
            for part in (*r.steps, *r.kinds):
                assert part.exposure.total_us() == pytest.approx(part.exposed_comm_us, rel=1e-9, abs=1e-6)
            assert r.exposure.late_peer_us == pytest.approx(report.crossrank.rank(r.rank).exposed_wait_us)
            assert all(s.overlap_bound_us <= s.step_us for s in r.steps)
