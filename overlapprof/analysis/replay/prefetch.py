"""``prefetch=N``: FSDP's all-gathers issued N units earlier than traced.

Per rank and step, the all_gather operations in issue order g_1 .. g_m are FSDP's units. Each
g_j with j > N is issued where g_(j−N) was issued in the trace (right after that key, before
anything the lane did next, so before a wait that followed it); the first N keep their place.
Their needs do not move (the unit's compute still needs its parameters then), and they still run
in order on their group (a moved all-gather waits for the one before it, as the replay's channel
rule has it). What the memory of N more gathered units would allow is not in the trace: the
rewrite does not limit it.
"""

from __future__ import annotations

from overlapprof.analysis.rank.classify import KINDS
from overlapprof.analysis.replay.timeline import BOUND, ISSUE, Traced

ALL_GATHER = KINDS.index("all_gather")


def _gathers(tr: Traced, lane) -> list[list[int]]:
    """Per step, the all_gather rows issued in it, in order."""
    out, cur = [[] for _ in lane.steps], None
    for kind, ref in zip(lane.kind, lane.ref):
        if kind == BOUND:
            cur = ref // 2 if ref % 2 == 0 else None
        elif kind == ISSUE and cur is not None and tr.kind[ref] == ALL_GATHER:
            out[cur].append(ref)
    return out


def prefetch(tr: Traced, depth: int) -> int:
    """Rewrite ``tr`` in place; the number of all-gathers moved (0: none has one to move past)."""
    moved = 0
    for lane in tr.lanes.values():
        after: dict[int, list[int]] = {}  # row of the slot's gather -> gathers issued right after it
        for rows in _gathers(tr, lane):
            for j in range(depth, len(rows)):
                after.setdefault(rows[j - depth], []).append(rows[j])
        leaving = {row for rows in after.values() for row in rows}
        if not leaving:
            continue
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
        moved += len(leaving)
    return moved
