"""Bandwidths of matched communication operations, as nccl-tests defines them.

NVIDIA/nccl-tests ``doc/PERFORMANCE.md`` (and ``src/*.cu``'s ``GetBw`` functions):

- ``algbw = S / t``: S the operation's size in bytes, t its time.
- ``busbw = algbw × factor``, the factor making busbw comparable to the hardware's peak
  whatever the number of ranks n: all_reduce 2(n−1)/n; reduce_scatter, all_gather and
  all_to_all (n−1)/n; broadcast, reduce and send/recv 1.
- S: the message size of :mod:`overlapprof.analysis.records.sizes`.

Here t is an instance's transfer time (the shortest duration across its ranks: waiting for late
ranks is not link time), µs; GB/s with GB = 1e9 bytes, so ``GB/s = bytes / µs / 1e3``.
:func:`bandwidth_rows` gives the section's rows: medians per kind × group size × message size.
"""

from __future__ import annotations

import numpy as np

from overlapprof.analysis.columns import Index, distinct_rows
from overlapprof.analysis.crossrank.matching import Matched
from overlapprof.analysis.crossrank.waits import Measured
from overlapprof.analysis.rank.classify import KINDS
from overlapprof.analysis.records.operations import CommOperations
from overlapprof.analysis.stats import median
from overlapprof.report import BandwidthRow

BUS_FACTORS = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "send_recv": lambda n: 1.0,
}


def bus_factor(kind: str, group_size: int | None) -> float | None:
    """nccl-tests' busbw/algbw for the kind with n = ``group_size`` ranks (None: no factor)."""
    factor = BUS_FACTORS.get(kind)
    if factor is None or not group_size or group_size < 1:
        return None
    return factor(group_size)


def gbps(nbytes: int | None, us: float | None) -> float | None:
    """bytes per µs as GB/s (GB = 1e9 bytes); None when either is unknown or the time is 0."""
    if nbytes is None or us is None or us <= 0:
        return None
    return nbytes / us / 1e3


OWN_DURATION = "own duration (upper bound)"


def _median(values) -> float | None:
    return median(values) if len(values) else None


def instance_sizes(ops: CommOperations, m: Matched, x: Measured) -> tuple[list, list]:
    """Per instance: bytes (the mean of its ranks' known sizes, rounded; None unknown) and group size (None unknown)."""
    if not m.sizes.size:
        return [], []
    rows, bounds = m.rows, m.bounds
    nbytes = ops.nbytes[rows]
    count = np.bincount(x.ids, weights=~np.isnan(nbytes), minlength=m.sizes.size)
    low, high = np.fmin.reduceat(nbytes, bounds), np.fmax.reduceat(nbytes, bounds)
    # All known sizes equal (the usual case): that size, which is also their mean.
    mean = [None if c == 0 else lo if lo == hi else float(np.mean(nbytes[b : b + k][~np.isnan(nbytes[b : b + k])]))
            for c, lo, hi, b, k in zip(count.tolist(), low.tolist(), high.tolist(), bounds.tolist(), m.sizes.tolist())]
    group_size = np.maximum.reduceat(ops.group_size[rows], bounds).tolist()
    return [None if v is None else int(round(v)) for v in mean], [n or None for n in group_size]


def bandwidth_rows(ops: CommOperations, m: Matched, x: Measured, one_clock, sizes) -> list[BandwidthRow]:
    """Medians per kind × group size × bytes × how the transfer time was obtained."""
    cells = {}
    live = np.flatnonzero(~x.warm)
    if live.size:  # the instances that are not warm-up, by cell in order of first appearance
        kind = ops.kind[m.rows[m.bounds[live]]]
        nbytes, group_size = (np.array([-1 if v is None else v for v in col], dtype=np.int64)[live] for col in sizes)
        method_ids = Index()
        methods = np.array([method_ids[meth] for meth in m.methods], dtype=np.int64)[live]
        transfer, skew = x.transfer[live], x.skew[live]
        mean_wait = x.wait[live] / m.sizes[live]  # Σ waits / ranks, per instance
        skew_known = np.asarray(one_clock, dtype=bool)[live]
        first, inverse = distinct_rows(kind, group_size, nbytes, methods)
        members = np.split(np.argsort(inverse, kind="stable"), np.cumsum(np.bincount(inverse))[:-1])
        for k, cell in zip(first.tolist(), members):
            key = (KINDS[kind[k]], int(group_size[k]) if group_size[k] >= 0 else None,
                   int(nbytes[k]) if nbytes[k] >= 0 else None, method_ids.order[methods[k]], "matched")
            cells[key] = (transfer[cell].tolist(), mean_wait[cell].tolist(), skew[cell][skew_known[cell]].tolist())
    for row in m.unmatched:
        if not x.op_warm[row]:
            nb = ops.nbytes[row]
            key = (ops.kind_of(row), int(ops.group_size[row]) or None, None if np.isnan(nb) else int(nb), "none", OWN_DURATION)
            cells.setdefault(key, ([], [], []))[0].append(float(ops.dur[row]))
    out = []
    for (kind, n, nbytes, method, source), (transfers, waits, skews) in cells.items():
        t = median(transfers)
        factor = bus_factor(kind, n)
        alg = gbps(nbytes, t)
        out.append(BandwidthRow(
            kind=kind, group_size=n, bytes=nbytes, count=len(transfers), median_transfer_us=t,
            median_wait_us=_median(waits), median_skew_us=_median(skews), algbw_gbps=alg,
            busbw_gbps=alg * factor if alg is not None and factor is not None else None, bus_factor=factor,
            method=method, transfer=source,
        ))
    return sorted(out, key=lambda b: (b.kind, b.transfer, b.bytes is None, b.bytes or 0))
