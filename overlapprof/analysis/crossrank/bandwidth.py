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
from overlapprof.analysis.stats import group_medians
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
    """Medians per kind × group size × bytes × how the transfer time was obtained: the matched
    instances that are not warm-up (cells in order of first appearance), then the unmatched
    operations that are not (their own durations; in the order matching met them)."""
    out = []
    live = np.flatnonzero(~x.warm)
    if live.size:
        kind = ops.kind[m.rows[m.bounds[live]]]
        nbytes, group_size = (np.array([-1 if v is None else v for v in col], dtype=np.int64)[live] for col in sizes)
        method_ids = Index()
        methods = np.array([method_ids[meth] for meth in m.methods], dtype=np.int64)[live]
        first, cell = distinct_rows(kind, group_size, nbytes, methods)
        skew_known = np.asarray(one_clock, dtype=bool)[live]
        medians = zip(group_medians(x.transfer[live], cell, first.size),
                      group_medians(x.wait[live] / m.sizes[live], cell, first.size),  # Σ waits / ranks, per instance
                      group_medians(x.skew[live][skew_known], cell[skew_known], first.size))
        counts = np.bincount(cell, minlength=first.size).tolist()
        for k, n, (t, wait, skew) in zip(first.tolist(), counts, medians):
            out.append(_row(KINDS[kind[k]], int(group_size[k]) if group_size[k] >= 0 else None,
                            int(nbytes[k]) if nbytes[k] >= 0 else None, method_ids.order[methods[k]], "matched",
                            n, t, wait, skew))
    rows = m.unmatched_rows()
    rows = rows[~x.op_warm[rows]]
    if rows.size:
        nb = ops.nbytes[rows]
        known = ~np.isnan(nb)
        nbytes = np.where(known, nb, 0).astype(np.int64)  # int(): towards zero
        kind, group_size = ops.kind[rows], ops.group_size[rows]
        first, cell = distinct_rows(kind, group_size, nbytes, known)
        counts = np.bincount(cell, minlength=first.size).tolist()
        for k, n, t in zip(first.tolist(), counts, group_medians(ops.dur[rows], cell, first.size)):
            out.append(_row(KINDS[kind[k]], int(group_size[k]) or None, int(nbytes[k]) if known[k] else None,
                            "none", OWN_DURATION, n, t, None, None))
    return sorted(out, key=lambda b: (b.kind, b.transfer, b.bytes is None, b.bytes or 0))


def _row(kind, n, nbytes, method, source, count, t, wait, skew) -> BandwidthRow:
    factor = bus_factor(kind, n)
    alg = gbps(nbytes, t)
    return BandwidthRow(
        kind=kind, group_size=n, bytes=nbytes, count=count, median_transfer_us=t, median_wait_us=wait,
        median_skew_us=skew, algbw_gbps=alg, busbw_gbps=alg * factor if alg is not None and factor is not None else None,
        bus_factor=factor, method=method, transfer=source,
    )
