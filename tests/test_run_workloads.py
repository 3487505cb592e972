"""End to end: every workload and variant on real CPU ranks (gloo, torchelastic): on 2 ranks, and
on 4 those where 4 ranks show something 2 do not (conftest.FOUR_RANK_VARIANTS; collectives' are
then run on 4 only, conftest.TWO_RANK_ONLY).

Each (workload, nproc) is launched once per session by the ``workload_runs`` fixture; the tests
read its run directories: traces per rank, their ``distributedInfo``, communication events and
``ProfilerStep`` marks, ``run.json``, logs, the workloads' metrics, and (through the analyzer)
that the async variants overlap what the sync ones cannot.
"""

import gzip
import json
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest

from conftest import REPO, WORKLOAD_VARIANTS, variants_run

# The <backend>:<op> annotations gloo records for each variant's communication.
EXPECTED_COMM = {
    ("ring", "sync"): {"gloo:send", "gloo:recv"},
    ("ring", "async"): {"gloo:send", "gloo:recv"},
    ("allreduce", "sync"): {"gloo:all_reduce"},
    ("allreduce", "async"): {"gloo:all_reduce"},
    ("collectives", "sync"): {"gloo:send", "gloo:recv"},
    ("collectives", "async"): {"gloo:send", "gloo:recv"},
    ("collectives", "broadcast"): {"gloo:broadcast"},
    ("collectives", "all_reduce"): {"gloo:all_reduce"},
    ("collectives", "scatter"): {"gloo:scatter"},
    ("collectives", "wait_vs_sync"): {"gloo:all_reduce"},
}
CASES = [pytest.param((w, v, n), id=f"{w}-{v}-{n}") for n in (2, 4)
         for w in WORKLOAD_VARIANTS for v in variants_run(w, n)]
RUN_KEYS = {"schema_version", "status", "name", "run_id", "created", "workload", "variant",
            "options", "world_size", "nnodes", "nproc_per_node", "backend", "device", "timeout_s",
            "link", "profiler", "versions", "env", "nodes", "ranks", "traces", "missing_ranks", "failure"}
RANK_KEYS = {"rank", "node_rank", "local_rank", "host", "pid", "device", "status", "error",
             "error_kind", "where", "started", "ended", "step_times_ms", "profiled_steps",
             "metrics", "traces", "machine_load"}


@lru_cache(maxsize=None)
def load_trace(path):
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


@lru_cache(maxsize=None)
def load_run_json(run_dir):
    return json.loads((run_dir / "run.json").read_text())


def annotations(trace):
    return {e["name"] for e in trace["traceEvents"] if e.get("cat") == "user_annotation"}


@pytest.fixture
def case(workload_runs, request):
    workload, variant, nproc = request.param
    made = workload_runs(workload, nproc)
    assert made.proc.returncode == 0, made.proc.stderr[-4000:]
    run_dir = made.dirs[variant]
    return workload, variant, nproc, run_dir, load_run_json(run_dir), made.schedule


def parametrize_case(fn):
    return pytest.mark.parametrize("case", CASES, indirect=True)(fn)


def test_declared_variants_are_the_tested_ones():
    from overlapprof.workload import load

    for name, variants in WORKLOAD_VARIANTS.items():
        assert tuple(load(REPO / "workloads" / f"{name}.py").variants) == variants
        assert set(variants_run(name, 2)) | set(variants_run(name, 4)) == set(variants), name  # each run somewhere


