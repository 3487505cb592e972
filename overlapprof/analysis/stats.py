"""Median and percentile of a few values (and medians of many groups at once), exactly as numpy computes them.

``numpy.median``/``numpy.percentile`` import ``numpy.ma`` on first use (several ms of a short
analysis); these give the same floats (numpy's default ``linear`` method: the sorted values at
``(n − 1) × q/100``, interpolated as numpy's ``_lerp`` does) without it.
"""

from __future__ import annotations

import math

import numpy as np


def median(values) -> float:
    """numpy.median of a non-empty sequence of numbers."""
    s = sorted(values)
    m = len(s) // 2
    return float(s[m]) if len(s) % 2 else (float(s[m - 1]) + float(s[m])) / 2


def percentile(values, q: float) -> float:
    """numpy.percentile(values, q) of a non-empty sequence of numbers."""
    s = [float(v) for v in sorted(values)]
    virtual = (len(s) - 1) * (q / 100)
    if virtual >= len(s) - 1:
        return s[-1]
    below = math.floor(virtual)
    gamma = virtual - below
    a, b = s[below], s[below + 1]
    return b - (b - a) * (1 - gamma) if gamma >= 0.5 else a + (b - a) * gamma


def group_medians(values: np.ndarray, groups: np.ndarray, count: int) -> list[float | None]:
    """:func:`median` of the values of each group ``0 .. count − 1`` (None: an empty group),
    from one sort of all of them: the same floats as calling it on each group's values in turn."""
    if np.isnan(values).any():  # NaN sorts apart in Python and numpy: take each group's as median does
        order = np.argsort(groups, kind="stable")
        parts = np.split(values[order], np.cumsum(np.bincount(groups, minlength=count))[:-1])
        return [median(p.tolist()) if p.size else None for p in parts]
    sizes = np.bincount(groups, minlength=count)
    ordered = values[np.lexsort((values, groups))]  # stable: equal values keep their order
    starts, half = np.cumsum(sizes) - sizes, sizes // 2
    upper = ordered[np.minimum(starts + half, max(ordered.size - 1, 0))] if ordered.size else np.zeros(count)
    lower = ordered[np.maximum(starts + half - 1, 0)] if ordered.size else np.zeros(count)
    middle = np.where(sizes % 2 == 1, upper, (lower + upper) / 2)
    return [m if n else None for m, n in zip(middle.tolist(), sizes.tolist())]
