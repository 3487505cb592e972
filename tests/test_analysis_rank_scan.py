"""The scan's per-chunk lookups: thread codes against a plain-Python reference, unknown
categories counted."""

from __future__ import annotations

from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from overlapprof.analysis.columns import Index
from overlapprof.analysis.rank import classify as C
from overlapprof.analysis.rank.scan import Threads, read_serially
from overlapprof.analysis.records.recorder import hashable

import synthetic as S

IDS = st.one_of(st.integers(0, 3), st.sampled_from([1.0, True, "a", "1"]), st.lists(st.integers(0, 1), max_size=1))


@settings(max_examples=300, deadline=None)
@given(chunks=st.lists(st.lists(st.tuples(IDS, IDS), max_size=12), max_size=5))
def test_thread_codes_in_order_of_first_appearance(chunks):
    """Across chunks, with threads new in the middle of one, equal ids of other types (1, 1.0,
    True) and unhashable ones (by their text)."""
    threads, seen, got, want = Threads(), {}, [], []
    for chunk in chunks:
        events = [SimpleNamespace(pid=pid, tid=tid) for pid, tid in chunk]
        got += threads.codes(events, list(range(len(events))))
        want += [seen.setdefault((hashable(pid), hashable(tid)), len(seen)) for pid, tid in chunk]
    assert got == want
    assert len(threads) == len(seen)


def test_unknown_categories_counted_outside_the_host(tmp_path):
    """Device work of categories the scan does not know, counted by category in order of
    appearance where no host event runs; events without a category in a process the autograd
    profiler named take that process's category."""
    events = [S.cpu_op("aten::mm", 0, 5)]
    for k in range(30):
        events.append({"ph": "X", "cat": "mtia_ccp_events" if k % 3 else "aiu_op", "name": "op", "pid": 7,
                       "tid": k % 2, "ts": 10 + k, "dur": 1, "args": {}})
        events.append({"ph": "X", "cat": "aiu_op", "name": "op", "pid": 1, "tid": 5, "ts": 10 + k, "dur": 1})
    events.append({"ph": "X", "cat": "", "name": "mm", "pid": "CUDA functions", "tid": 0, "ts": 50, "dur": 2})
    path = S.write(tmp_path / "t.json", S.kineto_text(events))
    names = Index()
    arrays, unclassified, _, _, _ = read_serially(path, names, None)
    assert list(unclassified.items()) == [("aiu_op", 10), ("mtia_ccp_events", 20)]
    assert arrays["codes"][-1] == C.KERNEL
