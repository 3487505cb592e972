"""Across ranks: waiting vs transferring, stragglers, bandwidth and warm-up (the ``comms`` section).

``compute_comms(inputs, align_clocks)`` takes each rank's communication operations (and its
exposed-communication intervals, for the exposed share of waiting), matches them across ranks
(:mod:`overlapprof.analysis.matching`), puts the ranks on a common clock
(:mod:`overlapprof.analysis.clocks`) and computes the metrics defined in
:mod:`overlapprof.analysis.comms`. Everything after matching is numpy over all operations at
once (``reduceat`` over instances, ``bincount`` over ranks).
"""

from __future__ import annotations

import gc
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field

import msgspec
import numpy as np

from overlapprof.analysis import intervals as iv
from overlapprof.analysis.bandwidth import bus_factor, gbps
from overlapprof.analysis.clocks import UNKNOWN_HOST, domains_of, estimate_offsets
from overlapprof.analysis.comm_ops import CommTable, Index
from overlapprof.analysis.comm_records import distinct_rows
from overlapprof.analysis.comms import (
    BandwidthRow,
    ClockDomain,
    CollectiveInstance,
    Comms,
    GroupComms,
    KindMatch,
    RankComms,
    Straggler,
    Unmatched,
    WarmupOp,
)
from overlapprof.analysis.classify import KINDS
from overlapprof.analysis.matching import DEFAULT_GROUP, Matched, Ops, concat, match, rank_ops
from overlapprof.analysis.stats import median
from overlapprof.trace.decode import TraceFile

WARMUP_FACTOR = 10.0  # a first op this many times the kind's median transfer is warm-up
WARMUP_MIN_OTHERS = 2  # ... judged only against at least this many other ops of its kind
OWN_DURATION = "own duration (upper bound)"


@dataclass
class RankInput:
    """One rank's share of the cross-rank analysis (built by the analyzer from a worker's result).

    ``base_us``: the trace's ``baseTimeNanoseconds`` / 1000 (``ts + base_us`` is its host clock).
    ``pg_ranks``: process group name -> member ranks (``distributedInfo.pg_config``).
    ``ops``: the rank's logical operations (:func:`~overlapprof.analysis.matching.rank_ops`);
    ``op_groups``: what they say of their groups, name -> (size, ranks, source); ``unnamed``:
    whether some carry no group name. ``exposed``: U(comm) \\ U(compute) of the rank (OVERLAP.md),
    on its own ``ts`` clock. Built in the worker that read the rank (small: numpy columns).
    """

    rank: int
    ops: Ops | None = None
    host: str | None = None
    base_us: float = 0.0
    world_size: int | None = None
    pg_ranks: dict[str, list[int]] = field(default_factory=dict)
    op_groups: dict[str, tuple] = field(default_factory=dict)
    unnamed: bool = False
    exposed: iv.Intervals = iv.EMPTY
    exposed_comm_us: float = 0.0

    def attach(self, table: CommTable, exposed: iv.Intervals, exposed_comm_us: float) -> None:
        """Add the rank's operations (as logical-operation columns) and exposed communication."""
        self.ops = rank_ops(table)
        self.exposed, self.exposed_comm_us = exposed, exposed_comm_us
        if not len(table):
            return
        pg, ranks = table.strings["pg_name"], table.strings["pg_ranks"]
        self.unnamed = bool((pg < 0).any())
        size = np.nan_to_num(table.numbers["group_size"], nan=0.0).astype(np.int64)
        # What the operations say of their groups: the first that lists the ranks, else the first
        # with a size (in order, so only the first operation of each distinct combination counts).
        first, _ = distinct_rows(pg, ranks, size)
        strings = table.values.strings
        for code, ranks_code, group_size in zip(pg[first].tolist(), ranks[first].tolist(), size[first].tolist()):
            name = (strings["pg_name"].values[code] if code >= 0 else None) or DEFAULT_GROUP
            members = strings["pg_ranks"].values[ranks_code] if ranks_code >= 0 else None
            if members and self.op_groups.get(name, (0, None))[1] is None:
                self.op_groups[name] = (len(members), members, "Process Group Ranks")
            elif group_size and name not in self.op_groups:
                self.op_groups[name] = (group_size, None, "Group size")


