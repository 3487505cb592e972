"""``overlapprof whatif`` end to end (issue 35): the text, --json (a WhatIf that loads back),
--check against a run, and one-line errors; and predict, then run: the ring traced over a
--link-rate link, predicted at other rates, then run at them."""

from __future__ import annotations

import json
import shutil

import pytest

from overlapprof.report.whatif import WhatIf

import synthetic as S
from conftest import overlapprof_here


def _blocking(at, dur):
    return [S.cpu_op("c10d::allreduce_", at, dur), S.annotation("gloo:all_reduce", at, dur)]


def _run(folder, compute_us, after_us=300):
    """Two gloo ranks, two steps: compute, a blocking 300 µs all_reduce, compute."""
    folder.mkdir()
    step = compute_us + 300 + after_us
    events = [S.step(1, 0, step), S.step(2, step, step)]
    for base in (0, step):
        events += [S.cpu_op("aten::mm", base, compute_us), *_blocking(base + compute_us, 300),
                   S.cpu_op("aten::mm", base + compute_us + 300, after_us)]
    for rank in (0, 1):
        S.write(folder / f"rank{rank}.json", S.trace(events, rank=rank, world_size=2, backend="gloo"))
    return folder


def test_the_text_names_each_change_its_step_and_what_limits_it(tmp_path):
    traced = _run(tmp_path / "a", 400)
    got = overlapprof_here("whatif", traced, "--set", "compute=x0.5", "--set", "bucket_cap_mb=5", "--workers", 1)
    assert got.exit_code == 0, got.output
    out = got.stdout
    assert "traced step (median over 2 ranks' steps): 1.000 ms; replayed unchanged: 1.000 ms (+0.00%)" in out
    row = next(line for line in out.splitlines() if line.startswith("compute=x0.5"))
    assert "0.650" in row and "1.54x" in row and "no_window 0.300" in row
    assert ("cannot be modelled from this trace: bucket_cap_mb=5: the all_reduce operations' sizes are not in "
            "the trace") in out


def test_json_loads_back_and_check_says_whether_the_run_is_within(tmp_path):
    """Predict compute=x0.5 from a trace with 400 + 300 µs of compute a step: 650 µs. The run
    whose compute is 200 + 150 measures exactly that (within); the one with 200 + 300, 800."""
    traced, halved, half_done = _run(tmp_path / "a", 400), _run(tmp_path / "b", 200, 150), _run(tmp_path / "c", 200)
    out = tmp_path / "w.json"
    got = overlapprof_here("whatif", traced, "--set", "compute=x0.5", "--check", halved, "--json", out, "--workers", 1)
    assert got.exit_code == 0, got.output
    w = WhatIf.load(out)
    assert WhatIf.from_json(w.to_json()) == w
    p = w.predictions[0]
    assert (p.step_us, p.check.measured_step_us, p.check.error, p.check.within) == (650, 650, 0, True)
    assert p.check.compute_ratio == 1  # 350 µs of compute a step, as the change predicts
    assert "error +0.00%, within the predicted spread" in got.stdout
    got = overlapprof_here("whatif", traced, "--set", "compute=x0.5", "--check", half_done, "--workers", 1)
    assert "measured 0.800 ms (0.800-0.800), predicted 0.650 ms: error -18.75%, outside" in got.stdout
    assert "compute a step was 1.43x what the change predicts" in got.stdout  # 500 µs, not 350
    assert json.loads(overlapprof_here("whatif", traced, "--set", "compute=x1", "--json", "--workers", 1).stdout)[
        "predictions"][0]["step_us"] == pytest.approx(1000)


@pytest.mark.parametrize("args, words", [
    ((), "give at least one change"),
    (("--set", "speed=x2"), "no change named 'speed'"),
    (("--set", "compute=x0"), "a factor is a positive number"),
    (("--set", "compute=x2", "--set", "bandwidth=x2", "--check", "."), "exactly one --set"),
])
def test_bad_input_is_one_error_line(tmp_path, args, words):
    traced = _run(tmp_path / "a", 400)
    got = overlapprof_here("whatif", traced, *args)
    assert got.exit_code == 2, got.output
    assert got.stderr.startswith("Error: ") and words in got.stderr and got.stderr.count("\n") == 1


# -- predict, then run: the ring's blocking send/recv over an emulated link (2 ranks, a 64 x 64
# matmul: the link sets the step), traced at 1 Gbit/s, predicted at 2 Gbit/s, then run at it (the
# halved rate is the benchmark's). TOLERANCE is what docs/whatif.md measured on this 2-core machine
# under load, with margin; the direction (a faster link is faster) must hold outright. The same
# ring traced with rank 1 sleeping 10 ms a step, predicted and checked without it, is the
# benchmark's ring-straggler row (``benchmarks/whatif_bench.py --only ring-straggler``: the same
# runs), not run here: a third linked launch, ~16 s of a loaded suite (issue 36 item 5).
LINKED = ("--nproc", 2, "--variant", "sync", "--no-analyze", "-q", "--warmup-steps", 1, "--wait", 0, "--warmup", 1,
          "--active", 3, "--", "--size", 64)
TOLERANCE = 0.35


