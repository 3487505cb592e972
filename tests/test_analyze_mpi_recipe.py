"""The dask-mpi recipe of docs/cluster.md, run as written with MPICH's ``mpiexec`` (from pip) in place of
``srun``: rank 0 is the scheduler, the other ranks are workers, and ``overlapprof analyze
--dask-scheduler-file`` on them gives the local report.

Everything is real: MPICH's process manager, mpi4py, dask-mpi's scheduler and workers, the
scheduler file they write, and the CLI reading it. Only the launcher differs: there is no Slurm
here, and ``srun`` and ``mpiexec`` both start the same command once per MPI rank.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import overlapprof

pytest.importorskip("distributed")
pytest.importorskip("dask_mpi")
pytest.importorskip("mpi4py")

BIN = Path(sys.executable).parent
MPIEXEC = shutil.which("mpiexec", path=str(BIN)) or shutil.which("mpiexec")
DASK_MPI = shutil.which("dask-mpi", path=str(BIN))
DATA = Path(__file__).parent / "data"
MULTI_RANK = DATA / "trace_filter"

pytestmark = pytest.mark.skipif(MPIEXEC is None or DASK_MPI is None, reason="no mpiexec or dask-mpi")


@pytest.mark.timeout(240)
def test_docs_dask_mpi_recipe(tmp_path):
    scheduler_file = tmp_path / "scheduler.json"
    local = json.loads(overlapprof.analyze([str(MULTI_RANK)], workers=1).to_json())
    # docs/cluster.md's line, `srun dask-mpi --scheduler-file ... --nthreads 1 &`, launched by mpiexec.
    cluster = subprocess.Popen([MPIEXEC, "-launcher", "fork", "-n", "3", DASK_MPI, "--scheduler-file",
                                str(scheduler_file), "--nthreads", "1"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
                               env={**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"})
    try:
        deadline = time.monotonic() + 120
        while not scheduler_file.exists() and cluster.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert scheduler_file.exists(), cluster.stderr.read().decode()[-2000:] if cluster.poll() is not None else ""
        cli = subprocess.run([sys.executable, "-m", "overlapprof", "analyze", str(MULTI_RANK), "--dask-scheduler-file",
                              str(scheduler_file), "--dask-timeout", "120", "--json", "-", "-q"],
                             capture_output=True, text=True, timeout=180)
        assert cli.returncode == 0, cli.stderr
        assert json.loads(cli.stdout) == local
        assert cluster.poll() is None  # the cluster outlives the command, as the recipe's `&` means
    finally:
        cluster.terminate()  # mpiexec passes it on to every rank (each in a session of its own)
        try:
            cluster.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(cluster.pid, signal.SIGKILL)
            cluster.wait(timeout=30)
    deadline = time.monotonic() + 30
    while _dask_mpi_running() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _dask_mpi_running()


def _dask_mpi_running() -> bool:
    """Whether a dask-mpi process (not a zombie) is left."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                name, rest = f.read().split(" (", 1)[1].rsplit(") ", 1)
        except (OSError, IndexError, ValueError):
            continue
        if name.startswith("dask-mpi") and not rest.startswith("Z"):
            return True
    return False
