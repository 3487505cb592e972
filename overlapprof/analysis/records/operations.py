"""A rank's logical communication operations (:class:`CommOperations`, columns), from its records.

**Logical operations.** Kernels launched by one host-side call (same record_param_comms /
annotation / c10d op start, or same process group and sequence number) are one operation
spanning from the first kernel's start to the last one's end (coalesced collectives launch
several). The *kind* is the collective the trace names (record_param_comms ``Collective name``,
else the enclosing ``nccl:<op>`` annotation, else the event's name; the first of them that names
a known kind), so the SendRecv kernels NCCL runs for all_to_all count as all_to_all here; in CPU
mode the kind of the ``c10d::*`` call that issued the span, as the per-kind metrics have it (gloo
runs FSDP2's reduce-scatter as a ``gloo:all_reduce``: a reduce_scatter).

An operation's message size S is nccl-tests' (:mod:`overlapprof.analysis.records.sizes`), the
bytes of one rank's share multiplied by the group size where the trace only gives that
(all_gather sized from its input), once the group sizes are known (:func:`concat_operations`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from overlapprof.analysis.columns import Index, per_distinct
from overlapprof.analysis.records.sizes import bytes_of, total_bytes
from overlapprof.analysis.records.table import CommTable
from overlapprof.analysis.vocabulary import KINDS, comm_kind

DEFAULT_GROUP = "default"  # the process group of operations that name none


@dataclass
class CommOperations:
    """Logical operations as columns (one row per operation): one rank's, or all ranks' after
    :func:`concat_operations`. ``scaled``: ``nbytes`` is one rank's share (all_gather sized from its input's
    recorded shape) and becomes × the group size in :func:`concat_operations`."""

    rank: np.ndarray  # int64 (-1 until the rank is settled)
    kind: np.ndarray  # int8, index into vocabulary.KINDS
    group: np.ndarray  # int64, index into ``groups``
    groups: list[str]  # process group names (DEFAULT_GROUP: none recorded)
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
    issue: np.ndarray  # when it was issued (its host call; GPU: its first launch), own clock, µs
    need: np.ndarray  # when its result was needed (CommTable.need_ts; NaN: not known), own clock, µs
    thread: np.ndarray  # int64, the event's (pid, tid) code in its rank (GPU: its stream)

    def __len__(self) -> int:
        return self.rank.size

    def kind_of(self, row: int) -> str:
        return KINDS[self.kind[row]]

    def group_of(self, row: int) -> str:
        return self.groups[self.group[row]]


_COLUMNS = {
    "rank": np.int64, "kind": np.int8, "seq": np.int64, "direction": np.int8, "peer": np.int64, "ts": np.float64, "end": np.float64,
    "dur": np.float64, "nbytes": np.float64, "scaled": bool, "step": np.int64, "group_size": np.int64, "issue": np.float64,
    "need": np.float64, "thread": np.int64,
}


def _direction(texts) -> int:
    """1 send, 2 recv, 0 unknown: the first of the texts that says one of them."""
    for text in texts:
        if text:
            low = text.lower()
            send, recv = "send" in low, "recv" in low
            if send != recv:
                return 1 if send else 2
    return 0


def _kind(texts) -> str:
    """The first kind that is not "other" of the collective's name, the annotation, the event."""
    for text in texts:
        if text and (kind := comm_kind(text)) != "other":
            return kind
    return "other"


def _first_of_runs(mask: np.ndarray, *keys: np.ndarray) -> np.ndarray:
    """For each row where ``mask``: the first row (lowest index) with equal ``keys``; else itself."""
    owner = np.arange(mask.size)
    idx = np.flatnonzero(mask)
    if idx.size:
        order = idx[np.lexsort((idx, *(k[idx] for k in reversed(keys))))]
        new = np.ones(order.size, dtype=bool)
        new[1:] = np.logical_or.reduce([k[order[1:]] != k[order[:-1]] for k in keys])
        owner[order] = order[new][np.cumsum(new) - 1]
    return owner


# Table rows whose operation columns are made at once (rank_operations): the temporaries are per
# block (about 240 bytes an operation at once on the 300 MB generated trace, 2026-12-07).
OPS_BLOCK = 1 << 16