@pytest.mark.skipif(not (shutil.which("unshare") and shutil.which("tc")), reason="needs unshare (util-linux) and tc")
def test_predict_then_run_the_ring_at_other_link_rates(tmp_path):
    from conftest import REPO, _overlapprof

    dirs = {}
    for rate in ("1gbit", "2gbit"):
        proc = _overlapprof("run", REPO / "workloads/ring.py", "--link-rate", rate, "--run-id", rate, "--out", tmp_path,
                            *LINKED, timeout=400)
        assert proc.returncode == 0, proc.stderr[-3000:]
        dirs[rate] = tmp_path / f"{rate}-sync"
    got = overlapprof_here("whatif", dirs["1gbit"], "--set", "link_rate=2gbit", "--check", dirs["2gbit"],
                           "--json", tmp_path / "2gbit.json")
    assert got.exit_code == 0, got.output
    checked = WhatIf.load(tmp_path / "2gbit.json")
    fast = checked.predictions[0]
    assert checked.traced_step_us > fast.step_us and checked.traced_step_us > fast.check.measured_step_us
    assert abs(fast.check.error) <= TOLERANCE, (fast.change, fast.step_us, fast.check)


def test_a_saved_report_is_refused_with_what_to_give(tmp_path):
    import overlapprof

    traced = _run(tmp_path / "a", 400)
    overlapprof.analyze(traced, workers=1).save(tmp_path / "r.json")
    got = overlapprof_here("whatif", tmp_path / "r.json", "--set", "compute=x2")
    assert got.exit_code == 2 and got.stderr.count("\n") == 1
    assert "holds no operations to replay: give the run directory or the traces" in got.stderr


def test_compare_and_report_show_a_saved_prediction_beside_the_measured_run(tmp_path):
    """compute=x0.5 predicted from the traced run (650 µs), saved; compare and report the traced
    run and the run that made the change with --prediction: the prediction beside the changed
    run only (error 0), not beside the traced run it came from."""
    traced, halved = _run(tmp_path / "a", 400), _run(tmp_path / "b", 200, 150)
    saved = tmp_path / "w.json"
    assert overlapprof_here("whatif", traced, "--set", "compute=x0.5", "--json", saved, "--workers", 1).exit_code == 0
    got = overlapprof_here("compare", traced, halved, "--prediction", saved)
    assert got.exit_code == 0, got.output
    (line,) = [x for x in got.stdout.splitlines() if x.startswith("prediction ")]
    assert line == (f"prediction compute=x0.5 (from {traced}) beside b: predicted 0.650 ms (0.650-0.650), measured "
                    "0.650 ms: error +0.00%, within the predicted spread")
    out = tmp_path / "c.json"
    assert overlapprof_here("compare", traced, halved, "--prediction", saved, "--json", out).exit_code == 0
    (row,) = json.loads(out.read_text())["predictions"]
    assert (row["variant"], row["step_us"], row["measured_step_us"], row["error"]) == ("b", 650, 650, 0)
    page = tmp_path / "r.html"
    got = overlapprof_here("report", traced, halved, "--prediction", saved, "-o", page)
    assert got.exit_code == 0, got.output
    html = page.read_text()
    assert "Predicted, then measured" in html and "compute=x0.5" in html and "+0.00%" in html
    for args in ((traced, halved, "--prediction", tmp_path / "missing.json"), (traced, halved, "--prediction", traced)):
        got = overlapprof_here("compare", *args)
        assert got.exit_code == 2 and got.stderr.startswith("Error: --prediction ") and got.stderr.count("\n") == 1


# -- predict, then run: the pipeline traced with 8 micro-batches, then run with 4 by `overlapprof
# run --predict-from`, which predicts before the run and checks after. The smallest sizes that
# keep a pipeline's shape (2 layers of 256 a stage, 256 rows), 5 steps a run. Measured on
# 2026-12-06 under load 13-16: +2.1% (compute ratio 0.76), then -69.6% and +188% (the traced run's
# steps 20 and 40 ms, the checked run's 13-69 ms: the load, not the model). So the accuracy is
# asserted where the check says the machine left compute alone between the runs (its compute
# ratio within COMPUTE_STEADY), with MICRO_TOLERANCE (the bench's loaded sync pairs erred -33% to
# +51%); otherwise the check must say the machine moved it.
PIPE = ("--nproc", 2, "--variant", "sync", "--no-analyze", "-q", "--warmup-steps", 1, "--wait", 0, "--warmup", 1,
        "--active", 5)
PIPE_OPTS = ("--width", 256, "--batch", 256, "--layers", 2)
MICRO_TOLERANCE = 0.6
COMPUTE_STEADY = (0.75, 1.33)


def test_run_predicts_micro_batches_before_running_and_checks_after(tmp_path):
    from conftest import REPO, _overlapprof

    proc = _overlapprof("run", REPO / "workloads/pipeline.py", "--run-id", "m8", "--out", tmp_path, *PIPE, "--",
                        *PIPE_OPTS, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    traced, changed = tmp_path / "m8-sync", tmp_path / "m4-sync"
    proc = _overlapprof("run", REPO / "workloads/pipeline.py", "--run-id", "m4", "--out", tmp_path, *PIPE,
                        "--predict-from", traced, "--set", "micro_batches=4", "--", *PIPE_OPTS, "--micro_batches", 4,
                        timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert out.startswith("prediction, before the run:") and "micro_batches=4: the traced 8 micro-batches" in out
    (line,) = [x for x in out.splitlines() if x.startswith("check micro_batches=4 against ")]
    got = overlapprof_here("whatif", traced, "--set", "micro_batches=4", "--check", changed, "--json", tmp_path / "w.json")
    assert got.exit_code == 0, got.output
    p = WhatIf.load(tmp_path / "w.json").predictions[0]
    assert f"error {100 * p.check.error:+.2f}%" in line  # the same check as whatif --check
    if COMPUTE_STEADY[0] <= p.check.compute_ratio <= COMPUTE_STEADY[1]:
        assert abs(p.check.error) <= MICRO_TOLERANCE, (line, p.check)
    else:
        assert "the checked run's compute a step was" in out, out
    got = overlapprof_here("run", REPO / "workloads/pipeline.py", "--predict-from", traced)
    assert got.exit_code == 2 and "go together" in got.stderr
