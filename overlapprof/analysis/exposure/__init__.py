"""Why communication is exposed, and what overlap could buy (OVERLAP.md section 6).

:func:`explain` runs in the parent once the cross-rank section is built: it takes each rank's
:class:`~overlapprof.analysis.exposure.inputs.ExposureInput` (built where the rank was read) and
the :class:`~overlapprof.analysis.crossrank.section.Matching` (operations, waits, clocks), and
fills every RankReport's causes (:mod:`.causes`: per rank, step and kind, its timeline's
exposed spans by cause, per-operation windows when asked) and bounds (:mod:`.bounds`), the
cross-rank section's per-collective causes and the summary's. No torch, no launching side.
"""

from __future__ import annotations

import numpy as np

from overlapprof.analysis import intervals as iv
from overlapprof.analysis.columns import distinct_rows
from overlapprof.analysis.crossrank.bandwidth import bus_factor
from overlapprof.analysis.exposure import late as L
from overlapprof.analysis.exposure.bounds import Resources, overlap_bounds
from overlapprof.analysis.exposure.causes import RankOps, added, cause_sets, measure, pieces_of, whole
from overlapprof.analysis.exposure.inputs import ExposureInput
from overlapprof.analysis.rank.classify import KINDS
from overlapprof.analysis.rank.metrics import TIMELINE_CAP
from overlapprof.analysis.stats import median
from overlapprof.report import CrossRank, OperationWindow, RankReport, Report

__all__ = ["explain", "comm_free_bounds", "resources"]


def comm_free_bounds(report: RankReport) -> None:
    """``comm_free_bound_us`` = step − exposed communication, per step; the rank's median and
    ``comm_free_speedup``; ``hidden_of_hideable`` = overlapped / min(comm, compute)."""
    for s in report.steps:
        s.comm_free_bound_us = s.step_us - s.exposed_comm_us
    if report.steps:
        report.comm_free_bound_us = median([s.comm_free_bound_us for s in report.steps])
        if report.median_step_us and report.comm_free_bound_us:
            report.comm_free_speedup = report.median_step_us / report.comm_free_bound_us
    m = report.metrics
    hideable = min(m.comm_us, m.compute_us)
    report.hidden_of_hideable = m.overlapped_us / hideable if hideable > 0 else None


def resources(run: dict | None, reference_bps: float | None) -> tuple[Resources, float | None, int]:
    """The floors' resources from run.json, and the reference bandwidth for slow transfers
    (bytes/µs) with the number of ranks that share it (1: a rank's own; a ``--link-rate``
    medium: every rank of the run, each owed an even share when all transfer at once)."""
    link_rate = None
    hosts: dict[str, tuple[int, list[int]]] = {}
    if run:
        link = run.get("link") or {}
        if link.get("shared") and link.get("bits_per_s"):
            link_rate = float(link["bits_per_s"]) / 8 / 1e6
        if run.get("device") == "cpu":
            for node in (run.get("nodes") or {}).values():
                cores, host = node.get("cpu_cores"), node.get("host")
                ranks = sorted(int(k) for k, v in (run.get("ranks") or {}).items()
                               if v.get("node_rank") == node.get("node_rank"))
                if cores and ranks:
                    hosts[host or str(node.get("node_rank"))] = (int(cores), ranks)
    sharing = int(run.get("world_size") or 1) if link_rate is not None else 1
    if reference_bps:
        return Resources(link_rate, hosts), reference_bps / 1e6, sharing
    return Resources(link_rate, hosts), link_rate, sharing


def _rank_ops(matching, rank: int, ei: ExposureInput, slow: np.ndarray) -> RankOps:
    ops, x = matching.ops, matching.measured
    rows = np.flatnonzero(ops.rank == rank)
    # one run of rows, as concat_operations lays ranks out: the columns are views, not copies
    take = slice(int(rows[0]), int(rows[-1]) + 1) if rows.size and rows[-1] - rows[0] + 1 == rows.size else rows
    start, end = ops.ts[take], ops.end[take]
    issue = np.minimum(ops.issue[take], start)
    need = np.clip(np.where(np.isnan(ops.need[take]), end, ops.need[take]), issue, end)
    counted = (x.inst_of[take] >= 0) & ~x.op_warm[take]
    wait = np.where(counted, x.op_wait[take], 0.0)
    if ei.mode == "gpu":  # a stream runs its kernels in order
        _, channel = distinct_rows(ops.group[take], ops.thread[take])
    else:
        channel = ops.group[take]
    return RankOps(rows=rows, kind=ops.kind[take].astype(np.int64), channel=np.asarray(channel).ravel(), issue=issue,
                   start=start, end=end, need=need, wait=wait, transfer=x.transfer_of[take],
                   slack=iv.covered(ei.compute, issue, need), slow=slow[take], step=ops.step[take])


