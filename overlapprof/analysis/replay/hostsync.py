"""``no_host_sync``: every barrier taken out of the replayed steps.

A barrier (an operation of kind ``barrier``: ``dist.barrier()``, gloo's or NCCL's) holds its
rank's lane from its issue until every rank has reached it. The rewrite removes, on every lane,
the barrier's ISSUE and NEED keys (so the time the lane sat blocked at it goes with them: the
lane's work never held it), the work after them added to the key before, so the lane goes
straight on to what followed; the work itself is unchanged. An operation that queued behind a
barrier on its collective channel queues behind what the barrier queued behind instead.

An operation in flight across a barrier (issued before it, needed after it, on some rank) was
measured with the barrier holding its lane: where the backend completes an operation only when
its lane waits for it (gloo on CPUs) its measured transfer runs to that wait, and a barrier
crosses the link with the data. Its transfer becomes the transfer model's for its bytes
(latency + bus bytes / bandwidth, where the model has a bandwidth), never longer than measured,
the latency read from the operations no barrier held (:func:`_modelled`).

Host synchronizations that are not operations (``cudaStreamSynchronize``, ``aten::item``) are
part of the lane's work between its keys: the trace does not say what the lane would have done
instead, so the rewrite does not model them (:func:`drop_barriers` removes none without a barrier).
"""

from __future__ import annotations

from overlapprof.analysis.rank.classify import KINDS
import numpy as np

from overlapprof.analysis.replay.timeline import ISSUE, NEED, Traced
from overlapprof.analysis.replay.transfer import Model, instance_bytes

BARRIER = KINDS.index("barrier")


def drop_barriers(tr: Traced, model: Model) -> tuple[int, float]:
    """Rewrite ``tr`` in place; the barrier operations removed from the lanes, and the µs taken
    off the transfers of the operations in flight across them."""
    barriers = {row for row, kind in enumerate(tr.kind.tolist()) if kind == BARRIER}
    if not barriers:
        return 0, 0.0
    removed = 0
    freed: set[int] = set()  # rows whose window the removal widened
    for lane in tr.lanes.values():
        open_: set[int] = set()
        keys: list[list] = []
        for t, kind, ref, work, compute in zip(lane.t, lane.kind, lane.ref, lane.work, lane.compute):
            if kind in (ISSUE, NEED) and ref in barriers:
                removed += kind == ISSUE
                freed |= open_
                if keys:  # the lane goes straight on: the work after the barrier follows the key before it
                    keys[-1][3] += work
                    keys[-1][4] += compute
                continue
            if kind == ISSUE:
                open_.add(ref)
            elif kind == NEED:
                open_.discard(ref)
            keys.append([t, kind, ref, work, compute])
        lane.t, lane.kind, lane.ref = [k[0] for k in keys], [k[1] for k in keys], [k[2] for k in keys]
        lane.work, lane.compute = [k[3] for k in keys], [k[4] for k in keys]
    for row, p in enumerate(tr.prev.tolist()):
        while p >= 0 and p in barriers:
            p = int(tr.prev[p])
        tr.prev[row] = p
    return removed, _modelled(tr, model, {int(tr.inst[row]) for row in freed - barriers if tr.inst[row] >= 0})


def _modelled(tr: Traced, model: Model, insts: set[int]) -> float:
    """Each of ``insts``' transfers down to the model's time for its bytes, its latency the median
    of ``x − bytes / bandwidth`` over the instances of its kind and group size *not* in ``insts``
    (past warm-up; none: 0): the model's own latency is fitted on the instances a barrier held
    too, and would keep what it held. The µs taken off."""
    fits = {(f.kind, f.group_size): f for f in model.fits if f.bandwidth_gbps}
    groups: dict[tuple[str, int], list[tuple[int, float]]] = {}  # (kind, n) -> (instance, bus bytes)
    bus, kinds, sizes = instance_bytes(tr)
    for k in np.flatnonzero(~np.isnan(bus)).tolist():
        groups.setdefault((KINDS[int(kinds[k])], int(sizes[k])), []).append((k, float(bus[k])))
    cut = 0.0
    for key, members in groups.items():
        f = fits.get(key)
        if f is None:
            continue
        rate = f.bandwidth_gbps * 1e3  # bytes/µs
        free = [float(tr.transfer[k]) - b / rate for k, b in members if k not in insts and not tr.warm[k]]
        latency = max(0.0, float(np.median(free))) if free else 0.0
        for k, b in members:
            x = latency + b / rate
            if k in insts and x < tr.transfer[k]:
                cut += float(tr.transfer[k]) - x
                tr.transfer[k] = x
    return cut
