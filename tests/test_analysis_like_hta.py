"""``--like-hta``: HolisticTraceAnalysis 0.5.0's get_comm_comp_overlap, per rank.

Synthetic traces whose HTA numbers are worked out by hand below (the cutoff from a later
gpu_user_annotation step marker, nanosecond rounding, no filter under two steps), and, when HTA
is installed (the ``bench`` extra, not the test extra: it pulls pandas and plotly), HTA itself on
every shared trace.
"""

from __future__ import annotations

import json
import logging
import math
import warnings
from pathlib import Path

import pytest
from click.testing import CliRunner

import overlapprof
from overlapprof.analysis import like_hta
from overlapprof.analysis.like_hta import hta_percent
from overlapprof.cli import main
from overlapprof.trace import reader
import real_data

DATA = Path(__file__).parent / "data"


def _x(name, cat, ts, dur, **args):
    return {"ph": "X", "name": name, "cat": cat, "pid": 1, "tid": 7 if "stream" in args else 1, "ts": ts, "dur": dur,
            "args": args}


def _write(path: Path, events, rank: int = 0, world: int = 1) -> Path:
    path.write_text(json.dumps({"distributedInfo": {"rank": rank, "world_size": world}, "traceEvents": events}))
    return path


def _two_steps(tmp_path: Path) -> Path:
    """Steps at 0 and 100 on the CPU; the GPU's ProfilerStep#2 marker (no correlation) at 120.

    HTA's cutoff is 120 (the latest non-kernel ProfilerStep event): launches at 10, 20 and 110
    count, 150 does not; the kernel without a launch (corr 99) does not. comm = [30, 70] ∪
    [112, 132] = 60 µs; compute = [50, 90]; overlapped = [50, 70] = 20 µs; ratio 1/3.
    overlapprof's --drop-last-step cuts at the CPU step (100): comm [30, 70] only, ratio 1/2.
    """
    ev = [
        _x("ProfilerStep#1", "cpu_op", 0, 100), _x("ProfilerStep#2", "cpu_op", 100, 100),
        _x("ProfilerStep#2", "gpu_user_annotation", 120, 90, stream=7, device=0),
        _x("cudaLaunchKernel", "cuda_runtime", 10, 1, correlation=1),
        _x("cudaLaunchKernel", "cuda_runtime", 20, 1, correlation=2),
        _x("cudaLaunchKernel", "cuda_runtime", 110, 1, correlation=4),
        _x("cudaLaunchKernel", "cuda_runtime", 150, 1, correlation=3),
        _x("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "kernel", 30, 40, stream=7,
           correlation=1, device=0),
        _x("void gemm_kernel<float>()", "kernel", 50, 40, stream=8, correlation=2, device=0),
        _x("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "kernel", 112, 20, stream=7,
           correlation=4, device=0),
        _x("void gemm_kernel<float>()", "kernel", 160, 20, stream=8, correlation=3, device=0),
        _x("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "kernel", 95, 10, stream=7,
           correlation=99, device=0),
    ]
    return _write(tmp_path / "two_steps.json", ev)


def _ns_one_step(tmp_path: Path) -> Path:
    """One step: nothing filtered (the unlaunched kernels count). Times in ns resolution, so
    start = ceil(ts), end = floor(ts + dur): comm [10.5, 30.7] -> [11, 30], compute [20.4, 35.4]
    -> [21, 35]: 9 of 19 µs; comm [50, 60] with compute [55, 65]: 5 of 10 µs. Ratio 14/29.
    The memcpy overlapping the first comm is memory, not compute."""
    ev = [
        _x("ProfilerStep#1", "cpu_op", 0.0, 100.0),
        _x("cudaLaunchKernel", "cuda_runtime", 5.25, 1.0, correlation=1),
        _x("cudaLaunchKernel", "cuda_runtime", 6.25, 1.0, correlation=2),
        _x("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "kernel", 10.5, 20.2, stream=7,
           correlation=1, device=0),
        _x("void gemm_kernel<float>()", "kernel", 20.4, 15.0, stream=8, correlation=2, device=0),
        _x("Memcpy DtoD (Device -> Device)", "gpu_memcpy", 11.0, 19.0, stream=9, correlation=5, device=0),
        _x("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "kernel", 50.0, 10.0, stream=7,
           correlation=77, device=0),
        _x("void gemm_kernel<float>()", "kernel", 55.0, 10.0, stream=8, correlation=78, device=0),
    ]
    return _write(tmp_path / "ns.json", ev)


