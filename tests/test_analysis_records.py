"""The vectorised helpers of the communication records against plain-Python references."""

from __future__ import annotations

import bisect

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from overlapprof.analysis.columns import distinct_rows
from overlapprof.analysis.records.table import innermost


def innermost_reference(c_thread, c_start, c_end, q_thread, q_time):
    """The per-thread stack walk: the last op started at or before t, else its enclosing ops."""
    by_thread = {}
    for i in sorted(range(len(c_start)), key=lambda i: c_start[i]):  # stable: ties keep their order
        starts, items = by_thread.setdefault(c_thread[i], ([], []))
        starts.append(c_start[i])
        items.append([c_end[i], i, -1])
    for starts, items in by_thread.values():
        open_ = []
        for j, item in enumerate(items):
            while open_ and items[open_[-1]][0] < starts[j]:
                open_.pop()
            item[2] = open_[-1] if open_ else -1
            open_.append(j)
    out = []
    for thread, t in zip(q_thread, q_time):
        if thread not in by_thread:
            out.append(-1)
            continue
        starts, items = by_thread[thread]
        j = bisect.bisect_right(starts, t) - 1
        while j >= 0 and items[j][0] < t:
            j = items[j][2]
        out.append(items[j][1] if j >= 0 else -1)
    return out


TIMES = st.integers(0, 60).map(float)


@settings(max_examples=300, deadline=None)
@given(ops=st.lists(st.tuples(st.integers(0, 2), TIMES, st.integers(0, 30)), max_size=25),
       queries=st.lists(st.tuples(st.integers(0, 3), TIMES), max_size=25))
def test_innermost_is_the_stack_walk(ops, queries):
    c_thread = np.array([o[0] for o in ops], dtype=np.int64)
    c_start = np.array([o[1] for o in ops], dtype=np.float64)
    c_end = c_start + np.array([o[2] for o in ops], dtype=np.float64)
    q_thread = np.array([q[0] for q in queries], dtype=np.int64)
    q_time = np.array([q[1] for q in queries], dtype=np.float64)
    got = innermost(c_thread, c_start, c_end, q_thread, q_time).tolist()
    assert got == innermost_reference(c_thread.tolist(), c_start.tolist(), c_end.tolist(), q_thread.tolist(),
                                      q_time.tolist())


@settings(max_examples=300, deadline=None)
@given(rows=st.lists(st.tuples(st.integers(-3, 3), st.integers(-(2**40), 2**40), st.sampled_from([0, 7, 2**62])),
                     max_size=40))
def test_distinct_rows_in_order_of_first_appearance(rows):
    columns = [np.array([r[k] for r in rows], dtype=np.int64) for k in range(3)]
    first, inverse = distinct_rows(*columns)
    order = list(dict.fromkeys(rows))
    assert [rows[i] for i in first.tolist()] == order
    assert [order[k] for k in inverse.tolist()] == rows
