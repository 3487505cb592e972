"""The what-if and advise benches' steady-state settings (per-workload warm-up and traced steps) and
advise_bench's ``--runs K`` (a configuration scored by the median of its K runs)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _bench(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    module = sys.modules[name] = importlib.util.module_from_spec(spec)  # its dataclasses need the module known
    spec.loader.exec_module(module)
    return module


whatif_bench = _bench("whatif_bench")
advise_bench = _bench("advise_bench")


def _parsed(flags: list[str]) -> dict:
    """``overlapprof run``'s own parse of the flags (nothing run)."""
    from overlapprof.cli.run_cmd import run

    return run.make_context("run", [str(REPO / "workloads" / "allreduce.py"), *flags]).params


def test_whatif_bench_warms_up_and_traces_the_short_step_workloads_longer():
    allreduce = _parsed(whatif_bench.schedule("allreduce"))
    assert (allreduce["warmup_steps"], allreduce["active"], allreduce["wait"]) == (30, 30, 0)
    ring = _parsed(whatif_bench.schedule("ring"))
    assert (ring["warmup_steps"], ring["active"]) == (5, 16)
    fsdp = _parsed(whatif_bench.schedule("fsdp"))  # 8 unprofiled steps of ~100 ms: warm already
    assert (fsdp["warmup_steps"], fsdp["active"], fsdp["warmup"]) == (1, 8, 1)


def test_advise_bench_schedule_per_workload_is_a_profiler_schedule():
    from overlapprof.rundir.schedule import ProfilerSchedule

    for workload in ("allreduce", "ddp", "fsdp", "ring", "pipeline"):
        steady = ProfilerSchedule(**{**advise_bench.SCHEDULE, **advise_bench.STEADY.get(workload, {})})
        assert steady.warmup_steps >= 8 and steady.active >= 16, workload
    assert ProfilerSchedule(**{**advise_bench.SCHEDULE, **advise_bench.STEADY["allreduce"]}).steps_needed() == 91


def test_median_of_runs_scores_each_configuration_by_the_median_of_its_runs(tmp_path):
    runner = advise_bench.Runner(tmp_path, "r0")
    a, b = ("allreduce", "sync", None, ()), ("allreduce", "async", None, ())
    runner.dirs = {a: tmp_path / "a", b: tmp_path / "b"}
    runner.steps = {a: 9.0, b: 5.0}  # each configuration's first run
    runner.runs = {a: [9.0, 6.0, 6.5], b: [5.0, 7.0, 5.5]}
    medians = advise_bench.median_of_runs(runner)
    assert medians.steps == {a: 6.5, b: 5.5}
    assert runner.steps == {a: 9.0, b: 5.0}  # the first runs' scoring is kept beside it
    assert medians.run(a) == tmp_path / "a" and medians.count == 0  # nothing run again


def _saved(folder, variant, steps, options=None):
    import json

    folder.mkdir()
    ranks = {str(r): {"step_times_ms": {"profiled": steps}} for r in (0, 1)}
    (folder / "run.json").write_text(json.dumps({"workload": {"name": "allreduce"}, "variant": variant,
                                                  "options": options or {}, "link": None, "ranks": ranks}))


def test_rescore_reads_a_kept_bench_as_its_runner_kept_it(tmp_path):
    """``--rescore``: each kept run directory is its configuration again (run.json's workload,
    variant, link and options, the defaults filled in as a Runner keys them), its runs in the order
    of their numbers (r0-10 after r0-2), the first one its directory and step; another repeat's
    and a configuration the bench never ran are not there (None: not scored)."""
    _saved(tmp_path / "r0-002-allreduce-sync", "sync", [9.0, 9.0])
    _saved(tmp_path / "r0-010-allreduce-sync", "sync", [7.0])
    _saved(tmp_path / "r0-003-allreduce-async", "async", [5.0], {"wait_early": False})
    _saved(tmp_path / "r1-001-allreduce-sync", "sync", [1.0])
    saved = advise_bench.saved_runs(tmp_path, "r0")
    sync = advise_bench._full(("allreduce", "sync", None, ()))
    not_early = advise_bench._full(("allreduce", "async", None, (("wait_early", False),)))
    assert saved.runs == {sync: [9.0, 7.0], not_early: [5.0]}
    assert saved.dirs[sync] == tmp_path / "r0-002-allreduce-sync" and saved.steps[sync] == 9.0
    assert saved.run(advise_bench._full(("allreduce", "sync", "1gbit", ()))) is None


def test_advise_bench_refuses_fewer_than_one_run_in_one_line():
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "advise_bench.py"), "--runs", "0"],
                          capture_output=True, text=True)
    assert proc.returncode != 0
    assert proc.stderr.strip() == "advise_bench: --runs and --repeat must be at least 1"


def test_steady_bench_compares_the_old_schedule_with_the_benches_steady_one():
    steady_bench = _bench("steady_bench")
    assert steady_bench.steady("allreduce") == {"--warmup-steps": "30", "--active": "30"}
    assert steady_bench.steady("fsdp") == {"--warmup-steps": "8", "--active": "16"}
    assert steady_bench.CONFIGS["ddp-async-0.5"][2]["bucket_cap_mb"] == 0.5
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "steady_bench.py"), "--runs", "1"],
                          capture_output=True, text=True)
    assert proc.returncode != 0
    assert proc.stderr.strip() == "steady_bench: --runs must be at least 2 (a spread needs two runs)"


def test_whatif_bench_judges_a_pair_once_by_its_repeats_medians():
    """One repeat's run in a slow phase (120 ms against the others' 95 and 100) makes that repeat
    wrong-way (predicted 10% faster, ran slower), not the pair: its medians ran no slower."""
    repeats = [(90.0, 100.0, 100.0), (90.0, 95.0, 100.0), (90.0, 120.0, 100.0)]
    per_repeat = [whatif_bench._judged(*r) for r in repeats]
    assert [w for _, _, w in per_repeat] == [False, False, True]
    (error, right, wrong, label), = whatif_bench._per_pair({"ring: async=send_recv": repeats})
    assert label == "ring: async=send_recv" and not wrong and abs(error - (90 / 100 - 1)) < 1e-12
    assert not right  # predicted 10% faster, measured the traced step: the direction is not right
    lines = whatif_bench._targets([(e, r, w, "x r2") for e, r, w in per_repeat])
    assert lines[-1].startswith("FAIL") and lines[-1].endswith(": x r2")
