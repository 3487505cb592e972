"""The knobs a user tunes, as workload options (issue 35), each shown to take effect in a real
trace: 2 gloo ranks, a short schedule, small layers (4 of width 128), the async variant.

- DDP ``bucket_cap_mb``: the number of all_reduces a step makes. A layer's gradients are
  128 x 128 + 128 float32 (66,048 bytes); DDP fills a bucket, last layer first, until it holds
  the cap: at 0.1 MiB (104,858 bytes) two layers a bucket, two all_reduces a step; at 25 MiB one.
- DDP ``gradient_as_bucket_view``: DDP copies each gradient (weight and bias: 2 per layer) into
  its bucket before reducing it, unless the gradient is a view into the bucket: 8 ``aten::copy_``
  fewer a step.
- FSDP ``prefetch=N``: before a step's first Linear runs, the first layer's all-gather and the
  N after it have been issued (N + 1); ``reshard_after_forward=false``: the backward
  all-gathers nothing, so a step makes 4 all-gathers, not 8.
- ``compute_repeat=2`` (DDP, FSDP; the ring and the all-reduce repeat their one matmul): each
  layer (Linear and ReLU) twice, forward and backward: ``aten::linear``, ``aten::relu`` and
  ``aten::threshold_backward`` 8 a step for 4 layers, not 4, and the backward's ``aten::mm`` 14,
  not 7 (4 weights' gradients and 3 inputs': the first layer's input needs none); the check
  twice (``aten::equal``); the gradients unchanged (the run's own ``check_result``): the same
  step on a device 2x slower, as ``whatif``'s ``compute=x2`` takes it. DDP's own copies are not
  repeated (the copy count above, the bias's copy inside ``aten::addmm`` left out, holds with it).
- ``slow_rank``/``slow_ms`` (every workload; the harness applies them): rank 0's exposed
  communication is late_peer, the late rank named 1, doing neither compute nor communication
  (asleep) or, with ``slow_compute=true``, computing.

Two runs per workload: each knob changed in one of them only, or (the two DDP knobs and the two
FSDP ones) in a way that does not change what the other counts (measured: 2026-12-06, each of
the four changed alone gave the same count of the other's events as the defaults).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

import overlapprof

REPO = Path(__file__).resolve().parent.parent
SMALL = ("width=128", "layers=4", "batch=64")
SLOW_MS = 60.0


def _run(out: Path, workload: str, run_id: str, *opts: str) -> Path:
    args = [sys.executable, "-m", "overlapprof", "run", REPO / "workloads" / f"{workload}.py", "--nproc", "2",
            "--variant", "async", "--run-id", run_id, "--out", out, "--no-analyze", "-q", "--warmup-steps", "1",
            "--wait", "0", "--warmup", "1", "--active", "2"]
    for opt in (*SMALL, *opts):
        args += ["--opt", opt]
    proc = subprocess.run(list(map(str, args)), capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out / f"{run_id}-async"


def _steps(run: Path, rank: int = 0) -> list[list[dict]]:
    """Rank ``rank``'s complete events per ProfilerStep, in time order."""
    (trace,) = run.glob(f"rank{rank}.*.pt.trace.json")
    events = [e for e in json.loads(trace.read_text())["traceEvents"] if e.get("ph") == "X"]
    steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e["name"].startswith("ProfilerStep#"))
    assert len(steps) == 2, steps
    return [sorted((e for e in events if a <= e["ts"] < b and not e["name"].startswith("ProfilerStep#")),
                   key=lambda e: e["ts"]) for a, b in steps]


def _counts(step: list[dict]) -> Counter:
    return Counter(e["name"] for e in step)


def _copies_not_in_addmm(step: list[dict]) -> int:
    """``aten::copy_`` but the one ``aten::addmm`` makes of its bias (CPU) on every call."""
    addmm = [(e["tid"], e["ts"], e["ts"] + e["dur"]) for e in step if e["name"] == "aten::addmm"]
    return sum(1 for e in step if e["name"] == "aten::copy_"
               and not any(t == e["tid"] and a <= e["ts"] < b for t, a, b in addmm))


