"""Waiting vs transferring, per instance and per rank; warm-up; stragglers.

The definitions are those of :mod:`overlapprof.report.crossrank` (``transfer_us``, ``wait_us``,
``last_rank``, ``exposed_wait_us``, ``caused_wait_us``, warm-up). Everything is numpy over all
operations at once: ``reduceat`` over instances, ``bincount`` over ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from overlapprof.analysis import intervals as iv
from overlapprof.analysis.crossrank.clocks import UNKNOWN_HOST
from overlapprof.analysis.crossrank.inputs import CrossRankInput
from overlapprof.analysis.crossrank.matching import Matched
from overlapprof.analysis.rank.classify import KINDS
from overlapprof.analysis.records.operations import CommOperations
from overlapprof.analysis.stats import median
from overlapprof.report import RankWaits, Straggler, WarmupOp

WARMUP_FACTOR = 10.0  # a first op this many times the kind's median transfer is warm-up

WARMUP_MIN_OTHERS = 2  # ... judged only against at least this many other ops of its kind
_SEND_RECV = KINDS.index("send_recv")
_SEND, _RECV = 1, 2  # CommOperations.direction


def _warmup(ops: CommOperations, inst_of: np.ndarray, transfer_of_row: np.ndarray) -> tuple[np.ndarray, list[WarmupOp]]:
    """Rows flagged warm-up: each rank's first op when its transfer ≥ WARMUP_FACTOR × the median
    transfer of the other ops of its kind on that rank (at least WARMUP_MIN_OTHERS of them)."""
    flagged = np.zeros(len(ops), dtype=bool)
    found = []
    for rank in np.flatnonzero(np.bincount(ops.rank)).tolist():
        rows = np.flatnonzero(ops.rank == rank)
        first = rows[np.argmin(ops.ts[rows])]
        same = rows[(rows != first) & (ops.kind[rows] == ops.kind[first])]
        if same.size < WARMUP_MIN_OTHERS:
            continue
        median_us = median(transfer_of_row[same].tolist())
        value = float(transfer_of_row[first])
        if median_us > 0 and value >= WARMUP_FACTOR * median_us:
            flagged[first] = True
            found.append(WarmupOp(rank=rank, kind=ops.kind_of(first), transfer_us=value, median_us=median_us,
                                  factor=value / median_us))
    # A matched instance is warm-up when any of its rows is: its wait is setup, not a straggler.
    flagged |= np.isin(inst_of, inst_of[flagged & (inst_of >= 0)]) & (inst_of >= 0)
    return flagged, found


@dataclass
class Measured:
    """Per-instance and per-operation arrays of the metrics (:mod:`overlapprof.report.crossrank`).

    ``rows``: the matched operations, instance by instance (``ids``: their instance, ``bounds``:
    where each instance starts in ``rows``). Per instance: ``transfer``, ``skew``, ``last_rank``,
    ``wait`` (Σ of its ranks' waits), ``warm``. Per operation: ``inst_of`` (-1: unmatched),
    ``transfer_of`` (its instance's transfer, else its own duration), ``wait``, ``warm``.
    """

    rows: np.ndarray
    ids: np.ndarray
    bounds: np.ndarray
    transfer: np.ndarray
    skew: np.ndarray
    last_rank: np.ndarray
    wait: np.ndarray
    warm: np.ndarray
    inst_of: np.ndarray
    transfer_of: np.ndarray
    op_wait: np.ndarray
    op_warm: np.ndarray
    warmups: list[WarmupOp]


def _pairs_by_receiver(ops: CommOperations, m: Matched, start: np.ndarray, one_clock: np.ndarray,
                       transfer, transfer_of, op_wait, last_rank) -> None:
    """Send/recv pairs whose two ranks share a clock, measured at the receiver (in place): a send
    may end as soon as its data is buffered (gloo over TCP, any eager protocol) while the data is
    still on its way, so the shortest duration is not the transfer. The transfer is the receiver's
    end − the later start; a rank waits from its start to the later start if its operation
    ends after that (one that ended before its partner arrived did not wait for it), and its
    own transfer is the rest of its duration, at most the pair's. The last rank is the later
    start (ties: the shorter operation). A pair whose receiver ends before the later start (odd
    clocks) keeps the durations' rule."""
    pick = np.flatnonzero((m.sizes == 2) & (ops.kind[m.rows[m.bounds]] == _SEND_RECV) & one_clock)
    a, b = m.rows[m.bounds[pick]], m.rows[m.bounds[pick] + 1]
    a_recv = ops.direction[a] == _RECV
    recv, send = np.where(a_recv, a, b), np.where(a_recv, b, a)
    latest = np.maximum(start[recv], start[send])
    t = start[recv] + ops.dur[recv] - latest
    ok = (ops.direction[recv] == _RECV) & (ops.direction[send] == _SEND) & (t >= 0)
    pick, recv, send, latest, t = pick[ok], recv[ok], send[ok], latest[ok], t[ok]
    transfer[pick] = t
    for row in (recv, send):
        wait = np.where(start[row] + ops.dur[row] > latest, latest - start[row], 0.0)
        op_wait[row] = wait
        transfer_of[row] = np.minimum(t, ops.dur[row] - wait)
    later = (start[send] > start[recv]) | ((start[send] == start[recv]) & (ops.dur[send] <= ops.dur[recv]))
    last_rank[pick] = ops.rank[np.where(later, send, recv)]


def measure(ops: CommOperations, m: Matched, start: np.ndarray, one_clock: np.ndarray) -> Measured:
    """The metrics of the matched instances; ``start``: each operation's start on the common clock;
    ``one_clock``: per instance, whether its ranks' starts are comparable (bool)."""
    n, sizes, rows, bounds = len(ops), m.sizes, m.rows, m.bounds
    ids = np.repeat(np.arange(sizes.size), sizes)
    inst_of = np.full(n, -1, dtype=np.int64)
    inst_of[rows] = ids
    transfer_of, op_wait = ops.dur.copy(), np.zeros(n)
    if sizes.size:
        transfer = np.minimum.reduceat(ops.dur[rows], bounds)
        skew = np.maximum.reduceat(start[rows], bounds) - np.minimum.reduceat(start[rows], bounds)
        transfer_of[rows] = transfer[ids]
        op_wait[rows] = ops.dur[rows] - transfer_of[rows]
        # Last arrival: the shortest duration in the instance (ties: the latest start).
        order = np.lexsort((-start[rows], ops.dur[rows], ids))
        last_rank = ops.rank[rows[order][np.concatenate(([True], ids[order][1:] != ids[order][:-1]))]]
        _pairs_by_receiver(ops, m, start, one_clock, transfer, transfer_of, op_wait, last_rank)
    else:
        transfer = skew = np.empty(0)
        last_rank = np.empty(0, dtype=np.int64)
    op_warm, warmups = _warmup(ops, inst_of, transfer_of)
    warm = np.zeros(sizes.size, dtype=bool)
    warm[inst_of[op_warm & (inst_of >= 0)]] = True
    wait = np.bincount(ids, weights=op_wait[rows], minlength=sizes.size)
    return Measured(rows, ids, bounds, transfer, skew, last_rank, wait, warm, inst_of, transfer_of, op_wait,
                     op_warm, warmups)


def _caused(x: Measured, nranks: int) -> tuple[np.ndarray, np.ndarray]:
    """Per rank: the others' wait in the non-warm-up instances where it was last, and how many."""
    keep = ~x.warm
    return (np.bincount(x.last_rank[keep], weights=x.wait[keep], minlength=nranks),
            np.bincount(x.last_rank[keep], minlength=nranks))


def rank_rows(inputs: list[CrossRankInput], ops: CommOperations, x: Measured, shift, domain_of) -> list[RankWaits]:
    nranks = max(r.rank for r in inputs) + 1

    def per_rank(mask, weights=None):
        return np.bincount(ops.rank[mask], weights=None if weights is None else weights[mask], minlength=nranks)

    counted = (x.inst_of >= 0) & ~x.op_warm  # matched, not warm-up: what the sums use
    lone = x.inst_of < 0
    ops_n, matched, unmatched_n, unmatched_us = per_rank(slice(None)), per_rank(~lone), per_rank(lone), per_rank(lone, ops.dur)
    wait, transfer = per_rank(counted, x.op_wait), per_rank(counted, x.transfer_of)
    warm_n, warm_us = per_rank(x.op_warm), per_rank(x.op_warm, ops.dur)
    caused, last_count = _caused(x, nranks)
    lowest = min(r.base_us for r in inputs)
    out = []
    for r in inputs:
        mine = (ops.rank == r.rank) & counted & (x.op_wait > 0)
        exposed_wait = iv.overlap_length(iv.union(ops.ts[mine], ops.ts[mine] + x.op_wait[mine]), r.exposed)
        k = r.rank
        out.append(RankWaits(
            rank=k, host=None if domain_of[k] == UNKNOWN_HOST else r.host,
            clock_offset_us=float(shift[k]) - (r.base_us - lowest), ops=int(ops_n[k]), matched_ops=int(matched[k]),
            unmatched_ops=int(unmatched_n[k]), unmatched_us=float(unmatched_us[k]), wait_us=float(wait[k]),
            transfer_us=float(transfer[k]), exposed_wait_us=exposed_wait, exposed_comm_us=r.exposed_comm_us,
            wait_share=exposed_wait / r.exposed_comm_us if r.exposed_comm_us > 0 and matched[k] else None,
            last_arrivals=int(last_count[k]), caused_wait_us=float(caused[k]),
            warmup_ops=int(warm_n[k]), warmup_us=float(warm_us[k]),
        ))
    return out


def stragglers(x: Measured) -> list[Straggler]:
    """Ranks that made others wait, most first; ``share`` of all (non-warm-up) waiting."""
    nranks = int(x.last_rank.max()) + 1 if x.last_rank.size else 0
    caused, last_count = _caused(x, nranks)
    total = float(x.wait[~x.warm].sum())
    return [Straggler(rank=r, caused_wait_us=float(caused[r]), share=float(caused[r]) / total if total > 0 else 0.0,
                      last_arrivals=int(last_count[r]))
            for r in np.argsort(-caused, kind="stable").tolist() if caused[r] > 0]
