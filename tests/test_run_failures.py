"""Runs that go wrong: a rank that raises, a deadlock, a hang, Ctrl-C, bad input, an existing
run directory.

Each is a real ``overlapprof run``; the assertions are on the exit code, the last line of
stderr, and what is left on disk.
"""

import gzip
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, SHORT_SCHEDULE, _overlapprof, overlapprof_here

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
    assert line.endswith(f"; logs and traces kept in {run_dir}")


def test_a_failed_setup_says_no_trace_was_written(tmp_path):
    proc = _overlapprof("run", TEST_WORKLOADS / "crash.py", "--nproc", 2, "--run-id", "s", "--out", tmp_path,
                        "--opt", "in_setup=true")
    assert proc.returncode == 1
    line = last_line(proc.stderr)
    assert "rank 1: RuntimeError: setup failed on rank 1" in line and "phase 'setup'" in line
    assert line.endswith(f"; logs (no trace was written) kept in {tmp_path / 's-sync'}")
    assert (tmp_path / "s-sync" / "logs" / "rank1.stderr.log").is_file()


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
    assert "boom on rank 1" in error_file["message"]["message"]  # as torchelastic's @record writes it
    assert "harness.py" in error_file["message"]["extraInfo"]["py_callstack"]  # every frame, there
    # On the console, the traceback holds the workload's frames only.
    shown = [line for line in proc.stderr.splitlines() if 'File "' in line]
    assert shown and all("crash.py" in line for line in shown), shown
    assert "Traceback of rank 1 (its workload's frames" in proc.stderr
    assert "This is typically caused by" not in proc.stderr  # a peer's gloo error: its first sentence only
    assert len(bad["step_times_ms"]["profiled"]) == 1  # ProfilerStep#2 completed


def test_analyze_says_the_run_failed(crashed):
    _, run_dir = crashed
    analyzed = overlapprof_here("analyze", run_dir)
    assert analyzed.exit_code == 0, analyzed.output
    assert (f"warning: run.json: run {run_dir.name} failed (rank 1: ValueError: boom on rank 1 "
            "at ") in analyzed.stdout


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
    # both ranks blocked in recv: rank 0 does not wait its grace (8 s after the 3 s timeout: nothing
    # can unwind them), it exits as soon as both records say so (about 4 s in all, 12 s before)
    took = float(re.search(r"deadlock/sync: failed in ([0-9.]+) s", proc.stderr).group(1))
    assert took < 3 + 8, proc.stderr[-2000:]


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
    result = overlapprof_here("run", "--out", tmp_path / "out", *args)
    assert result.exit_code == 2, (result.output, result.exception)
    assert message in last_line(result.stderr)
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()  # nothing started, nothing written


def test_an_out_that_cannot_hold_run_directories_is_one_line_and_exit_2(tmp_path):
    """--out under a file, and in a folder no run directory can be made in (read-only for this
    user, or /sys, which refuses even root): one line, exit 2, before any rank starts. The first
    case in a real process (the whole of stderr is that line), the others in this one."""
    afile = tmp_path / "afile"
    afile.write_text("kept")
    cases = [(afile / "sub", f"Error: --out {afile / 'sub'}: {afile} is a file, not a folder")]
    if os.geteuid() != 0:
        locked = tmp_path / "ro"
        locked.mkdir(mode=0o555)
        cases.append((locked / "x", f"Error: --out {locked / 'x'}: cannot create folders in {locked} (Permission denied)"))
    if Path("/sys").is_dir():
        cases.append((Path("/sys/overlapprof-test/x"), "Error: --out /sys/overlapprof-test/x: cannot create folders in /sys ("))
    for n, (out, message) in enumerate(cases):
        if n == 0:
            proc = _overlapprof("run", "workloads/ring.py", "--nproc", 2, "--out", out)
            code, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
        else:
            result = overlapprof_here("run", "workloads/ring.py", "--nproc", 2, "--out", out)
            code, stdout, stderr = result.exit_code, result.stdout, result.stderr
        assert code == 2, stderr[-2000:]
        assert last_line(stderr).startswith(message), stderr[-2000:]
        assert len(stderr.strip().splitlines()) == 1 and "[rank" not in stdout
    assert afile.read_text() == "kept" and sorted(p.name for p in tmp_path.iterdir()) in (["afile"], ["afile", "ro"])


