"""``bucket_cap_mb=N``: DDP's gradient all-reduces regrouped into buckets of another size.

Per rank and step, the traced all_reduce operations are DDP's buckets, in the order backward
produced them (bucket j of ``B_j`` bytes issued at lane work position ``p_j``: the lane's work
done since the step began). Gradients are taken as produced evenly in the work between two
buckets' issues (the first bucket's over as much work before it as its bytes needed at the
second's pace), so the bytes ready by work position p are a piecewise-linear G(p) with
``G(p_j) = B_1 + ... + B_j``. New buckets close where DDP would close them (:func:`_bounds`:
traced buckets merged until one holds N MiB, one above N split evenly), bucket m at G's position
of its last byte; each moves ``latency + bytes × pace``: the step's own time per byte
(``Σ (x_j − latency) / Σ B_j``, the transfer model's latency) for as much of it as its window
(the work between its issue and the wait) holds, the least hindered traced pace (the 10th
percentile over the trace's buckets: on CPU runs the compute beside a bucket stretches it several
times over) for the rest, as far as compute explains the step's pace (:func:`_pace`: at most the
time compute ran beside the traced buckets; a step whose buckets had none beside keeps its own pace:
what slowed them was not compute, and a regrouping does not remove it), at most as many run at once as the traced ones
did (gloo's worker threads), with the rank's smallest traced lead over the run, and all are waited where the last
traced bucket was (DDP waits for every bucket when backward ends). The k-th new bucket of every
rank is one instance.

**Over loopback** (a CPU run whose ranks share one host and no ``--link-rate`` link: nothing but
the cores moves the bytes) the least hindered pace is the fastest traced bucket's, and of what a
step's buckets took beyond their bytes at that pace, the part compute beside them does not explain
is paid per bucket, not per byte (:func:`_per_operation`): gloo's thread waiting its turn for a
core, its wake-ups, which every operation pays whatever its bytes. Merging buckets saves it,
splitting one pays it more times. On the advise bench's crowded host (2 ranks and their gloo
threads on 2 cores) one bucket after backward ran 9.3 ms a step against 11.9 for 0.5 MiB buckets
and 13.0 for 0.01: per byte, the replay had predicted the larger buckets no faster from the
smaller ones' traces. A step of one traced bucket shows nothing of what is per operation: its
time stays per byte.

**Over a paced link** (``--link-rate``) with an interference fit on the trace (its transfers grow
with the compute beside them), a new bucket that moves alone beside more compute a byte than the
traced buckets had is charged for the difference at the fit's rate (:func:`_slowed`): DDP's one
bucket after backward had little beside it, a split's first buckets move while backward computes
and gloo's threads wait for a core. Alone: until the next bucket's issue (gloo's second thread
then keeps the link busy) or the wait.

**Over a paced link, where a step's traced buckets ran two or more at once** (gloo's two threads),
a new bucket moves its bus bytes at the link's rate for a rank (the transfer fit's, from
``--link-rate``) after the latency that is not that sharing (:func:`_shared_link_latency`), the new
buckets one at a time, plus what compute beside it costs (above). The traced buckets' times include
the bucket in flight beside them: fitted as ``latency + bytes × pace``, that share is latency (12
ms a 1 MiB bucket at 1 Gbit/s), which merging buckets would save, where the link moves a step's
bytes at its rate whatever the buckets. DDP over 1 Gbit/s, from a trace of six 1 MiB buckets:
three of 2 MiB predicted 153.7 ms (155.8 measured; 125.6 with the fitted latency), one 186.8
(190.9; 146.1).

A step whose traced buckets the cap keeps (the same bytes, bucket for bucket) is left as traced:
each bucket keeps its measured time, so the planted size predicts the replay back. The traced
buckets' bytes leave with them (a link's floor counts each byte once); no new bucket is issued
after the wait; a step that starts before the previous one ends on a rank's clock owns the keys
from its start.

What the trace must hold: in each step, the same number of all_reduce operations on every rank,
matched one per rank, with known sizes. Where the trace records the gradients' shapes
(``record_shapes``: :mod:`.gradients`), the new buckets are DDP's own: whole parameters in the
order backward made them, a bucket closed at the first that fills it (a traced bucket of one
parameter larger than the cap stays whole, as DDP keeps it). Without them a traced bucket of at
least two caps is split evenly, so a cap below a parameter's size predicts more buckets than DDP
makes (over a 1 Gbit/s link, six 1 MiB parameters under a 0.25 MiB cap: 24 buckets a step
predicted 0.6x as fast as the same run's 6).
"""

