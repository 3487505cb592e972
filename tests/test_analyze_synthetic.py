"""Synthetic traces with answers known by construction (OVERLAP.md sections 1-3)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import overlapprof
from overlapprof.analysis import intervals as iv
from overlapprof.analysis.rank.classify import comm_kind

import synthetic as S

NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
GEMM = "ampere_sgemm_128x64_nn"


def run(tmp_path, events, name="rank0.json", **kw):
    path = S.write(tmp_path / name, S.trace(events))
    return overlapprof.analyze(path, workers=1, **kw).ranks[0]


def metrics(tmp_path, events, **kw):
    m = run(tmp_path, events, **kw).metrics
    return m.comm_us, m.compute_us, m.overlapped_us, m.exposed_comm_us, m.overlap_ratio


@pytest.mark.parametrize(
    "comm, compute, expected",
    [
        # disjoint
        ([(0, 10)], [(20, 10)], (10, 10, 0, 10, 0.0)),
        # compute nested in comm, twice
        ([(0, 100)], [(10, 10), (30, 10)], (100, 20, 20, 80, 0.2)),
        # comm nested in compute
        ([(40, 20)], [(0, 100)], (20, 100, 20, 0, 1.0)),
        # adjacent: [0,10) then [10,20): touching, not overlapping
        ([(0, 10)], [(10, 10)], (10, 10, 0, 10, 0.0)),
        # adjacent comm intervals join into one 20 µs union
        ([(0, 10), (10, 10)], [(5, 10)], (20, 10, 10, 10, 0.5)),
        # identical intervals count once
        ([(0, 10), (0, 10)], [(0, 10), (0, 10)], (10, 10, 10, 0, 1.0)),
        # partial overlaps on both sides
        ([(10, 20)], [(0, 15), (25, 10)], (20, 25, 10, 10, 0.5)),
    ],
    ids=["disjoint", "nested", "comm-in-compute", "adjacent", "adjacent-comm", "identical", "partial"],
)
def test_interval_shapes(tmp_path, comm, compute, expected):
    events = [S.kernel(NCCL, ts, d, stream=20) for ts, d in comm] + [S.kernel(GEMM, ts, d) for ts, d in compute]
    assert metrics(tmp_path, events) == pytest.approx(expected)


def test_comm_on_two_streams_at_once_counts_once(tmp_path):
    events = [S.kernel(NCCL, 0, 10, stream=20), S.kernel(NCCL, 5, 10, stream=21), S.kernel(GEMM, 0, 5)]
    assert metrics(tmp_path, events) == pytest.approx((15, 5, 5, 10, 1 / 3))


def test_compute_on_several_streams_is_pooled(tmp_path):
    # Three compute streams cover [0,30) between them; comm [5,40) overlaps 25 µs of it.
    events = [S.kernel(GEMM, 0, 12, stream=7), S.kernel(GEMM, 10, 10, stream=8), S.kernel(GEMM, 20, 10, stream=9),
              S.kernel(NCCL, 5, 35, stream=20)]
    assert metrics(tmp_path, events) == pytest.approx((35, 30, 25, 10, 25 / 35))


def test_overlap_is_between_streams_not_within(tmp_path):
    # The comm kernel's own stream has no compute while it runs: overlap comes only from stream 8.
    events = [S.kernel(NCCL, 0, 100, stream=7), S.kernel(GEMM, 100, 50, stream=7), S.kernel(GEMM, 50, 10, stream=8)]
    assert metrics(tmp_path, events) == pytest.approx((100, 60, 10, 90, 0.1))


def test_zero_duration_events_contribute_nothing(tmp_path):
    events = [S.kernel(NCCL, 5, 0, stream=20), S.kernel(GEMM, 0, 10), S.kernel(GEMM, 3, 0)]
    assert metrics(tmp_path, events) == (0, 10, 0, 0, None)
    events += [S.kernel(NCCL, 0, 4, stream=20)]
    assert metrics(tmp_path, events) == pytest.approx((4, 10, 4, 0, 1.0))


def test_rank_with_no_compute(tmp_path):
    events = [S.kernel(NCCL, 0, 10, stream=20), S.kernel(NCCL, 20, 10, stream=20)]
    assert metrics(tmp_path, events) == pytest.approx((20, 0, 0, 20, 0.0))


def test_memory_is_neither_comm_nor_compute(tmp_path):
    events = [S.kernel(NCCL, 0, 10, stream=20), S.memcpy(0, 10), S.memcpy(5, 10, stream=9)]
    r = run(tmp_path, events)
    assert (r.metrics.compute_us, r.metrics.overlapped_us, r.metrics.memory_us) == (0, 0, 15)
    assert r.memory_events == 2


def test_user_comm_kernel_pattern(tmp_path):
    events = [S.kernel("my_custom_allgather_kernel", 0, 10, stream=20), S.kernel(GEMM, 5, 10)]
    assert metrics(tmp_path, events)[0] == 0
    r = run(tmp_path, events, comm_kernels=["custom_all"])
    assert r.metrics.comm_us == 10 and r.metrics.overlapped_us == 5
    assert [k.kind for k in r.kinds] == ["all_gather"]


def test_steps_assign_gpu_work_by_launch(tmp_path):
    """GPU work launched in a step belongs to it, even when it runs past the step's CPU end."""
    events = [
        S.step(1, 0, 100),
        S.step(2, 100, 100),
        # launched at 50 in step 1, runs [150, 250): belongs to step 1, extends its wall span
        *S.launched(NCCL, 50, 150, 100, stream=20),
        *S.launched(GEMM, 60, 120, 60),  # step 1 compute [120, 180)
        *S.launched(GEMM, 110, 210, 30),  # step 2 compute [210, 240), overlaps step 1's comm
        S.kernel(GEMM, 130, 10),  # no launch in the trace: belongs where it starts (step 2)
    ]
    r = run(tmp_path, events)
    s1, s2 = r.steps
    assert (s1.step, s2.step) == (1, 2)
    assert (s1.comm_us, s1.compute_us, s1.overlapped_us) == (100, 60, 30)
    assert s1.step_us == 250  # ProfilerStep start 0 -> latest end of its events, 250
    assert s1.exposed_share == pytest.approx(70 / 250)
    assert (s2.comm_us, s2.compute_us, s2.overlap_ratio) == (0, 40, None)
    assert s2.step_us == 140  # 100 -> 240
    # The whole rank: comm [150,250) vs compute [120,180) ∪ [130,140) ∪ [210,240)
    assert (r.metrics.comm_us, r.metrics.overlapped_us) == (100, 60)
    # The timeline draws the middle step by number (of two, the first): step 1's own unions,
    # relative to its start (0); the kernel at 130 without a launch belongs to step 2.
    t = r.timeline
    assert (t.step, t.start_us) == (1, 0)
    assert (t.comm, t.compute, t.overlapped) == ([(150, 250)], [(120, 180)], [(150, 180)])


