"""``prefetch=N``: FSDP's all-gathers issued N units earlier than traced.

Per rank, step and pass, the all_gather operations in issue order g_1 .. g_m are FSDP's units
(a step with R reduce_scatter operations and more than R all-gathers: the first R are the
forward pass's, the rest the backward's, which FSDP does not prefetch into from the forward).
Each g_j (j > 1) is issued where g_(max(1, j−N)) was issued in the trace (right after that key
and the gathers moved there before it, before anything the lane did next, so before a wait that
followed it): the first unit's pre-forward (pre-backward) issues the next N, each later one the
N-th after it. Their needs do not move (the unit's compute still needs its parameters then).
A backward all-gather issued ahead of the reduce-scatter that the trace ran before it does not
wait for it (:func:`_rechain`). On CPU runs two all-gathers run at once where FSDP has two in
flight (:func:`_two_at_once`: gloo's two worker threads a process group; from a trace already
prefetching one unit ahead, one more is two in flight). On CPU runs a moved all-gather's transfer grows with the compute
it now has beside it, at the slope the trace's own all-gathers show (:func:`_stretch`). What the
memory of N more gathered units would allow is not in the trace: the rewrite does not limit it.
"""

from __future__ import annotations

import numpy as np

from overlapprof.analysis.rank.classify import KINDS
from overlapprof.analysis.replay.timeline import BOUND, ISSUE, NEED, Traced
from overlapprof.analysis.replay.transfer import slopes

ALL_GATHER, REDUCE_SCATTER = KINDS.index("all_gather"), KINDS.index("reduce_scatter")


def _passes(tr: Traced, lane) -> list[list[int]]:
    """Per step and pass, the all_gather rows issued in it, in order: a step with R
    reduce_scatter operations (FSDP's units, one each in backward) and more than R all-gathers
    has two passes, the first R all-gathers the forward's and the rest the backward's."""
    gathers, scatters, cur = [[] for _ in lane.steps], [0] * len(lane.steps), None
    for kind, ref in zip(lane.kind, lane.ref):
        if kind == BOUND:
            cur = ref // 2 if ref % 2 == 0 else None
        elif kind == ISSUE and cur is not None and tr.kind[ref] == ALL_GATHER:
            gathers[cur].append(ref)
        elif kind == ISSUE and cur is not None and tr.kind[ref] == REDUCE_SCATTER:
            scatters[cur] += 1
    out = []
    for rows, r in zip(gathers, scatters):
        out += [rows[:r], rows[r:]] if 0 < r < len(rows) else [rows]
    return out


def prefetch(tr: Traced, depth: int) -> int:
    """Rewrite ``tr`` in place; the number of all-gathers moved (0: none has one to move past)."""
    slope, was = slopes(tr)  # on the traced lanes, before they move
    passes = {r: _passes(tr, lane) for r, lane in tr.lanes.items()}
    if not any(len(rows) > depth for p in passes.values() for rows in p):
        return 0  # every unit is issued ahead already at a smaller depth
    moved: set[int] = set()
    for r, lane in tr.lanes.items():
        after: dict[int, list[int]] = {}  # row of the slot's gather -> gathers issued right after it
        for rows in passes[r]:
            for j in range(1, len(rows)):
                after.setdefault(rows[max(0, j - depth)], []).append(rows[j])
        leaving = {row for rows in after.values() for row in rows}
        if not leaving:
            continue
        waited = _waited_at(lane, after)
        keys = list(zip(lane.t, lane.kind, lane.ref, lane.work, lane.compute))
        out: list[list] = []
        for t, kind, ref, work, compute in keys:
            here = after.get(ref, []) if kind == ISSUE else []
            if not (kind == ISSUE and ref in leaving):
                out.append([t, kind, ref, 0.0, 0.0])
            out += [[t, ISSUE, row, 0.0, 0.0] for row in here]
            out[-1][3] += work  # the slot's work follows the issues moved to it
            out[-1][4] += compute
        lane.t, lane.kind, lane.ref = [k[0] for k in out], [k[1] for k in out], [k[2] for k in out]
        lane.work, lane.compute = [k[3] for k in out], [k[4] for k in out]
        _rechain(tr, lane, leaving)
        if tr.mode == "cpu":
            _two_at_once(tr, after, leaving, waited)
        moved |= leaving
    _stretch(tr, moved, slope, was)
    return len(moved)