class _ProcessGroup(msgspec.Struct):
    pg_name: str | int
    ranks: list[int]


_PG_CONFIG = msgspec.json.Decoder(list[_ProcessGroup])


def rank_input(traces: list[TraceFile], base_ns: int | None) -> RankInput:
    """A rank's host, clock base and process groups from its decoded trace files (the operations
    and exposed intervals are filled in later). Odd values are ignored, never fatal."""
    host, pg_ranks = None, {}
    for t in traces:
        if host is None and t.host_name:
            try:
                host = msgspec.json.decode(t.host_name, type=str) or None
            except (msgspec.DecodeError, msgspec.ValidationError):
                pass
        if t.distributedInfo is not None and t.distributedInfo.pg_config:
            try:
                groups = _PG_CONFIG.decode(t.distributedInfo.pg_config)
            except (msgspec.DecodeError, msgspec.ValidationError):
                groups = []
            pg_ranks.update({str(g.pg_name): g.ranks for g in groups})
    return RankInput(rank=-1, host=host, base_us=base_ns / 1000 if base_ns else 0.0, pg_ranks=pg_ranks)


def _groups(inputs: list[RankInput]) -> tuple[dict[str, tuple[int | None, list[int] | None, str]], list[str]]:
    """Each group's (size, member ranks, where the size came from), and notes."""
    known: dict[str, tuple[int | None, list[int] | None, str]] = {}
    for r in inputs:
        for name, ranks in r.pg_ranks.items():
            known.setdefault(name, (len(ranks), ranks, "distributedInfo.pg_config"))
        for name, info in r.op_groups.items():
            if info[1] is not None or name not in known:
                known[name] = info
    world = max((r.world_size for r in inputs if r.world_size), default=None)
    if DEFAULT_GROUP not in known:
        known[DEFAULT_GROUP] = (world, list(range(world)) if world else None, "world_size") if world else (None, None, "unknown")
    notes = []
    configured = {n for r in inputs for n in r.pg_ranks}
    if any(r.unnamed for r in inputs) and len(configured) > 1:
        notes.append(
            f"the trace lists {len(configured)} process groups but its operations carry no group name: they are "
            "matched within the default group (wrong if subgroups of fewer ranks were used)"
        )
    return known, notes


def _clock(inputs: list[RankInput], ops: Ops, align: bool):
    """(domain per rank, per-rank shift µs, clocks label, clock shared for matching?, notes,
    instances used per domain by the alignment)."""
    domain_of = domains_of({r.rank: r.host for r in inputs}, align)
    base = min(r.base_us for r in inputs)
    shift = {r.rank: r.base_us - base for r in inputs}
    names = set(domain_of.values())
    if len(names) == 1:
        note = ["--align-clocks: every rank is on one clock (one host): nothing to align"] if align and len(inputs) > 1 else []
        return domain_of, shift, "shared", True, note, {}
    if not align:
        return domain_of, shift, "unaligned", False, [
            f"{len(names)} hosts and clocks not aligned: matched by order; skew across hosts is not shown "
            "(--align-clocks estimates offsets)"
        ], {}
    rows_shift = _row_shift(shift, ops)
    first = match(ops, set(shift), False, rows_shift)
    ends = ops.end + rows_shift
    offsets, used, notes = estimate_offsets(
        ((ops.kind_of(i[0]), ops.rank[i].tolist(), ends[i].tolist()) for i in first.instances()), domain_of
    )
    for r in shift:
        shift[r] += offsets[domain_of[r]]
    return domain_of, shift, "aligned", True, notes, used


def _row_shift(shift: dict[int, float], ops: Ops) -> np.ndarray:
    """Each operation's rank's shift (µs)."""
    by_rank = np.zeros(max(shift) + 1)
    by_rank[list(shift)] = list(shift.values())
    return by_rank[ops.rank]


def _warmup(ops: Ops, inst_of: np.ndarray, transfer_of_row: np.ndarray) -> tuple[np.ndarray, list[WarmupOp]]:
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


def _median(values) -> float | None:
    return median(values) if len(values) else None


