"""``bucket_cap_mb`` over loopback: what a bucket took beyond its bytes at the least hindered pace
is paid per bucket (overlapprof/analysis/replay/buckets.py), on hand-made traces with the answers
worked out in each docstring."""

from __future__ import annotations

import json

import pytest

from overlapprof.analysis.replay.predict import whatif

import synthetic as S

MIB = 1 << 20


def _bucket(at, dur):
    """An async all_reduce of 1000 float32 (4000 bytes): a 1 µs c10d call, its span on gloo's
    worker; the issuing thread does nothing until it ends (its result needed at once)."""
    return [S.cpu_op("c10d::allreduce_", at, 1),
            S.annotation("gloo:all_reduce", at, dur, tid=200, args={"Input Dims": [[1000]], "Input type": ["float"]})]


def _step(n, base, first, second):
    """400 µs of backward, a bucket of ``first`` µs, 400 µs more, a bucket of ``second`` µs, 300 µs
    of optimizer: nothing computes beside a bucket."""
    t1 = base + 400 + first
    t2 = t1 + 400 + second
    return [S.step(n, base, t2 + 300 - base), S.cpu_op("aten::mm", base, 400), *_bucket(base + 400, first),
            S.cpu_op("aten::mm", t1, 400), *_bucket(t1 + 400, second), S.cpu_op("aten::mm", t2, 300)]


def _run(folder, loopback: bool):
    """Steps A (buckets of 300 µs), B (200 µs) and A again on both ranks; with ``loopback`` a
    run.json putting both ranks on one host of 8 cores (not crowded: no interference charged)."""
    folder.mkdir()
    events = _step(1, 0, 300, 300) + _step(2, 1700, 200, 200) + _step(3, 3200, 300, 300)
    for rank in (0, 1):
        S.write(folder / f"rank{rank}.1.pt.trace.json", S.trace(events, rank=rank, world_size=2, backend="gloo"))
    if loopback:
        (folder / "run.json").write_text(json.dumps(_loopback_record()))
    return str(folder)


def _loopback_record():
    """run.json of 2 CPU ranks on one host of 8 cores, no link: over loopback, not crowded."""
    return {"schema_version": 1, "world_size": 2, "device": "cpu",
            "nodes": {"0": {"node_rank": 0, "host": "h", "cpu_cores": 8, "nproc": 2}},
            "ranks": {str(r): {"rank": r, "node_rank": 0, "traces": [f"rank{r}.1.pt.trace.json"]} for r in (0, 1)}}


MERGED, SPLIT = f"bucket_cap_mb={8000 / MIB!r}", f"bucket_cap_mb={2000 / MIB!r}"


def _predict(path):
    result = whatif([path], [MERGED, SPLIT], workers=1)
    return result, {p.change: p for p in result.predictions}


def test_over_loopback_a_buckets_time_beyond_its_bytes_is_paid_per_bucket(tmp_path):
    """Latency 120 µs (two hops of 60 over loopback, under the shortest transfer). The least
    hindered pace is step B's (200 − 120) / 4000 = 0.02 µs a byte; step A's buckets took 0.045
    (360 µs for 8000 bytes beyond latency), 100 µs each beyond their bytes at 0.02. The median
    (rank, step) is an A step (1700 µs traced). One bucket of 8000 bytes, issued when backward
    ends (work 800) and waited there: 120 + 8000 × 0.02 + 100 = 380 µs, a step of 800 + 380 + 300
    = 1480 (not 480 µs, 1580, with all of it per byte). Four of 2000 bytes, issued at work 200,
    400, 600 and 800 as the gradients are produced, one at a time: 120 + 40 + 100 = 260 µs each,
    the last ending at 200 + 4 × 260 = 1240: a step of 1540 (not 210 each, 1340)."""
    result, got = _predict(_run(tmp_path / "loopback", loopback=True))
    assert result.traced_step_us == pytest.approx(1700, abs=2)
    assert got[MERGED].modelled and "3 buckets in all" in got[MERGED].notes[0]
    assert got[MERGED].step_us == pytest.approx(1480, abs=3)
    assert got[SPLIT].step_us == pytest.approx(1540, abs=3)


def test_without_loopback_a_buckets_time_stays_per_byte(tmp_path):
    """The same traces with no run.json (where the bytes went is not known): a bucket's time
    scales with its bytes at its step's own pace, as before. No latency (one size, no fit, not
    loopback): step A's buckets took 600 µs for 8000 bytes, 0.075 µs a byte. One bucket of 8000
    bytes: 600 µs, the traced step again (1700: merging saves nothing); four of 2000 bytes: 150 µs
    each, issued at work 200, 400, 600 and 800, the last ending at 950: a step of 1250."""
    _, got = _predict(_run(tmp_path / "plain", loopback=False))
    assert got[MERGED].step_us == pytest.approx(1700, abs=3)
    assert got[SPLIT].step_us == pytest.approx(1250, abs=3)


