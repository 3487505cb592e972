"""An adapter for DDP's single bucket: where one all_reduce a (rank, step) holds every gradient
and the trace records no gradients' shapes (``AccumulateGrad``: with them the rewrite issues each
new bucket where its last gradient was accumulated, and this adapter is not used), the replay's
``bucket_cap_mb`` rewrite (:mod:`overlapprof.analysis.replay.buckets`) cannot tell where backward
produced them (it reads the gradients' pace from the gap between two traced buckets, and there is
one). Backward's start is in the trace by name: the step's first autograd
function (``autograd::engine::evaluate_function: ...``). This adapter gives the rewrite that pace:
it splits each single bucket into two traced halves, the first issued halfway between backward's
start and the bucket's issue, the second where the bucket was, each moving half of its bytes in
``latency + (transfer − latency) / 2``, one after the other, both waited where the bucket was.
The rewrite then spreads the gradients evenly over ``[backward's start, the issue]``, which is
what it assumes between two traced buckets. The halves are only ever an input to the rewrite
(it replaces them with the new buckets); the unchanged replay keeps the traced bucket.

Over loopback, where the rewrite pays per bucket what the traced ones took beyond their bytes at
the fastest bucket's pace (:mod:`overlapprof.analysis.replay.buckets`), each half keeps all of the
bucket's: it moves its half of the bytes at that pace and pays the whole of the rest, and its
transfer lies inside the traced one's (the compute beside it is the bucket's). Merged back with
nothing beside them, the halves are the traced bucket again (its rest counted once, not halved);
each smaller bucket pays that rest again. One bucket cannot show what of its time is per
operation, so advise takes the reading that stands behind a smaller size only where it wins even
so (on the advise bench's crowded host, 0.25 MiB buckets after an async all_reduce ran 14-22%
slower than its one bucket).
"""

from __future__ import annotations

import copy
from dataclasses import replace

import numpy as np

from overlapprof.analysis.replay import buckets as _buckets
from overlapprof.analysis.replay.changes import Context
from overlapprof.analysis.replay.timeline import ISSUE, NEED, Traced, position, work_positions

BACKWARD = "autograd::engine::evaluate_function"


def single(tr: Traced) -> bool:
    """One all_reduce in every (rank, step) that has any, on every rank."""
    per = [_buckets._step_buckets(tr, lane) for lane in tr.lanes.values()]
    return bool(per) and any(per) and all(len(rows) == 1 for b in per for rows in b.values())


def split(tr: Traced, ctx: Context, backward: dict[int, list[float]]) -> tuple[Traced, Context] | None:
    """``tr`` with each single bucket split in two (module docstring), and the context extended to
    the new instances; ``backward``: rank -> the start (its lane's clock) of each step's backward.
    None where a step's backward is not found on a rank, or it does not start before the issue."""
    tr = copy.deepcopy(tr)
    per = {r: _buckets._step_buckets(tr, lane) for r, lane in tr.lanes.items()}
    steps = sorted({k for b in per.values() for k in b})
    n0, i0 = tr.rank.size, len(tr.members)
    latency = ctx.model.latency
    unhindered = _buckets._unhindered_per_byte(tr, per, latency, least=ctx.per_operation)
    if ctx.per_operation and not np.isfinite(unhindered):
        return None
    new: list[dict] = []
    transfer, lat_new = [], []
    for m, k in enumerate(steps):
        rows = {r: b[k][0] for r, b in per.items() if k in b}
        inst = int(tr.inst[next(iter(rows.values()))])
        if inst < 0 or any(int(tr.inst[v]) != inst for v in rows.values()):
            return None
        lat = float(min(latency[inst], tr.transfer[inst])) if inst < latency.size else 0.0
        half = lat + (float(tr.transfer[inst]) - lat) / 2
        # over loopback the rewrite pays a bucket's time beyond its bytes' per bucket: each half keeps
        # the whole of it, and moves its bytes at the least hindered pace
        x = (max(lat, float(tr.transfer[inst]) - unhindered * float(tr.nbytes[next(iter(rows.values()))]) / 2)
             if ctx.per_operation else half)
        for r, v in rows.items():
            lane = tr.lanes[r]
            starts = backward.get(r, [])
            q = position(lane, k, starts[k]) if k < len(starts) else None
            pos = work_positions(lane)
            j_issue = next(j for j, (kk, ref) in enumerate(zip(lane.kind, lane.ref)) if kk == ISSUE and ref == v)
            j_need = next(j for j, (kk, ref) in enumerate(zip(lane.kind, lane.ref)) if kk == NEED and ref == v)
            if q is None or q >= pos[j_issue]:
                return None
            row = n0 + len(new)
            s = float(tr.start[v])
            # one after the other: the rewrite runs its buckets as the traced ones ran; over loopback each
            # half's transfer lies inside the traced one's (the compute beside them is the bucket's)
            cut = s + (float(tr.transfer[inst]) - x if ctx.per_operation else half)
            new.append(dict(rank=r, nbytes=tr.nbytes[v] / 2, inst=i0 + m, lead=float(tr.lead[v]), step=int(tr.step[v]),
                            group_size=int(tr.group_size[v]), start=s, end=cut, issue=float(tr.issue[v])))
            tr.nbytes[v] /= 2
            tr.start[v] = cut
            lo, hi = _buckets._span(lane, k)  # a wait the trace put in a later step: the half's at the issue
            need_at = pos[j_need] if lo < j_need < hi else pos[j_issue]
            _buckets._insert(lane, k, (q + pos[j_issue]) / 2, ISSUE, row)
            _buckets._insert(lane, k, need_at, NEED, row)
        tr.members.append(np.array([n0 + len(new) - len(rows) + i for i in range(len(rows))]))
        tr.transfer[inst] = x
        transfer.append(x)
        lat_new.append(lat)
    _append(tr, new)
    tr.transfer = np.append(tr.transfer, transfer)
    tr.warm = np.append(tr.warm, np.zeros(len(transfer), dtype=bool))
    model = replace(ctx.model, latency=np.append(latency, lat_new))
    cost = np.append(ctx.interference, np.zeros(len(transfer))) if ctx.interference.size else ctx.interference
    return tr, Context(model, ctx.link_bytes_per_us, cost, op_shapes=ctx.op_shapes, files=ctx.files, shift=ctx.shift,
                       per_operation=ctx.per_operation)


def _append(tr: Traced, rows: list[dict]) -> None:
    n = len(rows)
    col = {name: np.array([r[name] for r in rows]) for name in rows[0]} if rows else {}
    for name in ("rank", "step", "inst", "group_size"):
        setattr(tr, name, np.append(getattr(tr, name), col.get(name, [])).astype(np.int64))
    tr.kind = np.append(tr.kind, np.full(n, _buckets.ALL_REDUCE)).astype(np.int64)
    for name in ("issue", "start", "end", "nbytes", "lead"):
        setattr(tr, name, np.append(getattr(tr, name), col.get(name, [])))
    tr.dur = np.append(tr.dur, np.zeros(n))
    tr.tail = np.append(tr.tail, np.zeros(n))
    tr.prev = np.append(tr.prev, np.full(n, -1)).astype(np.int64)
