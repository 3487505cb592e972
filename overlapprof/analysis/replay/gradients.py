"""The gradients of each step, parameter by parameter, read from the ops of the traces
(``record_shapes``): what ``bucket_cap_mb`` regroups into DDP's buckets (:mod:`.buckets`).

Autograd accumulates each parameter's gradient in a ``torch::autograd::AccumulateGrad`` op whose
recorded input is that gradient: the product of its shape is the parameter's elements. In a step,
those ops in time order are the order backward produced the gradients, the order DDP's reducer
fills its buckets in (it rebuilds them after the first iteration from the order the gradients
became ready). DDP puts whole parameters in a bucket and closes it at the first parameter that
fills it to the cap, so with each parameter's size a new cap's buckets are DDP's own; without
them the traced buckets are split evenly, which can cut a parameter in two. The element size is
not in the shapes: it is the step's all_reduce bytes over its gradients' elements, and where that
is not a whole 1, 2, 4 or 8 bytes (the all_reduces are not only DDP's, or autograd accumulated
gradients into other leaves too) the regrouping goes without the parameters.

The files are read again for these ops (by the analysis's own reader, a chunk at a time), only
when a ``bucket_cap_mb`` change is replayed, as advise reads them again for its words
(:mod:`overlapprof.analysis.advise.names`, the same size limit): asking the analysis's one read for every op's shapes (``AnalyzeOptions.op_shapes``)
decodes every ``cpu_op``'s args and reads a large file in one process, which made ``advise`` of
``tests/data/mtia`` 0.8 → 1.1 s whether the trace had DDP's buckets or not.
"""

from __future__ import annotations

import bisect
from pathlib import Path

import numpy as np

from overlapprof.analysis.rank.op_shapes import STEP, shapes
from overlapprof.analysis.replay.timeline import Traced, position
from overlapprof.errors import TraceError
from overlapprof.trace.decode import SHAPED_DECODER
from overlapprof.trace.reader import LayoutError, TraceReader

ACCUMULATE = "torch::autograd::AccumulateGrad"
MAX_BYTES = 256 << 20  # a file larger than this is not read again (advise's names keep the same limit)
ELEMENT_BYTES = (1, 2, 4, 8)


def file_gradients(path: str) -> dict[int, list[tuple[float, int]]]:
    """Step number -> (when it was accumulated: its op's end, µs on the trace's clock, and its
    elements) for each gradient accumulated inside its ``ProfilerStep#N`` span, in time order (any
    thread: on CUDA backward runs on autograd's device thread); {} for a file that is not a
    Kineto trace or is larger than :data:`MAX_BYTES`. Read as the analysis reads a file (a chunk
    at a time), the shapes decoded alone of each event's args."""
    try:
        if Path(path).stat().st_size > MAX_BYTES:
            return {}
    except OSError:
        return {}
    steps, grads = [], []
    for generic in (False, True):
        steps, grads = [], []
        try:
            for chunk in TraceReader(path, SHAPED_DECODER).chunks(generic=generic):
                for e in chunk.events:
                    if e.ph != "X" or e.ts is None or e.dur is None:
                        continue
                    if e.name.startswith(STEP):
                        try:
                            steps.append((e.ts, e.ts + e.dur, int(e.name[len(STEP):])))
                        except ValueError:
                            continue
                    elif e.name == ACCUMULATE and e.args is not None and (found := shapes(e.args.input_dims)):
                        grads.append((e.ts, e.ts + e.dur, int(np.prod(found[0]))))
            break
        except LayoutError:
            continue
        except (TraceError, OSError):
            return {}
    grads.sort()
    starts = [t for t, _, _ in grads]
    out = {}
    for lo, hi, number in steps:
        inside = grads[bisect.bisect_left(starts, lo):bisect.bisect_left(starts, hi)]
        if inside:
            out[number] = [(end, n) for _, end, n in inside]
    return out


def gradients(files: dict[int, list[str]]) -> dict[int, dict[int, list[tuple[float, int]]]]:
    """Rank -> step number -> (end µs on the rank's trace clock, elements) of its gradients in the
    order backward made them, from each rank's trace files (none from a trace without
    ``record_shapes`` or an Nsight Systems export)."""
    out: dict[int, dict[int, list[tuple[float, int]]]] = {}
    for rank, paths in files.items():
        for path in paths:
            found = file_gradients(path)
            if found:
                out.setdefault(rank, {}).update(found)
    return out


def parameter_bytes(elements: list[int], total_bytes: float) -> np.ndarray | None:
    """Each gradient's bytes, the element size being ``total_bytes`` (the step's all_reduce bytes)
    over the elements; None where that is not a whole :data:`ELEMENT_BYTES`."""
    n = float(sum(elements))
    if n <= 0 or not total_bytes > 0:
        return None
    size = total_bytes / n
    whole = min(ELEMENT_BYTES, key=lambda b: abs(b - size))
    if abs(size - whole) > 1e-6 * whole:
        return None
    return np.asarray(elements, dtype=float) * whole


def parameters(tr: Traced, rows: dict, k: int, gradients: dict | None,
                total: float) -> tuple[np.ndarray, dict[int, np.ndarray]] | None:
    """Step index ``k``'s gradients' bytes (:func:`parameter_bytes`) and, per rank,
    when each was accumulated (common clock), where every rank of ``rows`` recorded the same ones
    and their bytes are the step's all_reduce bytes; else None."""
    if not gradients:
        return None
    seen, ready = set(), {}
    for r in rows:
        steps = tr.lanes[r].steps
        found = gradients.get(r, {}).get(steps[k], []) if k < len(steps) else []
        seen.add(tuple(n for _, n in found))
        ready[r] = np.array([t for t, _ in found])
    if len(seen) != 1 or () in seen:
        return None
    params = parameter_bytes(list(seen.pop()), total)
    return None if params is None else (params, ready)


def ready_at(lane, step: int, ready: np.ndarray, params: np.ndarray, bounds: list[float]) -> list[float] | None:
    """Each new bucket's work position when its last parameter's gradient was accumulated (DDP
    issues a bucket once every gradient in it is ready); None where one falls outside the step."""
    ends = np.cumsum(params)
    out = []
    for b in bounds:
        q = position(lane, step, float(ready[min(int(np.searchsorted(ends, b * (1 - 1e-12))), ready.size - 1)]))
        if q is None:
            return None
        out.append(q)
    return out
