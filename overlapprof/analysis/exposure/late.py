"""Who each rank waited for, and what that rank was doing: the ``late_peer`` cause's labels.

A rank waits in an operation from its start until the last rank of its instance arrived (the
cross-rank section's wait). Where waits of several operations overlap, the one that ends last
holds the rank (it waits until then). The rank waited for may itself have been waiting for a
third one at that moment: the label follows such waits, hop by hop on the common clock, to the
rank that was not waiting (Scalasca's root cause; at most one hop per rank, and never back to
the waiting rank). That rank's *activity* then is ``compute`` (in its compute union), ``comm``
(in its communication union, not waiting: transferring) or ``other`` (neither: host code, data
loading, a sleep).

Labelled sets are ``(starts, ends, labels)``: sorted, disjoint intervals, one int label each.
"""

from __future__ import annotations

import numpy as np

from overlapprof.analysis import intervals as iv

Labelled = tuple[np.ndarray, np.ndarray, np.ndarray]
NONE: Labelled = (np.empty(0), np.empty(0), np.empty(0, dtype=np.int64))
COMPUTE, COMM, OTHER = 0, 1, 2  # activity codes, in the order of report.exposure.ACTIVITIES
STEADY_SHARE = 0.03  # a straggler: in the median step, waited for this share of the step more than any other rank


def distinct(labels: np.ndarray) -> list[int]:
    """The distinct values of non-negative int labels, ascending (np.unique would import numpy.ma)."""
    return np.flatnonzero(np.bincount(labels)).tolist() if labels.size else []


def cuts(*arrays: np.ndarray) -> np.ndarray:
    """The distinct times of the arrays, sorted."""
    s = np.sort(np.concatenate(arrays))
    return s[np.concatenate(([True], s[1:] != s[:-1]))] if s.size else s


def claim(starts: np.ndarray, ends: np.ndarray, labels: np.ndarray) -> Labelled:
    """Overlapping labelled intervals made disjoint: each instant goes to the interval covering it
    that ends last (ties: the later one in input order)."""
    keep = ends > starts
    starts, ends, labels = starts[keep], ends[keep], labels[keep]
    if starts.size == 0:
        return NONE
    order = np.argsort(starts, kind="stable")
    s, e, lab = starts[order], ends[order], labels[order]
    reach = np.maximum.accumulate(e)
    holder = np.maximum.accumulate(np.where(e >= reach, np.arange(e.size), 0))  # latest interval reaching furthest
    at = cuts(s, e)
    lo, hi = at[:-1], at[1:]
    j = np.searchsorted(s, lo, "right") - 1
    ok = j >= 0
    j = np.maximum(j, 0)
    ok &= reach[j] > lo
    return _merged(lo[ok], hi[ok], lab[holder[j[ok]]])


def _merged(starts: np.ndarray, ends: np.ndarray, labels: np.ndarray) -> Labelled:
    """Touching pieces with one label joined (pieces sorted and disjoint)."""
    if starts.size < 2:
        return starts, ends, labels
    new = np.ones(starts.size, dtype=bool)
    new[1:] = (starts[1:] > ends[:-1]) | (labels[1:] != labels[:-1])
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, starts.size - 1)
    return starts[first], ends[last], labels[first]


def overlay(a: Labelled, b: Labelled) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The pieces of ``a`` cut where ``b``'s intervals begin and end: (starts, ends, a's label,
    b's label or -1 where no interval of b covers the piece)."""
    a_s, a_e, a_lab = a
    b_s, b_e, b_lab = b
    if a_s.size == 0:
        return np.empty(0), np.empty(0), np.empty(0, np.int64), np.empty(0, np.int64)
    if b_s.size:  # only b's intervals that can meet a's (b is sorted and disjoint: so are its ends)
        lo_b, hi_b = np.searchsorted(b_e, a_s[0], "right"), np.searchsorted(b_s, a_e[-1], "left")
        b_s, b_e, b_lab = b_s[lo_b:hi_b], b_e[lo_b:hi_b], b_lab[lo_b:hi_b]
    at = cuts(a_s, a_e, b_s, b_e)
    lo, hi = at[:-1], at[1:]
    i = np.searchsorted(a_s, lo, "right") - 1
    inside = (i >= 0) & (a_e[np.maximum(i, 0)] > lo)
    lo, hi, i = lo[inside], hi[inside], i[inside]
    k = np.searchsorted(b_s, lo, "right") - 1 if b_s.size else np.full(lo.size, -1)
    in_b = (k >= 0) & (b_e[np.maximum(k, 0)] > lo) if b_s.size else np.zeros(lo.size, bool)
    return lo, hi, a_lab[i], np.where(in_b, b_lab[np.maximum(k, 0)] if b_s.size else -1, -1)


def roots(pieces: dict[int, Labelled]) -> dict[int, Labelled]:
    """Each rank's wait pieces (common clock, labelled with the rank waited for) relabelled with
    the rank at the end of the chain of waits (module docstring)."""
    out = {}
    for rank, first in pieces.items():
        s, e, lab = first
        for _ in range(len(pieces)):
            moved = False
            parts_s, parts_e, parts_lab = [], [], []
            for q in distinct(lab):
                mine = lab == q
                theirs = pieces.get(q, NONE)
                ps, pe, _, next_lab = overlay((s[mine], e[mine], lab[mine]), theirs)
                follow = (next_lab >= 0) & (next_lab != rank)
                moved |= bool(follow.any())
                parts_s.append(ps)
                parts_e.append(pe)
                parts_lab.append(np.where(follow, next_lab, q))
            if not parts_s:
                break
            order_s = np.concatenate(parts_s)
            order = np.argsort(order_s, kind="stable")
            s, e, lab = order_s[order], np.concatenate(parts_e)[order], np.concatenate(parts_lab)[order]
            if not moved:
                break
        out[rank] = _merged(s, e, lab)
    return out


