"""Ranks forked from the fork server (launch/forkserver.py) start as a fresh interpreter would: with
the launcher's environment at launch time (not the server's), torchelastic's variables and one
intra-op thread; OVERLAPPROF_FORKSERVER=0 starts them as fresh interpreters, children of the
launcher. Real ranks (tests/workloads/environment.py records what each was started with)."""

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO


@pytest.mark.parametrize("forkserver", [None, "0"])
def test_ranks_get_the_launchers_environment(tmp_path, forkserver):
    env = {k: v for k, v in os.environ.items() if k not in ("OVERLAPPROF_FORKSERVER", "PYTHONUNBUFFERED",
                                                            "OMP_NUM_THREADS", "NCCL_DEBUG")}
    env["OVERLAPPROF_TEST_MARKER"] = "launcher"
    if forkserver is not None:
        env["OVERLAPPROF_FORKSERVER"] = forkserver
    proc = subprocess.run([sys.executable, "-m", "overlapprof", "run", str(REPO / "tests" / "workloads" / "environment.py"),
                           "--nproc", "2", "--nccl-debug", "WARN", "--run-id", "env", "--out", str(tmp_path), "--no-analyze", "-q",
                           "--warmup-steps", "0", "--wait", "0", "--warmup", "0", "--active", "1"],
                          capture_output=True, text=True, timeout=300, cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = json.loads((tmp_path / "env-sync" / "run.json").read_text())
    ranks = {int(r): {k: v["profiled"][0] for k, v in info["metrics"].items()} for r, info in run["ranks"].items()}
    launcher_pid = run["nodes"]["0"]["pid"]
    for rank in (0, 1):
        assert ranks[rank]["marker"] == 1 and ranks[rank]["rank_env"] == 1, ranks
        assert ranks[rank]["nccl_debug"] == 1, ranks  # set after the server started
        assert ranks[rank]["unbuffered"] == 0, ranks  # the server's, not the launcher's
        assert ranks[rank]["torch_threads"] == 1, ranks  # OMP_NUM_THREADS=1, set by the launcher
    parents = {ranks[r]["parent_pid"] for r in (0, 1)}
    if forkserver == "0":
        assert parents == {launcher_pid}, (parents, launcher_pid)
    else:
        assert len(parents) == 1 and launcher_pid not in parents, (parents, launcher_pid)
