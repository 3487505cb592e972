"""Build small Kineto-shaped traces with known answers, for the analyzer's tests.

Each helper returns one trace event (a dict shaped like torch.profiler writes it); ``trace``
wraps events into a trace object and ``write`` saves it (optionally gzipped).
"""

from __future__ import annotations

import gzip
import itertools
import json
from pathlib import Path

_ids = itertools.count(1_000)
MAIN_TID = 100


def kernel(name, ts, dur, *, stream=7, device=0, correlation=None):
    """A GPU kernel (``cat: kernel``); comm when ``name`` contains nccl/rccl."""
    args = {"device": device, "stream": stream}
    if correlation is not None:
        args["correlation"] = correlation
        args["External id"] = correlation
    return {"ph": "X", "cat": "kernel", "name": name, "pid": device, "tid": stream, "ts": ts, "dur": dur, "args": args}


def memcpy(ts, dur, *, stream=7, correlation=None):
    ev = kernel("Memcpy HtoD (Pageable -> Device)", ts, dur, stream=stream, correlation=correlation)
    ev["cat"] = "gpu_memcpy"
    return ev


def runtime(ts, dur, correlation, *, name="cudaLaunchKernel", tid=MAIN_TID):
    """The CPU-side launch of a GPU event with the same ``correlation``."""
    return {
        "ph": "X", "cat": "cuda_runtime", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur,
        "args": {"correlation": correlation, "External id": correlation},
    }


def launched(name, launch_ts, ts, dur, **kw):
    """A kernel and its launch: two events sharing a fresh correlation id."""
    corr = next(_ids)
    return [runtime(launch_ts, 2, corr), kernel(name, ts, dur, correlation=corr, **kw)]


def cpu_op(name, ts, dur, *, tid=MAIN_TID, args=None):
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": args or {}}


def annotation(name, ts, dur, *, tid=MAIN_TID, args=None):
    return {"ph": "X", "cat": "user_annotation", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur,
            "args": args or {}}


def step(n, ts, dur, *, cat="user_annotation"):
    """A ``ProfilerStep#n`` span on the main thread."""
    return {"ph": "X", "cat": cat, "name": f"ProfilerStep#{n}", "pid": 1, "tid": MAIN_TID, "ts": ts, "dur": dur,
            "args": {}}


def trace(events, *, rank=None, world_size=None, backend=None, base_ns=None):
    """A trace object (with ``distributedInfo`` when ``rank`` is given)."""
    meta = [{"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "ts": 0, "args": {"name": "python"}}]
    out = {"schemaVersion": 1, "traceEvents": meta + list(events)}
    if rank is not None:
        out["distributedInfo"] = {"rank": rank, "world_size": world_size, "backend": backend or "nccl"}
    if base_ns is not None:
        out["baseTimeNanoseconds"] = base_ns
    return out


def write(path, obj, *, gz=None):
    """Write a trace object (or raw bytes/str) to ``path``; gzip when ``gz`` or the name ends .gz."""
    path = Path(path)
    data = obj if isinstance(obj, bytes) else (obj if isinstance(obj, str) else json.dumps(obj)).encode()
    if gz or (gz is None and path.name.endswith(".gz")):
        data = gzip.compress(data)
    path.write_bytes(data)
    return path


def kineto_text(events, rank: int = 0) -> bytes:
    """Kineto's layout: a top level before and after the events, one event per ``\\n  {`` line
    (what the parallel decoder cuts at)."""
    head = json.dumps({"schemaVersion": 1, "distributedInfo": {"rank": rank, "world_size": 2, "backend": "nccl"}})
    body = ",\n  ".join(json.dumps(e, ensure_ascii=False) for e in events)
    return (head[:-1] + ', "traceEvents": [\n  ' + body + '\n], "traceName": "x{\\"y\\"}", "baseTimeNanoseconds": 5}\n').encode()
