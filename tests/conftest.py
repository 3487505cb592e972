"""Shared fixtures. Append only (several areas share this file); keep expensive ones session-scoped."""

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@dataclass
class Runs:
    """Real 2-rank CPU/gloo runs of `overlapprof run`, made once per test session, all in ``root``:
    the ring's sync and async variants in one invocation (``ring_stdout``/``ring_stderr`` are its
    output) and one async allreduce run (collectives, for TensorBoard's Distributed view)."""

    root: Path
    ring: dict
    allreduce: Path
    ring_stdout: str
    ring_stderr: str


def _overlapprof(*args, timeout=240):
    return subprocess.run([sys.executable, "-m", "overlapprof", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, cwd=REPO)


@pytest.fixture(scope="session")
def runs(tmp_path_factory) -> Runs:
    root = tmp_path_factory.mktemp("runs")
    ring = _overlapprof("run", REPO / "workloads/ring.py", "--nproc", 2, "--variant", "sync", "--variant", "async",
                        "--out", root)
    assert ring.returncode == 0, ring.stderr[-3000:]
    allreduce = _overlapprof("run", REPO / "workloads/allreduce.py", "--nproc", 2, "--variant", "async",
                             "--run-id", "allreduce", "--out", root)
    assert allreduce.returncode == 0, allreduce.stderr[-3000:]
    dirs = {p.name.rsplit("-", 1)[-1]: p for p in root.glob("ring-*")}
    assert set(dirs) == {"sync", "async"}, sorted(root.iterdir())
    return Runs(root=root, ring=dirs, allreduce=root / "allreduce-async", ring_stdout=ring.stdout,
                ring_stderr=ring.stderr)


# -- overlapprof run (issue 2): real runs of the workloads, each (workload, nproc) once per session

SHORT_SCHEDULE = ("--warmup-steps", 1, "--wait", 0, "--warmup", 1, "--active", 2)
WORKLOAD_VARIANTS = {  # checked against the files by tests/test_run_workloads.py
    "ring": ("sync", "async"),
    "allreduce": ("sync", "async"),
    "collectives": ("sync", "async", "broadcast", "all_reduce", "scatter", "wait_vs_sync"),
}
# What 4 ranks show that 2 do not: the ring's two different neighbours, collectives' second pair
# (0-1, 2-3) and scatter's list of world-size chunks. The other variants' 4-rank runs would repeat
# their 2-rank ones (each variant's launch costs ~6 s of rank start-up).
FOUR_RANK_VARIANTS = {"ring": ("sync", "async"), "collectives": ("sync", "async", "scatter")}
# Collectives' 4-rank variants are not run again on 2 ranks: their 2-rank runs showed nothing the
# 4-rank ones do not (the same calls, one pair fewer), and cost ~5 s of CPU each. The ring's 2-rank
# variants stay: they are the ``runs`` fixture's, which costs nothing more.
TWO_RANK_ONLY = {"collectives": tuple(v for v in WORKLOAD_VARIANTS["collectives"]
                                      if v not in FOUR_RANK_VARIANTS["collectives"])}


def variants_run(name, nproc):
    """The variants ``workload_runs(name, nproc)`` runs (none: that pair is not run)."""
    if nproc == 2:
        return TWO_RANK_ONLY.get(name, WORKLOAD_VARIANTS[name])
    return FOUR_RANK_VARIANTS.get(name, ())


@dataclass(frozen=True)
class Schedule:
    """What a run's profiler schedule makes of its steps, as run.json records it."""

    profiler: tuple  # run.json's profiler: (wait, warmup, active, repeat)
    steps: dict  # step kind -> how many steps of it, in each rank's step_times_ms
    profiled_steps: tuple  # their ProfilerStep numbers


SHORT = Schedule((0, 1, 2, 1), {"warmup": 1, "unprofiled": 2, "profiler_warmup": 1, "profiled": 2}, (3, 4))
DEFAULT = Schedule((1, 1, 16, 1), {"warmup": 2, "unprofiled": 16, "profiler_warmup": 1, "profiled": 16},
                   tuple(range(18, 34)))  # overlapprof run's defaults


@dataclass
class WorkloadRun:
    """One ``overlapprof run`` of every variant of a workload on ``nproc`` CPU ranks (gloo)."""

    proc: subprocess.CompletedProcess
    dirs: dict  # variant -> run directory
    nproc: int
    schedule: Schedule


@pytest.fixture(scope="session")
def workload_runs(tmp_path_factory, runs):
    """``workload_runs(name, nproc)`` -> WorkloadRun of workloads/<name>.py (its
    ``variants_run(name, nproc)``), made on first use with a short profiler schedule and no
    analysis, then shared by every test that asks. The ring on 2 ranks is the ``runs`` fixture's
    (the default schedule, analyzed): a launch of its own would repeat it."""
    root = tmp_path_factory.mktemp("workload_runs")
    made = {("ring", 2): WorkloadRun(subprocess.CompletedProcess([], 0, runs.ring_stdout, runs.ring_stderr),
                                     dict(runs.ring), 2, DEFAULT)}

    def get(name, nproc):
        if (name, nproc) not in made:
            run_id = f"{name}{nproc}"
            assert variants_run(name, nproc), (name, nproc)
            variants = [a for v in variants_run(name, nproc) for a in ("--variant", v)]
            proc = _overlapprof("run", REPO / "workloads" / f"{name}.py", "--nproc", nproc,
                                "--run-id", run_id, "--out", root, "--no-analyze",
                                *SHORT_SCHEDULE, *variants, timeout=600)
            dirs = {v: root / f"{run_id}-{v}" for v in variants_run(name, nproc)}
            made[name, nproc] = WorkloadRun(proc, dirs, nproc, SHORT)
        return made[name, nproc]

    return get


# -- hypothesis: derandomized by default, so a CI run tests the same examples every time; set
# HYPOTHESIS_PROFILE=explore to search new ones (and fix what it finds before it lands).
import os  # noqa: E402

from hypothesis import settings as _hypothesis_settings  # noqa: E402

_hypothesis_settings.register_profile("repeatable", derandomize=True)
_hypothesis_settings.register_profile("explore", derandomize=False)
_hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repeatable"))


# -- torch (issue 11): tests that launch ranks need it; where it is absent they are skipped, not
# errors. By fixture (the session's runs) or by module (the ones that launch their own).
import importlib.util  # noqa: E402


def _have_torch() -> bool:
    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        return False


TORCH_FIXTURES = frozenset({"runs", "workload_runs", "straggler_runs"})
TORCH_MODULES = frozenset({"test_run_failures", "test_run_link", "test_run_multinode", "test_run_workloads"})


def pytest_collection_modifyitems(config, items):
    if _have_torch():
        return
    skip = pytest.mark.skip(reason="needs torch (./scripts/setup.sh installs torch==2.13.0 CPU): it launches ranks")
    for item in items:
        module = getattr(item, "module", None)
        if TORCH_FIXTURES & set(getattr(item, "fixturenames", ())) or getattr(module, "__name__", "") in TORCH_MODULES:
            item.add_marker(skip)


# -- issue 29: the workloads users recognise (ddp, fsdp, pipeline) and a user-style DDP script
# recorded with overlapprof.profile under torch.distributed.run; 2 CPU ranks each, made once.

USER_WORKLOADS = ("ddp", "fsdp", "pipeline")
USER_SCHEDULE = ("--warmup-steps", 1, "--wait", 0, "--warmup", 1, "--active", 3)
USER_OPTIONS = ("--opt", "width=256", "--opt", "batch=1024")  # a layer's compute ~ its communication
# examples/ddp_profile.py, small: 8 layers of 256 (256 KiB each) in 0.25 MiB buckets
EXAMPLE_ARGS = ("--active", 4, "--width", 256, "--batch", 128, "--bucket-cap-mb", 0.25)


@dataclass
class UserRuns:
    root: Path
    procs: dict  # workload or example run id -> CompletedProcess
    dirs: dict  # (workload, variant) or ("example", run id) -> run directory


def torchrun(*args, timeout=240):
    """``python -m torch.distributed.run --standalone`` as a user runs it (a free port: tests run side by side;
    OMP_NUM_THREADS=1 as overlapprof run sets it)."""
    import os as _os

    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, cwd=REPO,
                          env={**_os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)})


