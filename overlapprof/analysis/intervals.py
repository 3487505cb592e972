"""Interval arithmetic on numpy arrays: unions, intersections, differences, total lengths.

Intervals are half-open, ``[start, end)``, in microseconds. A *set* of intervals is a pair of
float64 arrays ``(starts, ends)``; a *union* is a set that is sorted and disjoint (touching
intervals are merged). Every function is vectorised: O(n log n) for the sort, linear after it,
with no Python loop over intervals. Zero- or negative-length intervals contribute nothing.
"""

from __future__ import annotations

import numpy as np

Intervals = tuple[np.ndarray, np.ndarray]

EMPTY: Intervals = (np.empty(0), np.empty(0))


def event_ends(ts: np.ndarray, dur: np.ndarray) -> np.ndarray:
    """Where trace events end: ``ts + max(dur, 0)`` µs (a negative ``dur`` counts as zero)."""
    return ts + np.maximum(dur, 0.0)


def union(starts: np.ndarray, ends: np.ndarray) -> Intervals:
    """U(X): the sorted, disjoint union of the intervals ``[starts[i], ends[i])``.

    Sort by start, keep a running maximum of the ends; a new run begins where a start lies
    beyond every end seen before it.
    """
    starts = np.asarray(starts, dtype=np.float64)
    ends = np.asarray(ends, dtype=np.float64)
    keep = ends > starts
    if not keep.all():
        starts, ends = starts[keep], ends[keep]
    if starts.size == 0:
        return EMPTY
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    return _runs(starts, np.maximum.accumulate(ends))


def _runs(starts: np.ndarray, reach: np.ndarray) -> Intervals:
    """The runs of non-empty intervals sorted by start, ``reach`` the running maximum of their
    ends: a new run begins where a start lies beyond every end before it."""
    begins = np.empty(starts.size, dtype=bool)
    begins[0] = True
    np.greater(starts[1:], reach[:-1], out=begins[1:])
    first = np.flatnonzero(begins)
    return starts[first], reach[np.append(first[1:] - 1, starts.size - 1)]


def length(intervals: Intervals) -> float:
    """|X|: the total length of a union (µs)."""
    starts, ends = intervals
    return float(np.sum(ends - starts)) if starts.size else 0.0


def _where(a: Intervals, b: Intervals, a_weight: int, b_weight: int, wanted: int) -> Intervals:
    """The parts of the line where the coverage ``a_weight*[in a] + b_weight*[in b]`` == wanted.

    Both inputs are unions (disjoint), so a sweep over their boundaries gives the coverage
    between consecutive boundaries by a cumulative sum. Where several boundaries share a
    position their order does not matter: the pieces between them have zero length and are
    dropped, and the coverage after the last of them is their sum. So each union's starts and
    ends, interleaved, are one sorted run, and the two runs are merged by one stable sort
    (which runs at the speed of a merge on sorted runs: two runs, one merge) rather than sorted
    by (position, delta). The pieces found are sorted and disjoint already: only touching ones
    are joined (what :func:`union` would do, without its sort).
    """
    na, nb = a[0].size, b[0].size
    if na + nb == 0:
        return EMPTY
    pos = np.empty(2 * (na + nb))
    pos[0 : 2 * na : 2], pos[1 : 2 * na : 2] = a
    pos[2 * na :: 2], pos[2 * na + 1 :: 2] = b
    delta = np.empty(pos.size, dtype=np.int8)  # the coverage of two unions is at most 3
    delta[0 : 2 * na : 2], delta[1 : 2 * na : 2], delta[2 * na :: 2], delta[2 * na + 1 :: 2] = (
        a_weight, -a_weight, b_weight, -b_weight)
    order = np.argsort(pos, kind="stable")
    pos, cover = pos[order], np.cumsum(delta[order], dtype=np.int8)
    hit = np.flatnonzero(cover[:-1] == wanted)
    starts, ends = pos[hit], pos[hit + 1]
    keep = ends > starts
    if not keep.all():
        starts, ends = starts[keep], ends[keep]
    # sorted and disjoint, so their ends are their running maximum
    return _runs(starts, ends) if starts.size else EMPTY