def _one_step_rank1(tmp_path: Path) -> Path:
    """Rank 1 of 2 with one step name (ProfilerStep#1 at 50): alone, HTA filters nothing, comm
    [20, 40] and compute [30, 70] give 10 of 20 µs; beside rank 0's two step names HTA's window is
    on, the cutoff is 50 and the compute kernel (launched at 60) is left out: 0 of 20 µs."""
    ev = [
        _x("ProfilerStep#1", "cpu_op", 50, 100),
        _x("cudaLaunchKernel", "cuda_runtime", 10, 1, correlation=1),
        _x("cudaLaunchKernel", "cuda_runtime", 60, 1, correlation=2),
        _x("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "kernel", 20, 20, stream=7,
           correlation=1, device=0),
        _x("void gemm_kernel<float>()", "kernel", 30, 40, stream=8, correlation=2, device=0),
    ]
    return _write(tmp_path / "rank1.json", ev, rank=1, world=2)


def test_window_decided_by_the_step_names_of_all_ranks(tmp_path):
    rank1 = _one_step_rank1(tmp_path)
    assert overlapprof.analyze(rank1, like_hta=True, comms=False).ranks[0].metrics.overlap_ratio == 0.5
    rank0 = _two_steps(tmp_path)
    rank0.write_text(rank0.read_text().replace('"world_size": 1', '"world_size": 2'))
    report = overlapprof.analyze([rank0, rank1], like_hta=True, comms=False, workers=1)
    assert [r.metrics.overlap_ratio for r in report.ranks] == [pytest.approx(1 / 3), 0.0]


def test_cutoff_from_latest_step_event_of_any_non_kernel_category(tmp_path):
    path = _two_steps(tmp_path)
    m = overlapprof.analyze(path, like_hta=True, comms=False).ranks[0].metrics
    assert (m.comm_us, m.compute_us, m.overlapped_us, m.exposed_comm_us) == (60, 40, 20, 40)
    assert m.overlap_ratio == pytest.approx(1 / 3)
    filtered = overlapprof.analyze(path, drop_last_step=True, require_launch=True, comms=False).ranks[0].metrics
    assert filtered.overlap_ratio == pytest.approx(1 / 2)


def test_ns_times_rounded_and_no_filter_under_two_steps(tmp_path):
    path = _ns_one_step(tmp_path)
    m = overlapprof.analyze(path, like_hta=True, comms=False).ranks[0].metrics
    assert (m.comm_us, m.overlapped_us, m.memory_us) == (29, 14, 19)
    assert hta_percent(m.overlap_ratio) == round(100 * 14 / 29, 2)
    assert overlapprof.analyze(path, comms=False).ranks[0].metrics.overlap_ratio == pytest.approx((10.3 + 5) / 30.2)


