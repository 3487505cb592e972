"""``overlapprof advise RUN --verify``'s launching part (overlapprof/launch/verify.py, and rerun.py: what rerun makes a change) and the
workload knobs the advise benchmark plants (issue 37), on real 2-rank gloo runs with a short
schedule: the allreduce's async variant with ``wait_early`` (the traced run, made once), its
reruns by ``verify``, and one run with ``host_sync``.

``change_to_request`` is checked for every kind of change on that run's run.json, and on copies of
it that name another workload, options or link (what ``change_to_request`` reads is run.json
and the workload file: no other run is needed for them).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

import overlapprof
from overlapprof.errors import InputError
from overlapprof.launch import netns
from overlapprof.launch.rerun import change_to_request, command, plan_rerun
from overlapprof.launch.verify import RESULT, VerifyFailed, verify
from overlapprof.report.advice import Verification

REPO = Path(__file__).resolve().parent.parent
SCHEDULE = ["--warmup-steps", "1", "--wait", "0", "--warmup", "1", "--active", "3"]
SMALL = ["buckets=3", "width=96", "batch=2048"]


def _run(out: Path, run_id: str, *opts: str, workload: Path = REPO / "workloads" / "allreduce.py") -> Path:
    args = [sys.executable, "-m", "overlapprof", "run", str(workload), "--nproc", "2", "--variant", "async",
            "--run-id", run_id, "--out", str(out), "--no-analyze", "-q", *SCHEDULE]
    for opt in (*SMALL, *opts):
        args += ["--opt", opt]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out / f"{run_id}-async"


@pytest.fixture(scope="module")
def traced(tmp_path_factory) -> Path:
    """The allreduce's async variant, each bucket waited right after its issue."""
    return _run(tmp_path_factory.mktemp("verify"), "early", "wait_early=true")


def _copy(run: Path, to: Path, *, workload: str | None = None, variant: str | None = None,
          options: dict | None = None, link: dict | None = None) -> Path:
    """A copy of ``run`` (its traces and run.json) whose run.json says another workload, variant,
    options (over the workload's defaults: {} for another workload) or link."""
    shutil.copytree(run, to)
    data = json.loads((to / "run.json").read_text())
    if workload is not None:
        path = Path(workload) if Path(workload).is_file() else REPO / "workloads" / f"{workload}.py"
        data["workload"] = {"name": path.stem, "path": str(path)}
        data["options"] = {}
    data["options"].update(options or {})
    data["variant"] = variant or data["variant"]
    data["link"] = link if link is not None else data["link"]
    (to / "run.json").write_text(json.dumps(data))
    return to


def _events(run: Path, rank: int = 0) -> list[dict]:
    (trace,) = run.glob(f"rank{rank}.*.pt.trace.json")
    return sorted((e for e in json.loads(trace.read_text())["traceEvents"] if e.get("ph") == "X"),
                  key=lambda e: e["ts"])


def _in_steps(events: list[dict]) -> list[list[dict]]:
    steps = [(e["ts"], e["ts"] + e["dur"]) for e in events if e["name"].startswith("ProfilerStep#")]
    return [[e for e in events if a <= e["ts"] < b and not e["name"].startswith("ProfilerStep#")] for a, b in steps]


def _waits_between_computes(run: Path) -> list[int]:
    """Per step, the ``wait`` phases that start before the step's last ``compute``."""
    out = []
    for step in _in_steps(_events(run)):
        last = max(e["ts"] for e in step if e["name"] == "compute")
        out.append(sum(1 for e in step if e["name"] == "wait" and e["ts"] < last))
    return out


# change_to_request: each kind of change


def test_bucket_cap_mb_sets_ddps_option(traced, tmp_path):
    run = _copy(traced, tmp_path / "ddp", workload="ddp")
    request = change_to_request(run, "bucket_cap_mb=8")
    assert request.options["bucket_cap_mb"] == 8.0 and request.variants == ["async"]
    assert request.workload.name == "ddp" and request.nproc == 2 and request.schedule.active == 3
    assert "bucket_cap_mb=8.0" in command(request, "x")


def test_bucket_cap_mb_on_ddps_sync_variant_reruns_the_async_one(traced, tmp_path):
    """The sync variant reduces its gradients in one all_reduce after backward (no_sync): a bucket
    size changes nothing there, so the rerun that makes the replayed buckets is the async one."""
    run = _copy(traced, tmp_path / "ddp", workload="ddp", variant="sync")
    planned = plan_rerun(run, "bucket_cap_mb=1")
    assert planned.request.variants == ["async"] and planned.request.options["bucket_cap_mb"] == 1.0
    assert any("--variant async" in n and "no buckets" in n for n in planned.notes)


def test_prefetch_is_fsdps_option_on_top_of_the_traced_depth(traced, tmp_path):
    sync = _copy(traced, tmp_path / "sync", workload="fsdp", variant="sync")
    request = change_to_request(sync, "prefetch=2")
    assert request.variants == ["async"] and request.options["prefetch"] == 2  # sync prefetches nothing
    deep = _copy(traced, tmp_path / "async", workload="fsdp", options={"prefetch": 1})
    assert change_to_request(deep, "prefetch=1").options["prefetch"] == 2  # one unit earlier than traced


