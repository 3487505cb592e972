"""``no_straggler=R``: rank R's extra work removed from the traced steps.

In each step, where R's keys are the other ranks' keys (the same program), each piece of R's
work above the other ranks' median for that piece is brought down to it, its compute and the
rest (host code, idle) each on its own; where only the issues match (the same operations issued
in the same order, each rank coming to wait for them between other keys: FSDP's prefetched
all-gathers), the same from one issue to the next; otherwise R's work in the step is scaled
down to the other ranks' median totals (which count the others' own host work against R's).
Each instance R started last (the others waited for it) gets the transfer it takes unhindered
(:func:`.transfer.unhindered`): the peers' threads no longer spin beside it; and its operations
start after their issue no later than the least delayed ones (the backend's threads are no
longer held by operations waiting for R).
"""

from __future__ import annotations

import numpy as np

from overlapprof.analysis.replay.buckets import Refused
from overlapprof.analysis.replay.timeline import ISSUE, Traced, step_pieces
from overlapprof.analysis.replay.transfer import UNHINDERED_PERCENTILE, unhindered
from overlapprof.analysis.stats import median
from overlapprof.errors import InputError


def no_straggler(tr: Traced, value: str) -> list[str]:
    """Rewrite ``tr`` in place for ``no_straggler=value`` (the module docstring); notes of what it
    removed. Refused when the trace has no other rank to compare with."""
    try:
        rank = int(value)
    except ValueError:
        raise InputError(f"--set no_straggler={value}: a rank number") from None
    if rank not in tr.lanes:
        raise InputError(f"--set no_straggler={value}: no rank {rank} with steps in the trace "
                         f"(ranks {', '.join(map(str, sorted(tr.lanes)))})")
    if len(tr.lanes) < 2:
        raise Refused("the trace has one rank, no other to compare its work with")
    lane = tr.lanes[rank]
    before = lane.step_work()
    mine = step_pieces(lane)
    computed = [sum(lane.compute[j] for j in js) for js in mine]
    others = [(o, step_pieces(o)) for r, o in tr.lanes.items() if r != rank]
    for k, number in enumerate(lane.steps):
        peers = [(o, p[o.steps.index(number)]) for o, p in others if number in o.steps]
        if not peers:
            continue
        shape = [lane.kind[j] for j in mine[k]]
        if all([o.kind[j] for j in p] == shape for o, p in peers):
            for at, j in enumerate(mine[k]):  # the same keys: each piece's compute and rest down to the others' median
                _down_to(lane, [j], median([o.compute[p[at]] for o, p in peers]),
                         median([o.work[p[at]] - o.compute[p[at]] for o, p in peers]))
        elif (theirs := _same_issues(tr, lane, mine[k], peers)) is not None:
            segments = _issue_segments(lane, mine[k])
            for at, keys in enumerate(segments):  # the same issues, needs placed apart: from one issue to the next
                _down_to(lane, keys, median([sum(o.compute[j] for j in s[at]) for o, s in theirs]),
                         median([sum(o.work[j] - o.compute[j] for j in s[at]) for o, s in theirs]))
        elif before[k] > 0:
            _down_to(lane, mine[k], median([sum(o.compute[j] for j in p) for o, p in peers]),
                     median([sum(o.work[j] - o.compute[j] for j in p) for o, p in peers]))
    late = np.array([k for k, rows in enumerate(tr.members) if rank in tr.rank[rows].tolist()
                     and tr.start[rows].max() > tr.start[rows].min()
                     and int(tr.rank[rows[np.argmax(tr.start[rows])]]) == rank], dtype=np.int64)
    scale = {(rank, number): sum(lane.compute[j] for j in js) / was
             for number, js, was in zip(lane.steps, mine, computed) if was > 0}  # its compute beside them, as cut
    shorter = tr.transfer[late] - unhindered(tr, late, scale)
    tr.transfer[late] -= shorter
    waited = _unhindered_leads(tr, late)
    cut = sum(before) - sum(lane.step_work())
    less = sum(computed) - sum(sum(lane.compute[j] for j in js) for js in mine)
    steps = max(len(before), 1)
    notes = [f"no_straggler={rank}: the {late.size} operations rank {rank} started last take the transfer they take "
             f"unhindered, {shorter.sum() / steps / 1000:.3f} ms a step less"] if shorter.sum() > 0 else []
    if waited > 0:
        notes.append(f"no_straggler={rank}: their operations start as soon as the least delayed ones did, "
                     f"{waited / steps / 1000:.3f} ms a step less (the backend's threads no longer wait "
                     f"for rank {rank})")
    if cut <= 0:
        return [f"no_straggler={rank}: rank {rank}'s work was at most the others' median in every step: nothing removed",
                *notes]
    return [f"no_straggler={rank}: {cut / steps / 1000:.3f} ms of rank {rank}'s work a step removed (down to the other "
            f"ranks' median): {less / steps / 1000:.3f} ms of compute beyond theirs (more work or a slower device) and "
            f"{(cut - less) / steps / 1000:.3f} ms of host work or idle", *notes]