def test_cli_like_hta_names_itself_in_the_report(tmp_path):
    res = CliRunner().invoke(main, ["analyze", str(_two_steps(tmp_path)), "--like-hta", "--no-comms", "-q", "--json", "-"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.output)
    assert report["options"]["like_hta"] is True
    assert any("HolisticTraceAnalysis" in f for f in report["filters"])
    assert report["ranks"][0]["metrics"]["overlap_ratio"] == pytest.approx(1 / 3)


def _metrics(paths, **kw) -> list:
    return [r.metrics for r in overlapprof.analyze(paths, like_hta=True, comms=False, workers=1, **kw).ranks]


def test_on_disk_and_in_chunks_the_same_floats(tmp_path, monkeypatch):
    """HTA's merge a chunk of rows at a time, then of the chunks' groups, is its merge of every
    event: the same floats in memory, on disk, and cut into chunks of a few events (the window
    decided by both ranks' step names; a real two-rank trace with its window on)."""
    rank0 = _two_steps(tmp_path)
    rank0.write_text(rank0.read_text().replace('"world_size": 1', '"world_size": 2'))
    cases = [[rank0, _one_step_rank1(tmp_path)], _ns_one_step(tmp_path), DATA / "trace_filter"]
    whole = [_metrics(c, memory_budget="1TB") for c in cases]
    assert whole[0][1].overlap_ratio == 0.0 and whole[1][0].comm_us == 29  # the cases above
    spill = tmp_path / "spill"
    spill.mkdir()
    monkeypatch.setenv("TMPDIR", str(spill))
    assert [_metrics(c, memory_budget=0) for c in cases] == whole
    assert not list(spill.iterdir())  # the rows' files are removed
    monkeypatch.setattr(reader, "_CHUNK_BYTES", 2048)
    monkeypatch.setattr(like_hta, "_WINDOW_ROWS", 7)
    assert [_metrics(c, memory_budget=0) for c in cases] == whole
    assert [_metrics(c, memory_budget="1TB") for c in cases] == whole


def test_refuses_the_json_array_format(tmp_path):
    path = tmp_path / "array.json"
    path.write_text(json.dumps([_x("ProfilerStep#1", "cpu_op", 0, 100)]))
    res = CliRunner().invoke(main, ["analyze", str(path), "--like-hta", "--no-comms", "-q"])
    assert res.exit_code == 2 and "not a trace HolisticTraceAnalysis can read" in res.output, res.output
    assert "Traceback" not in res.output


def _hta_percent(folder: Path) -> dict:
    """HTA 0.5.0's own get_comm_comp_overlap on a folder: rank -> percent (None for NaN)."""
    pytest.importorskip("hta", reason="HolisticTraceAnalysis is in the bench extra: pip install -e '.[bench]'")
    from hta.trace_analysis import TraceAnalysis

    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            df = TraceAnalysis(trace_dir=str(folder)).get_comm_comp_overlap(visualize=False)
    except Exception as exc:  # HTA's own failure (its parser, pandas) on a trace overlapprof reads
        pytest.skip(f"HolisticTraceAnalysis 0.5.0 fails on {folder.name}: {type(exc).__name__}: {exc}")
    finally:
        logging.disable(logging.NOTSET)
    return {int(r): (None if math.isnan(v) else float(v)) for r, v in zip(df["rank"], df["comp_comm_overlap_pctg"])}


@pytest.mark.parametrize("folder", [real_data.name(d) for d in real_data.jobs()])
def test_equals_hta_on_shared_traces(folder):
    """HTA itself (the peer, when installed) against --like-hta, rank by rank, as HTA reports it
    (percent, two decimals; NaN when a rank has no NCCL kernel)."""
    want = _hta_percent(DATA / folder)
    report = overlapprof.analyze(DATA / folder, like_hta=True, comms=False, workers=1)
    assert {r.rank: hta_percent(r.metrics.overlap_ratio) for r in report.ranks} == want


def test_equals_hta_on_two_ranks_of_different_steps(tmp_path):
    rank0 = _two_steps(tmp_path)
    rank0.write_text(rank0.read_text().replace('"world_size": 1', '"world_size": 2'))
    _one_step_rank1(tmp_path)
    report = overlapprof.analyze(tmp_path, like_hta=True, comms=False, workers=1)
    assert _hta_percent(tmp_path) == {r.rank: hta_percent(r.metrics.overlap_ratio) for r in report.ranks}


@pytest.mark.parametrize("make", [_two_steps, _ns_one_step])
def test_equals_hta_on_synthetic_traces(tmp_path, make):
    ratio = overlapprof.analyze(make(tmp_path), like_hta=True, comms=False).ranks[0].metrics.overlap_ratio
    assert _hta_percent(tmp_path) == {0: hta_percent(ratio)}