def _slow_shares(matching, ref: float | None, sharing: int) -> np.ndarray:
    """Per operation, the share of its own transfer beyond what its bus bytes (nccl-tests'
    busbw factor × size) need at ``ref`` / ``sharing`` bytes/µs; 0 where unknown."""
    ops, x = matching.ops, matching.measured
    out = np.zeros(len(ops))
    if ref is None or not len(ops):
        return out
    factors = np.array([1.0 if KINDS[k] == "send_recv" else (bus_factor(KINDS[k], int(g)) or np.nan)
                        for k, g in zip(ops.kind.tolist(), ops.group_size.tolist())])
    need = ops.nbytes * factors * sharing / ref
    ok = (x.transfer_of > 0) & ~np.isnan(need)
    out[ok] = np.clip(1.0 - need[ok] / x.transfer_of[ok], 0.0, 1.0)
    return out


def _late_pieces(matching, ops: dict[int, RankOps], inputs: dict[int, ExposureInput]) -> dict[int, L.Labelled]:
    """Each rank's wait pieces labelled ``late rank * 3 + activity``, on its own clock."""
    last = matching.measured.last_rank
    inst = matching.measured.inst_of
    first = {}
    for r, o in ops.items():
        has = o.wait > 0
        shift = matching.shift.get(r, 0.0)
        first[r] = L.claim(o.start[has] + shift, o.start[has] + o.wait[has] + shift, last[inst[o.rows[has]]])
    rooted = L.roots(first)
    common = {r: (e.compute[0] + matching.shift.get(r, 0.0), e.compute[1] + matching.shift.get(r, 0.0))
              for r, e in inputs.items()}
    comm = {r: (e.comm[0] + matching.shift.get(r, 0.0), e.comm[1] + matching.shift.get(r, 0.0))
            for r, e in inputs.items()}
    out = {}
    for r, pieces in rooted.items():
        s, e, lab = L.activities(pieces, common, comm)
        shift = matching.shift.get(r, 0.0)
        out[r] = (s - shift, e - shift, lab)
    return out


def _timeline(report: RankReport, sets, ei: ExposureInput) -> None:
    t = report.timeline
    if t is None or t.step is None:
        return
    k = next((k for k, s in enumerate(report.steps) if s.step == t.step), None)
    if k is None:
        return
    seg, starts, ends = ei.steps
    mine = seg == k
    out = {}
    for name, (a, b) in pieces_of(sets, (starts[mine], ends[mine])).items():
        out[name] = list(zip((a[:TIMELINE_CAP] - t.start_us).tolist(), (b[:TIMELINE_CAP] - t.start_us).tolist()))
    t.exposed_by_cause = out


def _operations(o: RankOps, matching, ei: ExposureInput) -> list[OperationWindow]:
    ops, x = matching.ops, matching.measured
    exposed = iv.covered(ei.exposed, o.start, o.end)
    nbytes = ops.nbytes[o.rows]
    out = []
    for i, row in enumerate(o.rows.tolist()):
        b = None if nbytes[i] != nbytes[i] else int(nbytes[i])
        slack = float(o.slack[i])
        out.append(OperationWindow(
            kind=KINDS[o.kind[i]], group=ops.groups[ops.group[row]], step=int(o.step[i]) if o.step[i] >= 0 else None,
            issue_us=float(o.issue[i]), start_us=float(o.start[i]), end_us=float(o.end[i]), need_us=float(o.need[i]),
            window_us=float(o.need[i] - o.issue[i]), slack_us=slack, wait_us=float(x.op_wait[row]),
            transfer_us=float(o.transfer[i]), exposed_us=float(exposed[i]), bytes=b,
            hide_gbps=b / slack / 1e3 if b is not None and slack > 0 else None))
    return out


