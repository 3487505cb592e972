"""`overlapprof analyze` on real 2-rank CPU (gloo) runs of workloads/ring.py (the shared `runs`
fixture of tests/conftest.py): the blocking variant hides nothing, the async one clearly does."""

from __future__ import annotations

import overlapprof
from click.testing import CliRunner
from overlapprof.cli import main


def test_sync_hides_nothing_async_hides_clearly_more(runs):
    reports = {v: overlapprof.analyze(runs.ring[v]) for v in ("sync", "async")}
    sync, async_ = reports["sync"].summary, reports["async"].summary
    assert sync.ranks == async_.ranks == 2 and sync.ranks_with_comm == 2
    assert sync.pooled_ratio < 0.02, sync  # send/recv block: no matmul runs while they wait
    assert async_.pooled_ratio > 0.10 and async_.pooled_ratio > sync.pooled_ratio + 0.08, async_
    for variant, report in reports.items():
        assert report.run["variant"] == variant  # run.json travels with the report
        for r in report.ranks:
            assert r.mode == "cpu" and r.rank_source == "distributedInfo" and r.backend == "gloo"
            assert r.steps and all(s.step_us > 0 for s in r.steps)
            assert [k.kind for k in r.kinds] == ["send_recv"]  # the ring only sends and receives
            assert r.timeline is not None and r.timeline.comm


def test_cli_on_a_run_directory(runs):
    result = CliRunner().invoke(main, ["analyze", str(runs.ring["async"]), "--by", "step"])
    assert result.exit_code == 0, result.output
    assert "exposed share" in result.stdout and "mode: cpu" in result.stdout
