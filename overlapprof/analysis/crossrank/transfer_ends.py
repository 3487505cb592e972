"""Where an asynchronous point-to-point transfer is shown to end (OVERLAP.md version 3, section 1).

gloo records a send or recv as a span on the calling thread from its issue to its ``wait()``.
One whose thread did other work for less than half of the span (the compute between its issue
and its need time, when the program needed its result, OVERLAP.md section 6.1, and the time it
waited first for another send/recv of the thread that ended after that) ends when the operation
was seen to complete: a blocking receive, or one whose ``wait()`` blocked, ends when its data had arrived.
An asynchronous one (its thread did other work for most of the span) ends at the ``wait()``,
however long before that its transfer ended. (Half, not all: the call that issued a span
overlaps its first microseconds, and a ``wait()`` that finds the work done still takes some.)

Once the ranks' operations are matched on a common clock, an async send matched to a blocking
receive is shown to end: its transfer ended by the receive's end, so its communication ends
there when that is earlier than its span's end (and the span is empty when the receive ended
before the span opened). Every other async send or recv is an upper bound: its span, as recorded.

The analyzer measures the ranks whose sends this cuts again with these ends
(:attr:`PartnerEnds.ends`), so that every metric is computed once, from the classified intervals.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from overlapprof.analysis import intervals as iv
from overlapprof.analysis.crossrank.section import Matching
from overlapprof.analysis.rank.classify import KIND_CODE
from overlapprof.report import PointToPoint

SEND, RECV = 1, 2  # CommOperations.direction


@dataclass
class PartnerEnds:
    """``ends``: rank -> (starts, ends) µs on the rank's own clock, sorted by start: the spans of
    the async sends whose communication ends earlier, at their matched receive's end (the span
    that starts at ``starts[k]`` ends at ``ends[k]``); only ranks with such a send. ``p2p``: rank ->
    what is known of its async point-to-point operations' ends (CPU ranks with send/recv)."""

    ends: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    p2p: dict[int, PointToPoint] = field(default_factory=dict)


def _blocked_from(ops, p2p: np.ndarray) -> np.ndarray:
    """Since when each point-to-point operation's thread was blocked on it alone: its need time
    (CPU mode: always known), or the end of an earlier-ending send/recv of its thread that ended
    after that (its ``wait()`` came first: what the thread waited for until then was not this)."""
    out = ops.need.copy()
    rows = np.flatnonzero(p2p)
    order = rows[np.lexsort((ops.end[rows], ops.thread[rows], ops.rank[rows]))]
    if order.size > 1:
        same = (ops.rank[order[1:]] == ops.rank[order[:-1]]) & (ops.thread[order[1:]] == ops.thread[order[:-1]])
        prev = np.where(same, ops.end[order[:-1]], -np.inf)
        out[order[1:]] = np.maximum(out[order[1:]], prev)
    return out


def _other_work(ops, p2p: np.ndarray, compute: dict) -> np.ndarray:
    """How long each point-to-point operation's thread did something else during its span: the
    compute in [issue, need) (the issuing call itself is not other work: a blocking send whose
    call takes half of its short span is still waited for), then the time it waited for other
    operations first (``_blocked_from`` − need). A rank without its compute union (``compute``:
    rank -> U(compute), own clock) counts all of [issue, need)."""
    blocked = _blocked_from(ops, p2p)
    other = np.maximum(blocked - ops.need, 0.0) + np.maximum(ops.need - ops.issue, 0.0)
    for rank in np.unique(ops.rank[p2p]).tolist():
        if (u := compute.get(rank)) is not None:
            rows = np.flatnonzero(p2p & (ops.rank == rank))
            other[rows] = (np.maximum(blocked[rows] - ops.need[rows], 0.0)
                           + iv.covered(u, ops.issue[rows], np.maximum(ops.need[rows], ops.issue[rows])))
    return other


def partner_ends(m: Matching, cpu_ranks: set[int], compute: dict | None = None) -> PartnerEnds:
    """The ends that the matched receives show, for the operations of the CPU-mode ranks ``cpu_ranks``
    (module docstring; ``compute``: rank -> U(compute), its own clock, what :func:`_other_work`
    reads). Across hosts whose clocks are not aligned nothing is shown."""
    ops, out, x = m.ops, PartnerEnds(), m.matched
    p2p = (ops.kind == KIND_CODE["send_recv"]) & np.isin(ops.rank, sorted(cpu_ranks))
    if not p2p.any():
        return out
    waited = p2p & (_other_work(ops, p2p, compute or {}) < 0.5 * (ops.end - ops.issue))
    is_async = p2p & ~waited
    shown = np.zeros(len(ops), dtype=bool)
    end = ops.end.copy()
    if m.clocks != "unaligned" and x.sizes.size:
        first = x.bounds[(x.sizes == 2) & (ops.kind[x.rows[x.bounds]] == KIND_CODE["send_recv"])]
        a, b = x.rows[first], x.rows[first + 1]
        send = np.where(ops.direction[a] == SEND, a, b)
        recv = np.where(ops.direction[a] == SEND, b, a)
        ok = is_async[send] & waited[recv] & (ops.direction[recv] == RECV)
        send, recv = send[ok], recv[ok]
        shown[send] = True
        peer_end = ops.end[recv] + m.row_shift[recv] - m.row_shift[send]  # on the send's own clock
        end[send] = np.clip(peer_end, ops.ts[send], ops.end[send])
    cut = shown & (end < ops.end)
    upper = is_async & ~shown
    for rank in np.flatnonzero(np.bincount(ops.rank[p2p])).tolist():
        mine = ops.rank == rank
        if (rows := np.flatnonzero(mine & cut)).size:
            order = np.argsort(ops.ts[rows], kind="stable")
            out.ends[rank] = (ops.ts[rows][order], end[rows][order])
        out.p2p[rank] = PointToPoint(async_ops=int((mine & is_async).sum()), ends_from_peer=int(rows.size),
                                     upper_bound=int((mine & upper).sum()),
                                     upper_bound_us=iv.length(iv.union(ops.ts[mine & upper], ops.end[mine & upper])))
    return out
