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


def _inside(e, calls_by_thread):
    return any(s <= e["ts"] < t for s, t in calls_by_thread.get((e["pid"], e["tid"]), ()))


def test_blocking_waits_in_c10d_calls_are_comm(runs):
    """OVERLAP.md v2 on the blocking ring, recomputed in plain Python from the raw trace: comm is
    U(c10d::* calls, gloo:* spans) (the blocking waits inside c10d::send/recv_ before gloo opens
    its spans count), compute the cpu_ops outside every communication call of their thread."""
    import json
    from pathlib import Path

    run_dir = runs.ring["sync"]
    report = overlapprof.analyze(run_dir, workers=1)
    traces = json.loads((run_dir / "run.json").read_text())["traces"]
    waits = []
    for rank, files in traces.items():
        events = [e for f in files for e in json.loads((Path(run_dir) / f).read_text())["traceEvents"]
                  if e.get("ph") == "X"]
        is_call = lambda e: e["cat"] == "cpu_op" and (e["name"].startswith("c10d::")  # noqa: E731
                                                      or e["name"] == "record_param_comms")
        calls = {}
        for e in events:
            if is_call(e):
                calls.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
        spans = [(e["ts"], e["ts"] + e["dur"]) for e in events if e["cat"] == "user_annotation"
                 and e["name"].startswith("gloo:")]
        c10d = [(e["ts"], e["ts"] + e["dur"]) for e in events if is_call(e) and e["name"].startswith("c10d::")]
        comm = _union(spans + c10d)
        compute = _union((e["ts"], e["ts"] + e["dur"]) for e in events if e["cat"] == "cpu_op" and not is_call(e)
                         and not e["name"].startswith("ProfilerStep#") and not _inside(e, calls))
        r = report.rank(int(rank))
        total = sum(e - s for s, e in comm)
        assert abs(r.metrics.comm_us - total) <= 1e-6 * total
        assert abs(r.metrics.compute_us - sum(e - s for s, e in compute)) <= 1e-6 * r.metrics.compute_us
        waits.append(_minus(_union(c10d), _union(spans)))
    assert max(waits) > 0  # the blocking waits show: c10d calls cover time no gloo span does
    assert not any("c10d::" in w for w in report.warnings)  # nothing uncounted any more
