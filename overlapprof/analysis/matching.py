"""Matching communication operations across ranks: which operations were one collective call.

Input: every rank's :class:`~overlapprof.analysis.comm_ops.CommOp` list. Output: *instances*,
lists of operations (at most one per rank) that were the same collective call or the two ends
of one send/recv, and the operations nothing matched, with the reason.

**Logical operations.** Kernels launched by one host-side call (same record_param_comms /
annotation / c10d op start, or same process group and sequence number) are one operation
spanning from the first kernel's start to the last one's end (coalesced collectives launch
several). The *kind* is the collective the trace names (record_param_comms ``Collective name``,
else the enclosing ``nccl:<op>`` annotation, else the event's name; the first of them that names
a known kind), so the SendRecv kernels NCCL runs for all_to_all count as all_to_all here.

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
from itertools import compress

import numpy as np

from overlapprof.analysis.bandwidth import bytes_parts
from overlapprof.analysis.classify import comm_kind
from overlapprof.analysis.clocks import SYNCHRONISING
from overlapprof.analysis.comm_ops import CommOp

# Kinds whose ranks all move the same message (sizes must agree to match); all_to_all may be uneven.
SAME_SIZE = frozenset({"all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "send_recv"})
# Slack for "started before the first end" between clocks of one host (GPU timestamps converted
# to the CPU clock by CUPTI are within a few µs).
TOLERANCE_US = 2.0
DEFAULT_GROUP = "default"


@dataclass
class Ops:
    """Logical operations as columns (one row per operation): one rank's, or all ranks' after
    :func:`concat`. ``scaled``: ``nbytes`` is one rank's share (all_gather sized from its input's
    recorded shape) and becomes × the group size in :func:`concat`."""

    rank: np.ndarray  # int64 (-1 until the rank is settled)
    kind: list[str]
    group: list[str]
    seq: np.ndarray  # int64, -1 unknown
    direction: np.ndarray  # int8: 0 none, 1 send, 2 recv
    peer: np.ndarray  # int64, -1 unknown
    ts: np.ndarray  # own clock, µs
    end: np.ndarray
    dur: np.ndarray  # the trace's duration (the span of the kernels, for merged ones)
    nbytes: np.ndarray  # float64, NaN unknown
    scaled: np.ndarray  # bool
    step: np.ndarray  # int64, -1 none
    group_size: np.ndarray  # int64, 0 unknown

    def __len__(self) -> int:
        return self.rank.size


_COLUMNS = {
    "rank": np.int64, "seq": np.int64, "direction": np.int8, "peer": np.int64, "ts": np.float64, "end": np.float64,
    "dur": np.float64, "nbytes": np.float64, "scaled": bool, "step": np.int64, "group_size": np.int64,
}


@dataclass
class Matched:
    """Instances (lists of op rows) with their method and key; unmatched rows with reasons."""

    instances: list[list[int]]
    methods: list[str]
    keys: list[int]
    unmatched: dict[int, str]
    kind_methods: list[tuple[str, str, str, int, int, str | None]]  # group, kind, method, instances, unmatched, note


def _direction(op: CommOp) -> int:
    for text in (op.collective, op.annotation, op.call, op.name):
        if text:
            low = text.lower()
            send, recv = "send" in low, "recv" in low
            if send != recv:
                return 1 if send else 2
    return 0


def _merge_key(op: CommOp, group: str, kind: str):
    if op.seq is not None and kind != "send_recv":  # a rank's sends and recvs may share a p2p seq
        return ("seq", group, op.seq)
    if op.call_ts is not None:
        return ("call", op.call_ts)
    return None


class _KindOf(dict):
    def __missing__(self, text):
        value = self[text] = comm_kind(text)
        return value


_KIND_OF = _KindOf()


def _kind(op: CommOp) -> str:
    """The first kind that is not "other" of the collective's name, the annotation, the event."""
    for text in (op.collective, op.annotation, op.name):
        if text and (kind := _KIND_OF[text]) != "other":
            return kind
    return "other"


