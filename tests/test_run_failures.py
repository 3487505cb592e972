"""Runs that go wrong: a rank that raises, a deadlock, bad input, an existing run directory.

Each is a real ``overlapprof run``; the assertions are on the exit code, the last line of
stderr, and what is left on disk.
"""

import gzip
import json

import pytest

from conftest import REPO, SHORT_SCHEDULE, _overlapprof

TEST_WORKLOADS = REPO / "tests" / "workloads"


def last_line(text):
    return text.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def crashed(tmp_path_factory):
    """Rank 1 of 2 raises in ProfilerStep#5, in the second profiler cycle (unprofiled, warm-up,
    profiled: steps 0-2 and 3-5), after the first cycle's trace was saved."""
    out = tmp_path_factory.mktemp("crash")
    proc = _overlapprof("run", TEST_WORKLOADS / "crash.py", "--nproc", 2, "--run-id", "c",
                        "--out", out, "--warmup-steps", 1, "--wait", 0, "--warmup", 1,
                        "--active", 1, "--repeat", 2, "--opt", "at_step=5")
    return proc, out / "c-sync"


def test_crash_names_the_rank_and_its_error(crashed):
    proc, run_dir = crashed
    assert proc.returncode == 1
    line = last_line(proc.stderr)
    assert line.startswith("Error: crash/sync failed: rank 1: ValueError: boom on rank 1")
    assert "crash.py:" in line and "phase 'compute'" in line and "ProfilerStep#5" in line
    assert str(run_dir) in line


def test_crash_keeps_traces_and_logs_and_records_the_failure(crashed):
    proc, run_dir = crashed
    run = json.loads((run_dir / "run.json").read_text())
    assert run["status"] == "failed"
    assert run["failure"]["rank"] == 1 and run["failure"]["error_kind"] == "exception"
    bad = run["ranks"]["1"]
    assert bad["status"] == "failed" and bad["where"] == {"step": 5, "step_kind": "profiled",
                                                          "phase": "compute"}
    assert run["ranks"]["0"]["status"] == "failed"  # its peer died under it
    assert run["ranks"]["0"]["error_kind"] in ("peer", "terminated", "exit")
    for rank in ("0", "1"):
        # cycle 1 was saved before the crash; the cycle in progress is saved on the way out
        assert len(run["traces"][rank]) >= 1
        assert all((run_dir / name).is_file() for name in run["traces"][rank])
        assert (run_dir / "logs" / f"rank{rank}.stderr.log").is_file()
    assert "ValueError: boom on rank 1" in (run_dir / "logs" / "rank1.stderr.log").read_text()
    error_file = json.loads((run_dir / "logs" / "rank1.error.json").read_text())
    assert "boom on rank 1" in error_file["message"]["message"]  # torchelastic's @record
    assert len(bad["step_times_ms"]["profiled"]) == 1  # ProfilerStep#2 completed


def test_deadlock_ends_at_timeout_naming_the_hung_call(tmp_path):
    proc = _overlapprof("run", TEST_WORKLOADS / "deadlock.py", "--nproc", 2, "--timeout", 3,
                        "--out", tmp_path, "--run-id", "d", timeout=120)
    assert proc.returncode == 1
    line = last_line(proc.stderr)
    assert line.startswith("Error: deadlock/sync failed: rank ")
    assert "timed out: no progress for 3 s (--timeout 3)" in line
    assert "blocked in torch.distributed.recv at " in line and "deadlock.py:" in line
    assert "dist.recv(buf" in line and "phase 'comm' of warmup step 0" in line
    run = json.loads((tmp_path / "d-sync" / "run.json").read_text())
    assert run["status"] == "failed" and run["failure"]["error_kind"] == "timeout"


@pytest.mark.parametrize("args,message", [
    (["tests/workloads/nope.py"], "workload file tests/workloads/nope.py not found"),
    (["workloads/ring.py", "--variant", "asink"],
     "has no variant 'asink' (did you mean 'async'?) (variants: sync, async)"),
    (["workloads/ring.py", "--opt", "sise=3"], "has no option 'sise' (did you mean 'size'?)"),
    (["workloads/ring.py", "--opt", "size=big"], "option 'size' expects an integer, got 'big'"),
    (["workloads/ring.py", "--", "--rounds"], "workload argument '--rounds' needs a value"),
    (["workloads/ring.py", "--opt", "size"], "workload option 'size' is not key=value"),
    (["workloads/ring.py", "--device", "cuda"], "--device cuda: no CUDA device is available"),
    (["workloads/ring.py", "--nnodes", "2", "--node-rank", "1"], "--nnodes > 1 needs --run-id"),
    (["workloads/ring.py", "--node-rank", "1"], "--node-rank 1 is not below --nnodes 1"),
    (["workloads/ring.py", "--run-id", "a/b"], "--run-id 'a/b': use letters"),
    (["workloads/ring.py", "--nccl-debug", "LOUD"], "'LOUD' is not one of VERSION, WARN, INFO"),
])
def test_bad_input_is_one_line_and_exit_2_before_any_rank(tmp_path, args, message):
    proc = _overlapprof("run", "--out", tmp_path / "out", *args)
    assert proc.returncode == 2, proc.stderr
    assert message in last_line(proc.stderr)
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()  # nothing started, nothing written


