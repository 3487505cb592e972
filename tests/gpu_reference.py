"""OVERLAP.md section 1's GPU mode, computed directly from a trace's raw events, in plain Python:
an independent reference for the analyzer's numbers (tests/test_cuda_traces.py) and the classifier
of scripts/device_check.py. It shares no code with overlapprof.

- communication: kernels of OVERLAP.md version 3's families (``*nccl*``, ``*rccl*``, NVSHMEM, DeepEP,
  symmetric memory and multimem, the custom all-reduces, userbuffers, MSCCL++; any case), and any GPU activity (kernel,
  memcpy, memset) whose runtime call (same ``correlation``) starts inside a communication call
  (a ``cpu_op`` named ``record_param_comms`` or ``c10d::*``) on the same pid and tid;
- compute: every other kernel.
"""

from __future__ import annotations

import bisect
import gzip
import json
import re
from dataclasses import dataclass, field

_OLD = {"Kernel": "kernel", "Memcpy": "gpu_memcpy", "Memset": "gpu_memset", "Runtime": "cuda_runtime",
        "Operator": "cpu_op"}
_DEVICE = ("kernel", "gpu_memcpy", "gpu_memset")
_COMM_KERNEL = re.compile("nccl|rccl|nvshmem|deep_?ep::|dpsk::ep|multimem_|symmetric_memory::|one_?shot_?all_?reduce|"
                          "two_?shot_?all_?reduce|cross_device_reduce|allreduce_fusion_kernel|userbuffers|mscclpp",
                          re.IGNORECASE)


def load(path) -> dict:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


@dataclass
class Activity:
    name: str
    cat: str
    start: float
    end: float
    stream: object


@dataclass
class Classes:
    comm: list[Activity] = field(default_factory=list)
    compute: list[Activity] = field(default_factory=list)


def classify(trace: dict) -> Classes:
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
    calls: dict[tuple, list[tuple[float, float]]] = {}
    launches: dict[int, tuple] = {}
    for e in events:
        cat = _OLD.get(e.get("cat"), e.get("cat"))
        name = e.get("name", "")
        if cat == "cpu_op" and (name == "record_param_comms" or name.startswith("c10d::")):
            calls.setdefault((e.get("pid"), e.get("tid")), []).append((e["ts"], e["ts"] + max(e.get("dur", 0), 0)))
        elif cat in ("cuda_runtime", "cuda_driver") and "correlation" in (e.get("args") or {}):
            launches[e["args"]["correlation"]] = (e.get("pid"), e.get("tid"), e["ts"])
    starts = {key: sorted(spans) for key, spans in calls.items()}

    def in_call(pid, tid, ts) -> bool:
        spans = starts.get((pid, tid), [])
        k = bisect.bisect_right(spans, (ts, float("inf")))
        return any(s <= ts < end for s, end in spans[max(0, k - 64):k])  # calls nest; look back a little

    out = Classes()
    for e in events:
        cat = _OLD.get(e.get("cat"), e.get("cat"))
        if cat not in _DEVICE:
            continue
        args = e.get("args") or {}
        act = Activity(e.get("name", ""), cat, e["ts"], e["ts"] + max(e.get("dur", 0), 0), args.get("stream"))
        launch = launches.get(args.get("correlation"))
        if (cat == "kernel" and _COMM_KERNEL.search(act.name)) or (launch is not None and in_call(*launch)):
            out.comm.append(act)
        elif cat == "kernel":
            out.compute.append(act)
    return out


def union(spans) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for s, e in sorted(spans):
        if e <= s:
            continue
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    return [(s, e) for s, e in merged]


def length(spans) -> float:
    return sum(e - s for s, e in spans)


def intersection(a, b) -> list[tuple[float, float]]:
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if s < e:
            out.append((s, e))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def metrics(trace: dict) -> dict[str, float]:
    """comm_us and overlapped_us of OVERLAP.md section 2, whole trace."""
    classes = classify(trace)
    comm = union((a.start, a.end) for a in classes.comm)
    compute = union((a.start, a.end) for a in classes.compute)
    return {"comm_us": length(comm), "overlapped_us": length(intersection(comm, compute))}
