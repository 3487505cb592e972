"""overlapprof.profile's refusals and partial loops: settings that cannot work, a run directory
that exists (on every rank of a real 2-rank torch.distributed.run), a loop that ends early or
raises. The full runs are in test_user_workloads.py."""

import json
import re
import subprocess
import sys
import textwrap

import pytest

import overlapprof
from conftest import REPO, loaded_run, overlapprof_here, torchrun
from overlapprof.errors import ProfileError


@pytest.mark.parametrize("settings, says", [
    ({"active": 0}, "active must be an integer >= 1, not 0"),
    ({"wait": -1}, "wait must be an integer >= 0, not -1"),
    ({"device": "gpu"}, "device must be 'auto', 'cpu' or 'cuda', not 'gpu'"),
    ({"run_id": "a/b"}, "run_id 'a/b' is not a directory name"),
])
def test_settings_that_cannot_work(settings, says):
    with pytest.raises(ProfileError, match=says):
        overlapprof.profile(**settings)


def test_the_public_names_and_every_setting_are_listed():
    """dir() lists the lazily resolved names, and a ProfileConfig is made, without importing torch;
    help(profile) shows every ProfileConfig field with its default and meaning (made from the
    fields: one list)."""
    import dataclasses
    import inspect
    import pydoc

    proc = subprocess.run([sys.executable, "-c", "import sys, overlapprof; print(sorted(n for n in dir(overlapprof) "
                           "if not n.startswith('_'))); overlapprof.ProfileConfig(active=3); print('torch' in sys.modules)"],
                          capture_output=True, text=True, timeout=60)
    assert proc.stdout.splitlines() == ["['AnalyzeOptions', 'ProfileConfig', 'Report', 'analyze', 'profile']", "False"]
    params = inspect.signature(overlapprof.profile).parameters
    config = overlapprof.ProfileConfig()
    text = pydoc.render_doc(overlapprof.profile, renderer=pydoc.plaintext)
    for f in dataclasses.fields(overlapprof.ProfileConfig):
        assert params[f.name].default == getattr(config, f.name) and params[f.name].kind == params[f.name].KEYWORD_ONLY
        assert f"{f.name} = {getattr(config, f.name)!r}\n" in text and f.metadata["doc"].split()[0] in text
    assert "active: 'int' = 16" in text and "Steps recorded per cycle" in text
    with pytest.raises(ProfileError, match=r"no setting 'activ' \(the settings: out, run_id, variant, options, "):
        overlapprof.profile(activ=3)


def test_config_or_settings():
    config = overlapprof.ProfileConfig(active=4, unprofiled_steps=None)
    assert overlapprof.profile(config).config.steps_needed() == 2 + 4 + 1 + 1 + 4
    with pytest.raises(ProfileError, match="a config or settings, not both"):
        overlapprof.profile(config, active=3)


SCENARIOS = textwrap.dedent("""
    import os, sys, torch, overlapprof
    from overlapprof.errors import OverlapprofError
    out = sys.argv[1]
    settings = dict(out=out, warmup_steps=1, wait=0, warmup=1, active=2, quiet=True)

    def steps(prof, n, fail_at=None):
        for i in range(n):
            if i == fail_at:
                raise ValueError(f"bad batch {i}")
            torch.randn(64, 64) @ torch.randn(64, 64)
            prof.step()

    with overlapprof.profile(run_id="short", **settings) as prof:   # needs 6 steps, runs 3
        steps(prof, 3)
    with overlapprof.profile(run_id="cut", **{**settings, "repeat": 2, "quiet": False}) as prof:  # 11: runs 10
        steps(prof, 10)
    try:
        with overlapprof.profile(run_id="raises", **settings) as prof:
            steps(prof, 6, fail_at=4)
    except ValueError:
        pass
    open(os.path.join(out, "a-file"), "w").close()
    for run_id, env, where in (("short", {}, out), ("x", {}, os.path.join(out, "a-file")),
                               ("fresh", {"WORLD_SIZE": "2"}, out)):
        os.environ.update(env)
        try:
            overlapprof.profile(run_id=run_id, **{**settings, "out": where}).__enter__()
        except OverlapprofError as exc:
            print(f"{run_id}: {type(exc).__name__}: {exc}")
""")


def _recording_lines(stderr: str) -> list[str]:
    """profile()'s recording lines: each is one write, but kineto's own log lines (``USDT: ...``,
    from either rank) may end without their newline yet, just before one."""
    return re.findall(r"overlapprof\.profile: record[^\n]*", stderr)


