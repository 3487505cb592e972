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
    reach = np.maximum.accumulate(ends)
    begins = np.empty(starts.size, dtype=bool)
    begins[0] = True
    begins[1:] = starts[1:] > reach[:-1]
    first = np.flatnonzero(begins)
    last = np.append(first[1:] - 1, starts.size - 1)
    return starts[first], reach[last]


def length(intervals: Intervals) -> float:
    """|X|: the total length of a union (µs)."""
    starts, ends = intervals
    return float(np.sum(ends - starts)) if starts.size else 0.0


def _where(a: Intervals, b: Intervals, a_weight: int, b_weight: int, wanted: int) -> Intervals:
    """The parts of the line where the coverage ``a_weight*[in a] + b_weight*[in b]`` == wanted.

    Both inputs are unions (disjoint), so a sweep over their boundaries, with ends sorted before
    starts at the same position (half-open intervals), gives the coverage between consecutive
    boundaries by a cumulative sum.
    """
    pos = np.concatenate((a[0], a[1], b[0], b[1]))
    if pos.size == 0:
        return EMPTY
    na, nb = a[0].size, b[0].size
    delta = np.concatenate(
        (
            np.full(na, a_weight),
            np.full(na, -a_weight),
            np.full(nb, b_weight),
            np.full(nb, -b_weight),
        )
    )
    order = np.lexsort((delta, pos))
    pos, cover = pos[order], np.cumsum(delta[order])
    hit = np.flatnonzero(cover[:-1] == wanted)
    starts, ends = pos[hit], pos[hit + 1]
    keep = ends > starts
    return union(starts[keep], ends[keep]) if hit.size else EMPTY


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


def overlap_length(a: Intervals, b: Intervals) -> float:
    """|A ∩ B| of two unions, as |A| + |B| − |A ∪ B| (cheaper than building A ∩ B)."""
    if a[0].size == 0 or b[0].size == 0:
        return 0.0
    both = union(np.concatenate((a[0], b[0])), np.concatenate((a[1], b[1])))
    return max(0.0, length(a) + length(b) - length(both))
