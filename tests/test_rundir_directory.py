"""Run directories without launching anything: names, create/join rules, merging, loading."""

import json
import subprocess
import sys

import pytest

from overlapprof.errors import RunDirError
from overlapprof.rundir import directory, run_record


def header(nnodes=1, run_id="r", world_size=2):
    return run_record.RunConfig(name="r-sync", run_id=run_id, nnodes=nnodes, world_size=world_size)


def test_rundir_does_not_import_torch():
    code = ("import sys, overlapprof.rundir.directory\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_variants_of_one_invocation_sort_together():
    names = directory.run_dir_names("ring", ["sync", "async"], stamp="20260101-120000")
    assert names == {"sync": "ring-20260101-120000-sync", "async": "ring-20260101-120000-async"}
    later = directory.run_dir_names("ring", ["async"], stamp="20260101-120001")
    ordered = sorted([*names.values(), *later.values()])
    assert ordered[:2] == sorted(names.values())
    assert directory.run_dir_names("ring", ["sync"], run_id="exp1") == {"sync": "exp1-sync"}


def test_a_taken_time_name_gets_a_counter_and_a_taken_run_id_is_an_error(tmp_path):
    first = directory.plan_run_dirs(tmp_path, "ring", ["sync"])
    first["sync"].mkdir()
    second = directory.plan_run_dirs(tmp_path, "ring", ["sync"])
    assert second["sync"] != first["sync"] and not second["sync"].exists()
    (tmp_path / "x-async").mkdir()
    with pytest.raises(RunDirError, match="x-async exists; runs are never overwritten"):
        directory.plan_run_dirs(tmp_path, "ring", ["sync", "async"], run_id="x")
    assert directory.plan_run_dirs(tmp_path, "ring", ["async"], run_id="x", joinable=True)


def test_single_node_run_dir_is_created_once(tmp_path):
    path = directory.open_run_dir(tmp_path / "r-sync", header(), 0, [0, 1])
    assert sorted(p.name for p in path.iterdir()) == ["logs", "nodes", "progress", "ranks",
                                                       "run.json"]
    run = directory.load_run(path)
    assert run.status == "running" and run.ranks == {} and run.name == "r-sync"
    assert run_record.read_rank(directory.rank_file(path, 1)) == run_record.RankRecord(
        rank=1, node_rank=0, local_rank=1, status="starting")
    with pytest.raises(RunDirError, match="exists; runs are never overwritten"):
        directory.open_run_dir(path, header(), 0, [0, 1])


def test_multi_node_joins_a_running_dir_and_claims_ranks_exclusively(tmp_path):
    path = tmp_path / "r-sync"
    directory.open_run_dir(path, header(nnodes=2, world_size=4), 0, [0, 1])
    directory.open_run_dir(path, header(nnodes=2, world_size=4), 1, [2, 3])  # node 1 joins
    with pytest.raises(RunDirError, match="node1.json of run directory .* is already taken"):
        directory.open_run_dir(path, header(nnodes=2, world_size=4), 1, [2, 3])
    with pytest.raises(RunDirError, match="not a running 2-node run of --run-id other"):
        directory.open_run_dir(path, header(nnodes=2, run_id="other", world_size=4), 1, [2, 3])
    directory.update_json(path / "run.json", status="ok")
    with pytest.raises(RunDirError, match="is not a running 2-node run"):
        directory.open_run_dir(path, header(nnodes=2, world_size=4), 0, [0, 1])


def test_a_foreign_directory_is_not_joined(tmp_path, monkeypatch):
    monkeypatch.setattr(directory, "_JOIN_WAIT_S", 0.2)  # how long a joiner waits for run.json
    (tmp_path / "r-sync").mkdir()
    with pytest.raises(RunDirError, match="exists and is not an overlapprof run"):
        directory.open_run_dir(tmp_path / "r-sync", header(nnodes=2), 1, [1])


def test_atomic_write_replaces_and_leaves_no_temp_file(tmp_path):
    target = tmp_path / "run.json"
    directory.write_json_atomic(target, {"a": 1})
    directory.write_json_atomic(target, {"a": 2})
    assert json.loads(target.read_text()) == {"a": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]


def fragment(path, rank, **fields):
    run_record.update_rank(directory.rank_file(path, rank), **fields)


def test_merge_status_and_root_cause(tmp_path):
    path = directory.open_run_dir(tmp_path / "r", header(world_size=3), 0, [0, 1, 2])
    directory.write_json_atomic(directory.node_file(path, 0), {"status": "running", "config": {}})
    assert directory.merge(path).status == "running"
    # rank 2's error came first but was caused by rank 0's crash (its peer died)
    fragment(path, 2, status="failed", error="closed by peer", error_kind="peer", ended=10.0)
    fragment(path, 0, status="failed", error="ValueError: boom", error_kind="exception",
             ended=11.0, traces=["rank0.1.pt.trace.json"])
    fragment(path, 1, status="failed", error="terminated", error_kind="terminated", ended=9.0)
    run = directory.merge(path)
    assert run.status == "failed"
    assert run.failure == run_record.Failure(rank=0, error="ValueError: boom", error_kind="exception",
                                             consequences=[1, 2])
    assert run.traces == {"0": ["rank0.1.pt.trace.json"], "1": [], "2": []}
    assert directory.read_json(path / "run.json")["nodes"]["0"]["config"] is None  # not copied
    assert directory.load_run(path) == run


def test_merge_marks_missing_ranks_incomplete(tmp_path):
    path = directory.open_run_dir(tmp_path / "r", header(nnodes=2, world_size=4), 1, [2, 3])
    directory.write_json_atomic(directory.node_file(path, 1), {"status": "ok"})
    for rank in (2, 3):
        fragment(path, rank, status="ok")
    run = directory.merge(path)
    assert (run.status, run.missing_ranks) == ("incomplete", [0, 1])


def test_load_run_errors(tmp_path):
    with pytest.raises(RunDirError, match="is not a run directory"):
        directory.load_run(tmp_path)
    (tmp_path / "run.json").write_text('{"schema_version": 99}')
    with pytest.raises(RunDirError, match="schema_version 99 is not 1"):
        directory.load_run(tmp_path)


def test_root_cause_prefers_a_rank_that_died_on_its_own_over_its_peers_errors():
    from overlapprof.rundir.blame import root_cause
    R = run_record.RankRecord
    ranks = {"0": R(status="failed", error="RuntimeError: Connection closed by peer",
                    error_kind="peer", ended=10.0),
             "1": R(status="failed", error="exited with code 3", error_kind="exit", ended=12.0)}
    assert root_cause(ranks)[0] == 1
    ranks["0"].error_kind = "exception"
    assert root_cause(ranks)[0] == 0


def stuck(kind, location, stalled_s, ended, waiting, step=0, step_kind="unprofiled"):
    return run_record.RankRecord(status="failed", error=f"{kind} ...", error_kind=kind, ended=ended,
                                 stalled_s=stalled_s, location=location, waiting_on_peers=waiting,
                                 where=run_record.Where(step=step, step_kind=step_kind, phase="compute"))


def test_a_hang_is_blamed_on_the_rank_stalled_in_its_own_code_whichever_watchdog_fired():
    from overlapprof.rundir.blame import root_cause
    comm = "in torch.distributed.all_reduce at w.py:9 `dist.all_reduce(x)`"
    own = "at w.py:7 `time.sleep(3600)`"
    # rank 0's watchdog fired first; rank 1, asleep, was then stopped by the launcher
    ranks = {"0": stuck("timeout", comm, 10.0, 100.0, True),
             "1": stuck("terminated", own, 10.1, 100.5, False)}
    rank, error, kind, consequences = root_cause(ranks)
    assert (rank, kind, consequences) == (1, "stalled", [0])
    assert error == ("made no progress for 10 s in its own code, at w.py:7 `time.sleep(3600)`, "
                     "in phase 'compute' of ProfilerStep#0 (unprofiled)")
    # a deadlock: every rank waits on the others, the earliest timeout is the cause
    ranks["1"] = stuck("timeout", comm, 10.0, 100.2, True)
    assert root_cause(ranks)[:3] == (0, "timeout ...", "timeout")
    # ... unless one is behind: rank 1 blocked in a recv at step 7 holds up rank 0 at step 9's barrier
    recv = "in torch.distributed.recv at w.py:25 `dist.recv(x, src=0)`"
    ranks = {"0": stuck("timeout", comm, 10.1, 100.0, True, step=9, step_kind="profiled"),
             "1": stuck("timeout", recv, 10.0, 100.2, True, step=7, step_kind="profiled")}
    assert root_cause(ranks)[0] == 1
    ranks["1"] = stuck("timeout", recv, 10.0, 100.2, True, step=3, step_kind="warmup")  # warm-up comes first
    ranks["0"] = stuck("timeout", comm, 10.1, 100.0, True, step=0, step_kind="unprofiled")
    assert root_cause(ranks)[0] == 1
    ranks = {"0": stuck("timeout", comm, 10.0, 100.0, True), "1": stuck("terminated", own, 10.1, 100.5, False)}
    # a rank stopped a moment after it left its last boundary did not stall
    ranks["1"] = stuck("terminated", own, 0.2, 100.5, False)
    assert root_cause(ranks)[0] == 0
    # a rank that died (NCCL peers then time out waiting) comes before the timeouts
    ranks["1"] = run_record.RankRecord(status="failed", error="killed by signal SIGKILL",
                                       error_kind="exit", ended=130.0)
    assert root_cause(ranks)[:3] == (1, "killed by signal SIGKILL", "exit")


def test_status_interrupted_unless_a_rank_failed_of_its_own_first():
    from overlapprof.rundir.blame import run_status, status_note
    node = run_record.NodeRecord(status="failed", error="interrupted (SIGINT)")
    peer = run_record.RankRecord(status="interrupted", error_kind="interrupted")
    assert run_status([peer], [node], None, []) == "interrupted"
    own = run_record.Failure(rank=1, error="ValueError: boom", error_kind="exception")
    assert run_status([peer], [node], own, []) == "failed"
    run = run_record.RunRecord(name="x-sync", status="interrupted")
    assert status_note(run) == ("run.json: run x-sync was interrupted (Ctrl-C): its traces end "
                                "where it stopped; the step it stopped in counts as long as it ran "
                                "(--drop-last-step leaves each rank's last step out)")
    assert status_note(run_record.RunRecord(status="ok")) == ""


def test_an_old_run_json_still_loads(tmp_path):
    """A run.json as written before the typed record (no progress, no consequences, no stall
    fields; an unknown field) loads, with defaults for what it lacks."""
    old = {"schema_version": 1, "name": "r-sync", "run_id": None, "status": "failed",
           "workload": {"name": "ring", "path": "/w/ring.py"}, "variant": "sync",
           "world_size": 2, "nnodes": 1, "profiler": {"warmup_steps": 1, "active": 2},
           "some_future_field": 3,
           "ranks": {"0": {"rank": 0, "status": "failed", "error": "boom",
                           "error_kind": "exception", "where": {"step": 1, "phase": "comm"},
                           "step_times_ms": {"warmup": [1.5]}}},
           "traces": {"0": ["rank0.1.pt.trace.json"]}, "missing_ranks": [1],
           "failure": {"rank": 0, "error": "boom", "error_kind": "exception"}}
    (tmp_path / "run.json").write_text(json.dumps(old))
    run = directory.load_run(tmp_path)
    assert (run.profiler.warmup_steps, run.profiler.active, run.profiler.wait) == (1, 2, 1)
    assert run.ranks["0"].where.phase == "comm" and run.ranks["0"].stalled_s is None
    assert run.failure.rank == 0 and run.failure.consequences == []
    assert run.ranks["0"].step_times_ms == {"warmup": [1.5]}
    assert run.ranks["0"].machine_load is None  # a newer field: absent, not an error


def test_step_summary_gives_no_overhead_the_load_or_the_spread_explains():
    """A profiler cannot make steps faster: profiled steps 2.6x faster than unprofiled ones are
    not an overhead of x0.38 (before: "x0.38 (below 1: the steps' own spread)"); profiled steps
    0.99x the unprofiled ones within their spread are noise, not "x0.99" (issue 39 item 16); and
    an overhead that the machine's load change explains is not trusted (run.json's machine_load)."""
    from overlapprof.launch.step_times import step_summary
    R = run_record.RankRecord

    def run(unprofiled, profiled, other=None):
        times = {"warmup": [9.0], "unprofiled": unprofiled, "profiled": profiled}
        load = run_record.MachineLoad(other_share=other) if other else None
        return run_record.RunRecord(ranks={"0": R(status="ok", step_times_ms=times, machine_load=load)})

    assert step_summary(run([2.0, 2.0], [3.0, 3.0])).endswith("profiled step 3.00 ms, profiler overhead x1.50 [1.50-1.50]")
    assert step_summary(run([2.0], [2.0], {"unprofiled": 0.1, "profiled": 0.12})).endswith(
        "profiler overhead within noise: at most x1.00 (profiled / unprofiled steps, 95% interval 1.00-1.00x, includes 1x)")
    # profiled steps 0.99x the unprofiled ones, each kind spread by +-10%: noise, not an overhead of x0.99
    noisy = step_summary(run([1.8, 2.0, 2.2, 2.1, 1.9] * 4, [1.78, 1.98, 2.18, 2.08, 1.88] * 4))
    assert "x0.99" not in noisy and noisy.endswith("includes 1x)"), noisy
    low, high = (float(x) for x in noisy.split("95% interval ")[1].split("x,")[0].split("-"))
    assert low < 0.99 < 1 < high == float(noisy.split("at most x")[1].split(" ")[0])
    # above the noise: the overhead with its interval, seeded (the same line twice)
    slow = run([1.8, 2.0, 2.2, 2.1, 1.9] * 4, [2.3, 2.5, 2.7, 2.6, 2.4] * 4)
    assert step_summary(slow) == step_summary(slow) and " overhead x1.25 [" in step_summary(slow)
    assert step_summary(run([7.8], [3.0])).endswith(
        "profiler overhead not measured: the profiled steps ran 2.60x faster than the unprofiled ones, which a "
        "profiler cannot cause (the steps' own spread, or the machine's load); rerun when the machine is quieter")
    loaded = step_summary(run([2.0], [3.0], {"unprofiled": 0.05, "profiled": 0.45}))
    assert loaded.endswith(
        "profiler overhead not trusted: other processes took 5% of the machine's CPU during the unprofiled steps and "
        "45% during the profiled ones (load factor 1.73x, which alone can change steps by up to 2.98x: enough to "
        "explain the 1.50x measured); rerun when the machine is quieter")


@pytest.mark.parametrize("under", [(), ("sub", "deeper")])
def test_a_run_directory_under_a_file_says_the_file(tmp_path, under):
    """Before: "exists" (mkdir's FileExistsError on the file) or "Not a directory"."""
    (tmp_path / "a-file").write_text("x")
    path = tmp_path.joinpath("a-file", *under, "run")
    with pytest.raises(RunDirError, match=f"^cannot create run directory {path}: {tmp_path / 'a-file'} is a file, "
                                          "not a folder$"):
        directory.create_run_dir(path, run_record.RunConfig(name="run"))
    assert (tmp_path / "a-file").read_text() == "x"


def test_one_profiler_schedule_for_run_profile_and_run_json(tmp_path):
    """``overlapprof run``'s flags, ``RunRequest``, ``overlapprof.profile``'s settings and run.json's
    ``profiler`` share one schedule with one set of defaults; an old run.json's (profiler
    written with its ``unprofiled_steps`` resolved) loads as what it says."""
    from dataclasses import fields

    from click.testing import CliRunner

    from overlapprof.cli.run_cmd import run as run_command
    from overlapprof.launch.launcher import RunRequest
    from overlapprof.launch.profile_settings import ProfileConfig
    from overlapprof.rundir.schedule import SCHEDULE_FIELDS, ProfilerSchedule

    default = ProfilerSchedule()
    assert (default.warmup_steps, default.unprofiled(), default.wait, default.warmup, default.active,
            default.repeat) == (2, 16, 1, 1, 16, 1)
    assert RunRequest(workload=None, variants=[], options={}).schedule == default
    profile = ProfileConfig()
    assert isinstance(profile, ProfilerSchedule) and profile.schedule() == default.schedule()
    recorded = run_record.ProfilerConfig.of(ProfileConfig(active=4), gzip=True)
    assert (recorded.unprofiled_steps, recorded.active, recorded.gzip) == (4, 4, True)
    assert [f.name for f in fields(run_record.ProfilerConfig)][:len(SCHEDULE_FIELDS)] == list(SCHEDULE_FIELDS)
    flags = {p.name: p.default for p in run_command.params}
    assert {n: flags[n] for n in ("warmup_steps", "wait", "warmup", "active", "repeat")} == {
        n: getattr(default, n) for n in ("warmup_steps", "wait", "warmup", "active", "repeat")}
    assert "--active INTEGER RANGE" in CliRunner().invoke(run_command, ["--help"]).output
    old = {"schema_version": 1, "name": "r", "profiler": {"warmup_steps": 2, "unprofiled_steps": 3, "wait": 1,
                                                          "warmup": 1, "active": 3, "repeat": 1, "gzip": True}}
    (tmp_path / "run.json").write_text(json.dumps(old))
    run = directory.load_run(tmp_path)
    assert run.profiler.schedule() == ProfilerSchedule(unprofiled_steps=3, active=3) and run.profiler.gzip
    written = json.loads(run_record.msgspec.json.encode(run))["profiler"]
    assert written == {**old["profiler"], "record_shapes": True, "with_stack": False, "cuda_sync_events": False}