from __future__ import annotations

import math

import numpy as np

from overlapprof.analysis.rank.classify import KINDS
from overlapprof.analysis.replay.gradients import parameters, ready_at
from overlapprof.analysis.replay.timeline import BOUND, ISSUE, NEED, Traced, work_positions
from overlapprof.analysis.replay.transfer import beside, bus_bytes

ALL_REDUCE = KINDS.index("all_reduce")
MIB = 1 << 20


class Refused(Exception):
    """What the trace lacks for the regrouping (the message)."""


def _step_buckets(tr: Traced, lane) -> dict[int, list[int]]:
    """Step index -> the all_reduce rows issued in it, in order. A step that starts before the
    previous one ends (the ranks' host step times can overlap by a few ms) owns the keys from
    its start: the previous step's end does not close it."""
    out: dict[int, list[int]] = {}
    cur = None
    for kind, ref in zip(lane.kind, lane.ref):
        if kind == BOUND:
            if ref % 2 == 0:
                cur = ref // 2
            elif cur == ref // 2:
                cur = None
        elif kind == ISSUE and cur is not None and tr.kind[ref] == ALL_REDUCE:
            out.setdefault(cur, []).append(ref)
    return out


def _remove(lane, j: int) -> None:
    if j > 0:
        lane.work[j - 1] += lane.work[j]
        lane.compute[j - 1] += lane.compute[j]
    for name in ("t", "kind", "ref", "work", "compute"):
        del getattr(lane, name)[j]


def _span(lane, step: int) -> tuple[int, int]:
    """The keys of step index ``step``: from its start to its end, or the next step's start where
    that comes first (the previous step's end inside it does not end it), where the work
    positions run on from its start."""
    start = next(j for j, (k, r) in enumerate(zip(lane.kind, lane.ref)) if k == BOUND and r == 2 * step)
    end = next(j for j in range(start + 1, len(lane.kind))
               if lane.kind[j] == BOUND and (lane.ref[j] % 2 == 0 or lane.ref[j] == 2 * step + 1))
    return start, end


def _insert(lane, step: int, at: float, kind: int, ref: int) -> None:
    """Insert a key at work position ``at`` of step index ``step`` (after the keys already there)."""
    pos = work_positions(lane)
    start, end = _span(lane, step)
    j = start
    while j + 1 < end and pos[j + 1] <= at:
        j += 1
    into = min(max(at - pos[j], 0.0), lane.work[j])
    share = into / lane.work[j] if lane.work[j] > 0 else 0.0
    rest_w, rest_c = lane.work[j] - into, lane.compute[j] * (1 - share)
    lane.work[j], lane.compute[j] = into, lane.compute[j] * share
    for name, v in (("t", lane.t[j]), ("kind", kind), ("ref", ref), ("work", rest_w), ("compute", rest_c)):
        getattr(lane, name).insert(j + 1, v)


def _unseen_wait(lane, lo: int, hi: int, rows: list[int]) -> float:
    """Where a lane waits for its step's buckets when the trace put the wait in a later step (the
    lane not seen blocked: the time it waited is in its work, as idle): right after the last
    bucket's issue, as DDP waits when backward ends, and the idle after it in the step taken out
    of the work (the compute stays)."""
    last = max(j for j in range(lo, hi) if lane.kind[j] == ISSUE and lane.ref[j] in rows)
    for j in range(last, hi):
        lane.work[j] = lane.compute[j]
    return work_positions(lane)[last]


