"""OVERLAP.md version 2 rules on synthetic traces with answers known by construction."""

from __future__ import annotations

import json

import overlapprof

import synthetic as S

GEMM = "ampere_sgemm_128x64_nn"
WORKER = 200  # gloo's worker thread


def run(tmp_path, events, **kw):
    path = S.write(tmp_path / "rank0.json", S.trace(events))
    return overlapprof.analyze(path, workers=1, comms=False, **kw)


def m(rank):
    x = rank.metrics
    return x.comm_us, x.compute_us, x.overlapped_us, x.exposed_comm_us


# -- CPU mode ------------------------------------------------------------------------------------


def test_blocking_recv_wait_in_c10d_recv_is_comm(tmp_path):
    # c10d::recv_ [0, 100) waits 0..80, then gloo:recv [80, 100); compute [100, 150) after it.
    events = [S.cpu_op("c10d::recv_", 0, 100), S.annotation("gloo:recv", 80, 20), S.cpu_op("aten::mm", 100, 50)]
    r = run(tmp_path, events).ranks[0]
    assert r.mode == "cpu"
    assert m(r) == (100, 50, 0, 100)  # v1 counted 20 us of comm
    assert [(k.kind, k.count) for k in r.kinds] == [("send_recv", 1)]  # the span is part of the call


def test_ops_inside_a_call_on_its_thread_are_not_compute(tmp_path):
    events = [
        S.cpu_op("record_param_comms", 0, 100, args={"Collective name": "allreduce"}),
        S.cpu_op("c10d::allreduce_", 1, 98),
        S.cpu_op("aten::copy_", 10, 20),  # same thread, inside the call: the call's own work
        S.cpu_op("aten::empty", 99, 5),  # same thread, starts inside the call (99 < 1 + 98)
        S.cpu_op("aten::mm", 20, 40, tid=WORKER + 1),  # another thread: compute, overlapping
        S.cpu_op("aten::add", 120, 10),  # same thread, after the call: compute
        S.annotation("gloo:all_reduce", 5, 50, tid=WORKER),
    ]
    r = run(tmp_path, events).ranks[0]
    assert m(r) == (98, 50, 40, 58)
    assert r.compute_events == 2
    assert [(k.kind, k.count) for k in r.kinds] == [("all_reduce", 1)]  # the worker's span is the call's


def test_kind_counts_operations_not_spans(tmp_path):
    """A c10d::* call and the backend span recorded for it are one operation: on the calling
    thread (send/recv) the span starts inside the call; on gloo's worker threads (collectives) it
    is the earliest untaken call of its kind that started before it (first in, first out)."""
    events = [
        S.cpu_op("c10d::recv_", 0, 100), S.annotation("gloo:recv", 80, 20),  # blocking recv: 1
        S.cpu_op("c10d::send", 200, 10), S.annotation("gloo:send", 205, 300),  # isend, span outlives call: 1
        S.annotation("gloo:all_reduce", 300, 50, tid=WORKER),  # no call before it: its own operation
        S.cpu_op("c10d::allreduce_", 400, 5), S.cpu_op("c10d::allreduce_", 410, 5),  # two async all_reduces
        S.annotation("gloo:all_reduce", 420, 90, tid=WORKER), S.annotation("gloo:all_reduce", 415, 90, tid=WORKER + 1),
        S.cpu_op("c10d::barrier", 600, 10),  # a call whose backend recorded no span: 1
        S.annotation("gloo:broadcast", 700, 10, tid=WORKER),  # a span without a call: 1
        S.annotation("gloo:all_reduce", 800, 10, tid=WORKER),  # both calls taken: its own operation
        S.cpu_op("aten::mm", 0, 1000),
    ]
    r = run(tmp_path, events).ranks[0]
    assert r.comm_events == len(events) - 1
    assert {k.kind: k.count for k in r.kinds} == {"send_recv": 2, "all_reduce": 4, "barrier": 1, "broadcast": 1}
    path = S.write(tmp_path / "ops.json", S.trace(events))
    ops = overlapprof.analyze(path, workers=1, comm_ops=True).ranks[0].comm_records  # the backend spans
    assert sorted(o.kind for o in ops) == ["all_reduce"] * 4 + ["broadcast"] + ["send_recv"] * 2


def test_user_range_is_not_comm_but_named_backends_are(tmp_path):
    events = [S.annotation("fwd:attn", 0, 100), S.annotation("gloo:all_reduce", 200, 10),
              S.annotation("hccl:broadcast", 300, 10), S.annotation("nccl:recv 0<-1", 400, 10),
              S.annotation("mybackend:all_gather", 500, 10), S.cpu_op("aten::mm", 0, 1000)]
    r = run(tmp_path, events).ranks[0]
    assert r.metrics.comm_us == 30 and r.comm_events == 3
    assert sorted(k.kind for k in r.kinds) == ["all_reduce", "broadcast", "send_recv"]
    mine = run(tmp_path, events, comm_backends=["mybackend"])
    r = mine.ranks[0]
    assert r.metrics.comm_us == 40 and "all_gather" in [k.kind for k in r.kinds]
    assert mine.options.comm_backends == ["mybackend"]


