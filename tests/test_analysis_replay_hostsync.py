"""``no_host_sync`` (issues 35 and 37): every barrier removed from the replayed steps, on
hand-made traces with an exact expected step; a trace without one is one line and no number."""

from __future__ import annotations

import json

import pytest

from overlapprof.analysis.replay.changes import parse
from overlapprof.analysis.replay.predict import whatif
from overlapprof.errors import InputError

import synthetic as S


def _step(base, transfer):
    """400 µs of compute, an async all_reduce of ``transfer`` µs issued at 400 (a 1 µs call, its
    span on gloo's worker), a barrier on the main thread [401, 700), 300 µs of compute."""
    return [S.cpu_op("aten::mm", base, 400), S.cpu_op("c10d::allreduce_", base + 400, 1),
            S.annotation("gloo:all_reduce", base + 400, transfer, tid=200,
                         args={"Input Dims": [[1000]], "Input type": ["float"]}),
            S.cpu_op("c10d::barrier", base + 401, 299), S.annotation("gloo:barrier", base + 401, 299),
            S.cpu_op("aten::mm", base + 700, 300)]


def _write(tmp_path, events):
    for rank in (0, 1):
        S.write(tmp_path / f"rank{rank}.json", S.trace(events, rank=rank, world_size=2, backend="gloo"))
    return str(tmp_path)


def _predict(path, *changes):
    return {p.change: p for p in whatif([path], list(changes), workers=1).predictions}


def test_no_host_sync_removes_the_barrier_and_the_lane_goes_straight_on(tmp_path):
    """The all_reduce (200 µs) is needed right after its issue (no compute beside it); the barrier
    holds the lane to 700 after it ended at 600. Without the barrier: 400 + 1 µs, the wait to 600,
    300 µs of compute: 900 µs a step. The two spellings are one change."""
    events = [S.step(1, 0, 1000), S.step(2, 1000, 1000), *_step(0, 200), *_step(1000, 200)]
    result = whatif([_write(tmp_path, events)], ["no_host_sync", "no_host_sync=all"], workers=1)
    assert result.replayed_step_us == pytest.approx(1000)
    bare, named = result.predictions
    assert bare.step_us == pytest.approx(900) and named.step_us == pytest.approx(900)
    assert any(n.startswith("no_host_sync: 4 barrier operations removed") for n in bare.notes)


def test_a_barrier_that_ends_with_the_operation_holds_nothing_to_remove(tmp_path):
    """The all_reduce (300 µs) ends when the barrier does: the lane waits for it all the same."""
    events = [S.step(1, 0, 1000), S.step(2, 1000, 1000), *_step(0, 300), *_step(1000, 300)]
    assert _predict(_write(tmp_path, events), "no_host_sync")["no_host_sync"].step_us == pytest.approx(1000)


def test_no_barrier_is_one_line_and_no_number(tmp_path):
    events = [S.step(1, 0, 1000), S.cpu_op("aten::mm", 0, 400), S.cpu_op("c10d::allreduce_", 400, 300),
              S.annotation("gloo:all_reduce", 400, 300), S.cpu_op("aten::mm", 700, 300)]
    p = _predict(_write(tmp_path, events), "no_host_sync")["no_host_sync"]
    assert not p.modelled and p.step_us is None and "\n" not in p.reason
    assert p.reason.startswith("no_host_sync: the trace has no barrier operation to remove")
    assert "cudaStreamSynchronize" in p.reason


def test_no_host_sync_takes_no_value_but_all(tmp_path):
    assert parse("no_host_sync") == parse("no_host_sync=all") == [("no_host_sync", "all")]
    assert parse("no_host_sync,compute=x2") == [("no_host_sync", "all"), ("compute", "x2")]
    events = [S.step(1, 0, 1000), *_step(0, 200)]
    with pytest.raises(InputError, match="no_host_sync=3: the only value is 'all'"):
        whatif([_write(tmp_path, events)], ["no_host_sync=3"], workers=1)


def _plain(base):
    """400 µs of compute, an async all_reduce of 60 µs waited for at once, 300 µs of compute."""
    return [S.cpu_op("aten::mm", base, 400), S.cpu_op("c10d::allreduce_", base + 400, 1),
            S.annotation("gloo:all_reduce", base + 400, 60, tid=200,
                         args={"Input Dims": [[1000]], "Input type": ["float"]}),
            S.cpu_op("aten::mm", base + 460, 300)]


def test_an_operation_in_flight_across_a_barrier_takes_the_models_transfer(tmp_path):
    """An 8 Gbit/s link shared by 2 ranks (500 bytes/µs): the 4000-byte all_reduce takes 60 µs in
    two steps (760 µs) and 200 µs in the two with a barrier in its window (900 µs: its end measured
    where the barrier let its lane wait). The model: 8 µs of bytes + the latency of the operations
    no barrier held (60 − 8 = 52; the model's own, 122, is the median with the held ones) = 60 µs.
    Without the barriers those two steps are 400 + 1 + the wait to 460 + 300 = 760 µs, as the
    others (at the measured 200 µs they would stay 900, the median 830); 2 × 140 µs of transfer
    over 4 steps: 0.070 ms a step."""
    events, base = [], 0
    for k, barrier in enumerate((False, True, False, True)):
        events += [S.step(k + 1, base, 900 if barrier else 760), *(_step(base, 200) if barrier else _plain(base))]
        base += 900 if barrier else 760
    folder = tmp_path / "run"
    folder.mkdir()
    for rank in (0, 1):
        S.write(folder / f"rank{rank}.1.pt.trace.json", S.trace(events, rank=rank, world_size=2, backend="gloo"))
    run = {"schema_version": 1, "world_size": 2, "device": "cpu",
           "ranks": {str(r): {"rank": r, "traces": [f"rank{r}.1.pt.trace.json"]} for r in (0, 1)},
           "link": {"bits_per_s": 8e9, "shared": True, "rate": "8gbit"}}
    (folder / "run.json").write_text(json.dumps(run))
    p = _predict(str(folder), "no_host_sync")["no_host_sync"]
    assert "no_host_sync: the operations in flight across a barrier take the transfer model's time for their bytes, " \
           "0.070 ms of transfer a step less than measured" in " ".join(p.notes)
    assert p.step_us == pytest.approx(760)
