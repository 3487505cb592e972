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


def _union(intervals):
    merged = []
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged


def _minus(a, b):
    """|A \\ B| of two sorted disjoint interval lists, by brute force over A's pieces."""
    total = 0.0
    for start, end in a:
        covered = sum(max(0.0, min(end, e) - max(start, s)) for s, e in b)
        total += (end - start) - covered
    return total


def test_time_inside_c10d_calls_outside_comm(runs):
    """The blocking ring waits inside c10d::send/recv_ before gloo opens its spans: that time is
    reported per rank (independently recomputed from the raw trace here) and warned about, while
    comm_us stays OVERLAP.md's."""
    import json
    import re
    from pathlib import Path

    run_dir = runs.ring["sync"]
    report = overlapprof.analyze(run_dir, workers=1)
    traces = json.loads((run_dir / "run.json").read_text())["traces"]
    annotation = re.compile(r"^[A-Za-z0-9_]+:[A-Za-z0-9_]+(?:\s.*)?$", re.DOTALL)
    for rank, files in traces.items():
        events = [e for f in files for e in json.loads((Path(run_dir) / f).read_text())["traceEvents"]
                  if e.get("ph") == "X"]
        calls = _union((e["ts"], e["ts"] + e["dur"]) for e in events
                       if e["cat"] == "cpu_op" and e["name"].startswith("c10d::"))
        comm = _union((e["ts"], e["ts"] + e["dur"]) for e in events
                      if e["cat"] == "user_annotation" and annotation.match(e["name"]))
        r = report.rank(int(rank))
        assert abs(r.uncounted_wrapper_us - _minus(calls, comm)) <= 1e-6 * max(1.0, r.uncounted_wrapper_us)
        assert abs(r.metrics.comm_us - sum(e - s for s, e in comm)) <= 1e-6 * r.metrics.comm_us  # unchanged
    worst = max(report.ranks, key=lambda r: r.uncounted_wrapper_us)
    assert worst.uncounted_wrapper_us > 0.05 * worst.metrics.comm_us  # the blocking waits show
    warned = [w for w in report.warnings if "c10d::" in w]  # one line for all ranks, the worst named
    flagged = [r for r in report.ranks if r.uncounted_wrapper_us > 0.05 * r.metrics.comm_us]
    assert len(warned) == 1 and "OVERLAP.md" in warned[0]
    assert f"rank {worst.rank}: " in warned[0] or f"{len(flagged)} ranks, most rank {worst.rank}: " in warned[0]
    assert f"{worst.uncounted_wrapper_us / 1000:.3f} ms" in warned[0]
    table = CliRunner().invoke(main, ["analyze", str(run_dir)]).stdout
    assert f"rank {worst.rank} {worst.uncounted_wrapper_us / 1000:.3f} ms" in table
    # GPU traces: not measured (None), nothing said
    gpu = overlapprof.analyze(Path(__file__).parent / "data" / "nccl_parser_config", workers=1)
    assert gpu.ranks[0].uncounted_wrapper_us is None and not any("c10d::" in w for w in gpu.warnings)
