"""The analyzer's GPU-mode numbers equal an independent computation from the raw events
(tests/gpu_reference.py), on real GPU traces.

In CI: the GPU traces of tests/data (recorded elsewhere), whose numbers OVERLAP.md section 4
lists. CUDA traces recorded by ``overlapprof run`` land in tests/data/cuda/ with the first device
run (scripts/device_check.sh, which also runs this module on its fresh traces through
``OVERLAPPROF_CUDA_TRACES=DIR``); until then those cases are skipped.
"""

from __future__ import annotations

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


@pytest.mark.skipif(not CUDA_TRACES, reason="no CUDA traces from overlapprof run yet (tests/data/cuda lands with "
                                            "the first device run of scripts/device_check.sh)")
@pytest.mark.parametrize("path", CUDA_TRACES, ids=[p.name for p in CUDA_TRACES])
def test_cuda_trace(path):
    trace = gpu_reference.load(path)
    assert trace.get("distributedInfo", {}).get("backend") == "nccl"
    classes = gpu_reference.classify(trace)
    assert classes.compute, "no compute kernel"
    rank = overlapprof.analyze(path, workers=1, comms=False).ranks[0]
    assert rank.mode == "gpu"
    same(rank.metrics, gpu_reference.metrics(trace))
