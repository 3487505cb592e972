"""What share of a pipeline's micro-batch compute is paid per micro-batch whatever its rows, read
from the ops of the traces (``record_shapes``).

A micro-batch's hand-over holds its rows: the first dimension of the first tensor a
``c10d::send``/``recv_`` (or gloo's ``gloo:send``/``gloo:recv`` span) records. On the thread
that runs the step, inside the micro-batches' stretch (from a spacing before the first send of a
direction to its last; from a receive direction's first to a spacing after its last, as
:mod:`.microbatch` places them), each op's self time (its time less its children's) is

- *per row* when one of the tensors it records has a dimension equal to those rows (the
  forward's and backward's matmuls, activations, the loss): cut finer or coarser with the batch;
- *per call* otherwise: the weights' gradient accumulation (``AccumulateGrad``, ``add_`` on the
  weights' shapes), autograd's own nodes, views and transposes of the weights: paid once per
  micro-batch, so N micro-batches pay N/M of it.

The share of a (rank, step) is per call / (per call + per row). A step is left out (no share:
its compute kept) where its hand-overs record no shape, their rows also size another dimension
of the same tensor (rows = width: which dimension is the batch is not known), or no op in the
stretch records the rows. An op on a weight that has a dimension of the rows' size counts as
per row (the shapes say sizes, not which is the batch's). Communication calls and what runs
inside them are not compute here (as :func:`.timeline._outside_calls` leaves them out of the
lanes). What this cannot see: an op with rows whose speed per row changes with the rows (a
matmul's efficiency at small sizes): one trace runs every such op at one size.

The ops and their shapes come from the rank's one read of its files (:mod:`overlapprof.analysis.rank.op_shapes`,
asked by ``whatif`` when a change cuts micro-batches): no trace is read again for them.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from overlapprof.analysis.rank.op_shapes import STEP, OpRows

_HAND_OVERS = {"c10d::send": "send", "c10d::recv_": "recv", "gloo:send": "send", "gloo:recv": "recv"}


@dataclass
class _Op:
    """A kept row of :class:`~overlapprof.analysis.rank.op_shapes.OpRows`: ``ints`` its shapes'
    ints, the first ``first`` of them its first tensor's."""

    name: str
    ts: float
    dur: float
    tid: int
    ints: tuple
    first: int


def _rows(hand_overs) -> int | None:
    """The micro-batch's rows: the first dimension of the hand-overs' first tensor, if every
    hand-over says the same and it sizes no other dimension of its tensor."""
    found = set()
    for e in hand_overs:
        if e.first:
            tensor = e.ints[:e.first]
            if tensor.count(tensor[0]) > 1:
                return None
            found.add(tensor[0])
    return found.pop() if len(found) == 1 else None


def _stretch(hand_overs) -> tuple[float, float] | None:
    """The micro-batches' stretch of one step: see the module docstring."""
    lo, hi = float("inf"), float("-inf")
    for way in ("send", "recv"):
        at = sorted(e.ts for e in hand_overs if _HAND_OVERS[e.name] == way and e.name.startswith("c10d::"))
        if len(at) < 2:
            continue
        spacing = (at[-1] - at[0]) / (len(at) - 1)
        lo = min(lo, at[0] - (spacing if way == "send" else 0.0))
        hi = max(hi, at[-1] + (spacing if way == "recv" else 0.0))
    return (lo, hi) if lo < hi else None


def _step_share(ops: list[_Op], spans: list[_Op]) -> float | None:
    """``ops``: the step's cpu_ops in order; ``spans``: its gloo send/recv spans (shapes only)."""
    hand_overs = [e for e in ops + spans if e.name in _HAND_OVERS]
    rows, stretch = _rows(hand_overs), _stretch(hand_overs)
    if rows is None or stretch is None:
        return None
    per_row = per_call = 0.0
    stack: list[list] = []  # [end, self time, event, inside a communication call]
    done: list[list] = []
    for e in ops:
        while stack and stack[-1][0] <= e.ts:
            done.append(stack.pop())
        inside = bool(stack) and stack[-1][3]
        if stack:
            stack[-1][1] -= e.dur
        stack.append([e.ts + e.dur, e.dur, e, inside or e.name.startswith("c10d::")])
    done += stack
    for _, own, e, comm in done:
        if comm or not stretch[0] <= e.ts < stretch[1]:
            continue
        if rows in e.ints:
            per_row += max(own, 0.0)
        else:
            per_call += max(own, 0.0)
    return per_call / (per_call + per_row) if per_row > 0 else None


def file_shares(rows: OpRows) -> dict[int, float]:
    """Step number -> the per-call share of one rank's file, from its kept ops (see the module docstring)."""
    events = [_Op(rows.names[n], t, d, th, tuple(rows.ints(k).tolist()), f) for k, (n, t, d, th, f) in enumerate(zip(
        rows.name_ids.tolist(), rows.ts.tolist(), rows.dur.tolist(), rows.thread.tolist(), rows.first.tolist()))]
    steps = [e for e in events if e.name.startswith(STEP)]
    ops = sorted((e for e in events if not e.name.startswith(STEP) and e.name not in ("gloo:send", "gloo:recv")),
                 key=lambda e: (e.ts, -e.dur))
    starts = [e.ts for e in ops]
    hand_overs = sorted((e for e in events if e.name in _HAND_OVERS), key=lambda e: e.ts)
    handed = [e.ts for e in hand_overs]
    out = {}
    for s in steps:
        try:
            number = int(s.name[len(STEP):])
        except ValueError:
            continue
        inside = ops[bisect.bisect_left(starts, s.ts):bisect.bisect_left(starts, s.ts + s.dur)]
        mine = [e for e in inside if e.tid == s.tid]
        spans = [e for e in hand_overs[bisect.bisect_left(handed, s.ts):bisect.bisect_left(handed, s.ts + s.dur)]
                 if e.tid == s.tid]
        share = _step_share(mine, spans)
        if share is not None:
            out[number] = share
    return out


def shares(kept: dict[int, list[OpRows]]) -> dict[int, dict[int, float]]:
    """Rank -> step number -> the per-call share of its micro-batches' compute, from each rank's
    files' kept ops (``kept``: :attr:`~overlapprof.analysis.analyzer.Analyzed.op_shapes`; an
    Nsight Systems export records no shapes: none)."""
    out: dict[int, dict[int, float]] = {}
    for rank, files in kept.items():
        for rows in files:
            out.setdefault(rank, {}).update(file_shares(rows))
    return out