def _bounds(nbytes: np.ndarray, cap: float, params: np.ndarray | None = None) -> list[float]:
    """Where the new buckets close, in bytes of the step's gradients. With ``params`` (each
    gradient's bytes in the order backward made them): parameters gathered in order until a
    bucket holds at least ``cap``, as DDP closes a bucket at the first parameter that fills it.
    Without: traced buckets merged in order until one holds at least ``cap`` (the traced buckets'
    edges are parameters' edges); a traced bucket of at least two caps split evenly into
    ``floor(bytes / cap)`` pieces (each at least ``cap``)."""
    if params is not None:
        ends = np.cumsum(params)
        out, start = [], 0.0
        for end in ends.tolist():
            if end - start >= cap * (1 - 1e-9):
                out.append(end)
                start = end
        if start < ends[-1]:
            out.append(float(ends[-1]))
        return out
    out, acc, start = [], 0.0, 0.0
    for b in nbytes.tolist():
        pieces = math.floor(b / cap + 1e-9)  # each at least cap, as DDP fills a bucket past it
        if acc == 0.0 and pieces >= 2:
            out += [start + b * (i + 1) / pieces for i in range(pieces)]
            start += b
            continue
        acc += b
        if acc >= cap * (1 - 1e-9):
            start += acc
            out.append(start)
            acc = 0.0
    if acc > 0:
        out.append(start + acc)
    return out


def _in_flight(starts: np.ndarray, ends: np.ndarray) -> int:
    """The most of these operations running at once (gloo runs a group's collectives on a few
    worker threads): a new bucket waits for the one that many before it."""
    pos = np.concatenate((starts, ends))
    delta = np.concatenate((np.ones(starts.size), -np.ones(ends.size)))
    order = np.lexsort((delta, pos))  # an end before a start at one instant
    return max(1, int(np.max(np.cumsum(delta[order])))) if pos.size else 1


def _unhindered_per_byte(tr: Traced, per_rank: dict, latency: np.ndarray, least: bool = False) -> float:
    """The traced buckets' time per byte when nothing slowed them: the 10th percentile over the
    steps' matched buckets (warm-up left out). On CPU runs, compute beside a bucket (gloo's
    threads share the cores) stretches it several times over; the least hindered show the link.
    ``least``: the least of them (over loopback, where only the cores move the bytes, anything
    that hinders a bucket adds to its time: the fastest is its bytes' own; a 10th percentile
    over 36 buckets of 0.5 MiB, few of them unhindered, was 3.8x the fastest)."""
    rows = [r for b in per_rank.values() for v in b.values() for r in v]
    rows = [r for r in rows if tr.inst[r] >= 0 and not tr.warm[tr.inst[r]] and tr.nbytes[r] > 0]
    if not rows:
        return math.inf
    inst = tr.inst[rows]
    lat = np.where(inst < latency.size, latency[np.minimum(inst, max(latency.size - 1, 0))], 0.0) \
        if latency.size else np.zeros(inst.size)
    return float(np.percentile(np.maximum(tr.transfer[inst] - lat, 0.0) / tr.nbytes[rows], 0 if least else 10))


def _hindered_share(transfer: np.ndarray, compute: np.ndarray) -> float:
    """The share of a step's traced bucket time that had compute beside it (per bucket, its ranks'
    compute beside its transfer, summed as the ranks of one host share its cores, at most its
    transfer)."""
    total = float(np.sum(transfer))
    return float(np.sum(np.minimum(transfer, compute))) / total if total > 0 else 0.0


def _explained(per_byte: float, clean: float, traced_share: float) -> float:
    """What compute beside the traced buckets explains of their time per byte: at most the gap to
    the least hindered pace (``per_byte − clean``) and at most the time it ran beside them
    (``traced_share × per_byte``)."""
    return min(per_byte - clean, traced_share * per_byte) if traced_share > 0 else 0.0


def _pace(per_byte: float, clean: float, traced_share: float, share: float) -> float:
    """A new bucket's time per byte: the step's own ``per_byte`` less what compute beside the
    traced buckets explains of it (:func:`_explained`), for the hindered share the new bucket
    loses (``traced_share`` of the traced buckets' time had compute beside it, ``share`` of the
    new one's has): where little or nothing computed beside the traced buckets, their pace is the
    link's or the host's that step, and it is kept."""
    if traced_share <= 0 or share >= traced_share:
        return per_byte
    return per_byte - _explained(per_byte, clean, traced_share) * (traced_share - share) / traced_share