@pytest.fixture(scope="module")
def knob_runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("knobs")
    return {
        "ddp_small_buckets": _run(out, "ddp", "ddp-small", "bucket_cap_mb=0.1", "compute_repeat=2"),
        "ddp_views": _run(out, "ddp", "ddp-views", "bucket_cap_mb=25", "gradient_as_bucket_view=true"),
        "fsdp_prefetch2": _run(out, "fsdp", "fsdp-prefetch2", "prefetch=2", "slow_rank=1", f"slow_ms={SLOW_MS}",
                               "slow_compute=true", "compute_repeat=2"),
        "fsdp_keep": _run(out, "fsdp", "fsdp-keep", "reshard_after_forward=false", "slow_rank=1", f"slow_ms={SLOW_MS}"),
    }


def test_ddp_bucket_cap_sets_the_all_reduces_of_a_step(knob_runs):
    small = [_counts(s)["c10d::allreduce_"] for s in _steps(knob_runs["ddp_small_buckets"])]
    whole = [_counts(s)["c10d::allreduce_"] for s in _steps(knob_runs["ddp_views"])]
    assert small == [2, 2] and whole == [1, 1], (small, whole)
    report = overlapprof.analyze(knob_runs["ddp_small_buckets"], workers=1, comms=False)
    assert {k.kind: k.count for k in report.rank(0).kinds}["all_reduce"] == 4  # 2 steps: what analyze counts


def test_ddp_gradient_as_bucket_view_drops_the_copies_into_the_buckets(knob_runs):
    copies = [_copies_not_in_addmm(s) for s in _steps(knob_runs["ddp_small_buckets"])]
    views = [_copies_not_in_addmm(s) for s in _steps(knob_runs["ddp_views"])]
    assert [a - b for a, b in zip(copies, views)] == [8, 8], (copies, views)  # a weight and a bias per layer


@pytest.mark.parametrize("repeated,once", [("ddp_small_buckets", "ddp_views"), ("fsdp_prefetch2", "fsdp_keep")])
def test_compute_repeat_does_each_whole_layer_and_the_check_that_many_times(knob_runs, repeated, once):
    for run, times in ((repeated, 2), (once, 1)):
        counts = [_counts(s) for s in _steps(knob_runs[run])]  # rank 0: rank 1's slow_compute is matmuls too
        for name in ("aten::linear", "aten::relu", "aten::threshold_backward"):  # forward, activation, its backward
            assert [c[name] for c in counts] == [4 * times] * 2, (run, name, counts)
        assert [c["aten::mm"] for c in counts] == [7 * times] * 2, (run, counts)  # the backward's matmuls
        assert [c["aten::equal"] for c in counts] == [times] * 2, (run, counts)  # the check


def _gathers_before_first_linear(step: list[dict]) -> int:
    first = next(e["ts"] for e in step if e["name"] in ("aten::linear", "aten::addmm"))
    return sum(1 for e in step if e["ts"] < first and e["name"] == "c10d::_allgather_base_")


def test_fsdp_prefetch_issues_that_many_layers_ahead(knob_runs):
    assert [_gathers_before_first_linear(s) for s in _steps(knob_runs["fsdp_prefetch2"])] == [3, 3]
    assert [_gathers_before_first_linear(s) for s in _steps(knob_runs["fsdp_keep"])] == [2, 2]  # prefetch=1


def test_fsdp_reshard_after_forward_false_gathers_nothing_in_backward(knob_runs):
    resharded = [_counts(s)["c10d::_allgather_base_"] for s in _steps(knob_runs["fsdp_prefetch2"])]
    kept = [_counts(s)["c10d::_allgather_base_"] for s in _steps(knob_runs["fsdp_keep"])]
    assert resharded == [8, 8] and kept == [4, 4], (resharded, kept)


