"""How long each combination of interval classes covers the time, for intervals kept on disk.

Each interval belongs to a *segment* (a step, or the whole rank) and a *class* (a bit of a
*pattern*). Its start and end are *boundaries*, written to the *slab* (a file,
:class:`~overlapprof.analysis.spill.Buckets`) of the time range they fall in. The slabs are then
read in time order. In each, a segment's boundaries sorted by time give, by a cumulative sum per
class, how many intervals of each class cover each piece of time between two boundaries; the
piece's length (µs) is added to its segment's total for its pattern (the classes with a count
above zero). The counts at a segment's last boundary in a slab are carried into the next. So
memory holds one slab, and per segment and pattern one float, whatever the number of intervals.

Each metric is then a sum of those totals over patterns (``lengths[(segment, pattern)]``):
``|U(A)|`` is the time whose pattern has A's bit, ``|U(A) ∩ U(B)|`` both bits, ``|U(A) − U(B)|``
A's and not B's. Zero-length intervals add nothing, as in :func:`overlapprof.analysis.intervals.union`.
The sums are the union lengths of :mod:`overlapprof.analysis.intervals` added in another order:
equal to float rounding (about 1e-12 of the value).
"""

from __future__ import annotations

import numpy as np

from overlapprof.analysis import intervals as iv
from overlapprof.analysis.spill import Buckets

BOUNDARY = np.dtype([("pos", "<f8"), ("seg", "<i4"), ("cls", "i1"), ("delta", "i1")])
_PATTERN_BITS = 16  # a key is segment << 16 | pattern


class Sweep:
    """Boundaries routed into slabs split at ``edges`` (sorted times: slab k holds the
    boundaries in ``[edges[k-1], edges[k])``, the first and last open-ended), in ``folder``;
    ``segments`` segments of at most ``classes`` classes (at most 16)."""

    def __init__(self, folder: str, edges: np.ndarray, segments: int, classes: int):
        assert classes <= _PATTERN_BITS
        self.edges, self.classes = np.asarray(edges, dtype=np.float64), classes
        self.slabs = Buckets(folder, "slab", BOUNDARY, self.edges.size + 1)
        self.count = np.zeros((segments, classes), dtype=np.int64)  # carried counts
        self.last = np.zeros(segments, dtype=np.float64)  # where each segment's last boundary was
        self.lengths: dict[tuple[int, int], float] = {}
        self._table = None  # lengths as (segment, pattern) and value arrays, for totals()

    def add(self, start: np.ndarray, end: np.ndarray, seg, cls: int) -> None:
        """Intervals ``[start, end)`` of class ``cls``, in segment ``seg`` (one, or one each)."""
        rec = boundary_records(start, end, seg, cls)
        if rec is None:
            return
        self.slabs.route(np.searchsorted(self.edges, rec["pos"], "right"), rec)

    def run(self, follow: dict | None = None) -> dict[str, iv.Intervals]:
        """Sweep every slab (filling :attr:`lengths`); removes them. ``follow``: ``{name: (seg,
        test, cap)}``, where ``test(patterns)`` says which patterns to keep as intervals: their
        union in that segment, its first ``cap + 1`` intervals (the first ``cap`` exact: only the
        last may still grow; None: all)."""
        follow = follow or {}
        runs = {name: iv.EMPTY for name in follow}
        for slab in self.slabs:
            rec = slab.read()
            slab.remove()
            pieces = self._slab(rec)
            del rec
            if pieces is None:
                continue
            for name, (seg, test, cap) in follow.items():
                cap = cap if cap is not None else 1 << 62
                if runs[name][0].size > cap:
                    continue
                pos, length, segs, pattern = pieces
                hit = np.flatnonzero((segs == seg) & (length > 0) & test(pattern))
                if hit.size:  # a piece ends at the next boundary (pos + length may round)
                    got = iv.union(np.concatenate((runs[name][0], pos[hit])),
                                   np.concatenate((runs[name][1], pos[hit + 1])))
                    runs[name] = (got[0][: cap + 1], got[1][: cap + 1])
        return runs

    def _slab(self, rec: np.ndarray):
        """One slab's pieces of time: (start, length, segment, pattern) of each, in segment and
        time order; None when it holds no boundary. Adds their lengths and carries the counts."""
        carried = np.flatnonzero(self.count.any(axis=1))
        n_carried = carried.size
        if rec.size == 0:
            return None
        order, pos, seg, first, heads, group = in_segment_order(rec, carried, self.last)
        n = pos.size
        tails = np.append(heads[1:] - 1, n - 1)
        length = np.zeros(n, dtype=np.float64)
        length[:-1] = np.where(first[1:], 0.0, pos[1:] - pos[:-1])
        pattern = np.zeros(n, dtype=np.int64)
        cls = np.concatenate((np.full(n_carried, -1, dtype=np.int8), rec["cls"]))[order]
        delta = np.concatenate((np.zeros(n_carried, dtype=np.int8), rec["delta"]))[order]
        is_carry = order < n_carried
        wanted = set(np.unique(rec["cls"]).tolist()) | set(np.flatnonzero(self.count.any(axis=0)).tolist())
        tail_segs = seg[tails]
        for c in sorted(wanted):
            d = np.where(cls == c, delta, 0).astype(np.int64)
            d[is_carry] = self.count[seg[is_carry], c]
            cum = np.cumsum(d)
            count = cum - (cum[heads] - d[heads])[group]
            pattern |= (count > 0).astype(np.int64) << c
            self.count[tail_segs, c] = count[tails]
        self.last[tail_segs] = pos[tails]
        keys = (seg.astype(np.int64) << _PATTERN_BITS) | pattern
        used = length > 0
        distinct, inverse = np.unique(keys[used], return_inverse=True)
        sums = np.bincount(inverse, weights=length[used], minlength=distinct.size)
        for key, total in zip(distinct.tolist(), sums.tolist()):
            k = (key >> _PATTERN_BITS, key & ((1 << _PATTERN_BITS) - 1))
            self.lengths[k] = self.lengths.get(k, 0.0) + total
        return pos, length, seg, pattern

    def totals(self, test) -> np.ndarray:
        """Per segment, the time whose pattern passes ``test(patterns) -> bool array`` (µs), once
        :meth:`run` is done."""
        if self._table is None:
            self._table = (np.array(list(self.lengths), dtype=np.int64).reshape(-1, 2),
                           np.array(list(self.lengths.values()), dtype=np.float64))
        keys, values = self._table
        hit = test(keys[:, 1]) if values.size else np.zeros(0, dtype=bool)
        out = np.bincount(keys[hit, 0], weights=values[hit], minlength=self.count.shape[0])
        return out.astype(np.float64, copy=False)  # no weight at all gives ints

    def remove(self) -> None:
        self.slabs.remove()


