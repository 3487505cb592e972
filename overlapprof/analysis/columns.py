"""Generic helpers over numpy columns: distinct rows of int columns, an insertion-ordered index,
and a cache of a function's values.

Used by every stage that keeps values as small int codes (communication records, logical
operations, matching): a rule that reads names and values runs once per distinct combination of
codes (:func:`per_distinct`), not once per row.
"""

from __future__ import annotations

import numpy as np


class Index(dict):
    """Key -> small int id, in order of first appearance; ``order[id]`` is the key."""

    def __init__(self):
        super().__init__()
        self.order: list = []
        # the same ids in a plain dict: CPython looks a key up in it about 1.5x as fast as in a
        # subclass (a lookup per event while a file is read)
        self.plain: dict = {}

    def __missing__(self, key):
        value = self[key] = self.plain[key] = len(self.order)
        self.order.append(key)
        return value


class Cache(dict):
    """A dict that computes missing values with ``func`` (one call per distinct key)."""

    def __init__(self, func):
        super().__init__()
        self.func = func

    def __missing__(self, key):
        value = self[key] = self.func(key)
        return value


def distinct_rows(*columns) -> tuple[np.ndarray, np.ndarray]:
    """(first, inverse): the first row of each distinct row of the int columns (in order of
    first appearance) and each row's index into ``first``. One int64 key per row (mixed radix
    of each column's dense codes), so a single 1-d unique."""
    n = len(columns[0])
    key, span = np.zeros(n, dtype=np.int64), 1
    for column in columns:
        column = np.asarray(column, dtype=np.int64)
        if n == 0 or (low := column.min()) == (high := column.max()):
            continue
        if high - low < n:
            dense, size = column - low, int(high - low) + 1
        else:
            distinct, dense = np.unique(column, return_inverse=True)
            size = distinct.size
        if span * size >= 1 << 62:
            key = np.unique(key, return_inverse=True)[1].astype(np.int64)
            span = int(key.max()) + 1
        key, span = key * size + dense, span * size
    if span == 1:  # every row alike
        return np.zeros(min(n, 1), dtype=np.int64), np.zeros(n, dtype=np.int64)
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    rank = np.empty(first.size, dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(first.size)
    return np.sort(first), rank[inverse.reshape(-1)]


def per_distinct(func, *columns) -> tuple[list, np.ndarray]:
    """``func(*values)`` once per distinct row of the int columns: (the results, each row's
    index into them)."""
    if len(columns[0]) == 0:
        return [], np.empty(0, dtype=np.int64)
    first, inverse = distinct_rows(*columns)
    return [func(*row) for row in zip(*(np.asarray(c)[first].tolist() for c in columns))], inverse


class GrowingColumns:
    """Named numpy columns that grow a chunk at a time: each chunk is copied in as it comes
    (capacity doubling, so O(1) amortised per row) and dropped, instead of keeping every chunk
    to concatenate at the end, which holds the data twice (and, for many small chunks, leaves
    the heap fragmented). :meth:`arrays` gives the filled part of each column."""

    def __init__(self, dtypes: dict[str, type], capacity: int = 1 << 16):
        self.size = 0
        self._buffers = {name: np.empty(capacity, dtype) for name, dtype in dtypes.items()}

    def append(self, **columns: np.ndarray) -> None:
        """One chunk's values of every column (equal lengths)."""
        need = self.size + len(next(iter(columns.values())))
        for name, values in columns.items():
            buf = self._buffers[name]
            if need > buf.size:
                grown = np.empty(max(need, 2 * buf.size), buf.dtype)
                grown[: self.size] = buf[: self.size]
                self._buffers[name] = buf = grown
            buf[self.size : need] = values
        self.size = need

    def arrays(self) -> dict[str, np.ndarray]:
        return {name: buf[: self.size] for name, buf in self._buffers.items()}
