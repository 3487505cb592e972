"""Across ranks: the cross-rank section of a Report (:class:`~overlapprof.report.CrossRank`).

``build_crossrank(inputs, align_clocks)`` takes each rank's
:class:`~overlapprof.analysis.crossrank.inputs.CrossRankInput` (its logical operations and
exposed-communication intervals), matches the operations across ranks
(:mod:`~overlapprof.analysis.crossrank.matching`), puts the ranks on a common clock
(:mod:`~overlapprof.analysis.crossrank.clocks`), measures waiting vs transferring
(:mod:`~overlapprof.analysis.crossrank.waits`) and bandwidth
(:mod:`~overlapprof.analysis.crossrank.bandwidth`), and assembles the section whose metrics
:mod:`overlapprof.report.crossrank` defines.
"""

from __future__ import annotations

import gc
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from overlapprof.analysis.columns import distinct_rows
from overlapprof.analysis.crossrank.bandwidth import bandwidth_rows, instance_sizes
from overlapprof.analysis.crossrank.clocks import domains_of, estimate_offsets
from overlapprof.analysis.crossrank.inputs import CrossRankInput
from overlapprof.analysis.crossrank.matching import Matched, match
from overlapprof.analysis.crossrank.waits import WARMUP_FACTOR, Measured, measure, named_straggler, rank_rows, stragglers
from overlapprof.analysis.rank.classify import KINDS
from overlapprof.analysis.records.operations import DEFAULT_GROUP, CommOperations, concat_operations
from overlapprof.report import ClockDomain, CollectiveInstance, CrossRank, KindMatch, ProcessGroup, Unmatched


def _groups(inputs: list[CrossRankInput]) -> tuple[dict[str, tuple[int | None, list[int] | None, str]], list[str]]:
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


def _clock(inputs: list[CrossRankInput], ops: CommOperations, align: bool):
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


def _row_shift(shift: dict[int, float], ops: CommOperations) -> np.ndarray:
    """Each operation's rank's shift (µs)."""
    by_rank = np.zeros(max(shift) + 1)
    by_rank[list(shift)] = list(shift.values())
    return by_rank[ops.rank]


@dataclass
class Matching:
    """What the section was measured from, for the causes of exposure
    (:mod:`overlapprof.analysis.exposure`): every rank's operations (``ops``), the instances
    (``matched``) and their measures (``measured``: waits, transfers, last ranks), ``row_shift``
    (µs added to each operation's own clock to put it on the common clock), ``shift`` (the same,
    per rank) and the clock label."""

    ops: CommOperations
    matched: Matched
    measured: Measured
    row_shift: np.ndarray
    shift: dict[int, float]
    clocks: str


