"""A folder written by ``torch.profiler.tensorboard_trace_handler`` with ``repeat=2`` on 2 ranks
(gloo, under torch.distributed.run): 4 files, ``<host>_<pid>.<time_ns>.pt.trace.json``, 2 per
process. Each process's cycles are one rank (before: refused as "recordings of one process",
with a suggestion that dropped a rank); ``--cycle N`` analyzes one cycle; ``view`` writes the
folder's scalars, and says why when it cannot."""

import shutil
import textwrap

import pytest

import overlapprof
from conftest import overlapprof_here, torchrun
from overlapprof.errors import InputError
from overlapprof.renderers.tensorboard import ensure_scalars

JOB = textwrap.dedent("""
    import os, sys, torch, torch.distributed as dist
    dist.init_process_group("gloo")
    schedule = torch.profiler.schedule(wait=1, warmup=1, active=2, repeat=2)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], schedule=schedule,
                                on_trace_ready=torch.profiler.tensorboard_trace_handler(sys.argv[1])) as prof:
        for _ in range(9):
            torch.randn(256, 256) @ torch.randn(256, 256)
            dist.all_reduce(torch.ones(1024))
            prof.step()
    dist.barrier()  # no rank tears gloo down while its peer still sends (a rank aborted once without it)
    dist.destroy_process_group()
    # every trace is written: end before the interpreter's teardown, as overlapprof's harness does
    # (a rank aborted there once more, "terminate called without an active exception": stop 50)
    sys.stdout.flush(), sys.stderr.flush()
    os._exit(0)
""")


@pytest.fixture(scope="module")
def handler_cycles(tmp_path_factory):
    root = tmp_path_factory.mktemp("handler")
    (root / "job.py").write_text(JOB)
    proc = torchrun("--nproc-per-node", 2, root / "job.py", root / "tb")
    assert proc.returncode == 0, proc.stderr[-3000:]
    files = sorted((root / "tb").iterdir())
    assert len(files) == 4 and len({f.name.split(".")[0] for f in files}) == 2, files
    return root / "tb"


def _by_worker(folder):
    workers = {}
    for f in sorted(folder.glob("*.pt.trace.json"), key=lambda f: int(f.name.split(".")[1])):
        workers.setdefault(f.name.split(".")[0], []).append(str(f))
    return workers


def test_each_process_cycles_are_one_rank(handler_cycles):
    report = overlapprof.analyze(handler_cycles, workers=1)
    assert [r.rank for r in report.ranks] == [0, 1]
    assert sorted(r.files for r in report.ranks) == sorted(_by_worker(handler_cycles).values())  # in time order
    # wait=1, warmup=1, active=2, repeat=2: ProfilerSteps 2-3, then 6-7
    assert [[s.step for s in r.steps] for r in report.ranks] == [[2, 3, 6, 7]] * 2
    assert any("2 profiler cycles of each of 2 process(es) (tensorboard_trace_handler files, repeat=2): each "
               "process's cycles are one rank (--cycle N for one cycle)" in w for w in report.warnings)
    # one all_reduce a step, matched across the ranks in every step of both cycles
    assert [(i.kind, i.ranks, i.step) for i in report.crossrank.instances] == [
        ("all_reduce", [0, 1], step) for step in (2, 3, 6, 7)] and not report.crossrank.unmatched


def test_one_cycle_is_analyzed_with_cycle_n(handler_cycles):
    both = overlapprof.analyze(handler_cycles, workers=1)
    cycles = [overlapprof.analyze(handler_cycles, cycle=n, workers=1) for n in (1, 2)]
    for n, report in enumerate(cycles, 1):
        assert [[s.step for s in r.steps] for r in report.ranks] == [[2, 3], [2, 3]] if n == 1 else [[6, 7]] * 2
        assert report.options.cycle == n and f"--cycle {n}: each rank's profiler cycle {n} alone" in report.filters
        assert sorted(r.files for r in report.ranks) == sorted([fs[n - 1]] for fs in _by_worker(handler_cycles).values())
    for rank in (0, 1):  # the cycles' steps are the whole's, measured the same
        whole = {s.step: s.comm_us for s in both.ranks[rank].steps}
        assert whole == {s.step: s.comm_us for c in cycles for s in c.ranks[rank].steps}
    res = overlapprof_here("analyze", handler_cycles, "--cycle", 3)
    assert res.exit_code == 2 and res.stderr.count("\n") == 1
    assert res.stderr.startswith("Error: --cycle 3: ") and "is one of 2 profiler cycle(s) of its rank; give --cycle 1 to 2" in res.stderr


def test_processes_with_different_cycle_counts_are_refused_but_one_cycle_is_read(handler_cycles, tmp_path):
    folder = tmp_path / "cut"
    shutil.copytree(handler_cycles, folder, ignore=shutil.ignore_patterns("scalars"))
    last = sorted(folder.glob("*.pt.trace.json"), key=lambda f: int(f.name.split(".")[1]))[-1]
    last.unlink()  # one process's second cycle is missing
    with pytest.raises(InputError, match=r"the processes saved different numbers of profiler cycles \(.* 2, .* 1|"
                                         r".* 1, .* 2\): a cycle would lack ranks; analyze the cycle every process "
                                         r"has with --cycle N \(N up to 1\)"):
        overlapprof.analyze(folder, workers=1)
    assert [r.rank for r in overlapprof.analyze(folder, cycle=1, workers=1).ranks] == [0, 1]
    said = []
    assert ensure_scalars(folder, log=said.append) == [] and not (folder / "scalars").exists()
    assert len(said) == 1 and said[0].startswith(f"no scalars for {folder}: {folder}: the processes saved different")


def test_view_writes_the_folders_scalars(handler_cycles):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    said = []
    assert ensure_scalars(handler_cycles.parent, log=said.append) == [handler_cycles] and said == []
    for rank in (0, 1):
        events = EventAccumulator(str(handler_cycles / "scalars" / f"rank{rank}"))
        events.Reload()
        assert [e.step for e in events.Tensors("overlap/comm_us")] == [2, 3, 6, 7]
    assert ensure_scalars(handler_cycles.parent) == []  # never overwritten


def test_two_runs_under_one_worker_name_are_not_cycles(handler_cycles, tmp_path):
    """A second run into the same folder with a fixed worker_name (``rank0``, ``rank1``) repeats
    its ProfilerSteps: refused, where it would have been read as the cycles of one process
    (here each rank's first cycle, saved again as a later run's)."""
    for k, files in enumerate(sorted(_by_worker(handler_cycles).values())):
        first = files[0].rsplit("/", 1)[-1]
        span = int(first.split(".")[1])
        shutil.copy(files[0], tmp_path / f"worker{k}.{span}.pt.trace.json")
        shutil.copy(files[0], tmp_path / f"worker{k}.{span + 10**12}.pt.trace.json")
    with pytest.raises(InputError, match=r"ProfilerStep#2 is in two of rank \d's 2 files \(worker\d\.\d+\.pt\.trace\.json, "
                                         r"worker\d\.\d+\.pt\.trace\.json\): two runs under one worker name, not the "
                                         r"profiler cycles of one process"):
        overlapprof.analyze(tmp_path, workers=1)
    assert [len(r.steps) for r in overlapprof.analyze(tmp_path, cycle=1, workers=1).ranks] == [2, 2]