def test_a_workload_that_blocks_at_import_ends_at_timeout_naming_the_line(tmp_path):
    """The launcher imports the file to check it before any rank starts: --timeout covers that
    import too (subprocess timeout: it would otherwise hang for an hour)."""
    workload = TEST_WORKLOADS / "import_hang.py"
    proc = _overlapprof("run", workload, "--timeout", 2, "--out", tmp_path / "out", timeout=90)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == [
        f"Error: cannot load workload {workload}: its import made no progress for 2 s (--timeout 2); "
        "blocked at tests/workloads/import_hang.py:6 `time.sleep(3600)`"]
    assert not (tmp_path / "out").exists()


def test_broken_workload_file_names_the_line(tmp_path):
    bad = tmp_path / "broken.py"
    bad.write_text("VARIANTS = {'sync': 'x'}\ndef step(ctx, s)\n    pass\n")
    result = overlapprof_here("run", bad, "--out", tmp_path / "out")
    assert result.exit_code == 2, (result.output, result.exception)
    assert last_line(result.stderr) == (f"Error: cannot load workload {bad} (line 2): SyntaxError: "
                                        "expected ':'")


def test_existing_run_directory_is_never_overwritten(tmp_path):
    existing = tmp_path / "mine-async"
    existing.mkdir()
    (existing / "run.json").write_text("precious")
    result = overlapprof_here("run", "workloads/ring.py", "--run-id", "mine", "--variant", "sync",
                              "--variant", "async", "--out", tmp_path)
    assert result.exit_code == 2, (result.output, result.exception)
    assert last_line(result.stderr) == (f"Error: run directory {existing} exists; runs are never "
                                        "overwritten (pick another --run-id or --out)")
    assert (existing / "run.json").read_text() == "precious"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine-async"]  # sync never started


def test_list_variants_shows_variants_and_options():
    result = overlapprof_here("run", "workloads/collectives.py", "--list-variants")
    assert result.exit_code == 0, (result.output, result.exception)
    lines = result.stdout.splitlines()
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


