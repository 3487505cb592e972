"""The analyzer's GPU-mode numbers equal an independent computation from the raw events
(tests/gpu_reference.py), on real GPU traces.

In CI: the GPU traces of tests/data (recorded elsewhere), whose numbers OVERLAP.md section 4
lists, and tests/data/cuda/: traces recorded by ``overlapprof run --device cuda`` on an H100
(scripts/device_check.sh, which also runs this module on its fresh traces through
``OVERLAPPROF_CUDA_TRACES=DIR``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import gpu_reference
import overlapprof

DATA = Path(__file__).parent / "data"
CUDA_DIRS = [DATA / "cuda", *([Path(os.environ["OVERLAPPROF_CUDA_TRACES"])]
                              if os.environ.get("OVERLAPPROF_CUDA_TRACES") else [])]
CUDA_TRACES = sorted(p for d in CUDA_DIRS if d.is_dir() for p in d.rglob("*.pt.trace.json*"))


def same(report_metrics, reference):
    assert report_metrics.comm_us == pytest.approx(reference["comm_us"], rel=1e-6, abs=1e-3)
    assert report_metrics.overlapped_us == pytest.approx(reference["overlapped_us"], rel=1e-6, abs=1e-3)


@pytest.mark.parametrize("name, comm_us, overlapped_us", [
    ("trace_filter/sampled_rank-0.json.gz", 396199, 59216),
    ("nccl_parser_config/nccl_data.json.gz", 46876.492, 7317.026),
])
def test_reference_is_overlap_md_and_the_analyzer(name, comm_us, overlapped_us):
    reference = gpu_reference.metrics(gpu_reference.load(DATA / name))
    assert reference["comm_us"] == pytest.approx(comm_us, abs=1e-3)
    assert reference["overlapped_us"] == pytest.approx(overlapped_us, abs=1e-3)
    rank = overlapprof.analyze(DATA / name, workers=1).ranks[0]
    assert rank.mode == "gpu"
    same(rank.metrics, reference)


@pytest.mark.skipif(not CUDA_TRACES, reason="no CUDA traces (tests/data/cuda or OVERLAPPROF_CUDA_TRACES)")
@pytest.mark.parametrize("path", CUDA_TRACES, ids=[p.name for p in CUDA_TRACES])
def test_cuda_trace(path):
    trace = gpu_reference.load(path)
    assert trace.get("distributedInfo", {}).get("backend") == "nccl"
    classes = gpu_reference.classify(trace)
    assert classes.compute, "no compute kernel"
    rank = overlapprof.analyze(path, workers=1, comms=False).ranks[0]
    assert rank.mode == "gpu"
    same(rank.metrics, gpu_reference.metrics(trace))


@pytest.mark.skipif(not (DATA / "cuda").is_dir(), reason="no tests/data/cuda")
def test_stream_waits_of_cuda_13_do_not_name_their_event_record():
    """What the first GPU run found (H100, torch 2.11.0+cu130): every "Stream Wait Event" record
    leaves ``wait_on_cuda_event_record_corr_id`` (and ``wait_on_stream``) at -1 and gives only
    ``wait_on_cuda_event_id``, which no ``cudaEventRecord`` call carries. The join of GPU windows
    (a wait to the record it waits on) then finds nothing; the windows fall back to the first-order
    form, and the report says why."""
    waits = []
    for path in sorted((DATA / "cuda").rglob("*.pt.trace.json*")):
        waits += [e["args"] for e in gpu_reference.load(path)["traceEvents"]
                  if e.get("cat") == "cuda_sync" and e.get("name") == "Stream Wait Event"]
    assert waits and all(a["wait_on_cuda_event_record_corr_id"] == -1 and a["wait_on_cuda_event_id"] >= 0
                         for a in waits)
    report = overlapprof.analyze(DATA / "cuda" / "collectives-scatter", workers=1)
    assert report.ranks[0].overlap_bound_form.startswith("first-order")
    assert any("wait_on_cuda_event_record_corr_id" in n for n in report.exposure_notes)


@pytest.mark.skipif(not (DATA / "cuda").is_dir(), reason="no tests/data/cuda")
@pytest.mark.parametrize("run", sorted(p.name for p in (DATA / "cuda").glob("*") if p.is_dir()))
def test_cuda_run_directories_read_as_gpu_runs(run):
    """A recorded run directory (run.json beside its traces) is read in GPU mode, with its steps and
    the workload's metrics; the scatter's copy is its communication, none of it hidden (sync)."""
    report = overlapprof.analyze(DATA / "cuda" / run, workers=1)
    (rank,) = report.ranks
    assert rank.mode == "gpu" and len(rank.steps) == 8
    recorded = json.loads((DATA / "cuda" / run / "run.json").read_text())["ranks"]["0"]["metrics"]
    assert {m.name for m in report.workload_metrics} == set(recorded)
    if run == "collectives-scatter":
        assert rank.metrics.comm_us > 0 and rank.metrics.overlapped_us == 0
        assert rank.exposure.late_peer_us == 0 and rank.exposure.total_us() == \
            pytest.approx(rank.metrics.exposed_comm_us)
