"""The second core after the read (``engine/ahead.py``): the next item computed in a thread while
the caller takes the one before, two functions at once; results as one thread gives them."""

from __future__ import annotations

import threading

import pytest

from overlapprof.analysis.engine.ahead import ahead, both


def test_ahead_gives_map_in_order_computing_the_next_item_while_the_caller_works_on_one():
    started = [threading.Event() for _ in range(6)]
    names = set()

    def fn(k):
        names.add(threading.current_thread().name)
        started[k].set()
        return k * k

    got = []
    for k, value in enumerate(ahead(iter(range(6)), fn)):
        if k + 1 < 6:  # fn of the next item starts while the caller is still on this one (map: never)
            assert started[k + 1].wait(10), f"fn({k + 1}) did not start while the caller held {k}'s result"
        if k + 2 < 6:
            assert not started[k + 2].is_set()  # one ahead, not all at once
        got.append(value)
    assert got == [k * k for k in range(6)]
    assert threading.current_thread().name not in names
    assert list(ahead(iter([]), fn)) == []


def test_ahead_raises_fns_error_at_its_item_and_stops_taking_items():
    taken = []

    def items():
        for k in range(10):
            taken.append(k)
            yield k

    def fn(k):
        if k == 3:
            raise ValueError("bad bucket 3")
        return k

    got = []
    with pytest.raises(ValueError, match="bad bucket 3"):
        for value in ahead(items(), fn):
            got.append(value)
    assert got == [0, 1, 2] and max(taken) <= 4


def test_both_runs_the_first_in_another_thread_and_raises_either_error():
    names = {}

    def first():
        names["first"] = threading.current_thread().name
        return 1

    def second():
        names["second"] = threading.current_thread().name
        return 2

    assert both(first, second) == (1, 2)
    assert names["second"] == threading.current_thread().name != names["first"]
    with pytest.raises(KeyError):
        both(lambda: {}["x"], lambda: 2)
    with pytest.raises(ZeroDivisionError):
        both(lambda: 1, lambda: 1 / 0)