def _by_collective(crossrank: CrossRank, o: RankOps, matching, pieces, ei: ExposureInput, parts: list,
                   reuse=None) -> None:
    """A rank's share of each bandwidth row's operations' exposed time by cause, appended to
    the row's list in ``parts``. ``reuse``: the rank's cause sets of every operation with no
    unowned communication, which are those of a row that holds every operation."""
    all_ops = matching.ops
    for row, mine in zip(crossrank.bandwidth, parts):
        code = KINDS.index(row.kind)
        nb = all_ops.nbytes[o.rows]
        size = all_ops.group_size[o.rows]
        mask = (o.kind == code) & (size == (row.group_size or 0)) & (
            np.isnan(nb) if row.bytes is None else nb == row.bytes)
        if not mask.any():
            continue
        domain = iv.difference(iv.union(o.start[mask], o.end[mask]), ei.compute)
        sets = reuse if reuse is not None and mask.all() else cause_sets(o, mask, pieces, ei.host_sync)
        mine.append(measure(sets, whole(domain), 1, False)[0])


def explain(report: Report, inputs: dict[int, ExposureInput], matching, run: dict | None,
            reference_bps: float | None, keep_operations: bool) -> list[str]:
    """Fill the causes and bounds of ``report``'s ranks (see the module docstring); returns
    notes on what was missing. ``reference_bps``: a reference bandwidth (bytes/s) for slow
    transfers, else the shared link of run.json."""
    for r in report.ranks:
        comm_free_bounds(r)
    if matching is None or not inputs:
        return ["causes of exposure and overlap bound: no communication operation was recorded and matched "
                "(--no-comms leaves them out)"] if any(r.metrics.comm_us > 0 for r in report.ranks) else []
    res, ref, sharing = resources(run, reference_bps)
    slow = _slow_shares(matching, ref, sharing)
    reports = {r.rank: r for r in report.ranks if r.rank in inputs}
    ops = {r: _rank_ops(matching, r, inputs[r], slow) for r in reports}
    pieces = _late_pieces(matching, ops, inputs)
    by_row = [[] for _ in report.crossrank.bandwidth] if report.crossrank is not None else None
    for r, rep in reports.items():
        o, ei = ops[r], inputs[r]
        everything = np.ones(len(o), dtype=bool)
        unowned = iv.difference(ei.comm, iv.union(np.minimum(o.issue, o.start), o.end))
        sets = cause_sets(o, everything, pieces[r], ei.host_sync, unowned)
        rep.exposure = measure(sets, whole(ei.exposed), 1, ref is not None)[0]
        for step, exposure in zip(rep.steps, measure(sets, ei.steps, len(rep.steps), ref is not None)):
            step.exposure = exposure
        for k in rep.kinds:
            code = KINDS.index(k.kind)
            mask = o.kind == code
            domain = ei.kinds.get(code, iv.EMPTY)
            # a kind of every operation has the rank's cause sets (one kind: made once)
            kind_sets = sets if mask.all() else cause_sets(o, mask, pieces[r], ei.host_sync, unowned)
            k.exposure = measure(kind_sets, whole(domain), 1, ref is not None)[0]
        _timeline(rep, sets, ei)
        if keep_operations:
            rep.operations = _operations(o, matching, ei)
        if by_row is not None:
            _by_collective(report.crossrank, o, matching, pieces[r], ei, by_row,
                           sets if unowned[0].size == 0 else None)
        del sets
    if by_row is not None:
        for row, parts in zip(report.crossrank.bandwidth, by_row):
            row.exposure = added(parts)
    report.summary.exposure = added([r.exposure for r in report.ranks if r.exposure is not None])
    windows = all(inputs[r].windows for r in reports)
    notes = overlap_bounds(reports, ops, {r: inputs[r].compute for r in reports}, matching, res, windows)
    if not windows:
        notes.append("causes: no CUDA event-sync record waits on a communication event: each operation's window "
                     "is taken to last until it ends, so no_window and window_short tell only whether compute ran "
                     "beside it")
    if ref is None:
        notes.append("slow transfer: no reference bandwidth (a --link-rate run, or --reference-bandwidth) to "
                     "tell a slow transfer from a long one")
    return notes
