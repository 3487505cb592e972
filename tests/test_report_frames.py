"""For notebooks and type checkers: overlapprof.analyze returns the Report, Report.to_pandas() gives
its tables as DataFrames (pandas imported only then, torch never), the workloads' metrics in the
Report, ctx.check_result, py.typed and the LICENSE."""

import subprocess
import sys
from pathlib import Path

import pytest

import overlapprof
from overlapprof.analysis.workload_metrics import workload_metrics
from overlapprof.rundir.run_record import RankRecord, RunRecord
from overlapprof.report import Report

REPO = Path(__file__).resolve().parent.parent
DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def report():
    return overlapprof.analyze([DATA / "trace_filter"], workers=1)


def test_analyze_returns_the_report_and_its_tables(report):
    assert isinstance(report, Report)
    frames = report.to_pandas()
    ranks = frames.ranks.set_index("rank")
    assert list(ranks.index) == [0, 1]
    for r in report.ranks:
        row = ranks.loc[r.rank]
        assert row["comm_us"] == r.metrics.comm_us and row["overlap_ratio"] == r.metrics.overlap_ratio
        assert row["steps"] == len(r.steps) and row["partition_idle_us"] == r.partition.idle_us
        assert row["wait_us"] == report.crossrank.rank(r.rank).wait_us
        # why exposed, and what overlap could buy
        assert row["late_peer_us"] == r.exposure.late_peer_us and row["window_short_us"] == r.exposure.window_short_us
        assert row["overlap_bound_us"] == r.overlap_bound_us and row["verdict"] == r.verdict
    assert (frames.steps["late_peer_us"] + frames.steps["host_blocked_us"] + frames.steps["queued_us"]
            + frames.steps["no_window_us"] + frames.steps["window_short_us"]).to_numpy() == pytest.approx(
        frames.steps["exposed_comm_us"].to_numpy())
    assert len(frames.steps) == sum(len(r.steps) for r in report.ranks) == 4
    first = report.ranks[0].steps[0]
    step = frames.steps.iloc[0]
    assert (step["rank"], step["step"], step["step_us"], step["exposed_comm_us"]) == (
        0, first.step, first.step_us, first.exposed_comm_us)
    assert list(frames.kinds[frames.kinds["rank"] == 0]["kind"]) == ["all_reduce", "all_gather", "all_to_all"]
    instances = report.crossrank.instances
    assert len(frames.collectives) == sum(len(i.ranks) for i in instances) > 0
    one = frames.collectives.iloc[0]
    assert (one["kind"], one["rank"], one["duration_us"], one["transfer_us"]) == (
        instances[0].kind, instances[0].ranks[0], instances[0].durations_us[0], instances[0].transfer_us)
    assert frames.workload_metrics.empty and list(frames.workload_metrics.columns) == ["name", "steps", "rank", "median"]


def test_pandas_on_use_and_never_torch():
    code = ("import sys, overlapprof\n"
            f"report = overlapprof.analyze({str(DATA / 'rank_non_gpu')!r}, workers=1)\n"
            "assert 'pandas' not in sys.modules, 'pandas imported before to_pandas()'\n"
            "frames = report.to_pandas()\n"
            "assert 'pandas' in sys.modules and 'torch' not in sys.modules\n"
            "print(len(frames.ranks))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout == "1\n", proc.stderr


def test_without_pandas_one_line_says_what_to_install():
    code = ("import sys; sys.modules['pandas'] = None\n"
            "import overlapprof\n"
            "from overlapprof.errors import ReportError\n"
            f"report = overlapprof.analyze({str(DATA / 'rank_non_gpu')!r}, workers=1)\n"
            "try:\n    report.to_pandas()\nexcept ReportError as exc:\n    print(exc)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.stdout == "Report.to_pandas() needs pandas: pip install 'overlapprof[pandas]'\n", proc.stderr


def test_workload_metrics_from_run_json():
    run = RunRecord(ranks={
        "0": RankRecord(metrics={"recv_host_ms": {"warmup": [50.0], "profiled": [1.0, 3.0]}, "setup_bytes": {"setup": [8.0]}}),
        "1": RankRecord(metrics={"recv_host_ms": {"profiled": [2.0, 6.0]}}),
    })
    recv, setup = workload_metrics(run)
    assert (recv.name, recv.steps, recv.count, recv.median, recv.min, recv.max, recv.by_rank) == (
        "recv_host_ms", "profiled", 4, 2.5, 1.0, 6.0, {0: 2.0, 1: 4.0})  # the warm-up's 50 left out
    assert (setup.name, setup.steps, setup.count, setup.median, setup.by_rank) == ("setup_bytes", "all", 1, 8.0, {0: 8.0})
    saved = Report.from_json(overlapprof.analyze(DATA / "rank_non_gpu", workers=1).to_json())
    assert saved.workload_metrics == []


def test_check_result_fails_a_wrong_result():
    import torch

    from overlapprof.workload import Context

    ctx = Context(rank=0, world_size=1, local_rank=0, node_rank=0, device=torch.device("cpu"), backend="gloo",
                  variant="async", options={})
    reference = torch.linspace(-1, 1, 1000)
    ctx.check_result("grads", reference.clone(), reference)
    ctx.check_result("grads", reference * (1 + 1e-7), reference)  # rounding: within rtol
    wrong = reference.clone()
    wrong[500] += 0.01
    with pytest.raises(AssertionError, match="variant async: grads differs from the sync variant's"):
        ctx.check_result("grads", wrong, reference)
    values = ctx.metrics["grads_checksum"]["setup"]
    assert len(values) == 3 and values[0] == pytest.approx(values[1], rel=1e-6) and values[0] != pytest.approx(values[2], rel=1e-6)


def test_typed_and_licensed():
    assert (REPO / "overlapprof" / "py.typed").is_file()
    assert "overlapprof = py.typed" in (REPO / "setup.cfg").read_text()
    text = (REPO / "LICENSE").read_text()
    assert text.startswith("MIT License\n") and "Copyright (c) 2026 overlapprof contributors" in text
    assert "license = MIT" in (REPO / "setup.cfg").read_text()