def boundary_records(start: np.ndarray, end: np.ndarray, seg, cls: int) -> np.ndarray | None:
    """The boundaries of intervals ``[start, end)`` of class ``cls`` in segment ``seg`` (one, or one
    each): a +1 at each start, a -1 at each end; None when no interval has a length (zero-length
    intervals add nothing, as :func:`overlapprof.analysis.intervals.union` drops them)."""
    keep = end > start
    start, end = start[keep], end[keep]
    n = start.size
    if n == 0:
        return None
    rec = np.empty(2 * n, dtype=BOUNDARY)
    rec["pos"][:n], rec["pos"][n:] = start, end
    seg = np.broadcast_to(seg, keep.shape)[keep] if np.ndim(seg) else seg
    rec["seg"][:n], rec["seg"][n:] = seg, seg
    rec["cls"], rec["delta"][:n], rec["delta"][n:] = cls, 1, -1
    return rec


def in_segment_order(rec: np.ndarray, carried: np.ndarray, last: np.ndarray):
    """Boundaries ``rec`` after one row per ``carried`` segment (at its ``last`` position: the
    counts carried into this batch), sorted by segment then position: ``(order, pos, seg, first,
    heads, group)``, ``order`` the sort of the carried rows then ``rec``'s, ``first`` true at a
    segment's first row, ``heads`` those rows, ``group`` each row's segment ordinal."""
    pos = np.concatenate((last[carried], rec["pos"]))
    seg = np.concatenate((carried.astype(np.int32), rec["seg"]))
    order = np.lexsort((pos, seg))
    pos, seg = pos[order], seg[order]
    first = np.empty(pos.size, dtype=bool)
    first[0] = True
    first[1:] = seg[1:] != seg[:-1]
    return order, pos, seg, first, np.flatnonzero(first), np.cumsum(first) - 1
