"""Matching communication operations across ranks: which operations were one collective call.

Input: every rank's logical operations
(:class:`~overlapprof.analysis.records.operations.CommOperations`, columns, all ranks together).
Output: *instances*, groups of operations (at most one per rank) that were the same collective call
or the two ends of one send/recv, and the operations nothing matched, with the reason.

**Collectives**, per process group (``Process Group Name``; without one, the default group) and
kind, by the first method that applies:

1. ``seq``: every operation carries a sequence number: same (group, kind, seq) = one instance.
2. ``order``: every rank present has the same number of operations and the i-th ones agree
   (same message size where the kind requires it; on a shared clock, synchronising kinds must
   overlap in time: the latest start before the earliest end): the i-th operations.
3. ``overlap`` (shared clock only): a sweep in time. Of the ranks' next operations, the one
   ending first closes an instance, which takes every rank whose next operation started before
   that end (and agrees in size). A rank missing an operation (sampled traces, a window that
   starts later) is skipped for that instance instead of shifting every later match.
4. Otherwise (clocks not comparable) ``order`` up to the shortest rank; the rest is unmatched.

**Send/recv** (``pair-order``): the i-th send from s to d with the i-th recv on d from s. The
peer comes from record_param_comms' ``Src Rank``/``Dst Rank``, the annotation (``nccl:send
0->1``) or c10d::send/recv_'s arguments (recorded with ``record_shapes``). Without a peer
(gloo annotations alone carry none) a send/recv is reported unmatched, never guessed.

Cost: one sort per sequence, then linear (the sweep is O(instances × ranks)).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from overlapprof.analysis.columns import Index, distinct_rows
from overlapprof.analysis.crossrank.clocks import SYNCHRONISING
from overlapprof.analysis.records.operations import CommOperations

# Kinds whose ranks all move the same message (sizes must agree to match); all_to_all may be uneven.
SAME_SIZE = frozenset({"all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "send_recv"})
# Slack for "started before the first end" between clocks of one host (GPU timestamps converted
# to the CPU clock by CUPTI are within a few µs).
TOLERANCE_US = 2.0


@dataclass
class Matched:
    """Instances, flat: ``rows`` holds each instance's op rows in turn, ``sizes`` how many; per
    instance its ``methods`` and ``keys``. The unmatched rows as columns, in the order they were
    found: ``unmatched_at`` (op rows) and ``unmatched_why`` (codes into ``reasons``): a single-rank
    trace leaves every operation unmatched, so nothing here is a Python object per operation."""

    rows: np.ndarray
    sizes: np.ndarray
    methods: list[str]
    keys: np.ndarray
    unmatched_at: np.ndarray
    unmatched_why: np.ndarray
    reasons: list[str]
    kind_methods: list[tuple[str, str, str, int, int, str | None]]  # group, kind, method, instances, unmatched, note

    @property
    def bounds(self) -> np.ndarray:
        """Where each instance starts in ``rows``."""
        return np.cumsum(self.sizes) - self.sizes

    def instances(self) -> list[np.ndarray]:
        """Each instance's op rows."""
        return np.split(self.rows, np.cumsum(self.sizes)[:-1]) if self.sizes.size else []

    def unmatched_rows(self) -> np.ndarray:
        """The unmatched rows, in the order they were found."""
        return self.unmatched_at

    def unmatched_reasons(self) -> tuple[np.ndarray, list[str]]:
        """Each unmatched row's reason (in the order of :meth:`unmatched_rows`), as codes into the distinct reasons."""
        return self.unmatched_why, self.reasons


def _sizes_agree(nbytes: np.ndarray) -> bool:
    known = nbytes[~np.isnan(nbytes)]
    return known.size < 2 or bool((known == known[0]).all())