def _per_operation(lat: float, size: float, pace: float, unexplained: float, per_bucket: float) -> float:
    """A new bucket's time over loopback: :func:`_pace`'s, less the ``unexplained`` part of it (µs a
    byte beyond the least hindered pace that compute beside the traced buckets does not explain),
    which is paid per bucket instead: ``per_bucket`` bytes' worth (the step's bytes over its traced
    buckets). Over loopback nothing but the cores moves the bytes: what the traced buckets took
    beyond their bytes' least hindered time and the compute beside them is a core's time that
    each operation pays again whatever its bytes (gloo's thread waiting its turn on a crowded
    host, its wake-ups): merging buckets saves it, splitting one pays it more times."""
    return lat + size * (pace - unexplained) + unexplained * per_bucket


def _compute_in(profile, a: float, b: float) -> float:
    """The compute a lane does between work positions ``a`` and ``b`` of a step (``profile``: its
    keys' positions, work and compute there, compute spread evenly over each key's work)."""
    pos, work, comp = profile
    out = 0.0
    if b <= a:
        return out
    for p, w, c in zip(pos, work, comp):
        if w > 0 and p < b and p + w > a:
            out += c * (min(b, p + w) - max(a, p)) / w
    return out


def _slope(tr: Traced, insts: np.ndarray, cost: np.ndarray, c: np.ndarray) -> float:
    """µs of transfer per µs of compute beside it, over the traced buckets: the interference fit's
    cost (:func:`~overlapprof.analysis.replay.transfer.interference`) over the compute beside
    them (0: no fit held)."""
    use = insts[(insts < cost.size) & ~tr.warm[insts]]
    total = float(np.sum(c[use]))
    return float(np.sum(cost[use])) / total if use.size and total > 0 else 0.0


def _slowed(slope: float, traced_per_byte: float, size: float, issue, until, start_after, x: float, profile):
    """Over a paced link, what a new bucket's transfer gains from the compute beside it beyond the
    traced buckets' (``traced_per_byte``: the compute beside them a byte): ``slope`` × the ranks'
    compute while it moves alone, at most the most of one rank, as
    :func:`~overlapprof.analysis.replay.transfer.interference` charges a traced one. Alone: each
    rank's from the later of its issue and its queue's turn (``start_after``) to ``until``, the
    next bucket's issue or the wait. gloo moves a group's collectives on two threads: once the
    next bucket is issued, it sends while the compute holds this one back, and the link is kept
    busy (in the advise bench's 0.25 MiB runs over a 2 Gbit/s link, the steps whose backward ran
    as usual kept the link busy from the first bucket's start to the last one's end, 12.5 ms for
    12.6 ms of bytes, with both ranks' backward beside the first two buckets)."""
    each = []
    for r in issue:
        lo = max(issue[r], start_after[r])
        each.append(_compute_in(profile[r], lo, min(lo + x, until[r])))
    extra = slope * (sum(each) - traced_per_byte * size)
    return max(0.0, min(extra, max(each, default=0.0)))