def _block_columns(table: CommTable, order: np.ndarray, group_ids: Index) -> dict[str, np.ndarray]:
    """The operation columns of the table's rows ``order`` (one per row, before merging), with
    what merging reads: ``by_seq``, ``raw_seq`` and ``call_ts``; ``group_ids``: the group
    names' codes, grown here."""
    v, n = table.values, order.size
    names, strings = v.names, v.strings
    text = lambda f, code: strings[f].values[code] if code >= 0 else None  # noqa: E731
    label = lambda code: names[code] if code >= 0 else None  # noqa: E731
    collective, annotation, name = table.strings["collective"][order], table.annotation[order], table.name[order]
    found, inverse = per_distinct(lambda c, a, e: KINDS.index(_kind((text("collective", c), label(a), label(e)))),
                                  collective, annotation, name)
    kind_code = np.array(found + [0], dtype=np.int8)[inverse]
    if table.source == "annotation":  # CPU mode: the kind of the call that issued the span (events.extract)
        kind_code = table.kind[order].astype(np.int8)
    p2p = kind_code == KINDS.index("send_recv")
    pg = table.strings["pg_name"][order]
    found, inverse = per_distinct(lambda c: group_ids[text("pg_name", c) or DEFAULT_GROUP], pg)
    group_code = np.array(found + [0], dtype=np.int64)[inverse]
    seq = table.numbers["seq"][order]
    by_seq = ~np.isnan(seq) & ~p2p
    found, inverse = per_distinct(lambda c, a, k, e: _direction((text("collective", c), label(a), label(k), label(e))),
                                  collective, annotation, table.call[order], name)
    direction = np.array(found + [0], dtype=np.int8)[inverse]
    peer = table.peer[order]
    dur = np.maximum(table.dur[order], 0.0)
    ts = table.ts[order].astype(np.float64)
    nelems = {k: np.where(np.isnan(table.numbers[k][order]), -1, table.numbers[k][order]).astype(np.int64)
              for k in ("in_nelems", "out_nelems")}
    found, inverse = per_distinct(
        lambda d, i, o, dims, types, k: bytes_of(text("dtype", d), i if i >= 0 else None, o if o >= 0 else None,
                                                 text("input_dims", dims), text("input_type", types), KINDS[k]),
        table.strings["dtype"][order], nelems["in_nelems"], nelems["out_nelems"], table.strings["input_dims"][order],
        table.strings["input_type"][order], kind_code,
    )
    nbytes = np.array([np.nan if b is None else b for b, _ in found] + [np.nan], dtype=np.float64)[inverse]
    scaled = np.array([s for _, s in found] + [False], dtype=bool)[inverse]
    ranks = table.strings["pg_ranks"][order]
    ranks_len = np.array([len(r) for r in strings["pg_ranks"].values] + [0], dtype=np.int64)[ranks]  # -1: the 0
    group_size = np.nan_to_num(table.numbers["group_size"][order], nan=0.0).astype(np.int64)
    cols = {
        "rank": np.full(n, -1, dtype=np.int64), "kind": kind_code, "group": group_code,
        "seq": np.where(by_seq, np.nan_to_num(seq, nan=-1), -1).astype(np.int64),
        "direction": np.where(p2p, direction, 0).astype(np.int8),
        "peer": np.nan_to_num(peer, nan=-1).astype(np.int64),
        "ts": ts, "end": ts + dur, "dur": dur,
        "nbytes": nbytes, "scaled": scaled,
        "step": table.step[order].astype(np.int64),
        "group_size": np.where(group_size != 0, group_size, ranks_len),
        "issue": np.fmin(table.issue_ts[order], ts), "need": table.need_ts[order].astype(np.float64),
        "thread": table.thread[order].astype(np.int64),
    }
    cols.update(by_seq=by_seq, raw_seq=seq, call_ts=table.call_ts[order])
    return cols


def rank_operations(table: CommTable) -> CommOperations:
    """One rank's logical operations, in time order (module docstring); ``rank`` is left -1.
    Each operation's columns are made :data:`OPS_BLOCK` of the table's rows at a time (the
    temporaries are per block), then the kernels of one operation merged."""
    order = np.argsort(table.ts, kind="stable")
    n = order.size
    group_ids = Index()  # codes in order of first appearance, block after block as in one pass
    cols = None
    for lo in range(0, max(n, 1), OPS_BLOCK):
        part = _block_columns(table, order[lo : lo + OPS_BLOCK], group_ids)
        if n <= OPS_BLOCK:
            cols = part
            break
        if cols is None:  # filled a block at a time, not joined at the end (see CommTable.filled)
            cols = {k: np.empty(n, dtype=v.dtype) for k, v in part.items()}
        for k, v in part.items():
            cols[k][lo : lo + OPS_BLOCK] = v
    del order
    by_seq, seq, call_ts = cols.pop("by_seq"), cols.pop("raw_seq"), cols.pop("call_ts")
    group_code = cols["group"]
    # Kernels of one host call (or one group + sequence number) become one operation.
    owner = _first_of_runs(by_seq, group_code, seq)
    by_call = ~by_seq & ~np.isnan(call_ts)
    owner = np.where(by_call, _first_of_runs(by_call, call_ts), owner)
    if (owner != np.arange(n)).any():
        keep = owner == np.arange(n)
        np.maximum.at(cols["end"], owner, cols["end"])
        np.fmax.at(cols["nbytes"], owner, cols["nbytes"])
        np.fmin.at(cols["issue"], owner, cols["issue"])
        np.fmax.at(cols["need"], owner, cols["need"])
        cols["dur"] = cols["end"] - cols["ts"]
        cols = {k: c[keep] for k, c in cols.items()}
    return CommOperations(**cols, groups=group_ids.order)


def concat_operations(parts: dict[int, CommOperations], group_sizes: dict[str, int]) -> CommOperations:
    """All ranks' operations (``parts`` by rank): rank column set, unknown group sizes taken from
    ``group_sizes``, scaled byte counts multiplied by the group size (unknown size: unknown bytes)."""
    ranks = sorted(parts)
    if len(ranks) == 1:  # one rank's columns, shared (not written to): one copy of its operations, not two
        cat = {n: np.asarray(getattr(parts[ranks[0]], n), dtype=t) for n, t in _COLUMNS.items()}
    else:
        cat = {n: np.concatenate([getattr(parts[r], n) for r in ranks]).astype(t) for n, t in _COLUMNS.items()}
    cat["rank"] = np.repeat(np.array(ranks, dtype=np.int64), [len(parts[r]) for r in ranks])
    names = Index()
    cat["group"] = np.concatenate(
        [np.array([names[g] for g in parts[r].groups] + [0], dtype=np.int64)[parts[r].group] for r in ranks])
    known = np.array([group_sizes.get(g, 0) for g in names.order] + [0], dtype=np.int64)[cat["group"]]
    cat["group_size"] = np.where(cat["group_size"] > 0, cat["group_size"], known)
    cat["nbytes"] = total_bytes(cat["nbytes"], cat["scaled"], cat["group_size"])
    return CommOperations(**cat, groups=names.order)
