"""Two launchers, as on two nodes (`--nnodes 2 --node-rank 0/1`), rendezvous on 127.0.0.1 and
write one run directory holding all four ranks."""

import json
import socket
import subprocess
import sys

import pytest

from conftest import REPO, SHORT_SCHEDULE, _overlapprof, overlapprof_here


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    out = tmp_path_factory.mktemp("nodes")
    common = ["run", REPO / "workloads" / "ring.py", "--nproc", 2, "--nnodes", 2, "--run-id",
              "mn", "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--out", out, "--no-analyze",
              "--timeout", 120, "--variant", "sync", "--variant", "async", *SHORT_SCHEDULE]
    node1 = subprocess.Popen([sys.executable, "-m", "overlapprof", *map(str, common),
                              "--node-rank", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, cwd=REPO)
    node0 = _overlapprof(*common, "--node-rank", 0, timeout=300)
    stdout1, stderr1 = node1.communicate(timeout=300)
    return out, node0, (node1.returncode, stdout1, stderr1)


def test_both_nodes_succeed(two_nodes):
    out, node0, (code1, _, stderr1) = two_nodes
    assert node0.returncode == 0, node0.stderr[-3000:]
    assert code1 == 0, stderr1[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["mn-async", "mn-sync"]


@pytest.mark.parametrize("variant", ["sync", "async"])
def test_one_run_directory_holds_every_rank(two_nodes, variant):
    out = two_nodes[0]
    run_dir = out / f"mn-{variant}"
    run = json.loads((run_dir / "run.json").read_text())
    assert run["status"] == "ok" and run["missing_ranks"] == []
    assert (run["world_size"], run["nnodes"], run["nproc_per_node"]) == (4, 2, 2)
    assert sorted(run["nodes"]) == ["0", "1"]
    assert [run["nodes"][k]["command"][-1] for k in ("0", "1")] == ["0", "1"]  # --node-rank K
    placement = {r: (info["node_rank"], info["local_rank"]) for r, info in run["ranks"].items()}
    assert placement == {"0": (0, 0), "1": (0, 1), "2": (1, 0), "3": (1, 1)}
    for rank in range(4):
        files = run["traces"][str(rank)]
        assert len(files) == 1
        info = json.loads((run_dir / files[0]).read_text())["distributedInfo"]
        assert (info["rank"], info["world_size"]) == (rank, 4)
        assert (run_dir / "logs" / f"rank{rank}.stdout.log").is_file()


def test_a_finished_run_cannot_be_joined(two_nodes):
    """Refused before any rank starts: in this process (a subprocess's imports cost ~1 s)."""
    out = two_nodes[0]
    result = overlapprof_here("run", "workloads/ring.py", "--nproc", 2, "--nnodes", 2, "--node-rank", 1,
                              "--run-id", "mn", "--rdzv-endpoint", f"127.0.0.1:{free_port()}",
                              "--out", out, "--variant", "sync")
    assert result.exit_code == 2, (result.output, result.exception)
    assert result.stderr.strip().splitlines()[-1] == (
        f"Error: run directory {out / 'mn-sync'} exists and is not a running 2-node run of "
        "--run-id mn; runs are never overwritten")