def regroup(tr: Traced, cap_mb: float, latency: np.ndarray, per_operation: bool = False,
            cost: np.ndarray | None = None, gradients: dict | None = None,
            link_per_byte: float | None = None) -> tuple[int, int]:
    """Rewrite ``tr`` in place for buckets of ``cap_mb`` MiB (see the module docstring); the new
    buckets per step. ``per_operation``: over loopback, what a step's buckets took beyond their
    bytes at the least hindered pace is paid per bucket (:func:`_per_operation`), not per byte.
    ``cost``: per traced instance, the µs the compute beside it cost its transfer (the
    interference fit); over a paced link a new bucket with more compute beside it a byte than the
    traced ones is charged for the difference at the same rate (:func:`_slowed`). ``gradients``:
    rank -> step number -> its gradients' elements in backward's order (:mod:`.gradients`): the
    new buckets hold whole parameters. ``link_per_byte``: µs a bus byte over the run's paced link
    (a rank's share of it): where a step's traced buckets ran two or more at once, each new one
    moves its bus bytes at that rate, one at a time (the module docstring). Returns the new buckets
    in all and the steps left as traced because the cross-rank matching did not pair their all_reduces (a step's buckets are
    one instance per rank: the replay cannot regroup what it cannot pair); Refused when the trace
    lacks what it needs, or most steps are not paired."""
    cap = cap_mb * MIB
    per_rank = {r: _step_buckets(tr, lane) for r, lane in tr.lanes.items()}
    if not any(per_rank.values()):
        raise Refused("the trace has no all_reduce operations (DDP's gradient buckets) in its steps")
    steps = sorted({k for b in per_rank.values() for k in b})
    unhindered = _unhindered_per_byte(tr, per_rank, latency, least=per_operation)
    # a start's delay beyond its issue is the scheduling of gloo's thread: the least one over the run's
    # buckets, not a step's (a single bucket's one-off delay repeated per bucket cost 0.5 ms each)
    least_lead = {r: float(np.min(tr.lead[[x for v in b.values() for x in v]])) for r, b in per_rank.items() if b}
    compute_beside = beside(tr)
    all_insts = np.unique(np.concatenate([tr.inst[x] for b in per_rank.values() for x in b.values()] or [[]]))
    slope = 0.0 if per_operation or cost is None else _slope(tr, all_insts[all_insts >= 0].astype(np.int64),
                                                                cost, compute_beside)
    new_rows: list[dict] = []
    made = 0
    unmatched: list[int] = []  # steps whose all_reduces the cross-rank matching did not pair
    for k in steps:
        rows = {r: b.get(k, []) for r, b in per_rank.items()}
        counts = {len(v) for v in rows.values()}
        if 0 in counts:  # a step some rank has no bucket in (its trace cut short there): left as traced
            continue
        if len(counts) != 1:
            raise Refused(f"step index {k}: ranks issued different numbers of all_reduce operations {sorted(counts)}")
        insts = [tr.inst[v] for v in rows.values()]
        if any((i < 0).any() for i in insts) or any((i != insts[0]).any() for i in insts):
            unmatched.append(k)  # left as traced (below: refused where most steps are)
            continue
        nbytes = tr.nbytes[next(iter(rows.values()))]
        if np.isnan(nbytes).any() or (nbytes <= 0).any():
            raise Refused("the all_reduce operations' sizes are not in the trace")
        lat = float(np.min(latency[insts[0]])) if insts[0].size else 0.0
        per_byte = float(np.sum(np.maximum(tr.transfer[insts[0]] - lat, 0.0)) / np.sum(nbytes))
        clean = min(per_byte, unhindered)
        traced_share = _hindered_share(tr.transfer[insts[0]], compute_beside[insts[0]])
        unexplained = per_byte - clean - _explained(per_byte, clean, traced_share)
        per_bucket = float(np.sum(nbytes)) / nbytes.size
        params, ready = parameters(tr, rows, k, gradients, float(np.sum(nbytes))) or (None, None)
        bounds = _bounds(nbytes, cap, params)
        if len(bounds) == nbytes.size and np.allclose(bounds, np.cumsum(nbytes)):
            made += len(bounds)  # the cap keeps the traced buckets: the step as traced, each its own time
            continue
        group = int(tr.group_size[insts[0][0]]) or len(rows)
        shared_link = _shared_link_latency(tr, next(iter(rows.values())), group, link_per_byte)
        first_inst = len(tr.members)
        windows: list[list[float]] = []
        issues, waits, profiles, depths = {}, {}, {}, {}
        for r, v in rows.items():
            lane = tr.lanes[r]
            pos = work_positions(lane)
            at = {lane.ref[j]: pos[j] for j, kk in enumerate(lane.kind) if kk == ISSUE and lane.ref[j] in v}
            p = np.array([at[row] for row in v])
            lo, hi = _span(lane, k)
            needs = [j for j, (kk, ref) in enumerate(zip(lane.kind, lane.ref)) if kk == NEED and ref in v]
            if all(lo < j < hi for j in needs):
                need_at = max(pos[j] for j in needs)
            else:  # the wait the trace put in a later step
                need_at = _unseen_wait(lane, lo, hi, v)
            cum = np.cumsum(nbytes)
            pace = (p[1] - p[0]) / nbytes[1] if p.size > 1 and nbytes[1] > 0 else 0.0
            xs = np.concatenate(([max(0.0, p[0] - pace * nbytes[0])], p))
            ys = np.concatenate(([0.0], cum))
            # over a paced link the link takes the buckets one at a time, however many gloo has in flight
            depth = 1 if shared_link is not None else _in_flight(tr.start[v], tr.end[v])
            lead = least_lead[r]
            if slope > 0:  # the step's compute as traced, before its buckets' keys leave
                profiles[r] = (pos[lo:hi], lane.work[lo:hi], lane.compute[lo:hi])
            # where each new bucket's last gradient was accumulated (the trace's AccumulateGrad), else
            # the gradients spread evenly between the traced issues; none issued after the wait
            at_ready = ready_at(lane, k, ready[r], params, bounds) if ready is not None else None
            issue_at = [min(float(np.interp(b, ys, xs)) if at_ready is None else at_ready[m], need_at)
                        for m, b in enumerate(bounds)]
            tr.nbytes[v] = np.nan  # their bytes are the new buckets' now (a link's floor counts each byte once)
            for row in v:  # the traced buckets leave this lane
                for kind in (ISSUE, NEED):
                    _remove(lane, next(j for j, (kk, ref) in enumerate(zip(lane.kind, lane.ref))
                                       if kk == kind and ref == row))
            windows.append([max(0.0, need_at - x) for x in issue_at])
            issues[r], waits[r], depths[r] = issue_at, need_at, depth
            for m, b in enumerate(bounds):
                row = tr.rank.size + len(new_rows)
                new_rows.append(dict(rank=r, nbytes=(b - (bounds[m - 1] if m else 0.0)), inst=first_inst + m,
                                     lead=lead, prev=row - depth if m >= depth else -1, step=int(tr.step[v[-1]]),
                                     group_size=int(tr.group_size[v[-1]]), end=float(tr.end[v[-1]])))
                _insert(lane, k, issue_at[m], ISSUE, row)
            for m in range(len(bounds)):
                _insert(lane, k, need_at, NEED, tr.rank.size + len(new_rows) - len(bounds) + m)
            for row in np.flatnonzero(np.isin(tr.prev, v)).tolist():  # later ops queued behind the new last
                tr.prev[row] = tr.rank.size + len(new_rows) - 1
        traced_beside = float(np.sum(compute_beside[insts[0]])) / float(np.sum(nbytes))
        ends: dict[int, list[float]] = {r: [] for r in issues}
        for m, b in enumerate(bounds):
            tr.members.append(None)
            size = b - (bounds[m - 1] if m else 0.0)
            hindered = lat + per_byte * size
            # the step's own pace for as much of the transfer as compute runs beside it (its window:
            # the work between its issue and the wait), the unhindered pace for the rest
            share = min(1.0, min(w[m] for w in windows) / hindered) if hindered > 0 else 1.0
            new_pace = _pace(per_byte, clean, traced_share, share)
            # one traced bucket: what is per operation is not seen, but where the gradients place the
            # new ones (not all at its issue), each pays its rest again, as advise's halves did
            if shared_link is not None:
                x = shared_link + bus_bytes(ALL_REDUCE, size, group) * link_per_byte
            elif per_operation and (nbytes.size > 1 or ready is not None):
                x = _per_operation(lat, size, new_pace, unexplained, per_bucket)
            else:
                x = lat + size * new_pace
            if slope > 0:  # queued as the traced ones ran, each rank's buckets end where the previous did
                after = {r: ends[r][m - depths[r]] if m >= depths[r] else 0.0 for r in issues}
                until = {r: min(issues[r][m + 1], waits[r]) if m + 1 < len(bounds) else waits[r] for r in issues}
                x += _slowed(slope, traced_beside, size, {r: issues[r][m] for r in issues}, until, after, x, profiles)
                for r in issues:
                    ends[r].append(max(issues[r][m], after[r]) + x)
            tr.transfer = np.append(tr.transfer, x)
            tr.warm = np.append(tr.warm, False)
        made += len(bounds)
    if 2 * len(unmatched) > len(steps):
        raise Refused("the all_reduce operations are not matched one per rank across the ranks "
                      f"({len(unmatched)} of {len(steps)} steps)")
    _append(tr, new_rows)
    return made, len(unmatched)