def _deltas(na: int, nb: int, a_weight: int, b_weight: int) -> np.ndarray:
    """The coverage steps of a's starts, a's ends, b's starts and b's ends, in that order (int8:
    the coverage of two unions is at most 3, and small arrays are fast to fill)."""
    return np.repeat(np.array([a_weight, -a_weight, b_weight, -b_weight], dtype=np.int8), [na, na, nb, nb])


def intersection(a: Intervals, b: Intervals) -> Intervals:
    """A ∩ B of two unions."""
    if a[0].size == 0 or b[0].size == 0:
        return EMPTY
    return _where(a, b, 1, 1, 2)


def difference(a: Intervals, b: Intervals) -> Intervals:
    """A \\ B of two unions."""
    if b[0].size == 0:
        return a
    return _where(a, b, 1, 2, 1)


def covered(u: Intervals, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """|[starts[i], ends[i]) ∩ U| for each query interval, U a union: the difference of the
    cumulative length of U before each end and before each start (one sorted search each)."""
    starts, ends = np.asarray(starts, dtype=np.float64), np.asarray(ends, dtype=np.float64)
    us, ue = u
    if us.size == 0 or starts.size == 0:
        return np.zeros(starts.size)
    before = np.concatenate(([0.0], np.cumsum(ue - us)))  # length of U's intervals 0 .. k-1

    def upto(t):  # |U ∩ (-inf, t)|
        j = np.searchsorted(us, t, "right")  # U's intervals that start at or before t
        k = np.maximum(j - 1, 0)
        inside = np.where(j > 0, np.minimum(t, ue[k]) - us[k], 0.0)
        return np.where(j > 0, before[k], 0.0) + inside

    return np.maximum(upto(ends) - upto(np.minimum(starts, ends)), 0.0)


# Runs of two unions merged at once by overlap_length: past this many, a block of time at a time
# (union's temporaries take about 65 bytes per interval).
UNION_BLOCK = 1 << 16


def overlap_length(a: Intervals, b: Intervals) -> float:
    """|A ∩ B| of two unions, as |A| + |B| − |A ∪ B| (cheaper than building A ∩ B)."""
    if a[0].size == 0 or b[0].size == 0:
        return 0.0
    if a[0].size + b[0].size <= UNION_BLOCK:
        both = length(union(np.concatenate((a[0], b[0])), np.concatenate((a[1], b[1]))))
    else:
        gaps = np.concatenate(list(_union_gaps(a, b)))
        both = float(np.sum(gaps)) if gaps.size else 0.0
    return max(0.0, length(a) + length(b) - both)


def _union_gaps(a: Intervals, b: Intervals):
    """The lengths (``end - start``) of the runs of A ∪ B, two unions, in time order, a block of
    :data:`UNION_BLOCK` runs of one of them at a time: each block's runs with the last run of the
    block before (which may still grow) carried into it. A run that is not a block's last ends
    before a start of the block, so before every later start: it is a run of A ∪ B. So the lengths
    are those of ``union`` of both, and their sum the same float."""
    (a0, a1), (b0, b1) = a, b
    ia = ib = 0
    carry_s, carry_e = np.empty(0), np.empty(0)
    while ia < a0.size or ib < b0.size:
        cut = min(a0[ia + UNION_BLOCK] if ia + UNION_BLOCK < a0.size else np.inf,
                  b0[ib + UNION_BLOCK] if ib + UNION_BLOCK < b0.size else np.inf)
        ja = int(np.searchsorted(a0, cut, "left")) if cut < np.inf else a0.size  # runs that start before the cut
        jb = int(np.searchsorted(b0, cut, "left")) if cut < np.inf else b0.size
        starts, ends = union(np.concatenate((carry_s, a0[ia:ja], b0[ib:jb])),
                             np.concatenate((carry_e, a1[ia:ja], b1[ib:jb])))
        last = starts.size - (1 if cut < np.inf else 0)
        yield ends[:last] - starts[:last]
        carry_s, carry_e = starts[last:], ends[last:]
        ia, ib = ja, jb


# -- segmented sets: many sets at once (one per step) -------------------------------------------
#
# A *segmented set* is ``(seg, starts, ends)``: interval i belongs to set ``seg[i]`` (an int >= 0).
# A segmented union is, for each segment, the union of its intervals, sorted by (segment, start).
# Each function below gives, segment by segment, exactly what its one-set counterpart gives for
# that segment's intervals (the same interval ends, so the same lengths): the sweeps sort by
# segment first, and each segment's coverage returns to zero before the next one begins.

Segmented = tuple[np.ndarray, np.ndarray, np.ndarray]

EMPTY_BY: Segmented = (np.empty(0, dtype=np.int64), np.empty(0), np.empty(0))


def union_by(seg: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> Segmented:
    """U(X) of each segment's intervals: a sweep over their starts and ends, sorted by (segment,
    position) with starts before ends at one position (so touching intervals merge); a run of
    the union ends where the count of open intervals comes back to zero."""
    keep = ends > starts
    seg, starts, ends = seg[keep], starts[keep], ends[keep]
    n = starts.size
    if n == 0:
        return EMPTY_BY
    pos, segs = np.concatenate((starts, ends)), np.concatenate((seg, seg))
    order = np.argsort(pos, kind="stable")  # ties keep input order: starts first
    order = order[np.argsort(segs[order], kind="stable")]
    cover = np.cumsum(np.where(order < n, np.int8(1), np.int8(-1)), dtype=np.int32 if n < 1 << 31 else np.int64)
    last = np.flatnonzero(cover == 0)
    first = np.concatenate(([0], last[:-1] + 1))
    pos = pos[order]
    return segs[order[first]], pos[first], pos[last]


def concat_by(*sets: Segmented) -> Segmented:
    """The intervals of several segmented sets together (not a union)."""
    return tuple(np.concatenate([s[k] for s in sets]) for k in range(3))


def clip_by(u: Segmented, lo: np.ndarray, hi: np.ndarray) -> Segmented:
    """Each segment's union intersected with its window ``[lo[seg], hi[seg])``."""
    seg, starts, ends = u
    starts, ends = np.maximum(starts, lo[seg]), np.minimum(ends, hi[seg])
    keep = ends > starts
    return seg[keep], starts[keep], ends[keep]


def difference_by(a: Segmented, b: Segmented) -> Segmented:
    """A \\ B of two segmented unions, segment by segment (the sweep of :func:`_where`)."""
    if b[0].size == 0:
        return a
    na, nb = a[0].size, b[0].size
    seg = np.concatenate((a[0], a[0], b[0], b[0]))
    pos = np.concatenate((a[1], a[2], b[1], b[2]))
    delta = _deltas(na, nb, 1, 2)
    order = np.lexsort((pos, seg))  # ties in any order: see _where
    seg, pos, cover = seg[order], pos[order], np.cumsum(delta[order], dtype=np.int8)
    hit = np.flatnonzero(cover[:-1] == 1)
    seg, starts, ends = seg[hit], pos[hit], pos[hit + 1]
    keep = ends > starts
    return union_by(seg[keep], starts[keep], ends[keep]) if hit.size else EMPTY_BY


def lengths_by(u: Segmented, count: int) -> tuple[list[float], np.ndarray]:
    """|X| of segments ``0 .. count-1`` of a segmented union (each summed as :func:`length`
    sums one set, so the same float), and how many intervals each has."""
    seg, starts, ends = u
    bounds = np.searchsorted(seg, np.arange(count + 1))
    sizes = np.diff(bounds)
    gaps = ends - starts
    out = gaps[np.minimum(bounds[:-1], max(gaps.size - 1, 0))] if gaps.size else np.zeros(count)
    out = np.where(sizes == 1, out, 0.0).tolist()  # a single interval: its length, no sum
    add = np.add.reduce  # what np.sum calls, without its wrapper
    for k in np.flatnonzero(sizes > 1).tolist():
        out[k] = float(add(gaps[bounds[k] : bounds[k + 1]]))
    return out, sizes
