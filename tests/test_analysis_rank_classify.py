"""OVERLAP.md version 3's communication kernel families (overlapprof/analysis/rank/classify.py):
the collectives of NVSHMEM, DeepEP, symmetric memory, multimem and the custom all-reduces are
communication with no option, of the kind they do, and a compute kernel whose name says
communication is warned about, with the --comm-kernel that would count it. On small hand-made
Kineto traces: every kernel alone on the stream, so each metric is a sum of durations."""

from __future__ import annotations

import pytest

import overlapprof
from overlapprof.analysis.rank import classify as C

import synthetic as S

# Kernel names as the libraries' kernels appear in traces (demangled, with template arguments).
FAMILIES = [
    ("void vllm::cross_device_reduce_1stage<__nv_bfloat16, 8>(vllm::RankData*, vllm::RankSignals)", "all_reduce"),
    ("void vllm::cross_device_reduce_2stage<float, 4>(vllm::RankData*)", "all_reduce"),
    ("void aiter::cross_device_reduce_2stage<__half, 8>(aiter::RankData*)", "all_reduce"),
    ("void (anonymous namespace)::multimem_all_reduce_kernel<float, 16>(float*, unsigned long)", "all_reduce"),
    ("void c10d::symmetric_memory::two_shot_all_reduce_kernel<float, 16, 8>(float**)", "all_reduce"),
    ("one_shot_all_reduce_kernel_0d1d2d", "all_reduce"),
    ("void deep_ep::intranode::dispatch<8, 768, 8192>(int4*, float*)", "all_to_all"),
    ("void deep_ep::internode_ll::combine<false>(void*)", "all_to_all"),
    ("dpsk::ep::dispatch_kernel", "all_to_all"),
    ("void nvshmemi_alltoall_kernel<float>(int, float*)", "all_to_all"),
    ("userbuffers_fp16_sum_inplace_gpu_rw(int, int)", "other"),
]


def _trace(tmp_path, kernels, name="rank0.json", rank=0, world_size=1):
    """A step of kernels 100 µs long, 1 ms apart from 100 µs, each launched, and a 300 µs compute kernel from 150 µs."""
    events = [S.step(1, 0, 20_000)]
    t = 100.0
    for kernel in kernels:
        events += S.launched(kernel, t - 50, t, 100)
        t += 1000
    events += S.launched("void at::native::vectorized_elementwise_kernel<4, BroadcastOp>(int)", 40, 150, 300, stream=9)
    return S.write(tmp_path / name, S.trace(events, rank=rank, world_size=world_size))


@pytest.mark.parametrize("name,kind", FAMILIES, ids=[C.kernel_stem(k[0]) for k in FAMILIES])
def test_families_are_communication(tmp_path, name, kind):
    assert C.COMM_KERNEL.search(name) and C.comm_kind(name) == kind
    report = overlapprof.analyze(_trace(tmp_path, [name]), workers=1)
    (rank,) = report.ranks
    assert rank.mode == "gpu" and rank.metrics.comm_us == 100 and rank.metrics.compute_us == 300
    assert rank.metrics.overlapped_us == 50  # [150, 200): the compute kernel runs [150, 450)
    assert [(k.kind, k.count) for k in rank.kinds] == [(kind, 1)]
    assert not [w for w in report.warnings if "named like communication" in w]


def test_lookalike_kernels_are_warned_about(tmp_path):
    """Compute kernels whose names (not their template arguments) say allreduce, all_gather, ...:
    one warning line naming the most frequent, with the --comm-kernel that would count them."""
    kernels = ["void my::fused_allreduce_rmsnorm_kernel<float, 8>(float*)"] * 3 + ["custom_all_gather_v2(int)",
                                                                                    "ncclDevKernel_AllReduce_Sum_f32_RING_LL"]
    path = _trace(tmp_path, kernels)
    for budget in ("1TB", 0):  # in memory and with the events on disk
        report = overlapprof.analyze(path, workers=1, memory_budget=budget)
        (line,) = [w for w in report.warnings if "named like communication" in w]
        assert line == ("kernels named like communication are counted as compute (not of a communication family "
                        "OVERLAP.md knows): my::fused_allreduce_rmsnorm_kernel (3 kernels on 1 rank), "
                        "custom_all_gather_v2 (1 kernels on 1 rank); if they communicate, name them: "
                        "--comm-kernel 'fused_allreduce_rmsnorm_kernel'")
        assert report.ranks[0].metrics.comm_us == 100  # the NCCL kernel alone
    named = overlapprof.analyze(path, workers=1, comm_kernels=["fused_allreduce_rmsnorm_kernel", "custom_all_gather"])
    assert not [w for w in named.warnings if "named like communication" in w]
    assert named.ranks[0].metrics.comm_us == 500
    assert {k.kind: k.count for k in named.ranks[0].kinds} == {"all_reduce": 4, "all_gather": 1}


def test_lookalikes_of_several_ranks_and_names(tmp_path):
    kernels = [f"custom_all_to_all_{k}(int)" for k in range(4)] + ["my_sendrecv(int)"] * 2
    paths = [_trace(tmp_path, kernels, f"rank{r}.json", rank=r, world_size=2) for r in range(2)]
    (line,) = [w for w in overlapprof.analyze(paths, workers=1).warnings if "named like communication" in w]
    assert "my_sendrecv (4 kernels on 2 ranks), custom_all_to_all_0 (2 kernels on 2 ranks)" in line
    assert "custom_all_to_all_1 (2 kernels on 2 ranks) and 2 more; if they communicate" in line
    assert line.endswith("--comm-kernel 'my_sendrecv'")


def test_template_arguments_do_not_look_like_communication():
    assert not C.looks_like_comm("void cutlass::Kernel<cutlass_80_tensorop_EpilogueWithBroadcast_128x128>(Params)")
    assert not C.looks_like_comm("void at::native::elementwise_kernel<128, 4, BroadcastLambda>(int)")
    assert C.looks_like_comm("broadcast_tensors_kernel")
    assert C.looks_like_comm("Reduce_Scatter_Fused(int)") and C.looks_like_comm("sendrecv_pipelined")
    assert C.looks_like_comm("void (anonymous namespace)::my_all_to_all_kernel<float>(float*)")