@pytest.fixture(scope="session")
def user_runs(tmp_path_factory) -> UserRuns:
    root = tmp_path_factory.mktemp("user_runs")
    procs, dirs = {}, {}
    for name in USER_WORKLOADS:
        procs[name] = _overlapprof("run", REPO / "workloads" / f"{name}.py", "--nproc", 2, "--run-id", name,
                                   "--out", root, "--no-analyze", "-q", *USER_SCHEDULE, *USER_OPTIONS,
                                   "--variant", "sync", "--variant", "async", timeout=300)
        dirs.update({(name, v): root / f"{name}-{v}" for v in ("sync", "async")})
    for run_id, extra in (("ddp-no-sync", ("--no-sync",)), ("ddp", ())):
        procs[run_id] = torchrun("--nproc-per-node", 2, REPO / "examples" / "ddp_profile.py", "--out", root,
                                 "--run-id", run_id, *EXAMPLE_ARGS, *extra)
        dirs["example", run_id] = root / run_id
    return UserRuns(root, procs, dirs)


TORCH_FIXTURES = TORCH_FIXTURES | {"user_runs"}


# -- refusals of bad input, in this process: a subprocess for each cost ~2 s of imports
def overlapprof_here(*args):
    """``overlapprof ARGS`` run by click's runner in this process, from the repository (as
    ``_overlapprof`` runs it); a click Result (exit_code, stdout, stderr). An exception that
    escaped the command's one-line errors exits 1, so a test that wants exit 2 rules it out.
    What the interpreter itself prints (an import's warning) shows only in a real process:
    a test that asserts the whole of stderr is one line runs one (``_overlapprof``)."""
    import contextlib

    from click.testing import CliRunner

    from overlapprof.cli import main

    with contextlib.chdir(REPO):
        return CliRunner().invoke(main, list(map(str, args)))


