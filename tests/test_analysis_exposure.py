"""Why communication is exposed (issue 26): every exposed µs gets one cause, on hand-made traces
with known answers (one cause at a time, then overlapping), and the five add up to the exposed
communication on every real trace in tests/data (rank, step and kind), with late_peer equal to
the cross-rank section's exposed wait."""

from __future__ import annotations

from pathlib import Path

import pytest

import overlapprof
from overlapprof.report import CAUSES

import real_data
import synthetic as S

DATA = Path(__file__).parent / "data"
REAL = real_data.jobs()
WORKER = 200  # gloo's worker thread, where a collective's span runs


def _causes(exposure) -> dict[str, float]:
    return {c: getattr(exposure, f"{c}_us") for c in CAUSES if getattr(exposure, f"{c}_us")}


def _allreduce(ts, dur, *, call_ts=None, call_dur=5, tid=S.MAIN_TID):
    """A gloo all_reduce: its c10d call on the main thread, its span on ``tid`` (the main thread:
    a blocking call; the worker: an async one, issued by the call)."""
    call_ts = ts if call_ts is None else call_ts
    return [S.cpu_op("c10d::allreduce_", call_ts, call_dur if tid != S.MAIN_TID else dur),
            S.annotation("gloo:all_reduce", ts, dur, tid=tid)]


def _analyze(tmp_path, ranks: dict[int, list]):
    for rank, events in ranks.items():
        S.write(tmp_path / f"rank{rank}.json", S.trace(events, rank=rank, world_size=len(ranks), backend="gloo"))
    return overlapprof.analyze([str(tmp_path)], workers=1)


def test_blocking_call_is_no_window(tmp_path):
    """Both ranks arrive together, nothing runs beside the call: every exposed µs is no_window."""
    events = [S.step(1, 0, 1000), *_allreduce(100, 300), S.cpu_op("aten::mm", 400, 500)]
    report = _analyze(tmp_path, {0: events, 1: events})
    for r in report.ranks:
        assert r.metrics.exposed_comm_us == 300
        assert _causes(r.exposure) == {"no_window": 300}
        assert _causes(r.steps[0].exposure) == {"no_window": 300}
        assert r.kinds[0].kind == "all_reduce" and _causes(r.kinds[0].exposure) == {"no_window": 300}


def test_late_rank_is_named_with_what_it_was_doing(tmp_path):
    """Rank 1 computes until 200, does nothing until 250, then joins the all_reduce rank 0 began at
    100: rank 0 waited 150 µs for rank 1 (100 computing, 50 neither), then both moved the data."""
    rank0 = [S.step(1, 0, 1000), *_allreduce(100, 300)]
    rank1 = [S.step(1, 0, 1000), S.cpu_op("aten::mm", 0, 200), *_allreduce(250, 150)]
    report = _analyze(tmp_path, {0: rank0, 1: rank1})
    r0, r1 = report.ranks
    assert _causes(r0.exposure) == {"late_peer": 150, "no_window": 150}
    assert r0.exposure.late_peer_by_rank == {1: 150}
    assert r0.exposure.late_peer_activity == {"compute": 100, "other": 50}
    assert _causes(r1.exposure) == {"no_window": 150}
    assert r0.exposure.late_peer_us == report.crossrank.rank(0).exposed_wait_us
    assert "rank 1" in r0.verdict or "late_peer" not in r0.verdict


def test_a_late_rank_holding_most_of_the_exposure_comes_first_in_the_verdict(tmp_path):
    """Rank 1 computes until 600, then joins the all_reduce rank 0 began at 100: rank 0 waits
    500 µs of its 600 exposed (83%, half its step) for rank 1. The lever is rank 1's work, so the
    verdict says that first (who, how much a step, what it was doing), then where the step stands
    against its bound, which holds these transfers (a blocking trace: first-order) and compute."""
    rank0 = [S.step(1, 0, 1000), *_allreduce(100, 600)]
    rank1 = [S.step(1, 0, 1000), S.cpu_op("aten::mm", 0, 600), *_allreduce(600, 100)]
    r0 = _analyze(tmp_path, {0: rank0, 1: rank1}).rank(0)
    assert _causes(r0.exposure) == {"late_peer": 500, "no_window": 100}
    first, _, rest = r0.verdict.partition("; behind it, ")
    assert first == ("late-peer-limited: 83% of its exposed communication, 0.500 ms a step, waits for a late rank: "
                     "rank 1, doing compute 100%: balance the ranks' work or issue earlier on the late rank"), r0.verdict
    assert rest.split(":")[0] in ("overlap-limited", "host-bound", "communication-bound", "compute-bound"), rest
    assert "within these transfers and this compute" in rest and "late_peer" not in rest


