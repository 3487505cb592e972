"""OVERLAPPROF_PIN=1: each CPU rank's threads, gloo's included, on a share of the cores of its own
(launch/host.pin_rank); unset, every rank may run anywhere. Real ranks (tests/workloads/affinity.py
records what each thread may use)."""

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO

CORES = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
pytestmark = pytest.mark.skipif(len(CORES) < 2, reason="needs 2 cores this process may use")


def _run(tmp_path, run_id, pin):
    env = {k: v for k, v in os.environ.items() if k != "OVERLAPPROF_PIN"}
    if pin is not None:
        env["OVERLAPPROF_PIN"] = pin
    proc = subprocess.run([sys.executable, "-m", "overlapprof", "run", str(REPO / "tests" / "workloads" / "affinity.py"),
                           "--nproc", "2", "--run-id", run_id, "--out", str(tmp_path), "--no-analyze", "-q",
                           "--warmup-steps", "0", "--wait", "0", "--warmup", "0", "--active", "1"],
                          capture_output=True, text=True, timeout=300, cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = json.loads((tmp_path / f"{run_id}-sync" / "run.json").read_text())
    return run, {int(r): {k: v["profiled"][0] for k, v in info["metrics"].items()} for r, info in run["ranks"].items()}


def test_pinned_ranks_get_disjoint_cores_for_all_their_threads(tmp_path):
    run, ranks = _run(tmp_path, "pinned", "1")
    share = len(CORES) // 2
    assert [ranks[r]["first_cpu"] for r in (0, 1)] == [CORES[0], CORES[share]], ranks
    assert [ranks[r]["cpus"] for r in (0, 1)] == [share, share], ranks
    assert [ranks[r]["threads_elsewhere"] for r in (0, 1)] == [0, 0], ranks  # gloo's threads inherited it
    assert run["env"]["OVERLAPPROF_PIN"] == "1"


def test_unpinned_ranks_may_use_every_core(tmp_path):
    run, ranks = _run(tmp_path, "free", None)
    assert [ranks[r]["cpus"] for r in (0, 1)] == [len(CORES)] * 2, ranks
    assert "OVERLAPPROF_PIN" not in run["env"]