def test_partial_loops_and_refusals(tmp_path):
    script = tmp_path / "scenarios.py"
    script.write_text(SCENARIOS)
    proc = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    short = json.loads((tmp_path / "short" / "run.json").read_text())
    assert short["status"] == "incomplete" and short["traces"] == {"0": []}  # ended before the profiled steps
    assert {k: len(v) for k, v in short["ranks"]["0"]["step_times_ms"].items()} == {
        "warmup": 1, "unprofiled": 2, "profiler_wait": 0, "profiler_warmup": 0, "profiled": 0}
    raised = json.loads((tmp_path / "raises" / "run.json").read_text())
    assert raised["status"] == "failed" and raised["failure"]["rank"] == 0
    assert raised["failure"]["error"].startswith("ValueError: bad batch 4 at ")
    assert raised["failure"]["error"].endswith("`raise ValueError(f\"bad batch {i}\")`, in ProfilerStep#4 (profiled)")
    # the second cycle is cut short: its one profiled step is saved, said, and read with a warning
    cut = json.loads((tmp_path / "cut" / "run.json").read_text())
    assert cut["status"] == "incomplete" and len(cut["traces"]["0"]) == 2 and cut["ranks"]["0"]["profiled_steps"] == [4, 5, 9]
    said = _recording_lines(proc.stderr)
    assert said == [f"overlapprof.profile: recording steps 5-6 of the loop (cycle 1 of 2) into {tmp_path / 'cut'}",
                    f"overlapprof.profile: recorded steps 5-6 (cycle 1 of 2): {cut['traces']['0'][0]}",
                    f"overlapprof.profile: recording steps 10-11 of the loop (cycle 2 of 2) into {tmp_path / 'cut'}",
                    f"overlapprof.profile: recorded steps 10-10 (cycle 2 of 2, cut short: 1 of 2): {cut['traces']['0'][1]}"]
    assert "overlapprof.profile: incomplete: the loop ended after 10 prof.step() call(s); the schedule needs 11" in proc.stderr
    report = overlapprof.analyze(tmp_path / "cut", comms=False, workers=1)
    # ProfilerStep#10 is what followed the last prof.step(), until the block ended: torch keeps it
    assert [s.step for s in report.ranks[0].steps] == [4, 5, 9, 10]
    for cycle, steps in ((1, [4, 5]), (2, [9, 10])):  # --cycle N of a run directory's cycles
        one = overlapprof.analyze(tmp_path / "cut", comms=False, workers=1, cycle=cycle)
        assert [s.step for s in one.ranks[0].steps] == steps and one.ranks[0].files == [
            str(tmp_path / "cut" / cut["traces"]["0"][cycle - 1])]
    assert any(w.startswith("run.json: run cut is incomplete: rank 0: the loop ended after 10 prof.step() call(s)")
               for w in report.warnings)
    assert proc.stdout.splitlines() == [
        f"short: RunDirError: overlapprof.profile: run directory {tmp_path / 'short'} exists; runs are never overwritten",
        f"x: RunDirError: overlapprof.profile: cannot create run directory {tmp_path / 'a-file' / 'x'}: "
        f"{tmp_path / 'a-file'} is a file, not a folder",
        "fresh: ProfileError: overlapprof.profile: WORLD_SIZE=2 but torch.distributed is not initialized: call "
        "init_process_group() before entering overlapprof.profile",
    ]
    assert not (tmp_path / "fresh").exists()


def test_existing_run_refused_on_every_rank(own_job):
    """Two ranks under torch.distributed.run (the module's job, whose first block asks for a run
    directory that exists): rank 0 finds the directory taken and says why; rank 1 learns it from
    rank 0's broadcast; nothing in the directory changes."""
    root, proc = own_job
    taken = root / "taken"
    said = sorted(line for line in proc.stdout.splitlines() if line.startswith("rank ") and "exists" in line)
    assert said == [f"rank 0: overlapprof.profile: run directory {taken} exists; runs are never overwritten",
                    f"rank 1: overlapprof.profile: rank 0 could not create the run directory: run directory {taken} "
                    "exists; runs are never overwritten"]
    assert sorted(p.name for p in taken.iterdir()) == ["run.json"] and (taken / "run.json").read_text() == "{}"


JOB = textwrap.dedent("""
    import os, sys, time, torch, torch.distributed as dist, overlapprof
    from overlapprof.errors import ProfileError
    out, which = sys.argv[1], sys.argv[2].split(",")
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    settings = dict(out=out, warmup_steps=1, wait=0, warmup=1, active=8)
    a = torch.randn(1024, 1024)

    def step(prof):   # at least 30 ms of matmuls: the load's share needs 50 CPU ticks of steps of a kind
        start = time.perf_counter()
        while time.perf_counter() - start < 0.03:
            a @ a
        dist.all_reduce(torch.ones(4096))
        prof.step()

    if "taken" in which:   # a run directory that exists: refused on every rank (one write: the ranks share the pipe)
        from overlapprof.errors import RunDirError
        try:
            with overlapprof.profile(out=out, run_id="taken") as prof:
                prof.step()
        except RunDirError as exc:
            os.write(1, f"rank {rank}: {exc}\\n".encode())
    if "outer" in which:   # a second profile() inside the first is refused; the first goes on
        with overlapprof.profile(run_id="outer", **settings) as prof:
            step(prof)
            try:
                with overlapprof.profile(run_id="inner", **settings):
                    pass
            except ProfileError as exc:  # one write: the two ranks share the pipe
                os.write(1, f"rank {rank}: {exc}\\n".encode())
            while not prof.done:
                step(prof)
    if "short" in which:   # two steps of a schedule of 18
        with overlapprof.profile(run_id="short", **settings) as prof:
            step(prof)
            step(prof)
    if "loaded" in which:
        with overlapprof.profile(run_id="loaded", **settings) as prof:
            while not prof.done:
                step(prof)
    dist.destroy_process_group()
""")