def test_steps_as_cpu_op_in_old_traces(tmp_path):
    events = [S.step(7, 0, 100, cat="cpu_op"), S.annotation("gloo:all_reduce", 10, 50, tid=5),
              S.cpu_op("aten::mm", 0, 30)]
    r = run(tmp_path, events)
    # The step marker is not compute (it would cover everything).
    assert r.mode == "cpu" and r.metrics.compute_us == 30 and r.metrics.overlapped_us == 20
    assert [s.step for s in r.steps] == [7]


def test_cpu_mode_classes(tmp_path):
    events = [
        S.annotation("gloo:all_reduce", 0, 100, tid=5),  # comm, on gloo's worker thread
        S.annotation("nccl:recv 0<-1", 200, 10),  # comm
        S.annotation("## metrics:publish ##", 0, 1000),  # not comm
        S.annotation("ProfilerStep#1", 0, 1000),  # a step, not comm
        S.cpu_op("aten::mm", 50, 100),  # compute
        S.cpu_op("c10d::allreduce_", 0, 10),  # a communication call: comm (OVERLAP.md v2)
        S.cpu_op("record_param_comms", 0, 10),  # wraps it, adds nothing; neither
    ]
    r = run(tmp_path, events)
    assert r.mode == "cpu"
    assert (r.metrics.comm_us, r.metrics.compute_us, r.metrics.overlapped_us) == (110, 100, 50)
    # The c10d::allreduce_ call and the worker's gloo:all_reduce span are one operation.
    assert {k.kind: k.count for k in r.kinds} == {"all_reduce": 1, "send_recv": 1}