def activities(pieces: Labelled, compute: dict[int, iv.Intervals], comm: dict[int, iv.Intervals]) -> Labelled:
    """``pieces`` (labelled with a rank, common clock) cut by what that rank was doing; the
    label becomes ``rank * 3 + activity`` (:data:`COMPUTE`, :data:`COMM`, :data:`OTHER`)."""
    s, e, lab = pieces
    out_s, out_e, out_lab = [], [], []
    for q in distinct(lab):
        mine = lab == q
        sub = (s[mine], e[mine], lab[mine])
        busy = _tagged(iv.union(*_cat(comm.get(q, iv.EMPTY), compute.get(q, iv.EMPTY))), compute.get(q, iv.EMPTY))
        ps, pe, _, what = overlay(sub, busy)
        out_s.append(ps)
        out_e.append(pe)
        out_lab.append(q * 3 + np.where(what < 0, OTHER, what))
    if not out_s:
        return NONE
    starts = np.concatenate(out_s)
    order = np.argsort(starts, kind="stable")
    return starts[order], np.concatenate(out_e)[order], np.concatenate(out_lab)[order]


def _cat(a: iv.Intervals, b: iv.Intervals) -> iv.Intervals:
    return np.concatenate((a[0], b[0])), np.concatenate((a[1], b[1]))


def _tagged(busy: iv.Intervals, compute: iv.Intervals) -> Labelled:
    """``busy`` (comm ∪ compute) labelled COMPUTE where compute runs, else COMM."""
    comp = iv.intersection(busy, compute)
    rest = iv.difference(busy, compute)
    starts = np.concatenate((comp[0], rest[0]))
    order = np.argsort(starts, kind="stable")
    labels = np.concatenate((np.full(comp[0].size, COMPUTE), np.full(rest[0].size, COMM)))
    return starts[order], np.concatenate((comp[1], rest[1]))[order], labels[order]


def lateness(ranks) -> tuple[dict[int, float], dict[int, float]]:
    """Per rank waited for, from the ranks' steps (:class:`~overlapprof.report.RankReport`'s,
    their ``exposure.late_peer_by_rank``): the µs a step the others waited for it (per step
    number the most-waiting rank's wait, averaged over the step numbers), and the median over the
    step numbers of how much longer they waited for it than for any other rank (µs). A straggler
    is late step after step; ranks late by turns, as a loaded host makes them, have a median near 0."""
    mean, nets = late_steps(ranks)
    return mean, {who: float(np.median(n)) for who, n in nets.items()}


def late_steps(ranks) -> tuple[dict[int, float], dict[int, list[float]]]:
    """:func:`lateness`'s mean, and per rank waited for, per step number (ascending) how much
    longer the others waited for it than for any other rank (µs; negative where another was
    waited for longer)."""
    by_number: dict[int, dict[int, float]] = {}
    numbers = set()
    for r in ranks:
        for s in r.steps:
            numbers.add(s.step)
            if s.exposure:
                d = by_number.setdefault(s.step, {})
                for who, us in s.exposure.late_peer_by_rank.items():
                    d[who] = max(d.get(who, 0.0), us)
    mean: dict[int, float] = {}
    for d in by_number.values():
        for who, us in d.items():
            mean[who] = mean.get(who, 0.0) + us / max(len(numbers), 1)
    nets = {who: [by_number.get(n, {}).get(who, 0.0) - max(
        (us for other, us in by_number.get(n, {}).items() if other != who), default=0.0) for n in sorted(numbers)]
        for who in mean}
    return mean, nets


def extra_work(work: dict[int, dict[int, float]]) -> dict[int, list[float]]:
    """Per rank, per step number it shares with another rank (ascending), its work that step (µs:
    what it did between its waits, ``work[rank][number]``) minus the median of the other ranks'."""
    out = {}
    for rank, mine in work.items():
        numbers = [n for n in sorted(mine) if any(n in w for r, w in work.items() if r != rank)]
        out[rank] = [mine[n] - float(np.median([w[n] for r, w in work.items() if r != rank and n in w]))
                     for n in numbers]
    return out


def not_steady(nets: list[float], step_us: float, spread_us: float, extra: list[float] | None = None) -> str | None:
    """Why a rank with these per-step net latenesses (:func:`late_steps`) is not a straggler, or
    None when it is. Late step after step means, in the median step, waited for longer than any
    other rank by at least :data:`STEADY_SHARE` of the step and at least the traced steps' own
    spread (their median deviation from the median step: a smaller lead is the steps' noise); and
    either the last to arrive in every traced step, or doing more work than the others in every
    traced step (``extra``, :func:`extra_work`), by at least that spread in the median one (a load
    that delays another rank in one step does not hide a rank with work the others do not do).
    "Every" is all but a tenth of them, for a spike the host made."""
    if not nets:
        return "no step to judge"
    median = float(np.median(nets))
    if median < STEADY_SHARE * step_us:
        return f"in the median step {max(median, 0.0) / 1000:.3f} ms more than for any other rank"
    if median < spread_us:
        return (f"in the median step {median / 1000:.3f} ms more than for any other rank, under the traced steps' "
                f"own spread ({spread_us / 1000:.3f} ms)")
    behind = sum(1 for n in nets if n > 0)
    if behind >= len(nets) - len(nets) // 10:
        return None
    more = sum(1 for e in extra or [] if e > 0)
    if extra and more >= len(extra) - len(extra) // 10 and float(np.median(extra)) >= spread_us:
        return None
    return (f"the last to arrive in {behind} of its {len(nets)} traced steps, and working longer than the others "
            f"in {more} of {len(extra or [])}")
