"""Median and percentile of a few values, exactly as numpy computes them.

``numpy.median``/``numpy.percentile`` import ``numpy.ma`` on first use (several ms of a short
analysis); these give the same floats (numpy's default ``linear`` method: the sorted values at
``(n − 1) × q/100``, interpolated as numpy's ``_lerp`` does) without it.
"""

from __future__ import annotations

import math


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
