"""One job, two formats (issue 38): this project's CUDA runs (tests/data/cuda, Kineto JSON) written
as Nsight Systems exports by tests/kineto_to_nsys.py, and the two reports compared field by field:
every field equal, or its difference one of those explained below."""

from __future__ import annotations

import math
import re
from pathlib import Path

import msgspec
import pytest

from overlapprof import analyze
from kineto_to_nsys import convert

CUDA = Path(__file__).parent / "data" / "cuda"

# Path (regex over the report's JSON paths) -> why it differs between the two formats.
EXPLAINED = {
    r"\$\.inputs\[0\]|\$\.ranks\[0\]\.files\[0\]": "the files' names",
    r"\$\.warnings": "the export's notes: its schema, and that its bytes and peers are missing",
    r"\$\.ranks\[0\]\.rank_source": "an export has no distributedInfo: the rank comes from the order",
    r"\$\.ranks\[0\]\.(backend|world_size)": "an export has no distributedInfo: backend and world size unknown",
    r"\$\.ranks\[0\]\.events": "Kineto counts every complete event (CPU ops, Python frames); the export's "
                               "reader counts the rows it reads (GPU activity, API calls, NVTX ranges, syncs)",
    r"\$\.comms\.(groups|matching)\[\d+\]\.(name|group|size|complete|size_source)":
        "no NVTX payloads: the process group (name, ranks) is not recorded, so it is the default group",
    r"\$\.comms\.bandwidth\[\d+\]\.(bytes|algbw_gbps|busbw_gbps|group_size)":
        "no NVTX payloads: the bytes are not recorded, so no bandwidth",
    r"\$\.ranks\[0\]\.operations\[\d+\]\.(bytes|group)": "no NVTX payloads: no bytes, the default group",
    r"\$\.ranks\[0\]\.comm_ops\[\d+\]\.(dtype|group_size|in_nelems|out_nelems|input_dims|input_type|pg_desc|pg_name"
    r"|pg_ranks)": "--comm-ops: record_param_comms' arguments are not in an export (emit_nvtx names the op only)",
    r"\$\.ranks\[0\]\.comm_ops\[\d+\]\.external_id": "--comm-ops: Kineto's own id, no export has it",
    r"\$\.ranks\[0\]\.comm_ops\[\d+\]\.annotation": "--comm-ops: the enclosing `nccl:<op>` record_function "
                                                    "range is not read from the export (its name is the kernel's kind)",
}
WITH_RECORDS = {"comm_ops": True, "lanes": True}


def differences(a, b, path="$"):
    """(path, Kineto's, nsys's) of every field that differs (floats: beyond 1e-9 relative)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b)) for d in differences(a.get(k), b.get(k), f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{path}[{i}]")]
    if isinstance(a, float) and isinstance(b, float):
        same = a == b or (math.isnan(a) and math.isnan(b)) or abs(a - b) <= 1e-9 * max(abs(a), abs(b))
        return [] if same else [(path, a, b)]
    return [] if a == b else [(path, a, b)]


@pytest.mark.parametrize("run", ["allreduce-async", "collectives-scatter", "fsdp-async"])
def test_a_kineto_run_and_its_nsys_export_give_the_same_report(run, tmp_path):
    trace = next((CUDA / run).glob("*.pt.trace.json.gz"))
    export = tmp_path / f"{run}.sqlite"
    assert convert(trace, export) > 100
    kineto = msgspec.to_builtins(analyze(trace, workers=1))
    nsys = msgspec.to_builtins(analyze(export, workers=1))
    unexplained = [d for d in differences(kineto, nsys) if not any(re.fullmatch(p, d[0]) for p in EXPLAINED)]
    assert unexplained == []
    # with the records of every communication event and export's lanes
    records = [msgspec.to_builtins(analyze(path, workers=1, **WITH_RECORDS)) for path in (trace, export)]
    assert [d for d in differences(*records) if not any(re.fullmatch(p, d[0]) for p in EXPLAINED)] == []
    assert [len(r["ranks"][0]["comm_ops"]) for r in records] == [len(records[0]["ranks"][0]["comm_ops"])] * 2
    # what the comparison covers: real numbers, equal
    k, n = kineto["ranks"][0], nsys["ranks"][0]
    assert k["metrics"] == n["metrics"] and k["steps"] == n["steps"] and k["kinds"] == n["kinds"]
    assert k["metrics"]["compute_us"] > 0 and len(k["steps"]) >= 2
    assert kineto["exposure_notes"] == nsys["exposure_notes"]
    # NCCL runs no kernel for a one-rank collective: scatter's copy, launched inside the call, is the communication
    assert (k["metrics"]["comm_us"] > 0) == (run == "collectives-scatter")


def test_the_explained_differences_are_the_ones_seen(tmp_path):
    trace = next((CUDA / "collectives-scatter").glob("*.pt.trace.json.gz"))
    convert(trace, tmp_path / "s.sqlite")
    seen = {p for p, _, _ in differences(msgspec.to_builtins(analyze(trace, workers=1, **WITH_RECORDS)),
                                           msgspec.to_builtins(analyze(tmp_path / "s.sqlite", workers=1, **WITH_RECORDS)))}
    assert {p for p in EXPLAINED if any(re.fullmatch(p, s) for s in seen)} == set(EXPLAINED)
