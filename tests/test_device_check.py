"""scripts/device_check.sh, the CUDA check (issues 10 and 29), where there is no GPU: its --dry-run
(every command it would run parses, the wheel list pins what is installed), and its verdicts on
real run directories (the CPU ones of the ``user_runs`` fixture, where the CUDA checks must fail).
"""

import os
import subprocess
import sys
import tarfile

import pytest

from conftest import REPO

sys.path.insert(0, str(REPO / "scripts"))
import device_check  # noqa: E402


def test_dry_run_passes():
    proc = subprocess.run([str(REPO / "scripts" / "device_check.sh"), "--dry-run"], capture_output=True, text=True,
                          timeout=300, cwd=REPO, env={**os.environ, "PYTHON": sys.executable})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    for gpus, workloads in ((1, ("allreduce", "collectives", "ddp", "fsdp")),
                            (2, ("allreduce", "collectives", "ddp", "fsdp", "ring", "pipeline"))):
        for workload in workloads:
            assert any(ln.startswith(f"PASS  dry run, {gpus} GPU(s): run {workload} (") for ln in lines), workload
        assert f"PASS  dry run, {gpus} GPU(s): overlapprof.profile profile-ddp: parses" in lines
        assert f"PASS  dry run, {gpus} GPU(s): overhead: parses" in lines
    assert "SKIP  dry run, 1 GPU(s): ring: every variant (needs 2 ranks; NCCL refuses 2 ranks on 1 GPU)" in lines
    assert any(ln.startswith("PASS  dry run: wheels") for ln in lines)
    # the trace checks, on a GPU trace recorded elsewhere: kernels on two streams overlapping, no sync records
    assert "PASS  trace_filter rank 0: CUDA kernels: 1154 in sampled_rank-0.json.gz" in lines
    assert any(ln.startswith("PASS  trace_filter rank 0: comm and compute on different streams, overlapping: "
                             "comm streams ['203', '84'], compute streams ['23', '7'], 59216.0 us") for ln in lines)
    assert any(ln.startswith("FAIL  trace_filter rank 0: CUDA event-sync records: 0 cuda_sync") for ln in lines)
    assert lines[-1] == "dry run: 0 failed of 20 checks"


def test_dry_run_refuses_what_would_not_run(tmp_path):
    bad_variant = device_check.Command("x", [sys.executable, "-m", "overlapprof", "run", str(REPO / "workloads/ring.py"),
                                             "--variant", "nosuch"])
    assert "has no variant 'nosuch'" in device_check.validate(bad_variant)
    bad_option = device_check.Command("x", [sys.executable, "-m", "overlapprof", "run", str(REPO / "workloads/ddp.py"),
                                            "--opt", "bucket_cap=3"])
    assert "has no option 'bucket_cap'" in device_check.validate(bad_option)
    bad_flag = device_check.Command("x", [sys.executable, "-m", "overlapprof", "run", str(REPO / "workloads/ddp.py"),
                                          "--nprocs", "2"])
    assert "No such option '--nprocs'" in device_check.validate(bad_flag)
    bad_script_arg = device_check.Command("x", [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1",
                                                str(REPO / "examples/ddp_profile.py"), "--run-id", "r", "--widht", "3"])
    assert device_check.validate(bad_script_arg) == "arguments refused (exit 2)"


@pytest.fixture(scope="module")
def runs(user_runs):
    for name, proc in user_runs.procs.items():
        assert proc.returncode == 0, f"{name}: {proc.stderr[-3000:]}"
    return user_runs


def test_verdicts_on_cpu_runs(runs, tmp_path, capsys):
    """The check's verdicts on real (CPU) run directories: what holds on CPU passes, what needs
    CUDA fails, and the traces are packed."""
    v = device_check.Verdicts()
    command = device_check.Command("run ddp", [], {x: runs.dirs["ddp", x] for x in ("sync", "async")}, "ddp",
                                   ("async",))
    reports = device_check.run_verdicts(v, command)
    device_check.workload_verdicts(v, command, reports, gpus=2)
    lines = v.lines
    assert "PASS  ddp-sync: run.json: status ok" in lines
    assert "FAIL  ddp-async rank 0: CUDA kernels: 0 in " + runs.dirs["ddp", "async"].joinpath(
        device_check.json.loads((runs.dirs["ddp", "async"] / "run.json").read_text())["traces"]["0"][0]).name in lines
    assert "PASS  ddp-async rank 1: record_function phases: backward, forward" in lines
    assert "FAIL  ddp-async rank 1: distributedInfo: backend gloo, rank 1 of 2" in lines
    assert "INFO  ddp-async rank 0: streams: no communication activity on the GPU (NCCL launched nothing here)" in lines
    assert "FAIL  ddp-async: overlapprof analyze: modes ['cpu']" in lines
    assert any(ln.startswith("PASS  ddp: results equal across variants") for ln in lines)
    assert any(ln.startswith("PASS  ddp: async hides more than sync: overlap ratio 0.00% (sync)") for ln in lines)
    device_check.overhead_verdict(v, "table\n\nmedian ratio over 2 variants: 1.031 (profiled / unprofiled ...)")
    assert v.lines[-1].startswith("PASS  profiler overhead on CUDA steps (target < 1.05): median ratio")
    out, work = tmp_path / "out", runs.root
    out.mkdir()
    assert device_check.finish(v, out, work, started=device_check.time.monotonic()) == 1  # CUDA checks failed
    with tarfile.open(out / "cuda_traces.tar.gz") as tar:
        names = tar.getnames()
    assert "ddp-async/run.json" in names and any(n.startswith("ddp-async/rank0.") for n in names)
    assert (out / "verdicts.txt").read_text().splitlines()[-1].startswith("PASS  the whole check under 8 minutes")
