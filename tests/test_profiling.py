"""overlapprof.profile's refusals and partial loops: settings that cannot work, a run directory
that exists (on every rank of a real 2-rank torch.distributed.run), a loop that ends early or
raises. The full runs are in test_user_workloads.py."""

import json
import subprocess
import sys
import textwrap

import pytest

import overlapprof
from conftest import torchrun
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
    try:
        with overlapprof.profile(run_id="raises", **settings) as prof:
            steps(prof, 6, fail_at=4)
    except ValueError:
        pass
    for run_id, env in (("short", {}), ("fresh", {"WORLD_SIZE": "2"})):
        os.environ.update(env)
        try:
            overlapprof.profile(run_id=run_id, **settings).__enter__()
        except OverlapprofError as exc:
            print(f"{run_id}: {type(exc).__name__}: {exc}")
""")


def test_partial_loops_and_refusals(tmp_path):
    script = tmp_path / "scenarios.py"
    script.write_text(SCENARIOS)
    proc = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    short = json.loads((tmp_path / "short" / "run.json").read_text())
    assert short["status"] == "ok" and short["traces"] == {"0": []}  # the loop ended before the profiled steps
    assert {k: len(v) for k, v in short["ranks"]["0"]["step_times_ms"].items()} == {
        "warmup": 1, "unprofiled": 2, "profiler_wait": 0, "profiler_warmup": 0, "profiled": 0}
    raised = json.loads((tmp_path / "raises" / "run.json").read_text())
    assert raised["status"] == "failed" and raised["failure"]["rank"] == 0
    assert raised["failure"]["error"].startswith("ValueError: bad batch 4 at ")
    assert raised["failure"]["error"].endswith("`raise ValueError(f\"bad batch {i}\")`, in ProfilerStep#4 (profiled)")
    assert proc.stdout.splitlines() == [
        f"short: RunDirError: overlapprof.profile: run directory {tmp_path / 'short'} exists; runs are never overwritten",
        "fresh: ProfileError: overlapprof.profile: WORLD_SIZE=2 but torch.distributed is not initialized: call "
        "init_process_group() before entering overlapprof.profile",
    ]
    assert not (tmp_path / "fresh").exists()


def test_existing_run_refused_on_every_rank(tmp_path):
    """Two ranks under torch.distributed.run: rank 0 finds the directory taken and says why; rank 1
    learns it from rank 0's broadcast; nothing in the directory changes."""
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "run.json").write_text("{}")
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent("""
        import sys, torch.distributed as dist, overlapprof
        from overlapprof.errors import RunDirError
        dist.init_process_group("gloo")
        try:
            with overlapprof.profile(out=sys.argv[1], run_id="taken") as prof:
                prof.step()
        except RunDirError as exc:
            print(f"rank {dist.get_rank()}: {exc}", flush=True)
        dist.destroy_process_group()
    """))
    proc = torchrun("--nproc-per-node", 2, script, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = sorted(line for line in proc.stdout.splitlines() if line.startswith("rank "))
    assert said == [f"rank 0: overlapprof.profile: run directory {taken} exists; runs are never overwritten",
                    f"rank 1: overlapprof.profile: rank 0 could not create the run directory: run directory {taken} "
                    "exists; runs are never overwritten"]
    assert sorted(p.name for p in taken.iterdir()) == ["run.json"] and (taken / "run.json").read_text() == "{}"
