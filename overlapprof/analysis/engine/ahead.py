"""The second core after the read: a rank's time buckets classified one ahead, and two parts of
its report made at once, in a thread.

Past its store's budget, the 2 GB operation-dense trace spends about half of this process's time
after the read (classification, the records' table, the report, the causes: 2026-12-07), when
the pool's processes have nothing left to do. :func:`ahead` computes ``fn`` of the next item in
a thread while the caller uses the result of the one before, :func:`both` two functions at once:
numpy lets go of the GIL over arrays, so two cores work. Results come in the items' order and
the caller does everything that changes shared state (the store, the unions), so a report is the
same as with :func:`map` or one call after the other.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor


def ahead(items: Iterable, fn: Callable) -> Iterator:
    """``fn(item)`` for each of ``items``, in order, each computed in a thread while the caller
    takes the one before (and ``items`` gives the next: its reads stay in the caller's thread).
    One item is in flight at a time: memory is that of one item more than :func:`map`'s. An
    exception in ``fn`` is raised where its result is taken."""
    with ThreadPoolExecutor(1, thread_name_prefix="overlapprof-ahead") as pool:
        pending = None
        for item in items:
            work = pool.submit(fn, item)
            if pending is not None:
                yield pending.result()
            pending = work
        if pending is not None:
            yield pending.result()


def both(first: Callable, second: Callable) -> tuple:
    """``(first(), second())``, ``first`` in a thread while this one runs ``second``; each must
    leave alone what the other reads or writes. An exception in either is raised here."""
    with ThreadPoolExecutor(1, thread_name_prefix="overlapprof-both") as pool:
        work = pool.submit(first)
        try:
            two = second()
        except BaseException:
            work.cancel()  # not started: never is; else the pool's exit waits for it
            raise
        return work.result(), two