def test_async_is_the_workloads_async_variant_or_its_option(traced, tmp_path):
    request = change_to_request(traced, "async=all_reduce@end")
    assert request.variants == ["async"] and request.options["wait_early"] is False
    sync = _copy(traced, tmp_path / "ring", workload="ring", variant="sync")
    assert change_to_request(sync, "async=send_recv").variants == ["async"]
    assert change_to_request(sync, "async=send_recv@end").variants == ["async"]  # its note says it waits earlier
    coll = _copy(traced, tmp_path / "coll", workload="collectives", variant="all_reduce")
    request = change_to_request(coll, "async=all_reduce")
    assert request.variants == ["all_reduce"] and request.options["overlap"] is True


def test_link_rate_and_bandwidth_are_the_link(traced, tmp_path):
    run = _copy(traced, tmp_path / "link", link=netns.link_for("1gbit"))
    request = change_to_request(run, "link_rate=2gbit")
    assert request.link["bits_per_s"] == 2e9 and request.link["latency_ms"] == netns.LATENCY_MS
    cmd = command(request, "x")
    assert cmd[cmd.index("--link-rate") + 1] == "2gbit"
    assert change_to_request(run, "bandwidth=x4").link["rate"] == "4gbit"
    assert change_to_request(run, "bandwidth=x0.5").link["rate"] == "500mbit"
    assert change_to_request(run, "bandwidth=x1.0000001").link["rate"] == "1000000100bit"


def test_no_straggler_drops_the_slow_rank_options(traced, tmp_path):
    run = _copy(traced, tmp_path / "slow", options={"slow_rank": 1, "slow_ms": 20.0, "slow_compute": True})
    request = change_to_request(run, "no_straggler=1")
    assert (request.options["slow_rank"], request.options["slow_ms"], request.options["slow_compute"]) == (-1, 0.0, False)
    assert request.options["wait_early"] is True  # the rest as traced
    assert not any("slow" in a for a in command(request, "x"))


def test_no_host_sync_turns_the_host_sync_option_off(traced, tmp_path):
    run = _copy(traced, tmp_path / "sync", options={"host_sync": True})
    request = change_to_request(run, "no_host_sync")
    assert request.options["host_sync"] is False and request.options["wait_early"] is True
    assert change_to_request(traced, "no_host_sync") == (
        "no_host_sync=all: workload allreduce has no host_sync option turned on: its host synchronizations are its "
        "code's")


def test_compute_scales_the_size_option(traced, tmp_path):
    assert change_to_request(traced, "compute=x0.5").options["batch"] == 1024  # compute ~ batch
    twice = change_to_request(traced, "compute=x2").options  # a whole number of times: the same ops repeated
    assert (twice["compute_repeat"], twice["batch"]) == (2, 2048)
    ring = _copy(traced, tmp_path / "ring", workload="ring")
    assert change_to_request(ring, "compute=x0.5").options["size"] == 508  # ~ size^3: 640 x 0.5^(1/3)


def test_changes_combine(traced, tmp_path):
    run = _copy(traced, tmp_path / "slow", options={"slow_rank": 1, "slow_ms": 20.0})
    request = change_to_request(run, "async=all_reduce@end,compute=x2,no_straggler=1")
    assert (request.options["wait_early"], request.options["compute_repeat"], request.options["slow_rank"]) == (False, 2, -1)


@pytest.mark.parametrize("change,words", [
    ("bucket_cap_mb=8", "has no bucket_cap_mb option"),
    ("prefetch=1", "has no prefetch option"),
    ("async=send_recv", "no variant or option of workload allreduce"),
    ("async=all_gather", "no variant or option of workload allreduce"),
    ("link_rate=2gbit", "had no --link-rate link"),
    ("bandwidth=x2", "had no --link-rate link"),
    ("no_straggler=1", "is not this run's slow rank"),
    ("compute=x1.0001", "rounds to itself"),
    ("micro_batches=4", "has no micro_batches option"),
    ("speed=x2", "no change named 'speed'"),
    ("async=all_reduce@end,bucket_cap_mb=8", "bucket_cap_mb=8: workload allreduce has no bucket_cap_mb"),
])
def test_a_change_no_rerun_makes_says_why_in_one_line(traced, change, words):
    reason = change_to_request(traced, change)
    assert isinstance(reason, str) and words in reason and "\n" not in reason, reason


def test_compute_on_the_pipeline_and_async_on_fsdp_say_why(traced, tmp_path):
    pipe = _copy(traced, tmp_path / "pipe", workload="pipeline")
    assert "no option that scales its compute alone" in change_to_request(pipe, "compute=x0.5")
    fsdp = _copy(traced, tmp_path / "fsdp", workload="fsdp", variant="sync")
    assert "no variant or option of workload fsdp" in change_to_request(fsdp, "async=all_gather")


