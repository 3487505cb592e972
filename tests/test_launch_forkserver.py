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


def test_a_ctrl_c_while_the_server_is_spawned_reaches_the_launcher():
    """The launcher spawns the server with SIGINT ignored (so that the server's import of torch is
    quiet on Ctrl-C) and blocked: a SIGINT that lands meanwhile stays pending and raises
    KeyboardInterrupt in the launcher once its handler is back (ignored only, it was lost: a fresh
    clone's run went on to its end). A process started meanwhile inherits SIGINT ignored and
    blocked; the server's first import (rank_server) unblocks it, or the ranks forked from the
    server would never see a Ctrl-C. In a fresh interpreter with one thread, as the launcher is
    when it starts the server (in this test process torch's own threads may take the signal)."""
    launcher = """
import os, signal, subprocess, sys
from overlapprof.launch import forkserver
probe = ("import signal, sys\\n"
         "if sys.argv[1] == 'server': import overlapprof.launch.rank_server\\n"
         "blocked = signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, [])\\n"
         "print(blocked, signal.getsignal(signal.SIGINT) is signal.SIG_IGN, flush=True)\\n")
try:
    with forkserver._server_environment():
        for role in ("plain", "server"):
            out = subprocess.run([sys.executable, "-c", probe, role], capture_output=True, text=True).stdout
            print(role, out.strip(), flush=True)
        os.kill(os.getpid(), signal.SIGINT)
    print("lost", flush=True)
except KeyboardInterrupt:
    print("interrupted", signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, []), flush=True)
"""
    proc = subprocess.run([sys.executable, "-c", launcher], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.stdout.splitlines() == ["plain True True", "server False True", "interrupted False"], \
        (proc.stdout, proc.stderr[-2000:])
