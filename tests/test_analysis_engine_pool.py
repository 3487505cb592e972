"""`overlapprof analyze --dask-scheduler`: the per-rank work on a real Dask distributed cluster.

Each cluster is a real `dask scheduler` and two `dask worker` processes (one thread each, no
dashboard, no nanny) on 127.0.0.1, started as subprocesses. The workers run in a folder of their
own (the client sends them absolute paths); where a test needs workers that cannot read the
traces, they run in a mount namespace with a tmpfs over the traces' folder.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import overlapprof
from overlapprof.analysis.engine.pool import DaskScheduler

import synthetic as S

distributed = pytest.importorskip("distributed")

REPO = Path(__file__).resolve().parent.parent
DATA = Path(__file__).parent / "data"
MULTI_RANK = DATA / "trace_filter"  # two real ranks of a 128-rank NCCL job
HIDING = ["unshare", "--mount", "--propagation", "private", "sh", "-c"]


def _can_hide() -> bool:
    """Whether this user may mount a tmpfs in a mount namespace of its own (root, usually)."""
    try:
        return subprocess.run([*HIDING, "mount -t tmpfs tmpfs /mnt"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


class Cluster:
    """A `dask scheduler` and ``workers`` `dask worker` processes on 127.0.0.1."""

    def __init__(self, root: Path, workers: int = 2, env: dict | None = None, hide: Path | None = None):
        """``hide``: a folder the workers see empty (a tmpfs over it in their own mount
        namespace), as a worker on a node without the client's filesystem would."""
        self.root, self.hide = root, hide
        root.mkdir(parents=True, exist_ok=True)
        self.scheduler_file = root / "scheduler.json"
        self.env = {**os.environ, **(env or {})}
        self.logs = []
        self.scheduler = self._start("scheduler", "scheduler", "--host", "127.0.0.1", "--port", "0",
                                     "--no-dashboard", "--scheduler-file", self.scheduler_file)
        deadline = time.monotonic() + 60
        while not self.scheduler_file.exists():
            assert self.scheduler.poll() is None, self.log_tail()
            assert time.monotonic() < deadline, "the scheduler wrote no scheduler file in 60 s"
            time.sleep(0.1)
        time.sleep(0.2)  # the file is written whole, but give the writer a moment to close it
        self.address = json.loads(self.scheduler_file.read_text())["address"]
        cwd = root / "worker-cwd"
        cwd.mkdir()
        self.workers = [self._start(f"worker{n}", "worker", self.address, "--nthreads", 1, "--nworkers", 1,
                                    "--no-nanny", "--no-dashboard", "--host", "127.0.0.1", cwd=cwd)
                        for n in range(workers)]
        self.client = distributed.Client(self.address, timeout=30, set_as_default=False)
        self.client.wait_for_workers(workers, timeout=90)

    def _start(self, name, *args, cwd=None):
        log = open(self.root / f"{name}.log", "w")
        self.logs.append(log)
        command = [sys.executable, "-m", "dask", *map(str, args)]
        if self.hide is not None and name.startswith("worker"):
            command = [*HIDING, 'mount -t tmpfs tmpfs "$0" && exec "$@"', str(self.hide), *command]
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=cwd or self.root, env=self.env)

    def worker_pids(self) -> dict:
        return self.client.run(os.getpid)  # {worker address: its pid}

    def log_tail(self) -> str:
        return "\n".join(p.read_text()[-1500:] for p in sorted(self.root.glob("*.log")))

    def stop(self):
        """The workers first, then the scheduler: a worker still closing when the scheduler goes
        could hang in its close until killed (20 s a cluster)."""
        self.client.close()
        for group in (self.workers, [self.scheduler]):
            for proc in group:
                if proc.poll() is None:
                    proc.terminate()
            for proc in group:
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        for log in self.logs:
            log.close()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("dask"))
    yield c
    c.stop()