def _down_to(lane, keys: list[int], compute: float, rest: float) -> None:
    """The work after ``keys`` of ``lane`` brought down to at most ``compute`` µs of compute and
    ``rest`` µs of the rest (host code, idle), each part scaled on its own: a rank that computes
    longer loses its extra compute even where the others idled as long as it computed."""
    c = sum(lane.compute[j] for j in keys)
    o = sum(lane.work[j] - lane.compute[j] for j in keys)
    fc = min(1.0, compute / c) if c > 0 else 1.0
    fo = min(1.0, rest / o) if o > 0 else 1.0
    for j in keys:
        other = (lane.work[j] - lane.compute[j]) * fo
        lane.compute[j] *= fc
        lane.work[j] = lane.compute[j] + other


def _unhindered_leads(tr: Traced, insts: np.ndarray) -> float:
    """The operations of ``insts`` started no later after their issue than the least delayed
    of their kind and group size (the 10th percentile of the leads, warm-up left out where
    others are left): a backend runs a group's operations on a few threads, and while those
    wait for a late rank the next operation issued waits for a thread (gloo: two). µs taken off."""
    rows = np.concatenate([tr.members[k] for k in insts.tolist()]) if insts.size else np.zeros(0, dtype=np.int64)
    matched = tr.inst >= 0
    size = np.zeros(tr.kind.size, dtype=np.int64)  # each row's group size (its instance's members)
    size[matched] = np.array([m.size for m in tr.members], dtype=np.int64)[tr.inst[matched]]
    cut = 0.0
    for kind, n in {(int(tr.kind[r]), int(size[r])) for r in rows.tolist()}:
        mine = rows[(tr.kind[rows] == kind) & (size[rows] == n)]
        peers = np.flatnonzero(matched & (tr.kind == kind) & (size == n))
        live = peers[~tr.warm[tr.inst[peers]]] if (~tr.warm[tr.inst[peers]]).any() else peers
        floor = max(0.0, float(np.percentile(tr.lead[live], UNHINDERED_PERCENTILE)))
        cut += float(np.maximum(tr.lead[mine] - floor, 0.0).sum())
        tr.lead[mine] = np.minimum(tr.lead[mine], floor)
    return cut


def _issue_segments(lane, keys: list[int]) -> list[list[int]]:
    """A step's keys cut before each issue: the work from the step's start to the first issue, and
    from each issue to the next (the needs between them included). A need's key sits after the
    last key before its operation's end, so two ranks running the same program can order their
    keys apart while issuing the same operations in the same order."""
    out = [[]]
    for j in keys:
        if lane.kind[j] == ISSUE and out[-1]:
            out.append([])
        out[-1].append(j)
    return out


def _same_issues(tr: Traced, lane, keys: list[int], peers) -> list | None:
    """The peers' (lane, segments) when each issues what ``lane``'s ``keys`` issue, in the same
    order (:func:`_issue_segments`); None when one does not."""
    signature = _signature(tr, lane, _issue_segments(lane, keys))
    theirs = [(o, _issue_segments(o, p)) for o, p in peers]
    return theirs if all(_signature(tr, o, s) == signature for o, s in theirs) else None


def _signature(tr: Traced, lane, segments: list[list[int]]) -> list[tuple[int, int]]:
    """What each segment starts with: the kind of the operation it issues and, for a send or
    receive, which of the two ((-1, 0): the step's start). A pipeline's stages send where their
    peers receive: not the same program."""
    def of(row):
        return int(tr.kind[row]), int(tr.direction[row]) if tr.direction.size else 0

    return [of(lane.ref[s[0]]) if lane.kind[s[0]] == ISSUE else (-1, 0) for s in segments]