def test_comm_backend_option_on_the_cli(tmp_path):
    from click.testing import CliRunner

    from overlapprof.cli import main

    path = S.write(tmp_path / "rank0.json", S.trace([S.annotation("mybackend:send", 0, 10),
                                                     S.cpu_op("aten::mm", 5, 10)]))
    out = CliRunner().invoke(main, ["analyze", str(path), "--json", "--no-comms", "--comm-backend", "mybackend"])
    assert out.exit_code == 0, out.output
    rank = json.loads(out.output)["ranks"][0]
    assert rank["metrics"]["comm_us"] == 10 and rank["metrics"]["overlapped_us"] == 5
    bad = CliRunner().invoke(main, ["analyze", str(path), "--comm-backend", "a:b"])
    assert bad.exit_code == 2 and bad.output.startswith("Error: ") and "Traceback" not in bad.output


# -- GPU mode ------------------------------------------------------------------------------------


def _launch(corr, ts, tid=S.MAIN_TID):
    return S.runtime(ts, 2, corr, tid=tid)


def test_copy_engine_collective_is_comm_plain_memcpy_stays_memory(tmp_path):
    events = [
        S.cpu_op("record_param_comms", 0, 20, args={"Collective name": "allgather"}),
        _launch(1, 5), S.memcpy(100, 50, correlation=1),  # a zero-CTA all_gather
        _launch(2, 30), S.memcpy(200, 30, correlation=2),  # a plain copy
        _launch(3, 40), S.kernel(GEMM, 120, 100, correlation=3),
    ]
    r = run(tmp_path, events).ranks[0]
    assert r.mode == "gpu"
    assert m(r) == (50, 100, 30, 20)
    assert r.metrics.memory_us == 30 and r.memory_events == 1
    assert [(k.kind, k.count) for k in r.kinds] == [("all_gather", 1)]
    path = S.write(tmp_path / "rank0.json", S.trace(events))
    records = overlapprof.analyze(path, workers=1, comm_ops=True).ranks[0].comm_records
    assert [(o.kind, o.name, o.dur) for o in records] == [("all_gather", "Memcpy HtoD (Pageable -> Device)", 50)]


def test_coalesced_p2p_launched_in_one_call(tmp_path):
    events = [S.cpu_op("c10d::batch_isend_irecv", 0, 50)]  # no Collective name: the c10d name says
    events += [S.cpu_op("record_param_comms", 1, 40, args={"Collective name": "coalesced"})]
    for k in range(4):
        events += [_launch(10 + k, 2 + 5 * k), S.memcpy(100 + 10 * k, 10, correlation=10 + k)]
    events += [_launch(20, 30), S.kernel("ncclDevKernel_SendRecv", 200, 10, correlation=20)]
    r = run(tmp_path, events).ranks[0]
    assert r.comm_events == 5 and r.metrics.comm_us == 50 and r.memory_events == 0
    assert [(k.kind, k.count) for k in r.kinds] == [("send_recv", 5)]


def test_sendrecv_kernel_under_all_to_all_is_all_to_all(tmp_path):
    events = [S.cpu_op("record_param_comms", 0, 20, args={"Collective name": "all_to_all"}),
              S.cpu_op("c10d::alltoall_base_", 1, 18),
              _launch(1, 5), S.kernel("ncclDevKernel_SendRecv", 100, 40, correlation=1),
              _launch(2, 50), S.kernel("ncclDevKernel_SendRecv", 200, 40, correlation=2)]  # outside: by name
    r = run(tmp_path, events).ranks[0]
    assert sorted((k.kind, k.count) for k in r.kinds) == [("all_to_all", 1), ("send_recv", 1)]


def test_launch_on_another_thread_is_not_inside(tmp_path):
    events = [S.cpu_op("record_param_comms", 0, 20, args={"Collective name": "allreduce"}),
              _launch(1, 5, tid=S.MAIN_TID + 1), S.memcpy(100, 50, correlation=1),
              _launch(2, 30), S.kernel(GEMM, 100, 10, correlation=2)]
    r = run(tmp_path, events).ranks[0]
    assert r.metrics.comm_us == 0 and r.metrics.memory_us == 50 and r.metrics.compute_us == 10


def test_old_kineto_category_names(tmp_path):
    events = [S.cpu_op("record_param_comms", 0, 20, args={"Collective name": "allreduce"}),
              _launch(1, 5), S.memcpy(100, 50, correlation=1),
              _launch(2, 30), S.kernel(GEMM, 120, 100, correlation=2),
              _launch(3, 40), S.memcpy(300, 10, correlation=3)]
    new = run(tmp_path, events).ranks[0]
    old_names = {"kernel": "Kernel", "gpu_memcpy": "Memcpy", "cuda_runtime": "Runtime", "cpu_op": "Operator"}
    for e in events:
        e["cat"] = old_names.get(e["cat"], e["cat"])
    old = run(tmp_path, events).ranks[0]
    assert m(old) == m(new) == (50, 100, 30, 20) and old.metrics.memory_us == 10
    assert [(k.kind, k.count) for k in old.kinds] == [("all_reduce", 1)]


def test_unclassified_device_activity_warned(tmp_path):
    events = [S.cpu_op("aten::mm", 0, 10), S.annotation("gloo:all_reduce", 5, 10)]
    for k in range(3):
        events.append({"ph": "X", "cat": "mtia_ccp_events", "name": "x", "pid": 9, "tid": 1, "ts": 20 + k, "dur": 1})
    report = run(tmp_path, events)
    assert report.ranks[0].mode == "cpu" and m(report.ranks[0]) == (10, 10, 5, 5)
    assert any("mtia_ccp_events (3 events)" in w for w in report.warnings)