@pytest.fixture(scope="module")
def own_job(tmp_path_factory):
    root = tmp_path_factory.mktemp("own_job")
    script = root / "job.py"
    script.write_text(JOB)
    taken = root / "taken"  # (was a torchrun of its own: one launch of 2 ranks fewer)
    taken.mkdir()
    (taken / "run.json").write_text("{}")
    proc = torchrun("--nproc-per-node", 2, script, root, "taken,outer,short")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root, proc


def test_a_second_profiler_is_refused_and_the_first_finishes(own_job):
    root, proc = own_job
    said = sorted(line for line in proc.stdout.splitlines() if line.startswith("rank ") and "exists" not in line)
    refused = ("overlapprof.profile: another overlapprof.profile block is recording in this process (into "
               f"{root / 'outer'}): one at a time, so end it before entering another")
    assert said == [f"rank 0: {refused}", f"rank 1: {refused}"]
    outer = json.loads((root / "outer" / "run.json").read_text())
    assert outer["status"] == "ok" and {r: len(t) for r, t in outer["traces"].items()} == {"0": 1, "1": 1}
    assert [len(outer["ranks"][r]["step_times_ms"]["profiled"]) for r in "01"] == [8, 8]
    assert not (root / "inner").exists()


def test_rank_0_says_which_steps_it_records(own_job):
    root, proc = own_job
    outer = json.loads((root / "outer" / "run.json").read_text())
    lines = _recording_lines(proc.stderr)
    # step 1 is the warm-up step, 2-9 unprofiled, 10 the profiler's warm-up: 11-18 are traced
    assert lines[:2] == [
        f"overlapprof.profile: recording steps 11-18 of the loop (cycle 1 of 1) into {root / 'outer'}",
        f"overlapprof.profile: recorded steps 11-18 (cycle 1 of 1): {outer['traces']['0'][0]}"]
    assert outer["ranks"]["0"]["profiled_steps"] == list(range(10, 18))  # ProfilerStep#N is step N + 1


def test_a_loop_shorter_than_the_schedule_is_incomplete(own_job):
    root, proc = own_job
    short = json.loads((root / "short" / "run.json").read_text())
    why = ("the loop ended after 2 prof.step() call(s); the schedule needs 18 (warmup_steps 1 + 1 x (8 unprofiled "
           "+ 0 wait + 1 warmup + 8 active); the first profiled step is step 11): 0 of 8 profiled steps recorded: "
           "run at least 18 steps (`while not prof.done:`), or ask for fewer (active, repeat, warmup_steps, "
           "unprofiled_steps)")
    assert short["status"] == "incomplete"
    assert [(short["ranks"][r]["status"], short["ranks"][r]["error"]) for r in "01"] == [("incomplete", why)] * 2
    assert f"overlapprof.profile: incomplete: {why}. 0 trace(s) in {root / 'short'}; nothing to analyze" in proc.stderr
    assert "Next: overlapprof analyze" not in proc.stderr.split("short")[-1]
    res = overlapprof_here("analyze", root / "short")
    assert res.exit_code == 2
    assert res.stderr == (f"Error: {root / 'short'}: no traces: run.json says the run is incomplete (rank 0: "
                          f"{why})\n")


def test_machine_load_is_recorded_and_judged(own_job):
    """Local rank 0 records the machine's load as `overlapprof run` does; a run while CPU
    burners take most of the machine then compares as not trusted (load)."""
    import os

    from overlapprof import analyze
    from overlapprof.compare import compare

    root, _ = own_job
    quiet = json.loads((root / "outer" / "run.json").read_text())["ranks"]
    load = quiet["0"]["machine_load"]
    assert load["cores"] == os.cpu_count() and len(load["load_average"]) == 2 and quiet["1"]["machine_load"] is None
    assert set(load["seconds"]) == {"unprofiled", "profiled"} and load["ticks"]["profiled"] >= 50, load
    # the burners start once the job has entered its profile() block (its run directory exists):
    # torch imported, the process group made (conftest.loaded_run)
    proc = loaded_run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", 2,
                       root / "job.py", root, "loaded"], (root / "loaded").exists, root / "console",
                      env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    loaded = json.loads((root / "loaded" / "run.json").read_text())["ranks"]["0"]["machine_load"]
    assert loaded["other_share"]["profiled"] >= 0.2, loaded
    c = compare([analyze([str(root / "outer")]), analyze([str(root / "loaded")])], labels=["quiet", "loaded"])
    assert "speedup" in c.variants[1].not_trusted, (c.variants[0].other_cpu, c.variants[1].other_cpu,
                                                    c.variants[1].speedup)
    assert any(w.startswith("loaded: step-time speedup") and "not trusted: other processes took" in w
               for w in c.warnings), c.warnings