@pytest.mark.parametrize("late_at, step_us", [(160, 1000), (600, 20_000)])
def test_a_late_rank_is_not_first_when_it_holds_little(tmp_path, late_at, step_us):
    """Not first when late_peer is under half of the exposure (60 of 160), or under a tenth of
    the step (500 µs of a 20 ms step): then the verdict's first word is the bound's."""
    rank0 = [S.step(1, 0, step_us), *_allreduce(100, late_at - 100 + 100)]
    rank1 = [S.step(1, 0, step_us), S.cpu_op("aten::mm", 0, late_at), *_allreduce(late_at, 100)]
    r0 = _analyze(tmp_path, {0: rank0, 1: rank1}).rank(0)
    assert r0.exposure.late_peer_us == late_at - 100
    assert not r0.verdict.startswith("late-peer-limited") and "behind it" not in r0.verdict, r0.verdict


def test_the_late_rank_is_followed_to_the_one_not_waiting(tmp_path):
    """Rank 0 waits for rank 1 in one all_reduce (group a); rank 1 meanwhile waits for rank 2 in
    another (group b): rank 0's wait is put on rank 2, who was computing."""
    def ar(ts, dur, group):
        args = {"Process Group Name": group, "Collective name": "allreduce"}
        return [S.cpu_op("c10d::allreduce_", ts, dur),
                S.cpu_op("record_param_comms", ts, dur, args=args),
                S.annotation("gloo:all_reduce", ts, dur, args=args)]
    rank0 = [S.step(1, 0, 1000), *ar(100, 400, "a")]
    rank1 = [S.step(1, 0, 1000), *ar(50, 350, "b"), *ar(400, 100, "a")]
    rank2 = [S.step(1, 0, 1000), S.cpu_op("aten::mm", 0, 300), *ar(300, 100, "b")]
    report = _analyze(tmp_path, {0: rank0, 1: rank1, 2: rank2})
    r0 = report.rank(0)
    # rank 0 waited [100, 400): while rank 1 waited for rank 2 ([100, 300)) the root is rank 2,
    # computing; then [300, 400) rank 1 itself, moving group b's data (communication).
    assert r0.exposure.late_peer_us == 300
    assert r0.exposure.late_peer_by_rank == {1: 100, 2: 200}
    assert r0.exposure.late_peer_activity == {"compute": 200, "comm": 100}


def test_compute_in_the_window_that_ran_out_is_window_short(tmp_path):
    """An async all_reduce issued at 100 (its span on the worker thread from 110 to 500), compute
    until 300, then the wait: the exposed [300, 500) and the call's own [100, 105) are window_short."""
    events = [S.step(1, 0, 1000), *_allreduce(110, 390, call_ts=100, tid=WORKER), S.cpu_op("aten::mm", 105, 195)]
    report = _analyze(tmp_path, {0: events, 1: events})
    for r in report.ranks:
        assert r.metrics.exposed_comm_us == 205
        assert _causes(r.exposure) == {"window_short": 205}


def test_an_operation_behind_another_on_its_group_is_queued(tmp_path):
    """Two async all_reduces issued at 100 and 101; the worker runs the first [110, 300), then the
    second [300, 500): while the first runs after the compute (150..300), the second is queued."""
    events = [S.step(1, 0, 1000), *_allreduce(110, 190, call_ts=100, call_dur=1, tid=WORKER),
              *_allreduce(300, 200, call_ts=101, call_dur=1, tid=WORKER), S.cpu_op("aten::mm", 102, 48)]
    report = _analyze(tmp_path, {0: events, 1: events})
    for r in report.ranks:
        assert r.metrics.exposed_comm_us == 352
        assert _causes(r.exposure) == {"queued": 150, "window_short": 202}