def _sweep(ops: CommOperations, seqs: list[np.ndarray], shift: np.ndarray, same_size: bool) -> list[list[int]]:
    """The overlap sweep of the module docstring over per-rank row sequences (time-ordered)."""
    heads = [0] * len(seqs)
    out = []
    start, end, nbytes = (shift + ops.ts).tolist(), (shift + ops.end).tolist(), ops.nbytes.tolist()
    live = [k for k, s in enumerate(seqs) if len(s)]
    seqs = [s.tolist() for s in seqs]
    while live:
        anchor = min(live, key=lambda k: end[seqs[k][heads[k]]])
        a = seqs[anchor][heads[anchor]]
        limit, size = end[a] + TOLERANCE_US, nbytes[a]
        members = []
        for k in live:
            row = seqs[k][heads[k]]
            if start[row] <= limit and (k == anchor or not same_size or size != size or nbytes[row] != nbytes[row] or nbytes[row] == size):
                members.append(row)
                heads[k] += 1
        out.append(members)
        live = [k for k in live if heads[k] < len(seqs[k])]
    return out


def _match_collective(ops: CommOperations, rows: np.ndarray, kind: str, shared: bool, shift: np.ndarray):
    """Instances of one (group, kind) sequence: (flat rows, sizes, method, unmatched {row: reason}, note)."""
    seq = ops.seq[rows]
    if (seq >= 0).all():  # one instance per sequence number, in order of first appearance
        first, inverse = distinct_rows(seq)
        order = np.argsort(inverse, kind="stable")
        return rows[order], np.bincount(inverse, minlength=first.size), "seq", {}, None
    ranks = np.flatnonzero(np.bincount(ops.rank[rows]))
    seqs = [rows[ops.rank[rows] == r] for r in ranks]  # rows are in time order per rank
    counts = {len(s) for s in seqs}
    same_size = kind in SAME_SIZE
    if len(counts) == 1:
        grid = np.stack(seqs)  # ranks × instances
        sizes = ops.nbytes[grid]
        low, high = np.fmin.reduce(sizes, axis=0), np.fmax.reduce(sizes, axis=0)  # NaN (unknown) ignored
        ok = (low == high) | np.isnan(low) if same_size else np.ones(grid.shape[1], bool)
        if shared and kind in SYNCHRONISING:
            starts, ends = (shift[grid] + ops.ts[grid]), (shift[grid] + ops.end[grid])
            ok &= starts.max(axis=0) <= ends.min(axis=0) + TOLERANCE_US
        if ok.all():
            return grid.T.ravel(), np.full(grid.shape[1], grid.shape[0]), "order", {}, None
    if shared:
        return *_flat(_sweep(ops, seqs, shift, same_size)), "overlap", {}, None
    n = min(counts)
    grid = np.stack([s[:n] for s in seqs])
    instances, unmatched, rejected = [], {}, 0
    for col in grid.T.tolist():
        if same_size and not _sizes_agree(ops.nbytes[col]):
            rejected += 1
            unmatched.update({row: "order match rejected: message sizes differ (clocks not comparable)" for row in col})
        else:
            instances.append(col)
    for s in seqs:
        unmatched.update({row: "counts differ across ranks (clocks not comparable: matched by order up to the shortest)" for row in s[n:].tolist()})
    note = f"{rejected} order matches rejected for differing sizes" if rejected else None
    return *_flat(instances), "order", unmatched, note