def test_verify_refuses_an_unrunnable_change_before_any_rerun(traced, tmp_path):
    with pytest.raises(InputError, match="cannot rerun bucket_cap_mb=8"):
        verify(traced, ["bucket_cap_mb=8"], top=1, out=tmp_path / "v", progress=lambda line: None)
    assert not any((tmp_path / "v").glob("*-async"))


# verify end to end, and the knobs in the traces


@pytest.fixture(scope="module")
def verified(traced, tmp_path_factory):
    lines = []
    out = tmp_path_factory.mktemp("verified")
    return verify(traced, ["async=all_reduce"], top=1, out=out, progress=lines.append), lines, out


def test_verify_reruns_the_baseline_and_the_change_and_compares(verified, traced):
    result, lines, out = verified
    base, changed = result.sets
    assert base.changes == [] and changed.changes == ["async=all_reduce"]
    assert "the rerun waits at the step's end: predicted as async=all_reduce@end, what it makes" in changed.note
    from overlapprof.analysis.replay.predict import whatif

    as_rerun = whatif([str(traced)], ["async=all_reduce@end"], workers=1).predictions[0]
    assert changed.predicted_step_us == pytest.approx(as_rerun.step_us)
    assert result.traced_step_us > 0 and base.predicted_step_us == result.traced_step_us
    assert changed.predicted_low_us <= changed.predicted_step_us <= changed.predicted_high_us
    for t in (base, changed):
        assert 0 < t.realized_low_us <= t.realized_step_us <= t.realized_high_us
    assert changed.within == (changed.predicted_low_us <= changed.realized_step_us <= changed.predicted_high_us)
    assert changed.speedup_low <= changed.speedup <= changed.speedup_high
    assert changed.speedup == pytest.approx(base.realized_step_us / changed.realized_step_us)
    predicted = result.traced_step_us / changed.predicted_step_us
    inside = changed.speedup_low <= predicted <= changed.speedup_high
    assert f"predicted speedup {predicted:.2f}x: {'inside' if inside else 'outside'}" in changed.note, changed.note
    options = {Path(t.run).name: json.loads((Path(t.run) / "run.json").read_text())["options"] for t in (base, changed)}
    assert options[Path(base.run).name]["wait_early"] is True and options[Path(changed.run).name]["wait_early"] is False
    assert any("[1/2] baseline: running" in ln for ln in lines) and any("[2/2] async=all_reduce: done" in ln
                                                                       for ln in lines), lines
    saved = msgspec.json.decode((out / RESULT).read_bytes(), type=Verification)
    assert saved == result


def test_wait_early_waits_before_the_next_bucket(verified, traced):
    """wait_early: every bucket but the last is waited before the next bucket's compute (3 buckets:
    2 waits a step before the last compute); the rerun without it waits only at the step's end."""
    result, _, _ = verified
    assert _waits_between_computes(traced) == [2, 2, 2]
    assert _waits_between_computes(Path(result.sets[1].run)) == [0, 0, 0]


def test_host_sync_blocks_the_host_in_the_window(tmp_path):
    run = _run(tmp_path, "sync", "host_sync=true")
    for step in _in_steps(_events(run)):
        assert sum(1 for e in step if e["name"] == "c10d::barrier") == 3  # one per bucket
    report = overlapprof.analyze(run, workers=1)
    assert report.rank(0).exposure.host_blocked_us > 0


def test_a_failed_rerun_ends_in_one_line_and_keeps_what_was_recorded(traced, tmp_path):
    """A copy of the allreduce that fails its setup below a batch of 100: compute=x0.01 reruns at
    batch 20, first (the baseline is in the middle of the reruns)."""
    planted = tmp_path / "w" / "allreduce.py"
    planted.parent.mkdir()
    text = (REPO / "workloads" / "allreduce.py").read_text()
    planted.write_text(text.replace("def setup(ctx):\n", "def setup(ctx):\n    if ctx.opts.batch < 100:\n"
                                    "        raise ValueError('planted: batch below 100')\n", 1))
    run = _copy(traced, tmp_path / "run", workload=str(planted))
    run_json = json.loads((run / "run.json").read_text())
    run_json["options"] = json.loads((traced / "run.json").read_text())["options"]
    (run / "run.json").write_text(json.dumps(run_json))
    with pytest.raises(VerifyFailed) as caught:
        verify(run, ["compute=x0.01", "async=all_reduce@end"], top=2, out=tmp_path / "v", progress=lambda line: None)
    message = str(caught.value)
    assert "\n" not in message and "the rerun of compute=x0.01 failed" in message and RESULT in message
    kept = json.loads((tmp_path / "v" / RESULT).read_text())
    assert [s["changes"] for s in kept["sets"]] == [[], ["compute=x0.01"], ["async=all_reduce@end"],
                                                    ["compute=x0.01", "async=all_reduce@end"]]
    assert "rerun failed" in kept["sets"][1]["note"] and kept["sets"][1]["predicted_step_us"] > 0
    assert caught.value.verification.sets[1].note == kept["sets"][1]["note"]