def _shared_link_latency(tr: Traced, rows: list[int], group: int, link_per_byte: float | None) -> float | None:
    """Over a paced link (``link_per_byte``: µs a bus byte), where the step's traced buckets ran
    two or more at once: each one's time less the link time of its own bus bytes and of the share
    of the others' that moved while it ran, the median (at least 0): the latency that is not the
    link shared with the bucket beside it. None where they ran one at a time or there is no link."""
    if link_per_byte is None or len(rows) < 2 or _in_flight(tr.start[rows], tr.end[rows]) < 2:
        return None
    start, end = tr.start[rows], tr.end[rows]
    took = np.maximum(end - start, 1e-9)
    bus = np.array([bus_bytes(ALL_REDUCE, float(b), group) for b in tr.nbytes[rows]])
    own = []
    for i in range(len(rows)):
        beside = np.clip(np.minimum(end[i], end) - np.maximum(start[i], start), 0.0, None) / took
        beside[i] = 0.0
        own.append(took[i] - (bus[i] + float(np.dot(beside, bus))) * link_per_byte)
    return max(0.0, float(np.median(own)))


def by_parameters(tr: Traced, gradients: dict | None) -> bool:
    """Whether every step with buckets on every rank is regrouped from the trace's gradients
    (their sizes and when each was accumulated: :func:`_parameters`)."""
    per_rank = {r: _step_buckets(tr, lane) for r, lane in tr.lanes.items()}
    checked = 0
    for k in sorted({k for b in per_rank.values() for k in b}):
        rows = {r: b.get(k, []) for r, b in per_rank.items()}
        if any(not v for v in rows.values()):
            continue
        if parameters(tr, rows, k, gradients, float(np.nansum(tr.nbytes[next(iter(rows.values()))]))) is None:
            return False
        checked += 1
    return checked > 0