def build_crossrank(inputs: list[CrossRankInput], align_clocks: bool = False,
                    matching_out: list | None = None) -> CrossRank | None:
    """The cross-rank section for these ranks (None when no rank has a communication operation).
    ``matching_out``: when a list, the :class:`Matching` is appended to it."""
    inputs = sorted((r for r in inputs if r.ops is not None), key=lambda r: r.rank)
    if not any(len(r.ops) for r in inputs):
        return None
    groups, notes = _groups(inputs)
    ops = concat_operations({r.rank: r.ops for r in inputs}, {g: s for g, (s, _, _) in groups.items() if s})
    domain_of, shift, clocks, shared, clock_notes, used = _clock(inputs, ops, align_clocks)
    notes += clock_notes
    present = {r.rank for r in inputs}
    if len(present) < 2:
        notes.append("one rank: no partner trace, so waits are unknown; transfer times are the rank's own "
                     "durations (upper bounds: they include any wait) and bandwidths lower bounds")
    row_shift = _row_shift(shift, ops)
    m = match(ops, present, shared, row_shift)
    start = ops.ts + row_shift
    # Skew, and send/recv measured at the receiver, need one clock: across unaligned hosts they are not.
    domain_index = {name: k for k, name in enumerate(sorted(set(domain_of.values())))}
    rank_domain = np.zeros(max(domain_of) + 1, dtype=np.int64)
    rank_domain[list(domain_of)] = [domain_index[d] for d in domain_of.values()]
    doms = rank_domain[ops.rank[m.rows]]
    one_clock = (np.maximum.reduceat(doms, m.bounds) == np.minimum.reduceat(doms, m.bounds)) if m.rows.size else []
    one_clock = np.ones(m.sizes.size, bool) if clocks != "unaligned" else np.asarray(one_clock, bool)
    x = measure(ops, m, start, one_clock)
    if matching_out is not None:
        matching_out.append(Matching(ops, m, x, row_shift, shift, clocks))
    origin = float(start.min())
    sizes = instance_sizes(ops, m, x)
    with _gc_paused():  # thousands of small lists kept: collections would only slow this down
        instances = _instances(ops, m, x, start - origin, one_clock, sizes)
    group_rows = _group_rows(groups, ops, present)
    straggler, evidence = named_straggler(x, ops, {g.name: (len(g.ranks_present), g.size) for g in group_rows})
    return CrossRank(
        clocks=clocks,
        time_origin_us=origin,
        domains=_domains(domain_of, shift, clocks, inputs, used),
        groups=group_rows,
        matching=[KindMatch(group=g, kind=k, method=meth, instances=c, unmatched_ops=u, note=note)
                  for g, k, meth, c, u, note in m.kind_methods],
        ranks=rank_rows(inputs, ops, x, shift, domain_of),
        stragglers=stragglers(x, ops),
        straggler=straggler,
        straggler_evidence=evidence,
        bandwidth=bandwidth_rows(ops, m, x, one_clock, sizes),
        instances=instances,
        unmatched=_unmatched(ops, m),
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


def _group_rows(groups, ops: CommOperations, present: set[int]) -> list[ProcessGroup]:
    out = []
    for code, name in sorted(enumerate(ops.groups), key=lambda kv: kv[1]):
        size, members, source = groups.get(name, (None, None, "unknown"))
        with_ops = set(ops.rank[ops.group == code].tolist())
        here = sorted(present & set(members)) if members else sorted(with_ops)
        out.append(ProcessGroup(name=name, size=size, ranks_present=here, complete=bool(size) and len(here) >= size, size_source=source))
    return out


@contextmanager
def _gc_paused():
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _instances(ops: CommOperations, m: Matched, x: Measured, starts: np.ndarray, one_clock, sizes) -> list[CollectiveInstance]:
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
            ops.kind[firsts].tolist(), ops.group[firsts].tolist(), m.methods, m.keys.tolist(), bounds, ends,
            x.transfer.tolist(), x.last_rank.tolist(), x.skew.tolist(), np.asarray(one_clock).tolist(), *sizes,
            ops.step[firsts].tolist(), x.warm.tolist())
    ]


def _unmatched(ops: CommOperations, m: Matched) -> list[Unmatched]:
    """Unmatched operations per rank × kind × reason: how many, and Σ their durations (µs, summed in
    the order matching met them)."""
    rows = m.unmatched_rows()
    if not rows.size:
        return []
    reason, reasons = m.unmatched_reasons()
    first, cell = distinct_rows(ops.rank[rows], ops.kind[rows], reason)
    counts = np.bincount(cell, minlength=first.size).tolist()
    us = np.bincount(cell, weights=ops.dur[rows], minlength=first.size).tolist()
    keys = [(rank, KINDS[kind], reasons[why]) for rank, kind, why in
            zip(ops.rank[rows[first]].tolist(), ops.kind[rows[first]].tolist(), reason[first].tolist())]
    return [Unmatched(rank=r, kind=k, count=counts[c], us=us[c], reason=why)
            for (r, k, why), c in sorted(zip(keys, range(first.size)))]