def _one_bucket_run(folder):
    """Backward's two autograd functions [0, 800), one 1 MiB bucket issued at 800 and waited at once
    (600 µs in steps 1 and 3, 400 in step 2), 100 µs of optimizer after it; both ranks on one
    host of 8 cores, over loopback."""
    folder.mkdir()
    events, base = [], 0
    for n, x in ((1, 600), (2, 400), (3, 600)):
        events += [S.step(n, base, 900 + x),
                   S.cpu_op("autograd::engine::evaluate_function: AddmmBackward0", base, 400),
                   S.cpu_op("autograd::engine::evaluate_function: AddmmBackward0", base + 400, 400),
                   S.cpu_op("c10d::allreduce_", base + 800, 1),
                   S.annotation("gloo:all_reduce", base + 800, x, tid=200,
                                args={"Input Dims": [[MIB // 4]], "Input type": ["float"]}),
                   S.cpu_op("aten::mm", base + 800 + x, 100)]
        base += 900 + x
    for rank in (0, 1):
        S.write(folder / f"rank{rank}.1.pt.trace.json", S.trace(events, rank=rank, world_size=2, backend="gloo"))
    (folder / "run.json").write_text(json.dumps(_loopback_record()))
    return str(folder)


def test_advise_splits_one_bucket_into_halves_that_each_keep_its_time_beyond_its_bytes(tmp_path):
    """Latency 120 µs; the fastest bucket (step 2's) moves 1 MiB in 400 − 120 = 280 µs. Advise's
    adapter splits each bucket in two halves, each moving 0.5 MiB at that pace and keeping the
    rest: 600 − 140 = 460 µs in steps 1 and 3. Merged back into one bucket they are the traced
    one again (600 µs: the median step, 1500, as traced; the halves' rest counted once, not
    halved). In buckets of 0.25 MiB, issued at work 200, 400, 600 and 800 as backward produces the
    gradients, one at a time, each pays the rest again: 120 + 70 + 200 = 390 µs, the last ending
    at 200 + 4 × 390 = 1760, a step of 1860."""
    from overlapprof.analysis.advise.replayer import Replayer

    rp = Replayer([_one_bucket_run(tmp_path / "one")], workers=1)
    assert rp.one_bucket() is not None and rp.base.prediction.step_us == pytest.approx(1500, abs=2)
    assert rp.predict("bucket_cap_mb=1").prediction.step_us == pytest.approx(1500, abs=2)
    assert rp.predict("bucket_cap_mb=0.25").prediction.step_us == pytest.approx(1860, abs=3)


def _grads(at, *shapes):
    """AccumulateGrad ops (autograd's, with their gradient's shape) just before ``at``, one µs each."""
    return [S.cpu_op("torch::autograd::AccumulateGrad", at - len(shapes) + k, 1, args={"Input Dims": [list(s)]})
            for k, s in enumerate(shapes)]


def _parameters_run(folder, first, second):
    """:func:`_run`'s steps (buckets of 1000 float32 each), the gradients each bucket holds recorded
    before its issue: ``first``'s shapes in the first bucket, ``second``'s in the second."""
    folder.mkdir()
    events = []
    for n, base, x in ((1, 0, 300), (2, 1700, 200), (3, 3200, 300)):
        events += _step(n, base, x, x) + _grads(base + 400, *first) + _grads(base + 800 + x, *second)
    for rank in (0, 1):
        S.write(folder / f"rank{rank}.1.pt.trace.json", S.trace(events, rank=rank, world_size=2, backend="gloo"))
    return str(folder)


def _made(result, change):
    [note] = [n for p in result.predictions for n in p.notes if n.startswith(f"{change}: ") and " in all " in n]
    return int(note.split(": ")[1].split()[0])


def test_a_cap_below_a_parameter_keeps_it_whole_as_ddp_does(tmp_path):
    """Each traced bucket holds one parameter of 1000 float32 (4000 bytes; its shape [10, 100]):
    under a cap of 2000 bytes DDP still makes one bucket of each, the step as traced (3 steps, 2
    buckets each: 6), where splitting a bucket evenly made 12 and another step. Where the first
    bucket holds two parameters of 500 (2000 bytes each), the cap closes a bucket after each: 3 a
    step, 9 in all. Gradients whose elements are not the all_reduce's bytes (800 elements in a
    4000-byte bucket: its all_reduces are not only DDP's) are not used: 12, as without them."""
    one = whatif([_parameters_run(tmp_path / "one", [(10, 100)], [(1000,)])], [SPLIT], workers=1)
    assert _made(one, SPLIT) == 6
    assert one.predictions[0].step_us == pytest.approx(one.replayed_step_us, rel=1e-9)
    two = whatif([_parameters_run(tmp_path / "two", [(500,), (500,)], [(1000,)])], [SPLIT], workers=1)
    assert _made(two, SPLIT) == 9
    odd = whatif([_parameters_run(tmp_path / "odd", [(800,)], [(1000,)])], [SPLIT], workers=1)
    assert _made(odd, SPLIT) == 12
    bare = whatif([_run(tmp_path / "bare", loopback=False)], [SPLIT], workers=1)
    assert _made(bare, SPLIT) == 12


def _unpaired_run(folder, steps_unpaired):
    """:func:`_run`'s three steps, rank 1's second bucket of the steps in ``steps_unpaired`` a
    different size (999 float32), so that the cross-rank matching pairs neither rank's."""
    folder.mkdir()
    for rank in (0, 1):
        events = []
        for n, base, x in ((1, 0, 300), (2, 1700, 200), (3, 3200, 300)):
            step = _step(n, base, x, x)
            if rank == 1 and n in steps_unpaired:
                step[-2]["args"]["Input Dims"] = [[999]]  # the second bucket's gloo span
            events += step
        S.write(folder / f"rank{rank}.1.pt.trace.json", S.trace(events, rank=rank, world_size=2, backend="gloo"))
    return str(folder)


def test_a_step_whose_buckets_are_not_paired_across_ranks_is_left_as_traced(tmp_path):
    """One step of three with a bucket the matching cannot pair (its sizes differ between the
    ranks): the other two are regrouped (merged: one bucket each) and the note says one step is
    left as traced; two of three: most steps cannot be regrouped, the change is not modelled."""
    one = whatif([_unpaired_run(tmp_path / "one", {2})], [MERGED], workers=1)
    assert _made(one, MERGED) == 2
    notes = [n for p in one.predictions for n in p.notes]
    assert f"{MERGED}: 1 step left as traced: the cross-rank matching did not pair their all_reduce operations " \
           "one per rank" in notes
    two = whatif([_unpaired_run(tmp_path / "two", {1, 2})], [MERGED], workers=1)
    assert not two.predictions[0].modelled and "(2 of 3 steps)" in two.predictions[0].reason


def test_one_bucket_is_split_where_its_gradients_were_accumulated(tmp_path):
    """:func:`_one_bucket_run`'s steps, each 1 MiB bucket's gradients recorded: two parameters of
    0.5 MiB, accumulated at work 400 and at 800 (the issue). Under a 0.5 MiB cap the first new
    bucket is issued at 400, beside the second half of backward. Over loopback each pays the
    traced bucket's time beyond its bytes at the fastest pace again (step 2's: 280 µs a MiB after
    the 120 µs latency): in steps 1 and 3 (600 µs: 480 a MiB, nothing computing beside it to
    explain the 200 a MiB more) each moves in 120 + 0.5 × 280 + 200 = 460 µs, 400-860 and 860-1320,
    then 100 µs of optimizer: 1420; step 2, 260 µs each: 1160; the median 1420 against 1500
    traced; without the gradients' ops whatif cannot place a smaller bucket (every one issued at
    the traced one's issue, each paying the per-operation rest over loopback: no shorter, 1620 µs)."""
    bare = whatif([_one_bucket_run(tmp_path / "bare")], ["bucket_cap_mb=0.5"], workers=1)
    assert bare.predictions[0].step_us >= bare.replayed_step_us
    folder = tmp_path / "grads"
    _one_bucket_run(folder)
    for path in folder.glob("rank*.json"):
        data = json.loads(path.read_text())
        steps = [e for e in data["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")]
        for s in steps:
            data["traceEvents"] += _grads(s["ts"] + 400, (MIB // 8,)) + _grads(s["ts"] + 800, (MIB // 8,))
        path.write_text(json.dumps(data))
    placed = whatif([str(folder)], ["bucket_cap_mb=0.5"], workers=1)
    assert _made(placed, "bucket_cap_mb=0.5") == 6
    assert placed.replayed_step_us == pytest.approx(1500, abs=2)
    assert placed.predictions[0].step_us == pytest.approx(1420, abs=2)