@parametrize_case
def test_run_json_is_complete(case):
    workload, variant, nproc, run_dir, run, schedule = case
    assert RUN_KEYS <= set(run)
    assert run["status"] == "ok" and run["failure"] is None and run["missing_ranks"] == []
    assert (run["workload"]["name"], run["variant"]) == (workload, variant)
    assert Path(run["workload"]["path"]) == REPO / "workloads" / f"{workload}.py"
    assert (run["world_size"], run["nnodes"], run["nproc_per_node"]) == (nproc, 1, nproc)
    assert (run["backend"], run["device"]) == ("gloo", "cpu")
    assert run["versions"]["torch"] and run["versions"]["gloo"]
    assert run["env"]["OMP_NUM_THREADS"]  # set to 1 for the ranks unless the user set it
    assert run["nodes"]["0"]["command"][1:3] == ["run", str(REPO / "workloads" / f"{workload}.py")]
    profiler = run["profiler"]
    assert (profiler["wait"], profiler["warmup"], profiler["active"], profiler["repeat"]) == schedule.profiler
    assert sorted(run["ranks"], key=int) == [str(r) for r in range(nproc)]
    for rank, info in run["ranks"].items():
        assert RANK_KEYS <= set(info), rank
        assert (info["status"], info["error"], info["error_kind"]) == ("ok", None, None)
        assert (info["rank"], info["node_rank"], info["local_rank"]) == (int(rank), 0, int(rank))
        assert info["started"] <= info["ended"]
        times = info["step_times_ms"]
        assert {k: len(times[k]) for k in schedule.steps} == schedule.steps
        assert all(t > 0 for values in times.values() for t in values)
        assert info["profiled_steps"] == list(schedule.profiled_steps)  # after the unprofiled and warm-up steps
        assert info["traces"] == run["traces"][rank]


@parametrize_case
def test_one_trace_per_rank_with_distributed_info(case):
    workload, variant, nproc, run_dir, run, _ = case
    for rank in range(nproc):
        files = run["traces"][str(rank)]
        assert len(files) == 1 and files[0].startswith(f"rank{rank}.")
        assert files[0].endswith(".pt.trace.json")
        trace = load_trace(run_dir / files[0])
        info = trace["distributedInfo"]
        assert (info["rank"], info["world_size"], info["backend"]) == (rank, nproc, "gloo")


@parametrize_case
def test_traces_hold_steps_phases_and_communication(case):
    workload, variant, nproc, run_dir, run, schedule = case
    expected = EXPECTED_COMM[workload, variant]
    if workload == "collectives" and variant in ("sync", "async") and nproc % 2:
        pytest.skip("the last rank of an odd world has no pair")
    for rank in range(nproc):
        trace = load_trace(run_dir / run["traces"][str(rank)][0])
        names = annotations(trace)
        assert {f"ProfilerStep#{n}" for n in schedule.profiled_steps} <= names, rank
        assert {"comm", "compute"} <= names
        assert expected <= names, (rank, sorted(names))
        ops = {e["name"] for e in trace["traceEvents"] if e.get("cat") == "cpu_op"}
        assert "aten::mm" in ops
        shapes = [e for e in trace["traceEvents"] if e.get("name") == "aten::mm"]
        assert all("Input Dims" in e["args"] for e in shapes)  # record_shapes is on


@parametrize_case
def test_each_rank_logs_to_its_files(case):
    workload, variant, nproc, run_dir, run, _ = case
    for rank in range(nproc):
        stdout = (run_dir / "logs" / f"rank{rank}.stdout.log").read_text()
        assert f"rank {rank}: {workload}/{variant} ok, " in stdout
        assert (run_dir / "logs" / f"rank{rank}.stderr.log").exists()


@pytest.mark.parametrize("nproc", [2, 4])
def test_console_shows_rank_output_prefixed_and_progress(workload_runs, nproc):
    proc = workload_runs("ring", nproc).proc
    for rank in range(nproc):
        for variant in ("sync", "async"):  # the variant named: the two runs' lines differ
            assert f"[rank{rank}]: rank {rank}: ring/{variant} ok, " in proc.stdout
    assert "profiler_start" not in proc.stdout + proc.stderr  # kineto's noise stays in the logs
    assert "ring/sync: ok" in proc.stderr and "ring/async: ok" in proc.stderr
    assert "first warm-up step" in proc.stderr