def _flat(instances: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    return (np.array([row for inst in instances for row in inst], dtype=np.int64),
            np.array([len(inst) for inst in instances], dtype=np.int64))


def _match_pairs(ops: CommOperations, rows: np.ndarray, present: set[int]):
    """Send/recv rows of one group: (instances [send, recv], unmatched {row: reason}, note)."""
    sends, recvs, unmatched = defaultdict(list), defaultdict(list), {}
    for row in rows.tolist():
        rank, peer, direction = int(ops.rank[row]), int(ops.peer[row]), int(ops.direction[row])
        if direction == 0 or peer < 0:
            unmatched[row] = "send/recv without a recorded peer (gloo records none without record_shapes)"
        elif peer not in present:
            unmatched[row] = f"its peer, rank {peer}, has no trace here"
        elif direction == 1:
            sends[(rank, peer)].append(row)
        else:
            recvs[(peer, rank)].append(row)
    # No time check: a send may complete before its recv is posted (eager protocols), and gloo
    # (torch 2.13) opens its gloo:send/recv spans late in the c10d call.
    instances, suspicious = [], 0
    for pair in sorted(set(sends) | set(recvs)):
        s, r = sends.get(pair, []), recvs.get(pair, [])
        n = min(len(s), len(r))
        for a, b in zip(s[:n], r[:n]):
            instances.append([a, b])
            suspicious += not _sizes_agree(ops.nbytes[[a, b]])
        for row in s[n:] + r[n:]:
            unmatched[row] = f"no matching {'recv' if ops.direction[row] == 1 else 'send'} on rank {pair[1] if ops.direction[row] == 1 else pair[0]} (counts differ)"
    note = f"{suspicious} pairs move different sizes (order may be off)" if suspicious else None
    return instances, unmatched, note


def match(ops: CommOperations, present: set[int], shared: bool, shift: np.ndarray) -> Matched:
    """Match every group's operations (module docstring). ``shift``: per-row µs added to ``ts``
    for a common clock; ``shared``: whether that clock is common to all ranks."""
    empty = np.empty(0, np.int64)
    result = Matched(empty, empty, [], empty, empty, np.empty(0, np.int32), [], [])
    if not len(ops):
        return result
    flats, all_sizes, keys, at, why = [], [], [], [], []
    reasons = Index()
    first, inverse = distinct_rows(ops.group, ops.kind)
    order = np.argsort(inverse, kind="stable")
    by_sequence = np.split(order, np.cumsum(np.bincount(inverse))[:-1])
    names = [(ops.group_of(row), ops.kind_of(row)) for row in first.tolist()]
    for k in sorted(range(first.size), key=lambda k: names[k]):
        (group, kind), rows = names[k], by_sequence[k]
        if kind == "send_recv":
            instances, unmatched, note = _match_pairs(ops, rows, present)
            flat, sizes = _flat(instances)
            method = "pair-order"
        else:
            flat, sizes, method, unmatched, note = _match_collective(ops, rows, kind, shared, shift)
        starts = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64)
        reason = "no other rank has a trace here" if len(present) < 2 else "no operation of another rank matches it"
        alone = flat[starts[sizes < 2]]
        if unmatched:  # a row found twice keeps its first place and its last reason, as a dict's update would
            unmatched.update(dict.fromkeys(alone.tolist(), reason))
            at.append(np.fromiter(unmatched, dtype=np.int64, count=len(unmatched)))
            why.append(np.fromiter(map(reasons.__getitem__, unmatched.values()), dtype=np.int32, count=len(unmatched)))
        elif alone.size:
            at.append(alone.astype(np.int64))
            why.append(np.full(alone.size, reasons[reason], dtype=np.int32))
        kept = sizes >= 2
        if len(present) < 2:
            method = "none"
        flat, sizes, starts = flat[np.repeat(kept, sizes)], sizes[kept], starts[kept]
        flats.append(flat)
        all_sizes.append(sizes)
        result.methods += [method] * sizes.size
        keys.append(ops.seq[flat[np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64)]]
                    if method == "seq" and sizes.size else np.arange(sizes.size, dtype=np.int64))
        result.kind_methods.append((group, kind, method, int(sizes.size), len(unmatched) or int(alone.size), note))
    result.rows, result.sizes = np.concatenate(flats), np.concatenate(all_sizes)
    result.keys = np.concatenate(keys).astype(np.int64)
    if at:
        result.unmatched_at, result.unmatched_why = np.concatenate(at), np.concatenate(why)
    result.reasons = reasons.order
    return result