def test_cpu_ops_do_not_count_in_gpu_mode(tmp_path):
    events = [S.kernel(NCCL, 0, 10, stream=20), S.cpu_op("aten::mm", 0, 10), S.annotation("nccl:all_reduce", 0, 10)]
    assert metrics(tmp_path, events) == pytest.approx((10, 0, 0, 10, 0.0))


def test_hta_style_filters(tmp_path):
    events = [
        S.step(1, 0, 100),
        S.step(2, 100, 100),
        *S.launched(NCCL, 10, 10, 50, stream=20),
        *S.launched(GEMM, 20, 20, 20),
        *S.launched(NCCL, 110, 110, 50, stream=20),  # in the last step
        S.kernel(GEMM, 50, 20),  # no launch
    ]
    r = run(tmp_path, events)
    assert (r.metrics.comm_us, r.metrics.overlapped_us) == (100, 30)
    assert run(tmp_path, events, require_launch=True).metrics.overlapped_us == 20
    dropped = run(tmp_path, events, drop_last_step=True)
    assert (dropped.metrics.comm_us, dropped.metrics.overlapped_us, len(dropped.steps)) == (50, 30, 1)


@pytest.mark.parametrize(
    "name, kind",
    [
        ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", "all_reduce"),
        ("ncclDevKernel_AllGather_RING_LL", "all_gather"),
        ("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL", "reduce_scatter"),
        ("ncclKernel_Broadcast_RING_LL_Sum_int8_t", "broadcast"),
        ("ncclDevKernel_Reduce_Sum_f32_RING_LL", "reduce"),
        ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t", "send_recv"),
        ("ncclDevKernel_SendRecv", "send_recv"),
        ("gloo:all_reduce", "all_reduce"),
        ("nccl:all_to_all", "all_to_all"),
        ("hccl:allgather", "all_gather"),
        ("nccl:_allgather_base", "all_gather"),
        ("nccl:_all_gather_base", "all_gather"),
        ("nccl:reduce_scatter_tensor_coalesced", "reduce_scatter"),
        ("nccl:_reduce_scatter_base", "reduce_scatter"),
        ("gloo:send", "send_recv"),
        ("gloo:recv", "send_recv"),
        ("nccl:recv 0<-1", "send_recv"),
        ("gloo:barrier", "barrier"),
        ("gloo:broadcast", "broadcast"),
        ("gloo:scatter", "other"),
        ("rcclKernel_Custom", "other"),
    ],
)
def test_kind_names(name, kind):
    assert comm_kind(name) == kind


def _grid_measure(intervals, resolution):
    covered = np.zeros(resolution, dtype=bool)
    for s, e in intervals:
        covered[s:e] = True
    return covered


spans = st.lists(st.tuples(st.integers(0, 200), st.integers(0, 40)).map(lambda t: (t[0], t[0] + t[1])), max_size=25)