def overlapprof_cli(*args, cwd=REPO, timeout=240):
    return subprocess.run([sys.executable, "-m", "overlapprof", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd)


def assert_one_line_error(proc, code, *needles):
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


_LOCAL = {}


def local_report(paths) -> dict:
    """The report of ``paths`` analyzed here, as JSON data; made once per set of paths (the 150 MB
    rank's took seconds, and two tests compare with it)."""
    key = tuple(str(p) for p in paths)
    if key not in _LOCAL:
        _LOCAL[key] = json.loads(overlapprof.analyze(list(key), workers=1).to_json())
    return _LOCAL[key]


# -- the report equals the local one


def test_cli_report_on_dask_equals_local(cluster):
    proc = overlapprof_cli("analyze", MULTI_RANK, "--dask-scheduler", cluster.address, "--json", "-", "-q")
    assert proc.returncode == 0, proc.stderr
    remote = json.loads(proc.stdout)
    assert len(remote["ranks"]) == 2
    assert remote == local_report([MULTI_RANK])


def test_an_nsys_export_on_dask_equals_local(cluster):
    """Issue 38: the ranks of one Nsight Systems export, each read by a worker from the file."""
    export = REPO / "tests" / "data" / "nsys" / "mfu_2gpu_before.sqlite"
    proc = overlapprof_cli("analyze", export, "--dask-scheduler", cluster.address, "--json", "-", "-q")
    assert proc.returncode == 0, proc.stderr
    remote = json.loads(proc.stdout)
    assert [r["files"] for r in remote["ranks"]] == [[f"{export}#pid=144"], [f"{export}#pid=145"]]
    assert remote == local_report([export])


def test_scheduler_file_and_progress_from_python(cluster):
    """The scheduler file dask writes; progress is reported once per rank, as results arrive."""
    seen = []
    report = overlapprof.analyze([str(MULTI_RANK)], dask_scheduler=DaskScheduler(scheduler_file=str(cluster.scheduler_file)),
                                 progress=lambda done, total, path: seen.append((done, total, Path(path).name)))
    assert json.loads(report.to_json()) == local_report([MULTI_RANK])
    assert [d for d, _, _ in seen] == [1, 2] and {t for _, t, _ in seen} == {2}
    assert {name for _, _, name in seen} == {p.name for p in MULTI_RANK.iterdir()}


def test_one_large_rank_is_read_in_ranges_across_the_workers(cluster):
    """One rank (mtia: 87 MB of JSON, gzip) and a worker to spare: the file's byte ranges are tasks
    of the cluster, and a worker other than the one running the rank's task reads one; the report
    equals the local one. With as many ranks as worker threads (trace_filter), no range task."""
    client = cluster.client
    client.get_task_stream()  # turns on the scheduler's record of which worker ran what
    start = time.time()
    report = overlapprof.analyze([str(DATA / "mtia")], dask_scheduler=cluster.address)
    stream = client.get_task_stream(start=start)
    assert json.loads(report.to_json()) == local_report([DATA / "mtia"])
    rank = {t["worker"] for t in stream if t["key"].startswith("overlapprof-rank-")}
    ranges = {t["worker"] for t in stream if t["key"].startswith("overlapprof-range-")}
    assert len(rank) == 1 and ranges - rank, stream
    start = time.time()
    overlapprof.analyze([str(MULTI_RANK)], dask_scheduler=cluster.address)
    keys = [t["key"] for t in client.get_task_stream(start=start)]
    assert sum(k.startswith("overlapprof-rank-") for k in keys) == 2
    assert not any(k.startswith("overlapprof-range-") for k in keys), keys


def test_cli_scheduler_file_table(cluster):
    proc = overlapprof_cli("analyze", MULTI_RANK, "--dask-scheduler-file", cluster.scheduler_file)
    local = overlapprof_cli("analyze", MULTI_RANK)
    assert proc.returncode == 0 and local.returncode == 0, proc.stderr + local.stderr
    assert proc.stdout == local.stdout and "rank" in proc.stdout


# -- bad input: one line, never a traceback, never a hang


def test_relative_paths_are_read_where_the_client_found_them(cluster, tmp_path):
    """The client finds traces/ relative to its own folder; the workers run in another one and
    are sent absolute paths. The report names the files as given, as a local run does."""
    shutil.copytree(MULTI_RANK, tmp_path / "traces")
    proc = overlapprof_cli("analyze", "traces", "--dask-scheduler", cluster.address, "--json", "-", "-q", cwd=tmp_path)
    local = overlapprof_cli("analyze", "traces", "--json", "-", "-q", cwd=tmp_path)
    assert proc.returncode == 0 and local.returncode == 0, proc.stderr + local.stderr
    remote = json.loads(proc.stdout)
    assert remote == json.loads(local.stdout)
    assert {f for r in remote["ranks"] for f in r["files"]} == {f"traces/{p.name}" for p in MULTI_RANK.iterdir()}


def test_a_rank_measured_again_names_its_files_as_given(cluster, tmp_path):
    """An async send cut at its peer's blocking receive (OVERLAP.md section 1) has its rank
    measured again in the client, from what the worker's read kept: the report still names the
    files as given (the worker measured absolute paths), and equals the local one."""
    import synthetic as S

    def p2p(kind, ts, dur, peer):
        call = "c10d::send" if kind == "send" else "c10d::recv_"
        return [S.cpu_op(call, ts - 5, 10, args={"Concrete Inputs": ["", "", str(peer), "0"]}),
                S.annotation(f"gloo:{kind}", ts, dur, args={"Input Dims": [[1000]], "Input type": ["float"]})]

    rank0 = [*p2p("send", 1000, 40_000, 1), *(S.cpu_op("aten::mm", 1100 + 1000 * k, 900) for k in range(39))]
    rank1 = [*p2p("recv", 1000, 2000, 0), S.cpu_op("aten::mm", 4000, 30_000)]
    (tmp_path / "traces").mkdir()
    for r, events in enumerate((rank0, rank1)):
        S.write(tmp_path / "traces" / f"rank{r}.json", S.trace(events, rank=r, world_size=2, backend="gloo",
                                                               base_ns=10**18))
    proc = overlapprof_cli("analyze", "traces", "--dask-scheduler", cluster.address, "--json", "-", "-q", cwd=tmp_path)
    local = overlapprof_cli("analyze", "traces", "--json", "-", "-q", cwd=tmp_path)
    assert proc.returncode == 0 and local.returncode == 0, proc.stderr + local.stderr
    remote = json.loads(proc.stdout)
    assert [r["p2p"]["ends_from_peer"] for r in remote["ranks"]] == [1, 0]
    assert [r["files"] for r in remote["ranks"]] == [["traces/rank0.json"], ["traces/rank1.json"]]
    assert remote == json.loads(local.stdout)


@pytest.mark.skipif(not _can_hide(), reason="needs a mount namespace of its own (unshare --mount: root)")
def test_path_a_worker_cannot_read_is_named(tmp_path):
    """Workers on which the traces' folder is not mounted: one line naming the first path."""
    traces = tmp_path / "traces"
    shutil.copytree(MULTI_RANK, traces)
    hidden = Cluster(tmp_path / "dask", workers=1, hide=traces)
    try:
        proc = overlapprof_cli("analyze", "traces", "--dask-scheduler", hidden.address, cwd=tmp_path)
    finally:
        hidden.stop()
    line = assert_one_line_error(proc, 2, "Dask worker tcp://127.0.0.1:", f"cannot read {traces}/sampled_rank-",
                                 "mounts at the same place")
    assert any(f"{traces}/{p.name}" in line for p in MULTI_RANK.iterdir()), line


@pytest.mark.timeout(60)
def test_unreachable_scheduler_fails_quickly():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = overlapprof_cli("analyze", MULTI_RANK, "--dask-scheduler", f"tcp://127.0.0.1:{port}", "--dask-timeout", 2,
                           timeout=50)
    assert_one_line_error(proc, 2, "cannot reach the Dask scheduler", f"127.0.0.1:{port}", "within 2 s")


@pytest.mark.timeout(60)
def test_a_listener_that_never_answers_fails_quickly():
    """TCP connects, but nothing speaks Dask (another service on the port): still bounded."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        proc = overlapprof_cli("analyze", MULTI_RANK, "--dask-scheduler", f"tcp://127.0.0.1:{port}",
                               "--dask-timeout", 1, timeout=50)
    assert_one_line_error(proc, 2, f"the Dask scheduler at tcp://127.0.0.1:{port} did not answer within 1 s")


def test_bad_scheduler_options(tmp_path):
    missing = overlapprof_cli("analyze", MULTI_RANK, "--dask-scheduler-file", tmp_path / "none.json")
    assert_one_line_error(missing, 2, "none.json: no such Dask scheduler file")
    (tmp_path / "bad.json").write_text('{"type": "Scheduler"}')
    bad = overlapprof_cli("analyze", MULTI_RANK, "--dask-scheduler-file", tmp_path / "bad.json")
    assert_one_line_error(bad, 2, "bad.json: not a Dask scheduler file (no 'address')")
    both = overlapprof_cli("analyze", MULTI_RANK, "--dask-scheduler", "tcp://127.0.0.1:1", "--workers", 2)
    assert_one_line_error(both, 2, "--workers")


# -- a worker that dies mid-run


@pytest.fixture(scope="module")
def big_ranks(tmp_path_factory):
    """Six generated ranks, each long enough to analyze that a worker can be killed while it runs one."""
    root = tmp_path_factory.mktemp("big_ranks")
    for rank in range(6):
        events = []
        for step in range(40):
            t0 = step * 100_000
            events.append(S.step(step, t0, 99_000))
            for i in range(600):
                ts = t0 + i * 160
                events += S.launched("ncclKernel_AllReduce" if i % 10 == 0 else "gemm", ts, ts + 5, 150)
        S.write(root / f"rank{rank}.json", S.trace(events, rank=rank, world_size=6))
    return root


def _kill_a_busy_worker(cluster, proc, timeout=120, task="overlapprof-rank-"):
    """SIGKILL a worker process that is running a task whose key starts with ``task`` (and no
    rank's task, when that is a range); its address."""
    pids = cluster.worker_pids()
    by_pid = {p.pid: p for p in cluster.workers}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the analysis ended before a worker could be killed: {proc.communicate()}"
        for addr, keys in cluster.client.processing().items():
            keys = [str(k) for k in keys]
            spare = task == "overlapprof-rank-" or not any(k.startswith("overlapprof-rank-") for k in keys)
            if any(k.startswith(task) for k in keys) and spare and pids.get(addr) in by_pid:
                by_pid[pids[addr]].send_signal(signal.SIGKILL)
                by_pid[pids[addr]].wait(timeout=10)
                return addr
        time.sleep(0.01)
    raise AssertionError(f"no worker ran a {task}* task")


def _analyze_in_background(cluster, paths, out: Path):
    return subprocess.Popen([sys.executable, "-m", "overlapprof", "analyze", *map(str, paths), "--dask-scheduler",
                             cluster.address, "--json", str(out), "-q"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, cwd=REPO)


@pytest.mark.timeout(300)
def test_killed_worker_is_retried(tmp_path, big_ranks):
    cluster = Cluster(tmp_path / "cluster")
    try:
        proc = _analyze_in_background(cluster, [big_ranks], tmp_path / "report.json")
        killed = _kill_a_busy_worker(cluster, proc)
        _, stderr = proc.communicate(timeout=200)
        assert proc.returncode == 0, stderr
        assert killed not in cluster.worker_pids()  # it is gone; the other worker did its rank again
    finally:
        cluster.stop()
    remote = json.loads((tmp_path / "report.json").read_text())
    assert len(remote["ranks"]) == 6
    assert remote == local_report([big_ranks])


@pytest.mark.timeout(300)
def test_worker_deaths_past_the_retries_are_one_error_line(tmp_path, big_ranks):
    """With no retry allowed, the rank whose worker died is named in one line (exit 1)."""
    cluster = Cluster(tmp_path / "cluster", env={"DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES": "0"})
    try:
        proc = _analyze_in_background(cluster, [big_ranks], tmp_path / "report.json")
        _kill_a_busy_worker(cluster, proc)
        _, stderr = proc.communicate(timeout=200)
    finally:
        cluster.stop()
    lines = stderr.strip().splitlines()
    assert proc.returncode == 1, stderr
    assert len(lines) == 1 and lines[0].startswith("Error: ") and "kept dying" in lines[0], stderr
    assert any(lines[0].startswith(f"Error: {big_ranks / f'rank{r}.json'}:") for r in range(6)), lines[0]
    assert not (tmp_path / "report.json").exists()


@pytest.fixture(scope="module")
def big_rank(tmp_path_factory):
    """One generated rank of 150 MB of JSON: read in ranges, each long enough to kill its worker."""
    root = tmp_path_factory.mktemp("big_rank")
    subprocess.run([sys.executable, str(REPO / "benchmarks" / "gen_traces.py"), str(root), "--size", "150"],
                   check=True, capture_output=True)
    (root / "expected.txt").unlink()
    return root


@pytest.mark.timeout(300)
@pytest.mark.parametrize("retries", ["3", "0"])
def test_a_worker_killed_mid_range(tmp_path, big_rank, retries):
    """A worker killed while it reads one of a rank's ranges: Dask runs the range again elsewhere
    (the rank's task gives up its thread while it waits, so even on its own worker); with no
    retry allowed, the rank's task reads the whole file itself. Either way, the local report."""
    cluster = Cluster(tmp_path / "cluster", env={"DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES": retries})
    try:
        proc = _analyze_in_background(cluster, [big_rank], tmp_path / "report.json")
        killed = _kill_a_busy_worker(cluster, proc, task="overlapprof-range-")
        _, stderr = proc.communicate(timeout=200)
        assert proc.returncode == 0, stderr
        assert killed not in cluster.worker_pids()
    finally:
        cluster.stop()
    assert json.loads((tmp_path / "report.json").read_text()) == local_report([big_rank])


def test_without_distributed_installed_one_line():
    """As where the [cluster] extra is not installed: `import distributed` fails."""
    code = ("import sys; sys.modules['distributed'] = None; from overlapprof.cli import main; "
            f"sys.argv = ['overlapprof', 'analyze', {str(MULTI_RANK)!r}, '--dask-scheduler', 'tcp://127.0.0.1:1']; main()")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert_one_line_error(proc, 2, "needs the 'distributed' package", "overlapprof[cluster]")
