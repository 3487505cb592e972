"""The Slurm recipe for dask-jobqueue of docs/cluster.md, run as written, with Slurm's commands stood in for.

There is no Slurm here, so ``sbatch`` is a small script that copies the job script dask-jobqueue
writes, runs it in the background (in a session of its own) and prints what sbatch prints; ``scancel``
ends that session, ``squeue`` lists nothing. Everything else is real: dask-jobqueue's
SLURMCluster and its scheduler, the worker command line it puts in the job script, the workers it
starts, and ``overlapprof.analyze`` / ``overlapprof analyze --dask-scheduler-file`` on them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import overlapprof

pytest.importorskip("distributed")
dask_jobqueue = pytest.importorskip("dask_jobqueue")

DATA = Path(__file__).parent / "data"
MULTI_RANK = DATA / "trace_filter"

SBATCH = """#!/bin/bash
id=$(( 1000 + RANDOM ))
cp "${@: -1}" "$FAKE_SLURM_DIR/job-$id.sh"  # read at submission, as sbatch does: the caller removes it
setsid bash "$FAKE_SLURM_DIR/job-$id.sh" > "$FAKE_SLURM_DIR/job-$id.log" 2>&1 < /dev/null &
echo "$!" > "$FAKE_SLURM_DIR/job-$id.pid"
echo "Submitted batch job $id"
"""
SCANCEL = """#!/bin/bash
for id in "$@"; do
  f="$FAKE_SLURM_DIR/job-$id.pid"
  [ -f "$f" ] && kill -- -"$(cat "$f")" 2>/dev/null
done
exit 0
"""


@pytest.fixture
def fake_slurm(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("sbatch", SBATCH), ("scancel", SCANCEL), ("squeue", "#!/bin/bash\nexit 0\n")):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SLURM_DIR", str(tmp_path))
    return tmp_path


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


@pytest.mark.timeout(180)
def test_docs_slurm_recipe(fake_slurm):
    scheduler_file = fake_slurm / "scheduler.json"
    local = json.loads(overlapprof.analyze([str(MULTI_RANK)], workers=1).to_json())
    cluster = dask_jobqueue.SLURMCluster(cores=2, processes=2, memory="2GB", walltime="00:10:00",
                                         scheduler_options={"scheduler_file": str(scheduler_file)})
    try:
        script = cluster.job_script()
        assert "#SBATCH" in script and "--nthreads 1" in script, script  # cores / processes: one thread each
        cluster.scale(jobs=1)  # 1 job x 2 single-threaded workers
        report = overlapprof.analyze([str(MULTI_RANK)], dask_scheduler=cluster.scheduler_address)
        assert json.loads(report.to_json()) == local
        cli = subprocess.run([sys.executable, "-m", "overlapprof", "analyze", str(MULTI_RANK), "--dask-scheduler-file",
                              str(scheduler_file), "--json", "-", "-q"], capture_output=True, text=True, timeout=120)
        assert cli.returncode == 0, cli.stderr
        assert json.loads(cli.stdout) == local
        jobs = [int(p.read_text()) for p in fake_slurm.glob("job-*.pid")]
        assert len(jobs) == 1 and _alive(jobs[0])
    finally:
        cluster.close()
    deadline = time.monotonic() + 30
    while _alive(jobs[0]) and time.monotonic() < deadline:  # scancel ended the job's session
        time.sleep(0.2)
    assert not _alive(jobs[0])