@settings(max_examples=300, deadline=None)
@given(spans, spans)
def test_interval_algebra_matches_a_grid(a, b):
    """Union, intersection, difference and overlap length against a 1-µs occupancy grid."""
    grid_a, grid_b = _grid_measure(a, 256), _grid_measure(b, 256)
    ua = iv.union(np.array([s for s, _ in a], float), np.array([e for _, e in a], float))
    ub = iv.union(np.array([s for s, _ in b], float), np.array([e for _, e in b], float))
    assert iv.length(ua) == grid_a.sum() and iv.length(ub) == grid_b.sum()
    assert np.all(ua[0][1:] > ua[1][:-1])  # sorted, disjoint, not touching
    assert iv.length(iv.intersection(ua, ub)) == (grid_a & grid_b).sum() == iv.overlap_length(ua, ub)
    assert iv.length(iv.difference(ua, ub)) == (grid_a & ~grid_b).sum()
    inter = iv.intersection(ua, ub)
    assert _grid_measure([(int(s), int(e)) for s, e in zip(*inter)], 256).tolist() == (grid_a & grid_b).tolist()


def test_generated_benchmark_traces_match_their_analytic_answer(tmp_path):
    """benchmarks/gen_traces.py: the analyzer finds the overlap the generator built in."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("gen_traces", Path(__file__).parents[1] / "benchmarks" / "gen_traces.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    answers = gen.generate(tmp_path, ranks=6, events=5000, compress=True)
    report = overlapprof.analyze(tmp_path, workers=1)
    assert len(report.ranks) == 6
    for r in report.ranks:
        want = answers[str(r.rank)]
        m = r.metrics
        assert (m.comm_us, m.compute_us, m.overlapped_us) == (want["comm_us"], want["compute_us"], want["overlapped_us"])
        assert m.overlap_ratio == pytest.approx(want["overlap_ratio"])
        assert all(s.overlap_ratio == pytest.approx(want["overlap_ratio"]) for s in r.steps)
    hta_like = overlapprof.analyze(tmp_path, workers=1, drop_last_step=True, require_launch=True)
    assert [r.metrics.overlap_ratio for r in hta_like.ranks] == pytest.approx([r.metrics.overlap_ratio for r in report.ranks])


def _partition_sums(p, tol=1e-6):
    assert min(p.compute_us, p.exposed_comm_us, p.exposed_memory_us, p.idle_us) >= 0
    total = p.compute_us + p.exposed_comm_us + p.exposed_memory_us + p.idle_us
    assert abs(total - p.step_us) <= tol * max(1.0, p.step_us)


def test_step_partition_accounts_for_every_microsecond(tmp_path):
    # step [0, 100): compute [10, 40), comm [30, 70) (exposed [40, 70)), memcpy [60, 80)
    # (exposed memory [70, 80)); idle = [0,10) + [80,100) = 30
    events = [S.step(1, 0, 100), *S.launched(GEMM, 1, 10, 30), *S.launched(NCCL, 2, 30, 40, stream=20),
              {**S.kernel("Memcpy HtoD (Pageable -> Device)", 60, 20), "cat": "gpu_memcpy"}]
    r = run(tmp_path, events)
    p = r.steps[0].partition
    assert (p.compute_us, p.exposed_comm_us, p.exposed_memory_us, p.idle_us, p.step_us) == (30, 30, 10, 30, 100)
    _partition_sums(p)
    assert r.partition == p  # one step: the mean is that step


@pytest.mark.parametrize("trace", ["trace_filter", "amd_trace", "ns_resolution_trace"])
def test_step_partition_sums_on_real_traces(trace):
    from pathlib import Path

    report = overlapprof.analyze([str(Path(__file__).parent / "data" / trace)], allow_partial=True)
    steps = [s for r in report.ranks for s in r.steps]
    for s in steps:
        _partition_sums(s.partition)
        assert s.partition.step_us == pytest.approx(s.step_us)
        assert s.partition.exposed_comm_us <= s.exposed_comm_us + 1e-6
    for r in report.ranks:
        if r.steps:
            _partition_sums(r.partition)