@dataclass
class _Measured:
    """Per-instance and per-operation arrays of the metrics (module docstring of comms).

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


def _measure(ops: Ops, m: Matched, start: np.ndarray) -> _Measured:
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
    else:
        transfer = skew = np.empty(0)
        last_rank = np.empty(0, dtype=np.int64)
    op_warm, warmups = _warmup(ops, inst_of, transfer_of)
    warm = np.zeros(sizes.size, dtype=bool)
    warm[inst_of[op_warm & (inst_of >= 0)]] = True
    wait = np.bincount(ids, weights=op_wait[rows], minlength=sizes.size)
    return _Measured(rows, ids, bounds, transfer, skew, last_rank, wait, warm, inst_of, transfer_of, op_wait,
                     op_warm, warmups)


def compute_comms(inputs: list[RankInput], align_clocks: bool = False) -> Comms | None:
    """The comms section for these ranks (None when no rank has a communication operation)."""
    inputs = sorted((r for r in inputs if r.ops is not None), key=lambda r: r.rank)
    if not any(len(r.ops) for r in inputs):
        return None
    groups, notes = _groups(inputs)
    ops = concat({r.rank: r.ops for r in inputs}, {g: s for g, (s, _, _) in groups.items() if s})
    domain_of, shift, clocks, shared, clock_notes, used = _clock(inputs, ops, align_clocks)
    notes += clock_notes
    present = {r.rank for r in inputs}
    if len(present) < 2:
        notes.append("one rank: no partner trace, so waits are unknown; transfer times are the rank's own "
                     "durations (upper bounds: they include any wait) and bandwidths lower bounds")
    row_shift = _row_shift(shift, ops)
    m = match(ops, present, shared, row_shift)
    start = ops.ts + row_shift
    x = _measure(ops, m, start)
    # Skew needs one clock: across unaligned hosts it is left out.
    domain_index = {name: k for k, name in enumerate(sorted(set(domain_of.values())))}
    rank_domain = np.zeros(max(domain_of) + 1, dtype=np.int64)
    rank_domain[list(domain_of)] = [domain_index[d] for d in domain_of.values()]
    doms = rank_domain[ops.rank[x.rows]]
    one_clock = (np.maximum.reduceat(doms, x.bounds) == np.minimum.reduceat(doms, x.bounds)) if x.rows.size else []
    one_clock = np.ones(m.sizes.size, bool) if clocks != "unaligned" else one_clock
    origin = float(start.min())
    sizes = _instance_sizes(ops, m, x)
    with _gc_paused():  # thousands of small lists kept: collections would only slow this down
        instances = _instances(ops, m, x, start - origin, one_clock, sizes)
    return Comms(
        clocks=clocks,
        time_origin_us=origin,
        domains=_domains(domain_of, shift, clocks, inputs, used),
        groups=_group_rows(groups, ops, present),
        matching=[KindMatch(group=g, kind=k, method=meth, instances=c, unmatched_ops=u, note=note)
                  for g, k, meth, c, u, note in m.kind_methods],
        ranks=_rank_rows(inputs, ops, x, shift, domain_of),
        stragglers=_stragglers(x),
        bandwidth=_bandwidth(ops, m, x, one_clock, sizes),
        instances=instances,
        unmatched=_unmatched(ops, m.unmatched),
        warmups=x.warmups,
        warmup_factor=WARMUP_FACTOR,
        notes=notes + [f"{g} {k}: {note}" for g, k, _, _, _, note in m.kind_methods if note],
    )


def _domains(domain_of, shift, clocks, inputs, used) -> list[ClockDomain]:
    by = defaultdict(list)
    for r, d in domain_of.items():
        by[d].append(r)
    base = {r.rank: r.base_us for r in inputs}
    lowest = min(base.values())
    return [
        ClockDomain(name=d, ranks=sorted(rs), instances=used.get(d, 0),
                    offset_us=float(shift[min(rs)] - (base[min(rs)] - lowest)) if clocks == "aligned" else 0.0)
        for d, rs in sorted(by.items(), key=lambda kv: min(kv[1]))
    ]


def _group_rows(groups, ops: Ops, present: set[int]) -> list[GroupComms]:
    out = []
    for code, name in sorted(enumerate(ops.groups), key=lambda kv: kv[1]):
        size, members, source = groups.get(name, (None, None, "unknown"))
        with_ops = set(ops.rank[ops.group == code].tolist())
        here = sorted(present & set(members)) if members else sorted(with_ops)
        out.append(GroupComms(name=name, size=size, ranks_present=here, complete=bool(size) and len(here) >= size, size_source=source))
    return out


def _caused(x: _Measured, nranks: int) -> tuple[np.ndarray, np.ndarray]:
    """Per rank: the others' wait in the non-warm-up instances where it was last, and how many."""
    keep = ~x.warm
    return (np.bincount(x.last_rank[keep], weights=x.wait[keep], minlength=nranks),
            np.bincount(x.last_rank[keep], minlength=nranks))


