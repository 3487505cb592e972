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


def _caused(x: Measured, ops: CommOperations, nranks: int, keep: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per rank r: the time the other ranks waited in the instances ``keep`` (default: those not
    warm-up) where r was last, each waiting rank's waits for r as a union (operations in flight
    at once count once, as in its ``wait_us``), summed over the waiting ranks; and in how many
    of them r was last."""
    keep = ~x.warm if keep is None else keep
    inst = x.ids[keep[x.ids]]
    rows, wait = x.rows[keep[x.ids]], x.op_wait[x.rows[keep[x.ids]]]
    culprit, waiter = x.last_rank[inst], ops.rank[rows]
    sel = (wait > 0) & (culprit != waiter)
    rows, wait, culprit, waiter = rows[sel], wait[sel], culprit[sel], waiter[sel]
    pairs = culprit * nranks + waiter
    lengths, _ = iv.lengths_by(iv.union_by(pairs, ops.ts[rows], ops.ts[rows] + wait), nranks * nranks)
    caused = np.asarray(lengths).reshape(nranks, nranks).sum(axis=1) if nranks else np.zeros(0)
    return caused, np.bincount(x.last_rank[keep], minlength=nranks)


def rank_rows(inputs: list[CrossRankInput], ops: CommOperations, x: Measured, shift, domain_of) -> list[RankWaits]:
    nranks = max(r.rank for r in inputs) + 1

    def per_rank(mask, weights=None):
        return np.bincount(ops.rank[mask], weights=None if weights is None else weights[mask], minlength=nranks)

    counted = (x.inst_of >= 0) & ~x.op_warm  # matched, not warm-up: what the sums use
    lone = x.inst_of < 0
    ops_n, matched, unmatched_n, unmatched_us = per_rank(slice(None)), per_rank(~lone), per_rank(lone), per_rank(lone, ops.dur)
    warm_n, warm_us = per_rank(x.op_warm), per_rank(x.op_warm, ops.dur)
    caused, last_count = _caused(x, ops, nranks)
    lowest = min(r.base_us for r in inputs)
    out = []
    for r in inputs:
        k = r.rank
        wait_us, transfer_us, exposed_wait = _time_split(ops, x, counted & (ops.rank == k), r)
        out.append(RankWaits(
            rank=k, host=None if domain_of[k] == UNKNOWN_HOST else r.host,
            clock_offset_us=float(shift[k]) - (r.base_us - lowest), ops=int(ops_n[k]), matched_ops=int(matched[k]),
            unmatched_ops=int(unmatched_n[k]), unmatched_us=float(unmatched_us[k]), wait_us=wait_us,
            transfer_us=transfer_us, exposed_wait_us=exposed_wait, comm_us=r.comm_us, exposed_comm_us=r.exposed_comm_us,
            wait_share=wait_us / r.comm_us if r.comm_us > 0 and matched[k] else None,
            exposed_wait_share=exposed_wait / r.exposed_comm_us if r.exposed_comm_us > 0 and matched[k] else None,
            last_arrivals=int(last_count[k]), caused_wait_us=float(caused[k]),
            warmup_ops=int(warm_n[k]), warmup_us=float(warm_us[k]),
        ))
    return out


def _time_split(ops: CommOperations, x: Measured, mine: np.ndarray, r: CrossRankInput) -> tuple[float, float, float]:
    """A rank's (wait, transfer, exposed wait) in µs: lengths of unions within its U(comm), so that
    operations in flight at once count once and wait + transfer <= comm_us. Its waits are
    ``[ts, ts + wait)`` at the start of each counted operation; its transfers follow them, each
    as long as its own transfer (of a send/recv, at most the pair's), less any wait; its exposed wait the waits under no compute (∩ U(comm) \\ U(compute))."""
    ts, waiting = ops.ts[mine], x.op_wait[mine]
    waits = iv.intersection(iv.union(ts[waiting > 0], (ts + waiting)[waiting > 0]), r.comm)
    moving = iv.intersection(iv.union(ts + waiting, ts + waiting + x.transfer_of[mine]), r.comm)
    return iv.length(waits), iv.length(iv.difference(moving, waits)), iv.overlap_length(waits, r.exposed)


# A straggler is named only on this evidence (docs/crossrank.md), from the matched instances
# of process groups whose every rank has a trace, warm-up left out: it caused at least
# STRAGGLER_SHARE of all their waiting and at least STRAGGLER_LEAD times what any other rank
# caused, and it did so again and again: it caused most of the waiting in more than
# STRAGGLER_STEPS of the steps with waiting (instances without a ProfilerStep are one step), so
# that one late arrival, however long, names no one. A rank late once a step, for the first of
# several collectives, arrives last in few of its instances but causes the step's waiting.
STRAGGLER_SHARE = 0.5
STRAGGLER_LEAD = 2.0
STRAGGLER_STEPS = 0.5


def named_straggler(x: Measured, ops: CommOperations, traced: dict[str, tuple[int, int | None]]) -> tuple[int | None, str]:
    """(the rank named straggler, or None; the evidence, in words) under the rule above.
    ``traced``: per process group name, (ranks with a trace, its size or None if unknown)."""
    complete = np.array([n == size for n, size in (traced.get(g, (0, None)) for g in ops.groups)], dtype=bool)
    firsts = x.rows[x.bounds] if x.bounds.size else np.empty(0, dtype=np.int64)
    inst_group = ops.group[firsts]
    keep = ~x.warm & complete[inst_group]
    if not keep.any():
        partial = sorted({ops.groups[g] for g in inst_group[~x.warm].tolist()})
        if not partial:
            return None, "no matched instance outside warm-up"
        shown = ", ".join(f"{g}: {traced[g][0]} of {traced[g][1] or 'an unknown number of'}" for g in partial[:3])
        return None, f"not every rank of its groups has a trace ({shown} ranks), so who arrived last is unknown"
    nranks = int(max(x.last_rank.max(), ops.rank.max())) + 1
    caused, last = _caused(x, ops, nranks, keep)
    total = float(caused.sum())
    if total <= 0:
        return None, "no rank waited for another"
    order = np.argsort(-caused, kind="stable")
    top, runner = int(order[0]), int(order[1]) if nranks > 1 else None
    share = caused[top] / total
    lead = caused[top] / caused[runner] if runner is not None and caused[runner] > 0 else np.inf
    held_up, steps = _steps_held_up(x, ops.step[firsts], keep, top)
    numbers = (f"caused {share:.0%} of the waiting" + (f", {lead:.1f}x rank {runner}'s" if np.isfinite(lead) else "")
               + f", most of it in {held_up} of the {steps} steps with waiting (last in {last[top]} instances)")
    if share >= STRAGGLER_SHARE and lead >= STRAGGLER_LEAD and held_up > STRAGGLER_STEPS * steps:
        return top, numbers
    return None, f"the most waited-for, rank {top}, {numbers}"


def _steps_held_up(x: Measured, inst_step: np.ndarray, keep: np.ndarray, rank: int) -> tuple[int, int]:
    """(steps in which ``rank``, as last rank, caused at least half of the waiting, steps with
    waiting), over the instances ``keep``; per instance, its waiting is the sum of its ranks'."""
    step, wait, mine = inst_step[keep], x.wait[keep], x.last_rank[keep] == rank
    codes = step - step.min()  # step numbers (-1: none) as small ints from 0
    n = int(codes.max()) + 1
    total = np.bincount(codes, weights=wait, minlength=n)
    by_rank = np.bincount(codes[mine], weights=wait[mine], minlength=n)
    waited = total > 0
    return int(np.count_nonzero(waited & (by_rank >= 0.5 * total))), int(np.count_nonzero(waited))


def stragglers(x: Measured, ops: CommOperations) -> list[Straggler]:
    """Ranks that made others wait, most first; ``share`` of all (non-warm-up) waiting."""
    nranks = int(max(x.last_rank.max(), ops.rank.max())) + 1 if x.last_rank.size else 0
    caused, last_count = _caused(x, ops, nranks)
    total = float(caused.sum())
    return [Straggler(rank=r, caused_wait_us=float(caused[r]), share=float(caused[r]) / total if total > 0 else 0.0,
                      last_arrivals=int(last_count[r]))
            for r in np.argsort(-caused, kind="stable").tolist() if caused[r] > 0]