def _stretch(tr: Traced, moved: set[int], slope, was) -> None:
    """CPU runs: each moved all-gather's transfer grows by its kind's measured interference slope
    × the compute its ranks now do beside it beyond what they did in the trace (each rank's
    compute between its new issue and its need, at most the transfer's µs; :func:`.transfer.slopes`):
    gloo's threads share the cores with that compute, which the fit says slows them."""
    now = np.zeros(len(tr.members))
    for lane in tr.lanes.values():
        open_: dict[int, float] = {}
        for kind, ref, compute in zip(lane.kind, lane.ref, lane.compute):
            if kind == NEED and ref in open_:
                k = int(tr.inst[ref])
                now[k] += min(open_.pop(ref), float(tr.transfer[k]))
            elif kind == ISSUE and ref in moved and tr.inst[ref] >= 0 and slope[tr.inst[ref]] > 0:
                open_[ref] = 0.0
            for row in open_:
                open_[row] += compute
    tr.transfer += slope * np.maximum(now - was, 0.0)


def _waited_at(lane, after: dict[int, list[int]]) -> dict[int, set[int]]:
    """Per slot (the row whose traced issue the moved gathers follow), the rows the traced lane
    waits for there: their needs reached from the slot's issue before any compute."""
    out: dict[int, set[int]] = {}
    for j, (kind, ref) in enumerate(zip(lane.kind, lane.ref)):
        if kind != ISSUE or ref not in after:
            continue
        rows, computed = out.setdefault(ref, set()), lane.compute[j]
        for k in range(j + 1, len(lane.kind)):
            if computed > 0 or lane.kind[k] == BOUND:
                break
            if lane.kind[k] == NEED:
                rows.add(lane.ref[k])
            computed += lane.compute[k]
    return out


def _two_at_once(tr: Traced, after: dict[int, list[int]], moved: set[int], waited: dict[int, set[int]]) -> None:
    """A moved all-gather whose channel predecessor is another moved gather still in flight at
    its slot (not one the lane waits for there: FSDP waits for the unit's own gather before it
    prefetches) waits only for that one's predecessor: the two run at once, as gloo's two worker
    threads a process group run them (the prefetch=2 traces show it: two gathers in flight, each
    started before the other ended). One unit ahead of a trace that waited each gather where it
    was issued (prefetch=0), the predecessor is the one waited at the slot: in order, as traced.
    Each keeps its traced transfer: what two at once cost each other is not measured in a trace
    that ran them one at a time."""
    prev = tr.prev.copy()
    for slot, rows in after.items():
        for row in rows:
            p = int(prev[row])
            if p >= 0 and p in moved and tr.kind[p] == ALL_GATHER and p not in waited.get(slot, ()):
                tr.prev[row] = prev[p]


def _rechain(tr: Traced, lane, moved: set[int]) -> None:
    """A moved all-gather whose channel predecessor (``prev``) is now issued after it waits
    instead for the latest row before that one on the channel that is issued before it: issued
    ahead of the reduce-scatter that the trace ran before it, it does not wait for it (gloo's
    workers take a group's operations as they are issued), and that reduce-scatter still waits
    for what it waited for in the trace."""
    order = {ref: j for j, (kind, ref) in enumerate(zip(lane.kind, lane.ref)) if kind == ISSUE}
    for row in moved:
        p = int(tr.prev[row])
        while p >= 0 and order.get(p, -1) > order[row]:
            p = int(tr.prev[p])
        tr.prev[row] = p