@pytest.mark.parametrize("run,doing", [("fsdp_keep", "other"), ("fsdp_prefetch2", "compute")])
def test_a_slow_rank_on_fsdp_is_the_late_peer(knob_runs, run, doing):
    """Asleep (other) or computing (slow_compute: compute), rank 1 is who rank 0 waited for."""
    report = overlapprof.analyze(knob_runs[run], workers=1)
    e = report.rank(0).exposure
    assert e.largest()[0] == "late_peer"
    assert e.late_peer_by_rank.get(1, 0.0) >= 0.9 * e.late_peer_us
    # what the late rank did most while rank 0 waited (the loop's Python between matmuls, and a
    # loaded machine's descheduling, are 'other': a majority, not all)
    assert max(e.late_peer_activity, key=e.late_peer_activity.get) == doing, e.late_peer_activity
    # rank 0 waits out rank 1's straggle once a step (its first all-gather), never twice; most of
    # it in a step where rank 0 was not held up itself (on a loaded machine 64-76 ms a step for a
    # 60 ms straggle measured: its rounds after it add up; once, idle, rank 0's own hold-up took a
    # step's wait: [5.3, 62.9] ms)
    per_step = [s.exposure.late_peer_us for s in report.rank(0).steps]
    assert all(t <= 2.0 * SLOW_MS * 1000 for t in per_step), per_step
    assert max(per_step) >= 0.6 * SLOW_MS * 1000, per_step
    assert report.rank(1).exposure.late_peer_us < 0.2 * e.late_peer_us


@pytest.mark.parametrize("workload", ["ddp", "fsdp"])
def test_compute_repeat_leaves_the_layers_output_and_gradients_as_they_were(workload):
    """The repeated layers' results go nowhere: repeat 3 gives repeat 1's output and gradients,
    bit for bit (the weight's, the bias's and the input's)."""
    import importlib.util

    import torch

    spec = importlib.util.spec_from_file_location(f"knob_{workload}", REPO / "workloads" / f"{workload}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    results = []
    for repeat in (1, 3):
        torch.manual_seed(0)
        layer = module.Layer(32, repeat)
        x = torch.randn(8, 32, generator=torch.Generator().manual_seed(1), requires_grad=True)
        y = layer(x)
        (y * torch.arange(32.0)).sum().backward()
        results.append((y.detach(), layer.weight.grad, layer.bias.grad, x.grad))
    assert all(torch.equal(a, b) for a, b in zip(*results))
    assert results[0][1].abs().sum() > 0  # a gradient there was



def _made(result) -> dict:
    """Change -> the buckets its regrouping made in all (its note)."""
    return {p.change: int(n.split(": ")[1].split()[0]) for p in result.predictions for n in p.notes
            if n.startswith(f"{p.change}: ") and "buckets in all" in n}


def test_whatif_regroups_ddps_real_gradients_as_ddp_buckets_them(knob_runs):
    """From the 25 MiB run (one bucket a step, 2 profiled steps), with the gradients' shapes its
    trace records (``torch::autograd::AccumulateGrad``, 8 a step: 4 weights of 65,536 bytes, 4
    biases of 512): 0.1 MiB makes 2 buckets a step, as the 0.1 MiB run made (4 in all); 0.02 MiB,
    under a weight's size, one bucket a layer (a bias, then its weight: 8 in all), never part of a
    parameter (the bucket split evenly in 20,972-byte pieces made 12 a step); its own cap, its
    own bucket (2). The 0.1 MiB run repeats each layer on detached copies (``compute_repeat=2``),
    whose gradients autograd accumulates too: 19 a step, not DDP's alone, so its buckets are split
    evenly as without shapes (6 pieces each at 0.02 MiB: 24)."""
    from overlapprof.analysis.replay.predict import whatif

    small = [_counts(s)["c10d::allreduce_"] for s in _steps(knob_runs["ddp_small_buckets"])]
    changes = ["bucket_cap_mb=0.1", "bucket_cap_mb=0.02", "bucket_cap_mb=25"]
    made = _made(whatif([str(knob_runs["ddp_views"])], changes, workers=1))
    assert made == {"bucket_cap_mb=0.1": sum(small), "bucket_cap_mb=0.02": 8, "bucket_cap_mb=25": 2}, (made, small)
    result = whatif([str(knob_runs["ddp_small_buckets"])], ["bucket_cap_mb=0.1", "bucket_cap_mb=0.02"], workers=1)
    assert _made(result) == {"bucket_cap_mb=0.1": 4, "bucket_cap_mb=0.02": 24}
    own = next(p for p in result.predictions if p.change == "bucket_cap_mb=0.1")
    assert own.step_us == pytest.approx(result.replayed_step_us, rel=1e-9)
