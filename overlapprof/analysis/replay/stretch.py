"""Transfers that a change puts beside more compute, or beside other transfers on a shared link,
run longer, as the trace measured them to.

Both are counted the same way in two replays: the traced steps unchanged (``c``, ``l``) and the
rewritten ones (``c'``, ``l'``); each instance's transfer is lengthened by the difference (with
nothing changed it is 0, and the replay gives the traced steps back). Only instances the trace
has: one a rewrite made (a bucket, a micro-batch's hand-over) has no traced counterpart to
compare with and keeps the transfer its rewrite gave it. One pass: what a lengthened transfer
then overlaps is not charged again.

**Compute beside it** (CPU runs): where the trace's fit holds
(:func:`~overlapprof.analysis.replay.transfer.slopes`: per kind and group size, ``transfer = x0 +
slope × the compute beside it``), a change that moves compute beside a transfer (``async=``,
``bucket_cap_mb=``, ``micro_batches=``; ``prefetch=`` lengthens the all-gathers it moves
itself) lengthens it by ``slope × (c' − c)``. ``c`` is Σ over its ranks of their lanes'
compute in [its latest replayed start, + its transfer), each key's compute spread evenly over
the work after it (the lane's keys say how much compute, not where in the work). The fit is
used where it was made: ``c`` and ``c'`` are taken at most up to the most compute beside one of
its instances (a blocking trace's fit, made on a little compute, is not stretched to the much
more an async change puts there: a 4-rank sync all_reduce fitted at 5.6 µs a µs on r = 0.59
otherwise predicted 88 ms for a run of 29), and the slope at most 1 (a transfer waits at most
for the compute beside it). A transfer is shortened (``c' < c``) by at most what the fit says
the compute beside it cost in the trace. ``compute=xF`` scales that part itself
(:mod:`.changes`) and ``no_straggler=`` gives the late transfers what they take unhindered:
neither is charged here.

**Other transfers beside it** (a ``--link-rate`` run: one medium for all its ranks): instances
whose transfers overlap share the link's rate. Each instance ``j`` needs ``p_j = min(its bytes
on the link / rate, x_j)`` of the link (:func:`~overlapprof.analysis.replay.cores.link_time`'s
bytes), spread evenly over its transfer; ``l_k`` is Σ over the other instances of the link time
they need inside ``k``'s transfer. Two equal transfers made concurrent by a change each take
twice as long, as the link's bytes do (a blocking ring's send and receive, made asynchronous).
"""

from __future__ import annotations

import numpy as np

from overlapprof.analysis.rank.classify import KINDS
from overlapprof.analysis.replay.engine import Replayed, replay
from overlapprof.analysis.replay.timeline import Traced
from overlapprof.analysis.replay.cores import link_bytes
from overlapprof.analysis.replay.transfer import slopes

MAX_SLOPE = 1.0  # a transfer waits at most for the compute beside it
# the rewrites that move compute beside a transfer (prefetch lengthens the all-gathers it moves itself)
MOVES = ("async", "bucket_cap_mb", "micro_batches")


def _window(tr: Traced, out: Replayed, k: int) -> tuple[float, float] | None:
    rows = tr.members[k]
    if rows is None or not len(rows) or np.isnan(out.start[rows]).any():
        return None
    lo = float(np.max(out.start[rows]))
    return lo, lo + float(tr.transfer[k])


def compute_beside(tr: Traced, out: Replayed, count: int) -> np.ndarray:
    """Per instance ``k < count`` of ``tr`` replayed as ``out``, the compute of its ranks' lanes in
    [its latest replayed start, + its transfer) (µs; NaN where it was not replayed whole)."""
    cum = {}  # rank -> (times, compute done by then): the lane's compute as a piecewise-linear clock
    for r, lane in tr.lanes.items():
        t0 = out.key_t.get(r)
        if t0 is None or not len(lane.t):
            continue
        w, c = np.asarray(lane.work, dtype=float), np.asarray(lane.compute, dtype=float)
        done = np.concatenate([[0.0], np.cumsum(c)])
        xs = np.column_stack([t0, t0 + w]).ravel()
        ys = np.column_stack([done[:-1], done[1:]]).ravel()
        ok = ~np.isnan(xs)
        cum[r] = (xs[ok], ys[ok])
    res = np.full(count, np.nan)
    for k in range(min(count, len(tr.members))):
        span = _window(tr, out, k)
        if span is None:
            continue
        res[k] = sum(float(np.interp(span[1], *cum[r]) - np.interp(span[0], *cum[r]))
                     for r in set(tr.rank[tr.members[k]].tolist()) if r in cum and cum[r][0].size)
    return res


