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
"""

from __future__ import annotations

import bisect
from pathlib import Path
from overlapprof.trace.decode import SHAPED_DECODER, ShapedEvent
from overlapprof.trace.discover import discover, rank_from_name
from overlapprof.trace.reader import LayoutError, TraceReader

_HAND_OVERS = {"c10d::send": "send", "c10d::recv_": "recv", "gloo:send": "send", "gloo:recv": "recv"}
_STEP = "ProfilerStep#"


def _shapes(dims) -> list[list[int]]:
    """The tensor shapes (lists of ints) anywhere in a recorded ``Input Dims``."""
    if not isinstance(dims, list):
        return []
    if dims and all(isinstance(d, int) for d in dims):
        return [dims]
    return [s for d in dims for s in _shapes(d)]


def _rows(hand_overs) -> int | None:
    """The micro-batch's rows: the first dimension of the hand-overs' first tensor, if every
    hand-over says the same and it sizes no other dimension of its tensor."""
    found = set()
    for e in hand_overs:
        shapes = _shapes(e.args.input_dims if e.args else None)
        if shapes and shapes[0]:
            if shapes[0].count(shapes[0][0]) > 1:
                return None
            found.add(shapes[0][0])
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


def _step_share(ops: list[ShapedEvent], spans: list[ShapedEvent]) -> float | None:
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
        if any(rows in s for s in _shapes(e.args.input_dims if e.args else None)):
            per_row += max(own, 0.0)
        else:
            per_call += max(own, 0.0)
    return per_call / (per_call + per_row) if per_row > 0 else None


def file_shares(events) -> dict[int, float]:
    """Step number -> the per-call share of one rank's trace events (see the module docstring)."""
    events = [e for e in events if _kept(e)]
    steps = [e for e in events if e.name.startswith(_STEP)]
    ops = sorted((e for e in events if e.cat == "cpu_op"), key=lambda e: (e.ts, -e.dur))
    starts = [e.ts for e in ops]
    hand_overs = sorted((e for e in events if e.name in _HAND_OVERS), key=lambda e: e.ts)
    handed = [e.ts for e in hand_overs]
    out = {}
    for s in steps:
        try:
            number = int(s.name[len(_STEP):])
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


def _kept(e: ShapedEvent) -> bool:
    """What the shares read: complete events with times, of the host's ops, steps and hand-overs
    (a GPU's kernels and the rest are dropped as each chunk is read)."""
    return e.ph == "X" and e.ts is not None and e.dur is not None and (
        e.cat == "cpu_op" or e.name in _HAND_OVERS or e.name.startswith(_STEP))


def _events(path: Path) -> tuple[list[ShapedEvent], int | None]:
    reader = TraceReader(path, decoder=SHAPED_DECODER)
    try:
        events = [e for chunk in reader.chunks() for e in chunk.events if _kept(e)]
    except LayoutError:
        reader = TraceReader(path, decoder=SHAPED_DECODER)
        events = [e for chunk in reader.chunks(generic=True) for e in chunk.events if _kept(e)]
    info = reader.header.distributedInfo if reader.header is not None else None
    return events, info.rank if info is not None else None


def shares(paths) -> dict[int, dict[int, float]]:
    """Rank -> step number -> the per-call share of its micro-batches' compute, for the Kineto
    traces of ``paths`` (an Nsight Systems export records no shapes: none)."""
    out: dict[int, dict[int, float]] = {}
    for group in discover(paths).groups:
        for f in group.files:
            if not str(f).endswith((".json", ".json.gz")):
                continue
            events, rank = _events(Path(f))
            rank = rank if rank is not None else group.run_rank if group.run_rank is not None \
                else rank_from_name(Path(f).name)
            if rank is not None:
                out.setdefault(rank, {}).update(file_shares(events))
    return out
