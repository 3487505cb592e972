"""``--by collective``: the cross-rank section of a Report as plain-text tables (and CSV rows).

One row per process group × kind × message size (medians over its matched instances), then one
row per rank (wait vs transfer, who waited for whom), the stragglers, warm-up operations,
unmatched operations and how matching and clocks were done. Definitions are those of
:mod:`overlapprof.report.crossrank`; times in ms, bandwidths in GB/s (GB = 1e9 bytes).
"""

from __future__ import annotations

from overlapprof.renderers import columns as C
from overlapprof.renderers.format import (
    RANK_SUMS,
    TRANSFER_RULE,
    WAIT_RULE,
    PLACEHOLDER, count, factor, ms, percent, rank_list, text_table, times,
)
from overlapprof.report import Report


def rank_cells(report: Report, rank: int) -> list[str]:
    """wait ms, transfer ms and wait share of a rank, for the per-rank summary table."""
    c = report.crossrank
    try:
        r = c.rank(rank) if c is not None else None
    except KeyError:
        r = None
    if r is None or not r.matched_ops:
        return [PLACEHOLDER] * len(C.RANK_WAITS)
    return C.cells(C.RANK_WAITS, r)


RANK_COLUMNS_NOTE = ("time in matched collectives, within the rank's comm (in flight at once counted once): "
                     "wait ms + transfer ms <= comm ms, the rest in no matched operation (warm-up, unmatched); "
                     "wait share = wait ms / comm ms")


STRAGGLER_RULE = ("a straggler is named only when, over the matched instances of groups with a trace of every rank "
                  "(warm-up left out), it caused at least half of the waiting, at least twice what any other rank "
                  "caused, and caused most of the waiting in more than half of the steps with waiting")


def straggler_line(report: Report) -> str | None:
    """One line naming the straggler (the rank the others waited for), or saying there is no
    clear one, with the evidence, for the summary; None without matched instances."""
    c = report.crossrank
    if c is None or not any(r.matched_ops for r in c.ranks):
        return None
    details = " · `--by collective` for details"
    if c.straggler_evidence is None:  # a report saved before the rule: as it was then
        if not c.stragglers:
            return None
        s = c.stragglers[0]
        return (f"straggler: rank {s.rank} (others waited {ms(s.caused_wait_us)} ms for it, {percent(s.share)} of "
                f"all waiting; arrived last {times(s.last_arrivals)}){details}")
    if c.straggler is None:
        return f"straggler: no clear straggler ({c.straggler_evidence}){details}"
    caused = next((s.caused_wait_us for s in c.stragglers if s.rank == c.straggler), 0.0)
    return f"straggler: rank {c.straggler} (the others waited {ms(caused)} ms for it; it {c.straggler_evidence}){details}"


def detail_lines(report: Report) -> list[str]:
    """Stragglers, warm-up, unmatched operations, groups, matching, clocks and notes."""
    c = report.crossrank
    lines = []
    for s in c.stragglers:
        lines.append(f"waited for: rank {s.rank} caused {ms(s.caused_wait_us)} ms of others' waiting "
                     f"({percent(s.share)}), arrived last {times(s.last_arrivals)}")
    if (line := straggler_line(report)) is not None:
        lines.append(line.split(" · ")[0])
        if c.straggler_evidence is not None:
            lines.append(f"rule: {STRAGGLER_RULE}")
    for w in c.warmups:
        lines.append(f"warm-up: rank {w.rank}'s first {w.kind} took {ms(w.transfer_us)} ms, {factor(w.factor)} the "
                     f"median {ms(w.median_us)} ms (communicator set-up): left out of the numbers above")
    for u in c.unmatched:
        lines.append(f"unmatched: rank {u.rank}: {u.count} {u.kind} ({ms(u.us)} ms): {u.reason}")
    for g in c.groups:
        size = f"{len(g.ranks_present)} of {g.size}" if g.size else f"{len(g.ranks_present)} of an unknown number of"
        state = "complete" if g.complete else "incomplete: waits for absent ranks are unknown"
        lines.append(f"group {g.name}: {size} ranks have traces ({state}; size from {g.size_source})")
    methods = ", ".join(f"{m.kind} {m.method} ({m.instances} matched, {m.unmatched_ops} unmatched)" for m in c.matching)
    lines.append(f"matching: {methods}")
    if c.clocks == "aligned":
        offsets = ", ".join(f"{d.name} {ms(d.offset_us, signed=True)} ms ({d.instances} collectives)" for d in c.domains)
        lines.append(f"clocks: aligned on matched collectives' ends: {offsets}")
    else:
        lines.append(f"clocks: {c.clocks}: " + "; ".join(f"{d.name}: ranks {rank_list(d.ranks)}" for d in c.domains))
    lines.extend(f"note: {n}" for n in c.notes)
    return lines


def render(report: Report) -> str:
    """The --by collective text: bandwidth table, per-rank table, then the details."""
    if report.crossrank is None:
        text = "(no communication operations to match)" if report.options.crossrank else \
            "(cross-rank analysis off: --no-comms)"
        return "\n".join([text, *(f"warning: {w}" for w in report.warnings)]) + "\n"
    parts = [
        f"collectives: medians per kind and size ({TRANSFER_RULE}; {WAIT_RULE})",
        text_table(C.heads(C.BANDWIDTH), [C.cells(C.BANDWIDTH, b) for b in report.crossrank.bandwidth])
        if report.crossrank.bandwidth else "(none)",
        "",
        f"ranks: wait vs transfer ({RANK_SUMS})",
        text_table(C.heads(C.CROSSRANK_RANK), [C.cells(C.CROSSRANK_RANK, r) for r in report.crossrank.ranks]),
        "",
        *_causes(report),
        *detail_lines(report),
        *(f"warning: {w}" for w in report.warnings),
    ]
    return "\n".join(parts) + "\n"


def _causes(report: Report) -> list[str]:
    from overlapprof.renderers.causes_table import collective_table

    table = collective_table(report)
    if table is None:
        return []
    return ["why exposed: the operations of each kind and size, exposed time by cause summed over ranks "
            "(operations in flight at once each count)", table, ""]


def csv_rows(report: Report) -> tuple[list[str], list[list]]:
    """Raw numbers (µs, bytes, GB/s) of the bandwidth rows for CSV; empty cells for unknowns."""
    from overlapprof.renderers.causes_table import CSV_CAUSES, csv_values

    head = ["kind", "group_size", "bytes", "count", "median_transfer_us", "median_wait_us", "median_skew_us",
            "algbw_gbps", "busbw_gbps", "bus_factor", "method", "transfer"]
    if report.crossrank is None:
        return head + CSV_CAUSES, []
    return head + CSV_CAUSES, [["" if (v := getattr(b, h)) is None else v for h in head] + csv_values(b.exposure)
                               for b in report.crossrank.bandwidth]