def test_overlapprofs_own_time_is_not_the_workloads(tmp_path):
    """6 ranks on this machine's cores, --timeout 2: the profiler's start (Kineto's: seconds per
    rank when ranks share cores, more where torch imports torch._inductor for it), saving each
    cycle's trace (--repeat 2) and the ranks meeting are overlapprof's time, not the workload's;
    before, the run failed blaming the workload 'in its own code'. -q: no rank's ok line on the
    console (each is in its log)."""
    proc = _overlapprof("run", "workloads/ring.py", "--nproc", 6, "--timeout", 2, "--repeat", 2,
                        "--out", tmp_path, "--run-id", "t", "-q", "--no-analyze", *SHORT_SCHEDULE,
                        "--opt", "size=64", "--opt", "chunk=1024", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = proc.stdout + proc.stderr
    assert "ok, " not in said and "Traceback" not in said and "Warning" not in said, said[-3000:]
    run = json.loads((tmp_path / "t-async" / "run.json").read_text())
    assert run["status"] == "ok" and all(len(run["traces"][str(r)]) == 2 for r in range(6))
    assert "rank 5: ring/async ok, 2 trace(s)" in (tmp_path / "t-async" / "logs" / "rank5.stdout.log").read_text()


def test_a_rank_that_dies_hard_is_blamed_and_its_peers_errors_are_consequences(tmp_path):
    """Rank 1 calls os._exit(3) in its 4th step (no Python exception): rank 0's failure is a
    consequence, not the cause: a gloo error ("peer") or, when the launcher stops it before its
    next collective (a loaded machine), "terminated"."""
    proc = _overlapprof("run", TEST_WORKLOADS / "hard_exit.py", "--nproc", 2, "--run-id", "h",
                        "--out", tmp_path, "--timeout", 30)
    assert proc.returncode == 1
    line = last_line(proc.stderr)
    assert line.startswith("Error: hard_exit/sync failed: rank 1: exited with code 3"), line
    assert "1 other rank failed as a consequence" in line
    run = json.loads((tmp_path / "h-sync" / "run.json").read_text())
    assert run["failure"]["rank"] == 1 and run["failure"]["error_kind"] == "exit"
    assert run["ranks"]["0"]["error_kind"] in ("peer", "terminated")


def test_a_hang_blames_the_rank_stalled_in_its_own_code_and_keeps_both_traces(tmp_path):
    """Rank 1 sleeps forever in 'compute' of ProfilerStep#3 (profiled); rank 0 waits for it in
    all_reduce. Whichever watchdog fires first, rank 1 is the cause and rank 0 is named as
    waiting; each rank saves the cycle it hung in (the trace of the hang) and analyze reads them.
    Every rank also spends 3 s in a weakref finalizer at exit, where the launcher's SIGTERM lands:
    no traceback from it. --quiet leaves no progress or heartbeat lines."""
    proc = _overlapprof("run", TEST_WORKLOADS / "hang.py", "--nproc", 2, "--timeout", 6,
                        "--out", tmp_path, "--run-id", "h", "--quiet", *SHORT_SCHEDULE,
                        "--opt", "at_step=3", "--opt", "exit_s=3", timeout=180)
    assert proc.returncode == 1, proc.stderr[-3000:]
    line = last_line(proc.stderr)
    assert line.startswith("Error: hang/sync failed: rank 1: made no progress for "), line
    assert "in its own code, at " in line and "hang.py:" in line and "`time.sleep(3600)`" in line
    assert "in phase 'compute' of ProfilerStep#3 (profiled)" in line
    assert "waiting for it: rank 0 (blocked in torch.distributed.all_reduce at " in line
    assert line.endswith("logs and traces kept in " + str(tmp_path / "h-sync"))
    run = json.loads((tmp_path / "h-sync" / "run.json").read_text())
    assert run["failure"]["rank"] == 1 and run["failure"]["error_kind"] == "stalled"
    assert run["failure"]["consequences"] == [0]
    assert run["ranks"]["1"]["waiting_on_peers"] is False
    assert run["ranks"]["0"]["waiting_on_peers"] is True
    assert not any(line.startswith("overlapprof:") for line in proc.stderr.splitlines())
    for noise in ("Traceback", "Exception ignored", "Terminated"):
        assert noise not in proc.stderr, proc.stderr[-3000:]
    for rank in ("0", "1"):
        [trace] = run["traces"][rank]
        steps = {e["name"] for e in json.loads((tmp_path / "h-sync" / trace).read_text())["traceEvents"]}
        assert "ProfilerStep#3" in steps, rank
    analyzed = overlapprof_here("analyze", tmp_path / "h-sync", "--no-comms")
    assert analyzed.exit_code == 0, analyzed.output
    assert "warning: run.json: run h-sync failed (rank 1: made no progress" in analyzed.stdout


def rank_processes(run_dir):
    """Live processes (not zombies) whose command line names ``run_dir``: its ranks."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = next(line for line in (proc / "status").read_text().splitlines()
                         if line.startswith("State:"))
        except (OSError, StopIteration, ValueError):
            continue
        if str(run_dir) in cmdline and "overlapprof.launch.harness" in cmdline \
                and "zombie" not in state:
            found.append(int(proc.name))
    return found


def run_and_interrupt(out, ready, *args):
    """Start `overlapprof run` in its own process group, wait until ``ready(run_dir)``, send
    SIGINT to the group (Ctrl-C) and return (CompletedProcess-like, run_dir)."""
    run_dir = out / "i-sync"
    proc = subprocess.Popen([sys.executable, "-m", "overlapprof", "run", "--out", str(out),
                             "--run-id", "i", "--no-analyze", *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                            start_new_session=True)
    deadline = time.monotonic() + 180
    while not ready(run_dir) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before it could be interrupted"
    os.killpg(proc.pid, signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr), run_dir


def progress_of(run_dir, rank):
    try:
        return json.loads((run_dir / "progress" / f"rank{rank}.json").read_text())
    except (OSError, ValueError):
        return {}


@pytest.fixture(scope="module")
def interrupted_mid_run(tmp_path_factory):
    """slow.py (1 s steps) interrupted once both ranks are in profiled steps: after 6 steps (1
    warm-up, 4 unprofiled, 1 profiler warm-up), long enough for the heartbeat (every 5 s) to see
    the ranks running; the default schedule's 20 steps before the profiled ones took 30 s."""
    def profiling(run_dir):
        return all(progress_of(run_dir, rank).get("step_kind") == "profiled" for rank in (0, 1))

    return run_and_interrupt(tmp_path_factory.mktemp("int"), profiling,
                             TEST_WORKLOADS / "slow.py", "--nproc", 2, "--warmup-steps", 1, "--wait", 0,
                             "--warmup", 1, "--active", 4, "--", "--step-s", 1)


def assert_cleanly_interrupted(proc, run_dir, kept="logs and traces"):
    assert proc.returncode == 130, proc.stderr[-3000:]
    assert last_line(proc.stderr) == f"Error: slow/sync interrupted; {kept} kept in {run_dir}"
    for noise in ("Traceback", "death signal", "KeyboardInterrupt", "failed"):
        assert noise not in proc.stderr + proc.stdout, noise
    run = json.loads((run_dir / "run.json").read_text())
    assert run["status"] == "interrupted" and run["failure"] is None
    assert {info["status"] for info in run["ranks"].values()} == {"interrupted"}
    assert rank_processes(run_dir) == []
    return run


def test_ctrl_c_mid_run_is_interrupted_not_failed(interrupted_mid_run):
    proc, run_dir = interrupted_mid_run
    run = assert_cleanly_interrupted(proc, run_dir)
    assert "slow/sync: interrupted in " in proc.stderr
    # torchelastic's own lines stay in the launcher's log
    assert "death signal" in (run_dir / "logs" / "node0.launcher.log").read_text()
    assert all(run["traces"][rank] for rank in ("0", "1"))  # the cycle in progress was saved
    note = (f"run.json: run {run_dir.name} was interrupted (Ctrl-C): its traces end where it stopped; the step it "
            "stopped in counts as long as it ran (--drop-last-step leaves each rank's last step out)")
    analyzed = overlapprof_here("analyze", run_dir)
    assert analyzed.exit_code == 0, analyzed.output
    assert f"warning: {note}" in analyzed.stdout
    compared = overlapprof_here("compare", run_dir, run_dir, "--label", "a", "--label", "b")
    assert compared.exit_code == 0, compared.output
    assert f"warning: a: {note}" in compared.stdout
    reported = overlapprof_here("report", run_dir, "-o", run_dir.parent / "r.html")
    assert reported.exit_code == 0, reported.output
    assert f"warning: sync: {note}" in reported.stderr


def test_heartbeat_says_which_step_each_rank_is_in(interrupted_mid_run):
    proc, _ = interrupted_mid_run
    beats = [line for line in proc.stderr.splitlines()
             if re.match(r"overlapprof: \d+ s: ranks? ", line)]
    assert beats, proc.stderr[-3000:]
    assert any(re.search(r"ranks 0-1 (warm-up step \d|ProfilerStep#\d+ \(\w+\))", line)
               or re.search(r"rank 0 .*; rank 1 ", line) for line in beats), beats
    assert all("\r" not in line for line in beats)  # not a terminal: plain lines


def test_ctrl_c_during_start_up_is_interrupted_and_leaves_no_rank(tmp_path):
    """SIGINT as soon as the run directory exists: the ranks are still starting (importing
    torch)."""
    proc, run_dir = run_and_interrupt(tmp_path, lambda d: (d / "run.json").is_file(),
                                      TEST_WORKLOADS / "slow.py", "--nproc", 2)
    run = assert_cleanly_interrupted(proc, run_dir, kept="logs (no trace was written)")
    assert all(not run["traces"][rank] for rank in ("0", "1"))
