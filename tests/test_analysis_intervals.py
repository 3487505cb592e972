"""The sweeps of intersection, difference and difference_by merge their boundaries in any order
at a shared position (intervals.py says why): they give exactly, array for array, what a sweep
with ends sorted before starts gives (the reference below), on unions full of shared ends."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from overlapprof.analysis import intervals as iv


def _reference_where(a, b, a_weight, b_weight, wanted):
    pos = np.concatenate((a[0], a[1], b[0], b[1]))
    if pos.size == 0:
        return iv.EMPTY
    na, nb = a[0].size, b[0].size
    delta = np.concatenate((np.full(na, a_weight), np.full(na, -a_weight), np.full(nb, b_weight),
                            np.full(nb, -b_weight)))
    order = np.lexsort((delta, pos))
    pos, cover = pos[order], np.cumsum(delta[order])
    hit = np.flatnonzero(cover[:-1] == wanted)
    starts, ends = pos[hit], pos[hit + 1]
    keep = ends > starts
    return iv.union(starts[keep], ends[keep]) if hit.size else iv.EMPTY


intervals = st.lists(st.tuples(st.integers(0, 40), st.integers(0, 8)), max_size=30)


def _union(pairs):
    return iv.union(np.array([s for s, _ in pairs], float), np.array([s + d for s, d in pairs], float))


def _same(x, y):
    return len(x) == len(y) and all(np.array_equal(p, q) for p, q in zip(x, y))


@settings(max_examples=300, deadline=None)
@given(a=intervals, b=intervals)
def test_intersection_and_difference_equal_the_ordered_sweep(a, b):
    ua, ub = _union(a), _union(b)
    if ua[0].size and ub[0].size:
        assert _same(iv.intersection(ua, ub), _reference_where(ua, ub, 1, 1, 2))
    if ub[0].size:
        assert _same(iv.difference(ua, ub), _reference_where(ua, ub, 1, 2, 1))


@settings(max_examples=200, deadline=None)
@given(a=st.lists(intervals, min_size=1, max_size=4), b=st.lists(intervals, min_size=1, max_size=4))
def test_difference_by_is_the_difference_of_each_segment(a, b):
    count = max(len(a), len(b))
    a, b = a + [[]] * (count - len(a)), b + [[]] * (count - len(b))

    def segmented(sets):
        seg = np.concatenate([np.full(len(p), k, dtype=np.int64) for k, p in enumerate(sets)])
        starts = np.concatenate([np.array([s for s, _ in p], float) for p in sets])
        ends = np.concatenate([np.array([s + d for s, d in p], float) for p in sets])
        return iv.union_by(seg, starts, ends)

    got = iv.difference_by(segmented(a), segmented(b))
    for k in range(count):
        ua, ub = _union(a[k]), _union(b[k])
        want = _reference_where(ua, ub, 1, 2, 1) if ub[0].size else ua
        mine = got[0] == k
        assert _same((got[1][mine], got[2][mine]), want)


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), sizes=st.tuples(st.integers(1, 400), st.integers(1, 400)), grid=st.booleans(),
       block=st.integers(1, 40))
def test_overlap_length_in_blocks_is_the_same_float(seed, sizes, grid, block):
    """Past UNION_BLOCK runs, |A ∪ B| is summed from the runs made a block of time at a time (the
    on-disk path's memory): the same runs, so the same float as one union of everything."""
    rng = np.random.default_rng(seed)

    def union_of(n):
        s, d = rng.uniform(0, 2000, n), rng.exponential(3.0, n)
        if grid:  # touching and identical runs
            s, d = np.round(s), np.round(d)
        return iv.union(s, s + d)

    a, b = union_of(sizes[0]), union_of(sizes[1])
    default = iv.UNION_BLOCK
    try:
        iv.UNION_BLOCK = 1 << 30
        whole = iv.overlap_length(a, b)
        iv.UNION_BLOCK = block
        assert iv.overlap_length(a, b) == whole
    finally:
        iv.UNION_BLOCK = default