# -- issue 39: a user's own job under torch.distributed.run (test_profiling.py) and a
# tensorboard_trace_handler folder of 2 ranks x 2 cycles (test_handler_cycles.py), made per module.
TORCH_FIXTURES = TORCH_FIXTURES | {"own_job", "handler_cycles"}


# -- a run on a loaded machine (test_compare.py, test_profiling.py): CPU burners (other
# processes) take most of the machine while the run's steps are measured.
# - Each burner runs in a session of its own, as each rank does (torchelastic starts ranks with
#   start_new_session): where the kernel shares the CPU between sessions first (autogroup, on here),
#   burners in one session were one group beside each rank's, and took only about a third of an
#   idle 2-core machine (0.27-0.42 measured), less on a machine others load; one group each, 2 a
#   core beside 2 ranks should take about 2/3 of it, with autogroup or without (not yet measured
#   idle; loaded by others, 2026-12-06 18:32 UTC, load 10: 0.75 against 0.46-0.55 quiet).
# - They start once the ranks have started up (``ready()``), not before: the launcher shares the
#   test's session, and under the burners its start-up (importing torch) took several times as
#   long; the load of the start-up is not judged.
BURNERS_PER_CORE = 2


def loaded_run(command, ready, out_dir, timeout=300, env=None):
    """Run ``command`` (a list) from the repository; once ``ready()`` (polled) or the command has
    ended, start BURNERS_PER_CORE x cores busy-looping Python processes, each in its own session,
    until it ends. A CompletedProcess."""
    import os as _os
    import time as _time

    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / "loaded.stdout", "w+") as stdout, open(out_dir / "loaded.stderr", "w+") as stderr:
        proc = subprocess.Popen(list(map(str, command)), stdout=stdout, stderr=stderr, text=True, cwd=REPO, env=env)
        burners = []
        try:
            deadline = _time.monotonic() + timeout
            while proc.poll() is None and not ready() and _time.monotonic() < deadline:
                _time.sleep(0.05)
            burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
                       for _ in range(BURNERS_PER_CORE * (_os.cpu_count() or 1))]
            proc.wait(timeout=max(1.0, deadline - _time.monotonic()))
        finally:
            for b in burners:
                b.kill()
                b.wait()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        stdout.seek(0)
        stderr.seek(0)
        return subprocess.CompletedProcess(proc.args, proc.returncode, stdout.read(), stderr.read())


def ranks_started(run_dir, nproc=2):
    """Whether every rank of an ``overlapprof run`` in ``run_dir`` has started up: its log has
    Kineto's first profiler_stop (torch imported, the profiler's start-up done), or, where Kineto
    logs nothing, its progress file names a step."""
    import json as _json

    def started(rank):
        try:
            if "profiler_stop" in (run_dir / "logs" / f"rank{rank}.stderr.log").read_text():
                return True
            return _json.loads((run_dir / "progress" / f"rank{rank}.json").read_text()).get("step") is not None
        except (OSError, ValueError):
            return False

    return lambda: all(started(r) for r in range(nproc))