def rank_ops(ops: list[CommOp]) -> Ops:
    """One rank's logical operations, in time order (module docstring); ``rank`` is left -1."""
    ops = sorted(ops, key=lambda o: o.ts)
    kinds = [_kind(o) for o in ops]
    groups = [o.pg_name or DEFAULT_GROUP for o in ops]
    sizes = [bytes_parts(o, k) for o, k in zip(ops, kinds)]
    dur = np.maximum(np.array([o.dur for o in ops], dtype=np.float64), 0.0)
    ts = np.array([o.ts for o in ops], dtype=np.float64)
    cols = {
        "rank": np.full(len(ops), -1, dtype=np.int64),
        "seq": np.array([o.seq if o.seq is not None and k != "send_recv" else -1 for o, k in zip(ops, kinds)], dtype=np.int64),
        "direction": np.array([_direction(o) if k == "send_recv" else 0 for o, k in zip(ops, kinds)], dtype=np.int8),
        "peer": np.array([-1 if o.peer is None else o.peer for o in ops], dtype=np.int64),
        "ts": ts, "end": ts + dur, "dur": dur,
        "nbytes": np.array([np.nan if b is None else b for b, _ in sizes], dtype=np.float64),
        "scaled": np.array([scaled for _, scaled in sizes], dtype=bool),
        "step": np.array([-1 if o.step is None else o.step for o in ops], dtype=np.int64),
        "group_size": np.array([o.group_size or (len(o.pg_ranks) if o.pg_ranks else 0) for o in ops], dtype=np.int64),
    }
    # Kernels of one host call (or one group + sequence number) become one operation.
    keys = [_merge_key(o, g, k) for o, g, k in zip(ops, groups, kinds)]
    first: dict = {}
    owner = np.array([first.setdefault(k, i) if k is not None else i for i, k in enumerate(keys)], dtype=np.int64)
    if (owner != np.arange(len(ops))).any():
        keep = owner == np.arange(len(ops))
        np.maximum.at(cols["end"], owner, cols["end"])
        np.fmax.at(cols["nbytes"], owner, cols["nbytes"])
        cols["dur"] = cols["end"] - cols["ts"]
        cols = {n: c[keep] for n, c in cols.items()}
        kinds, groups = list(compress(kinds, keep)), list(compress(groups, keep))
    return Ops(**cols, kind=kinds, group=groups)


def concat(parts: dict[int, Ops], group_sizes: dict[str, int]) -> Ops:
    """All ranks' operations (``parts`` by rank): rank column set, unknown group sizes taken from
    ``group_sizes``, scaled byte counts multiplied by the group size (unknown size: unknown bytes)."""
    ranks = sorted(parts)
    cat = {n: np.concatenate([getattr(parts[r], n) for r in ranks]).astype(t) for n, t in _COLUMNS.items()}
    cat["rank"] = np.repeat(np.array(ranks, dtype=np.int64), [len(parts[r]) for r in ranks])
    groups = [g for r in ranks for g in parts[r].group]
    known = np.array([group_sizes.get(g, 0) for g in groups], dtype=np.int64)
    cat["group_size"] = np.where(cat["group_size"] > 0, cat["group_size"], known)
    scale = np.where(cat["scaled"], np.where(cat["group_size"] > 0, cat["group_size"], np.nan), 1.0)
    cat["nbytes"] = cat["nbytes"] * scale
    return Ops(**cat, kind=[k for r in ranks for k in parts[r].kind], group=groups)


def build_ops(per_rank: dict[int, list[CommOp]], group_sizes: dict[str, int]) -> Ops:
    """:func:`rank_ops` of every rank, then :func:`concat`."""
    return concat({rank: rank_ops(ops) for rank, ops in per_rank.items()}, group_sizes)


def _sizes_agree(nbytes: np.ndarray) -> bool:
    known = nbytes[~np.isnan(nbytes)]
    return known.size < 2 or bool((known == known[0]).all())


def _sweep(ops: Ops, seqs: list[np.ndarray], shift: np.ndarray, same_size: bool) -> list[list[int]]:
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


def _match_collective(ops: Ops, rows: np.ndarray, kind: str, shared: bool, shift: np.ndarray):
    """Instances of one (group, kind) sequence: (instances, method, unmatched {row: reason}, note)."""
    if (ops.seq[rows] >= 0).all():
        by_seq = defaultdict(list)
        for row in rows.tolist():
            by_seq[int(ops.seq[row])].append(row)
        return list(by_seq.values()), "seq", {}, None
    ranks = np.unique(ops.rank[rows])
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
            return [list(col) for col in grid.T.tolist()], "order", {}, None
    if shared:
        return _sweep(ops, seqs, shift, same_size), "overlap", {}, None
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
    return instances, "order", unmatched, note


def _match_pairs(ops: Ops, rows: np.ndarray, present: set[int]):
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


def match(ops: Ops, present: set[int], shared: bool, shift: np.ndarray) -> Matched:
    """Match every group's operations (module docstring). ``shift``: per-row µs added to ``ts``
    for a common clock; ``shared``: whether that clock is common to all ranks."""
    result = Matched([], [], [], {}, [])
    sequences = defaultdict(list)
    for row, (group, kind) in enumerate(zip(ops.group, ops.kind)):
        sequences[(group, kind)].append(row)
    for (group, kind), rows in sorted(sequences.items()):
        rows = np.array(rows, dtype=np.int64)
        if kind == "send_recv":
            instances, unmatched, note = _match_pairs(ops, rows, present)
            method = "pair-order"
        else:
            instances, method, unmatched, note = _match_collective(ops, rows, kind, shared, shift)
        alone = [i for i in instances if len(i) < 2]
        for inst in alone:
            unmatched[inst[0]] = (
                "no other rank has a trace here" if len(present) < 2 else "no operation of another rank matches it"
            )
        kept = [i for i in instances if len(i) >= 2]
        if len(present) < 2:
            method = "none"
        for key, inst in enumerate(kept):
            result.instances.append(inst)
            result.methods.append(method)
            result.keys.append(int(ops.seq[inst[0]]) if method == "seq" else key)
        result.unmatched.update(unmatched)
        result.kind_methods.append((group, kind, method, len(kept), len(unmatched), note))
    return result