def _append(tr: Traced, rows: list[dict]) -> None:
    base = tr.rank.size
    n = len(rows)
    col = {name: np.array([r[name] for r in rows]) for name in rows[0]} if rows else {}
    tr.rank = np.append(tr.rank, col.get("rank", [])).astype(np.int64)
    tr.kind = np.append(tr.kind, np.full(n, ALL_REDUCE)).astype(np.int64)
    for name in ("issue", "start"):
        setattr(tr, name, np.append(getattr(tr, name), np.full(n, np.nan)))
    tr.end = np.append(tr.end, col.get("end", []))
    tr.dur = np.append(tr.dur, np.zeros(n))
    tr.nbytes = np.append(tr.nbytes, col.get("nbytes", []))
    tr.group_size = np.append(tr.group_size, col.get("group_size", [])).astype(np.int64)
    tr.step = np.append(tr.step, col.get("step", [])).astype(np.int64)
    tr.inst = np.append(tr.inst, col.get("inst", [])).astype(np.int64)
    tr.lead = np.append(tr.lead, col.get("lead", []))
    tr.tail = np.append(tr.tail, np.zeros(n))
    tr.prev = np.append(tr.prev, col.get("prev", [])).astype(np.int64)
    tr.direction = np.append(tr.direction, np.zeros(n)).astype(np.int64)
    tr.peer = np.append(tr.peer, np.full(n, -1)).astype(np.int64)
    for k in range(len(tr.members)):
        if tr.members[k] is None:
            tr.members[k] = np.flatnonzero(tr.inst[base:] == k) + base