def test_a_host_synchronization_is_host_blocked(tmp_path):
    """GPU mode: a NCCL kernel [100, 500) beside a compute kernel [100, 200); the host sits in
    cudaDeviceSynchronize [210, 500), then launches the next kernel: [210, 500) is host_blocked."""
    events = [S.step(1, 0, 1000),
              *S.launched("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 90, 100, 400, stream=20),
              *S.launched("ampere_sgemm_128x64_nn", 95, 100, 100),
              S.runtime(210, 290, 0, name="cudaDeviceSynchronize"),
              *S.launched("ampere_sgemm_128x64_nn", 505, 510, 90)]
    S.write(tmp_path / "rank0.json", S.trace(events, rank=0, world_size=1))
    r = overlapprof.analyze([str(tmp_path)], workers=1).ranks[0]
    assert r.mode == "gpu" and r.metrics.exposed_comm_us == 300
    # without CUDA event-sync records the window lasts the whole operation: compute ran in it
    assert _causes(r.exposure) == {"host_blocked": 290, "window_short": 10}


def test_a_late_peer_during_a_host_sync_is_late_peer(tmp_path):
    """Overlapping causes: the first in precedence order takes the µs (late_peer before
    host_blocked before no_window)."""
    rank0 = [S.step(1, 0, 1000), *_allreduce(100, 300), S.cpu_op("c10d::barrier", 150, 1, tid=300)]
    rank0.append(S.annotation("gloo:barrier", 150, 200, tid=WORKER))
    rank1 = [S.step(1, 0, 1000), *_allreduce(200, 200), S.cpu_op("c10d::barrier", 150, 1, tid=300),
             S.annotation("gloo:barrier", 150, 200, tid=WORKER)]
    report = _analyze(tmp_path, {0: rank0, 1: rank1})
    r0 = report.rank(0)
    # rank 0: all_reduce [100, 400) waits [100, 200) for rank 1; the barrier [150, 350) holds the host
    assert _causes(r0.exposure) == {"late_peer": 100, "host_blocked": 150, "no_window": 50}


@pytest.mark.parametrize("folder", REAL, ids=[real_data.name(d) for d in REAL])
def test_causes_add_up_on_every_real_trace(folder):
    report = overlapprof.analyze(folder, workers=1)
    for r in report.ranks:
        if r.metrics.comm_us == 0:
            assert r.exposure is None or r.exposure.total_us() == 0
            continue
        assert r.exposure.total_us() == pytest.approx(r.metrics.exposed_comm_us, rel=1e-9, abs=1e-6)
        for s in r.steps:
            assert s.exposure.total_us() == pytest.approx(s.exposed_comm_us, rel=1e-9, abs=1e-6)
            assert s.comm_free_bound_us == pytest.approx(s.step_us - s.exposed_comm_us)
            assert s.overlap_bound_us is None or s.overlap_bound_us <= s.step_us
        for k in r.kinds:
            assert k.exposure.total_us() == pytest.approx(k.exposed_comm_us, rel=1e-9, abs=1e-6)
        assert all(us >= 0 for us in _causes(r.exposure).values())
        if report.crossrank is not None:
            assert r.exposure.late_peer_us == pytest.approx(report.crossrank.rank(r.rank).exposed_wait_us)
        assert sum(r.exposure.late_peer_by_rank.values()) == pytest.approx(r.exposure.late_peer_us)
        assert sum(r.exposure.late_peer_activity.values()) == pytest.approx(r.exposure.late_peer_us)
        assert r.verdict
    assert report.exposure_notes or not any(r.metrics.comm_us for r in report.ranks)


def test_causes_round_trip_through_json(tmp_path):
    report = overlapprof.analyze(DATA / "trace_filter", workers=1)
    report.save(tmp_path / "r.json")
    back = overlapprof.Report.load(tmp_path / "r.json")
    assert back.ranks[0].exposure == report.ranks[0].exposure and back.exposure_notes == report.exposure_notes
    assert back.ranks[0].timeline.exposed_by_cause == report.ranks[0].timeline.exposed_by_cause


def test_slow_transfer_is_the_part_beyond_the_reference_bandwidth(tmp_path):
    """A 4 MB all_reduce on 2 ranks (bus factor 1) needs 100 µs at 40 GB/s; it took 300: the last
    200 µs of its transfer are slow (an overlay inside no_window, not a sixth cause)."""
    args = {"Collective name": "allreduce", "In msg nelems": 1_000_000, "Out msg nelems": 1_000_000,
            "dtype": "Float", "Group size": 2}
    events = [S.step(1, 0, 1000), S.cpu_op("record_param_comms", 100, 300, args=args), *_allreduce(100, 300)]
    for rank in (0, 1):
        S.write(tmp_path / f"rank{rank}.json", S.trace(events, rank=rank, world_size=2, backend="gloo"))
    r = overlapprof.analyze([str(tmp_path)], workers=1, reference_bandwidth="40GB/s").ranks[0]
    assert _causes(r.exposure) == {"no_window": 300}
    assert r.exposure.slow_transfer_us == pytest.approx(200)
    assert overlapprof.analyze([str(tmp_path)], workers=1).ranks[0].exposure.slow_transfer_us is None


def test_each_operation_has_its_window_and_slack(tmp_path):
    """--comm-ops: the async all_reduce of the window_short trace, issued at 100, needed at 300
    (the end of the compute on the issuing thread), with 195 µs of compute in its window."""
    events = [S.step(1, 0, 1000), *_allreduce(110, 390, call_ts=100, tid=WORKER), S.cpu_op("aten::mm", 105, 195)]
    for rank in (0, 1):
        S.write(tmp_path / f"rank{rank}.json", S.trace(events, rank=rank, world_size=2, backend="gloo"))
    (op,) = overlapprof.analyze([str(tmp_path)], workers=1, comm_ops=True).ranks[0].operations
    assert (op.kind, op.issue_us, op.start_us, op.end_us, op.need_us) == ("all_reduce", 100, 110, 500, 300)
    assert (op.window_us, op.slack_us, op.exposed_us, op.step) == (200, 195, 200, 1)
    assert op.bytes is None and op.hide_gbps is None


def test_a_bad_reference_bandwidth_is_one_line(tmp_path):
    from click.testing import CliRunner

    from overlapprof.cli import main

    result = CliRunner().invoke(main, ["analyze", str(DATA / "trace_filter"), "--reference-bandwidth", "fast"])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == ["Error: --reference-bandwidth 'fast': not a rate; use a number and "
                                                  "a unit, e.g. 500mbit, 2gbit, 10gbit (bit, kbit, mbit, gbit; bps, "
                                                  "mbps, GB/s = bytes/s)"]


def _stream_wait(ts, stream, record_corr, corr):
    """Kineto's record of cudaStreamWaitEvent under enable_cuda_sync_events (cat cuda_sync)."""
    return {"ph": "X", "cat": "cuda_sync", "name": "Stream Wait Event", "pid": 0, "tid": stream, "ts": ts, "dur": 1,
            "args": {"correlation": corr, "wait_on_cuda_event_record_corr_id": record_corr, "wait_on_stream": 20,
                     "stream": stream, "cuda_sync_kind": "Stream Wait Event"}}


@pytest.mark.parametrize("compute_before_wait", [True, False])
def test_gpu_windows_come_from_cuda_event_sync_records(tmp_path, compute_before_wait):
    """A NCCL kernel on stream 20 [100, 500) launched at 90, its end event recorded at 92; stream 7
    waits on that event at 96 (cudaStreamWaitEvent) and runs a matmul launched at 97. With a
    matmul [100, 200) launched before the wait, the result is needed when stream 7 is free, at
    200: compute ran out (window_short). With none, it is needed at once: no window."""
    events = [S.step(1, 0, 1000), *S.launched("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 90, 100, 400, stream=20),
              S.runtime(92, 1, 501, name="cudaEventRecord"), S.runtime(96, 1, 502, name="cudaStreamWaitEvent"),
              _stream_wait(96, 7, 501, 502), *S.launched("ampere_sgemm_128x64_nn", 97, 500, 100)]
    if compute_before_wait:
        events += S.launched("ampere_sgemm_128x64_nn", 95, 100, 100)
    S.write(tmp_path / "rank0.json", S.trace(events, rank=0, world_size=1))
    report = overlapprof.analyze([str(tmp_path)], workers=1, comm_ops=True)
    r = report.ranks[0]
    (op,) = r.operations
    if compute_before_wait:
        assert (op.need_us, op.slack_us) == (200, 100)
        assert _causes(r.exposure) == {"window_short": 300}
        assert r.overlap_bound_form.startswith("windows")
    else:
        assert (op.need_us, op.slack_us) == (97, 0)
        assert _causes(r.exposure) == {"no_window": 400}
    assert not any("event-sync" in n for n in report.exposure_notes)


def test_gpu_traces_without_event_sync_records_say_so():
    report = overlapprof.analyze(DATA / "nccl_parser_config", workers=1)
    assert report.ranks[0].overlap_bound_form.startswith("first-order")
    assert any("no CUDA event-sync record" in n for n in report.exposure_notes)


def test_real_cuda_sync_events_are_read_not_measured(tmp_path):
    """HTA's traces recorded with enable_cuda_sync_events (one GPU, no collectives): their
    cuda_sync events are read (a stream's wait joined to the cudaEventRecord it waits on) and
    change no metric: the same report as the trace without them."""
    import gzip
    import json

    kinds = set()
    for path in sorted(DATA.glob("cuda_event_sync*/*.json.gz")):
        data = json.loads(gzip.decompress(path.read_bytes()))
        kinds |= {e["name"] for e in data["traceEvents"] if e.get("cat") == "cuda_sync"}
        data["traceEvents"] = [e for e in data["traceEvents"] if e.get("cat") != "cuda_sync"]
        S.write(tmp_path / f"{path.parent.name}.json.gz", data)
        with_sync = overlapprof.analyze([str(path)], workers=1).ranks[0]
        without = overlapprof.analyze([str(tmp_path / f"{path.parent.name}.json.gz")], workers=1).ranks[0]
        assert with_sync.mode == "gpu" and with_sync.metrics == without.metrics and with_sync.steps == without.steps
    assert {"Stream Wait Event", "Event Sync", "Context Sync"} <= kinds