@pytest.mark.parametrize("workload,nproc", [("ring", 2), ("ring", 4), ("allreduce", 2), ("collectives", 4)])
def test_async_overlaps_where_sync_cannot(workload_runs, workload, nproc):
    from overlapprof import analyze

    made = workload_runs(workload, nproc)
    pooled = {v: analyze([str(made.dirs[v])]).summary.pooled_ratio for v in ("sync", "async")}
    assert pooled["sync"] < 0.02, pooled  # blocking calls: no compute runs during them
    assert pooled["async"] > 0.10, pooled  # the matmul runs inside isend..wait / the reduction


@pytest.mark.parametrize("nproc", [2, 4])
def test_collectives_metrics(workload_runs, nproc):
    made = workload_runs("collectives", nproc)
    assert {"sync", "scatter", "wait_vs_sync"} & set(made.dirs), made.dirs
    if "sync" in made.dirs:  # run on 4 ranks only (conftest.TWO_RANK_ONLY)
        recv = load_run_json(made.dirs["sync"])["ranks"]
        for rank in range(nproc - nproc % 2):
            times = recv[str(rank)]["metrics"]["recv_host_ms"]
            assert len(times["warmup"]) == 1 and len(times["profiled"]) == 2
    if "scatter" in made.dirs:
        scatter = load_run_json(made.dirs["scatter"])
        held = scatter["ranks"]["0"]["metrics"]["scatter_src_held_bytes"]["profiled"]
        numel = scatter["options"]["numel"]
        assert held == [nproc * numel * 4] * 2  # the whole scatter_list, still allocated after scatter
        assert scatter["ranks"]["0"]["metrics"]["scatter_src_kept_bytes"]["profiled"] == [0, 0]
        assert "metrics" in scatter["ranks"]["1"] and not scatter["ranks"]["1"]["metrics"]
    if "wait_vs_sync" in made.dirs:  # run on 2 ranks only (conftest.FOUR_RANK_VARIANTS)
        for info in load_run_json(made.dirs["wait_vs_sync"])["ranks"].values():
            assert len(info["metrics"]["wait_host_ms"]["profiled"]) == 2
            assert len(info["metrics"]["synchronize_host_ms"]["profiled"]) == 2


def test_tensorboard_lists_one_worker_per_rank(workload_runs):
    """The run directory is a TensorBoard logdir: torch-tb-profiler's own loader finds the
    workers rank0..rank3, each with a profile it can show."""
    run_dir = workload_runs("ring", 4).dirs["async"]
    code = ("import sys\n"
            "from torch_tb_profiler import io\n"
            "from torch_tb_profiler.profiler.loader import RunLoader\n"
            "if __name__ == '__main__':\n"
            "    run = RunLoader('r', sys.argv[1], io.Cache()).load()\n"
            "    for w in sorted(run.workers):\n"
            "        p = run.get_profile(w, run.get_spans(w)[0])\n"
            "        print(w, ','.join(v.display_name for v in p.views))\n")
    out = subprocess.run([sys.executable, "-c", code, str(run_dir)], capture_output=True,
                         text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.split()
    assert lines[::2] == ["rank0", "rank1", "rank2", "rank3"]
    assert all("Trace" in views.split(",") for views in lines[1::2])


def test_oversubscribed_cpu_runs_say_so(workload_runs):
    """4 CPU ranks on fewer cores time-share them: the run says so (a why-not for the overlap)."""
    import os

    cores = len(os.sched_getaffinity(0))
    for nproc in (2, 4):
        stderr = workload_runs("ring", nproc).proc.stderr
        crowded = f"note: {nproc} ranks x 1 thread(s) on {cores} CPU core(s)"
        assert (crowded in stderr) == (nproc > cores), stderr[-2000:]
        assert stderr.count("ranks time-share cores") <= 1  # once per invocation, not per variant