def test_broken_workload_file_names_the_line(tmp_path):
    bad = tmp_path / "broken.py"
    bad.write_text("VARIANTS = {'sync': 'x'}\ndef step(ctx, s)\n    pass\n")
    proc = _overlapprof("run", bad, "--out", tmp_path / "out")
    assert proc.returncode == 2
    assert last_line(proc.stderr) == (f"Error: cannot load workload {bad} (line 2): SyntaxError: "
                                      "expected ':'")


def test_existing_run_directory_is_never_overwritten(tmp_path):
    existing = tmp_path / "mine-async"
    existing.mkdir()
    (existing / "run.json").write_text("precious")
    proc = _overlapprof("run", "workloads/ring.py", "--run-id", "mine", "--variant", "sync",
                        "--variant", "async", "--out", tmp_path)
    assert proc.returncode == 2
    assert last_line(proc.stderr) == (f"Error: run directory {existing} exists; runs are never "
                                      "overwritten (pick another --run-id or --out)")
    assert (existing / "run.json").read_text() == "precious"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine-async"]  # sync never started


def test_list_variants_shows_variants_and_options():
    proc = _overlapprof("run", "workloads/collectives.py", "--list-variants")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[1] == "variants:"
    assert any(line.split()[:1] == ["sync"] and line.endswith("(default)") for line in lines)
    for name in ("async", "broadcast", "all_reduce", "scatter", "wait_vs_sync", "size", "numel",
                 "keep_scatter_list", "slow_rank", "slow_ms"):
        assert any(line.split()[:1] == [name] for line in lines), name


def test_options_after_dashes_straggler_gzip_and_repeat(tmp_path):
    """One run exercising the options: `--` workload arguments (a bare bool flag too), the
    common slow_rank/slow_ms, --gzip, --repeat and --nccl-debug."""
    proc = _overlapprof("run", "workloads/collectives.py", "--variant", "scatter", "--nproc", 2,
                        "--out", tmp_path, "--run-id", "o", "--gzip", "--repeat", 2,
                        "--nccl-debug", "INFO:INIT,COLL", "--no-analyze", *SHORT_SCHEDULE,
                        "--opt", "slow_rank=1", "--", "--keep-scatter-list", "--numel=1024",
                        "--slow-ms", "30")
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = tmp_path / "o-scatter"
    run = json.loads((run_dir / "run.json").read_text())
    assert run["options"]["keep_scatter_list"] is True and run["options"]["numel"] == 1024
    assert (run["options"]["slow_rank"], run["options"]["slow_ms"]) == (1, 30.0)
    assert (run["env"]["NCCL_DEBUG"], run["env"]["NCCL_DEBUG_SUBSYS"]) == ("INFO", "INIT,COLL")
    for rank in ("0", "1"):
        assert len(run["traces"][rank]) == 2  # one per profiler cycle
        assert all(name.endswith(".pt.trace.json.gz") and (run_dir / name).is_file()
                   for name in run["traces"][rank])
    kept = run["ranks"]["0"]["metrics"]["scatter_src_kept_bytes"]
    values = sorted(v for per_kind in kept.values() for v in per_kind)
    assert values == [2 * 1024 * 4 * (i + 1) for i in range(1 + 2 * (2 + 1 + 2))]  # grows each step
    slow = run["ranks"]["1"]["step_times_ms"]["profiled"]
    assert all(t >= 30 for t in slow)  # the straggler sleeps 30 ms in every step
    with gzip.open(run_dir / run["traces"]["1"][0], "rt") as f:
        names = {e["name"] for e in json.load(f)["traceEvents"]}
    assert "straggle" in names


def test_a_rank_that_dies_hard_is_blamed_and_its_peers_errors_are_consequences(tmp_path):
    """Rank 1 calls os._exit(3) in its 4th step (no Python exception): rank 0's gloo error is a
    consequence ("peer"), not the cause."""
    proc = _overlapprof("run", TEST_WORKLOADS / "hard_exit.py", "--nproc", 2, "--run-id", "h",
                        "--out", tmp_path, "--timeout", 30)
    assert proc.returncode == 1
    line = last_line(proc.stderr)
    assert line.startswith("Error: hard_exit/sync failed: rank 1: exited with code 3"), line
    assert "1 other rank failed as a consequence" in line
    run = json.loads((tmp_path / "h-sync" / "run.json").read_text())
    assert run["failure"]["rank"] == 1 and run["failure"]["error_kind"] == "exit"
    assert run["ranks"]["0"]["error_kind"] == "peer"