def link_beside(tr: Traced, out: Replayed, rate: float, count: int) -> np.ndarray:
    """Per instance ``k < count``, the link time (µs at ``rate`` bytes/µs) the other instances
    need inside its replayed transfer (NaN where it was not replayed whole)."""
    spans, need = [], []
    for k, b in enumerate(link_bytes(tr).tolist()):
        span = _window(tr, out, k)
        if span is None or np.isnan(tr.nbytes[tr.members[k]]).all() or span[1] <= span[0]:
            spans.append((np.nan, np.nan))
            need.append(0.0)
            continue
        spans.append(span)
        need.append(0.0 if np.isnan(b) else min(b / rate, span[1] - span[0]))
    lo, hi = np.array([s[0] for s in spans]), np.array([s[1] for s in spans])
    density = np.divide(need, hi - lo, out=np.zeros(len(need)), where=hi > lo)
    res = np.full(count, np.nan)
    for k in range(min(count, len(spans))):
        if np.isnan(lo[k]):
            continue
        over = np.clip(np.minimum(hi, hi[k]) - np.maximum(lo, lo[k]), 0.0, None)
        over[k] = 0.0
        res[k] = float(np.nansum(over * density))
    return res


class Stretcher:
    """The lengthening for the changes of one trace ``tr``: ``cost`` per traced instance (what
    :func:`~overlapprof.analysis.replay.transfer.interference` says the compute beside it cost), ``rate``
    the traced run's shared link (bytes/µs; None: none). The unchanged replay's ``c`` and ``l``
    are counted once, when first needed."""

    def __init__(self, tr: Traced, cost: np.ndarray, rate: float | None):
        self.tr, self.cost, self.rate = tr, cost, rate
        slope, c = slopes(tr)
        self.slope = np.minimum(slope, MAX_SLOPE)
        self.reach = np.zeros(slope.size)  # the most compute beside one of the instances its fit was made on
        groups: dict[tuple[int, int], list[int]] = {}
        for k in np.flatnonzero(slope > 0).tolist():
            groups.setdefault((int(tr.kind[tr.members[k][0]]), tr.members[k].size), []).append(k)
        for ks in groups.values():
            live = [k for k in ks if not tr.warm[k]]
            self.reach[ks] = float(np.max(c[live])) if live else 0.0
        self._before: tuple[np.ndarray, np.ndarray] | None = None

    def __call__(self, new: Traced, changes: list[tuple[str, str]], rate: float | None) -> list[str]:
        """Lengthen ``new`` (``tr`` rewritten for ``changes``; ``rate``: its link) in place; its notes."""
        names = {name for name, _ in changes}
        moves = bool(names & set(MOVES)) and "compute" not in names and self.slope.any()
        shares = bool(self.rate and rate)
        if not changes or not (moves or shares):
            return []
        count = min(len(self.tr.members), len(new.members))
        if self._before is None:
            base = replay(self.tr)
            n = len(self.tr.members)
            self._before = (compute_beside(self.tr, base, n) if self.slope.any() else np.zeros(n),
                            link_beside(self.tr, base, self.rate, n) if self.rate else np.zeros(n))
        out = replay(new)
        by_compute, by_link = np.zeros(count), np.zeros(count)
        if moves:
            reach = self.reach[:count]
            delta = np.nan_to_num(np.minimum(compute_beside(new, out, count), reach)
                                  - np.minimum(self._before[0][:count], reach))
            by_compute = np.maximum(self.slope[:count] * delta, -self.cost[:count])
        if shares:
            by_link = np.nan_to_num(link_beside(new, out, rate, count) - self._before[1][:count] * self.rate / rate)
        return _apply(new, by_compute, by_link)


def _apply(new: Traced, by_compute: np.ndarray, by_link: np.ndarray) -> list[str]:
    add = by_compute + by_link
    changed = np.flatnonzero(np.abs(add) > 1e-6)
    if not changed.size:
        return []
    new.transfer = new.transfer.copy()
    new.transfer[:add.size] = np.maximum(new.transfer[:add.size] + add, 0.0)
    steps = max((len(lane.steps) for lane in new.lanes.values()), default=1) or 1
    notes = []
    for kind in sorted({int(new.kind[new.members[k][0]]) for k in changed}):
        ks = [k for k in changed if int(new.kind[new.members[k][0]]) == kind]
        parts = [f"{float(part[ks].sum()) / steps / 1000:+.3f} ms a step for {why}"
                 for part, why in ((by_compute, "the compute this change moves beside them (the trace's fit)"),
                                   (by_link, "the other transfers it puts beside them on the shared link"))
                 if np.any(np.abs(part[ks]) > 1e-6)]
        notes.append(f"interference: {len(ks)} {KINDS[kind]} transfers run longer or shorter than traced: "
                     + "; ".join(parts))
    return notes