def _rank_rows(inputs: list[RankInput], ops: Ops, x: _Measured, shift, domain_of) -> list[RankComms]:
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
        out.append(RankComms(
            rank=k, host=None if domain_of[k] == UNKNOWN_HOST else r.host,
            clock_offset_us=float(shift[k]) - (r.base_us - lowest), ops=int(ops_n[k]), matched_ops=int(matched[k]),
            unmatched_ops=int(unmatched_n[k]), unmatched_us=float(unmatched_us[k]), wait_us=float(wait[k]),
            transfer_us=float(transfer[k]), exposed_wait_us=exposed_wait, exposed_comm_us=r.exposed_comm_us,
            wait_share=exposed_wait / r.exposed_comm_us if r.exposed_comm_us > 0 and matched[k] else None,
            last_arrivals=int(last_count[k]), caused_wait_us=float(caused[k]),
            warmup_ops=int(warm_n[k]), warmup_us=float(warm_us[k]),
        ))
    return out


def _stragglers(x: _Measured) -> list[Straggler]:
    """Ranks that made others wait, most first; ``share`` of all (non-warm-up) waiting."""
    nranks = int(x.last_rank.max()) + 1 if x.last_rank.size else 0
    caused, last_count = _caused(x, nranks)
    total = float(x.wait[~x.warm].sum())
    return [Straggler(rank=r, caused_wait_us=float(caused[r]), share=float(caused[r]) / total if total > 0 else 0.0,
                      last_arrivals=int(last_count[r]))
            for r in np.argsort(-caused, kind="stable").tolist() if caused[r] > 0]


@contextmanager
def _gc_paused():
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _instance_sizes(ops: Ops, m: Matched, x: _Measured) -> tuple[list, list]:
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


def _instances(ops: Ops, m: Matched, x: _Measured, starts: np.ndarray, one_clock, sizes) -> list[CollectiveInstance]:
    """One CollectiveInstance per matched instance; ``starts``: op starts on the common clock,
    relative to the time origin; ``sizes``: :func:`_instance_sizes`."""
    bounds = m.bounds.tolist()
    ends = (m.bounds + m.sizes).tolist()
    firsts = m.rows[m.bounds]
    ranks, start_list, durations = ops.rank[m.rows].tolist(), starts[m.rows].tolist(), ops.dur[m.rows].tolist()
    return [
        CollectiveInstance(
            kind=KINDS[kind], group=ops.groups[group], method=method, key=key, ranks=ranks[b:e],
            starts_us=start_list[b:e], durations_us=durations[b:e], transfer_us=transfer, last_rank=last,
            skew_us=skew if clock else None, bytes=nb, group_size=n, step=step if step >= 0 else None, warmup=warm,
        )
        for kind, group, method, key, b, e, transfer, last, skew, clock, nb, n, step, warm in zip(
            ops.kind[firsts].tolist(), ops.group[firsts].tolist(), m.methods, m.keys, bounds, ends,
            x.transfer.tolist(), x.last_rank.tolist(), x.skew.tolist(), np.asarray(one_clock).tolist(), *sizes,
            ops.step[firsts].tolist(), x.warm.tolist())
    ]


def _bandwidth(ops: Ops, m: Matched, x: _Measured, one_clock, sizes) -> list[BandwidthRow]:
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


def _unmatched(ops: Ops, unmatched: dict[int, str]) -> list[Unmatched]:
    cells = defaultdict(lambda: [0, 0.0])
    for row, reason in unmatched.items():
        cell = cells[(int(ops.rank[row]), ops.kind_of(row), reason)]
        cell[0] += 1
        cell[1] += float(ops.dur[row])
    return [Unmatched(rank=r, kind=k, count=c, us=us, reason=why) for (r, k, why), (c, us) in sorted(cells.items())]
