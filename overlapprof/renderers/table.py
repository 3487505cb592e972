"""Plain-text tables of a Report: one row per rank (or step, or kind) and the cross-rank summary.

Plain aligned text (:func:`overlapprof.renderers.format.text_table`); numbers as
:mod:`overlapprof.renderers.format` writes them (times in ms with the unit in the header, ratios
as percentages, a missing value as ``-``).
"""

from __future__ import annotations

from overlapprof.renderers import advice_text
from overlapprof.renderers import causes_table
from overlapprof.renderers import collectives_table as ct
from overlapprof.renderers import interference_lines
from overlapprof.renderers import columns as C
from overlapprof.renderers import workload_metrics
from overlapprof.renderers.base import Renderer
from overlapprof.renderers.format import PLACEHOLDER, ms, percent, text_table
from overlapprof.report import Report

BY = ("rank", "step", "kind", "collective")


_MODES = {
    "gpu": "communication-library kernels (NCCL/RCCL, ...) vs other kernels, all streams pooled",
    "cpu": "c10d::* calls and <backend>:<op> annotations vs cpu_ops",
}


def _rank_rows(report: Report):
    header = C.heads(C.RANK)
    rows = [C.cells(C.RANK, r) for r in report.ranks]
    if report.crossrank is not None and any(r.matched_ops for r in report.crossrank.ranks):  # wait vs transfer
        header += C.heads(C.RANK_WAITS)
        rows = [row + ct.rank_cells(report, r.rank) for row, r in zip(rows, report.ranks)]
    return header, rows


def _step_rows(report: Report):
    causes = any(s.exposure is not None for r in report.ranks for s in r.steps)
    slowed = C.STEP_INTERFERENCE if interference_lines.step_columns(report) else ()
    step = C.step_columns([s for r in report.ranks for s in r.steps])
    header = ["rank", *C.heads(step), *C.heads(slowed),
              *(C.heads(C.EXPOSURE_CAUSES) + ["overlap bound ms"] if causes else [])]
    rows = [
        [str(r.rank), *C.cells(step, s), *C.cells(slowed, s),
         *(C.cells(C.EXPOSURE_CAUSES, s.exposure) + [ms(s.overlap_bound_us)] if causes else [])]
        for r in report.ranks
        for s in r.steps
    ]
    return header, rows


def _kind_rows(report: Report):
    causes = any(k.exposure is not None for r in report.ranks for k in r.kinds)
    header = ["rank", *C.heads(C.KIND), *(C.heads(C.EXPOSURE_CAUSES) if causes else [])]
    rows = [[str(r.rank), *C.cells(C.KIND, k), *(C.cells(C.EXPOSURE_CAUSES, k.exposure) if causes else [])]
            for r in report.ranks for k in r.kinds]
    return header, rows


def unmeasured_devices(report: Report) -> str | None:
    """The line that heads a report whose ranks' devices were not measured (device activity of
    categories OVERLAP.md does not classify, and none it does), saying what was measured
    instead; None when every device was (or there was none)."""
    ranks = [r for r in report.ranks if r.device_not_measured]
    if not ranks:
        return None
    cats = sorted({c for r in ranks for c in r.device_not_measured})
    events = sum(n for r in ranks for n in r.device_not_measured.values())
    which = f"rank {ranks[0].rank}'s device" if len(ranks) == 1 else f"the devices of ranks {', '.join(str(r.rank) for r in ranks)}"
    return (f"host activity only: {which} was not measured ({', '.join(cats)}: {events} events of categories OVERLAP.md "
            "does not classify); the numbers are the host's (CPU mode): cpu_ops as compute, c10d::* calls and "
            "<backend>:<op> annotations as communication")


def p2p_lines(report: Report) -> list[str]:
    """What is known of the async send/recv operations' ends (OVERLAP.md section 1), a line each
    for the sends cut at their matched receive's end and for the spans that are upper bounds."""
    ranks = [r for r in report.ranks if r.p2p is not None]
    cut = [f"rank {r.rank} {r.p2p.ends_from_peer}" for r in ranks if r.p2p.ends_from_peer]
    upper = [f"rank {r.rank} {r.p2p.upper_bound} ({ms(r.p2p.upper_bound_us)} ms)" for r in ranks if r.p2p.upper_bound]
    lines = []
    if cut:
        lines.append("async sends whose communication ends at the end of the receive matched to them (one its "
                     "thread waited for): " + ", ".join(cut))
    if upper:
        lines.append("upper bound: async send/recv spans that end at their wait(), and nothing shows when their "
                     "transfer ended (a receive its thread waited for, on the peer, would): " + ", ".join(upper))
    return lines


def summary_lines(report: Report) -> list[str]:
    """The cross-rank summary and the notes (modes, rank sources, filters, warnings)."""
    s = report.summary
    lines = []
    host_only = " (host activity only: see the first line)" if unmeasured_devices(report) else ""
    if s.ranks_with_comm:
        lines.append(
            f"overlap ratio{host_only}: pooled {percent(s.pooled_ratio)} (Σ overlapped / Σ comm over {s.ranks_with_comm} "
            f"rank{'s' if s.ranks_with_comm != 1 else ''}); min {percent(s.min_ratio)} (rank {s.min_ratio_rank}), "
            f"median {percent(s.median_ratio)}, max {percent(s.max_ratio)} (rank {s.max_ratio_rank})"
        )
        lines.append(
            f"exposed communication: {ms(s.exposed_comm_us)} ms in all; most on rank {s.most_exposed_rank} "
            f"({ms(s.most_exposed_us)} ms)"
        )
    else:
        lines.append(f"no communication found: overlap ratio is undefined ({PLACEHOLDER})")
    if report.crossrank is not None and any(r.matched_ops for r in report.crossrank.ranks):
        lines.append(f"wait, transfer: {ct.RANK_COLUMNS_NOTE}")
    if (straggler := ct.straggler_line(report)) is not None:
        lines.append(straggler)
    lines += causes_table.summary_lines(report)
    lines += p2p_lines(report)
    if s.median_step_us is not None:
        lines.append(f"step time: median {ms(s.median_step_us)} ms, p90 {ms(s.p90_step_us)} ms")
    for r in report.ranks:
        if (p := r.partition) is not None:
            step, *parts = C.PARTITION
            lines.append(f"rank {r.rank} {step.header} {step.cell(p)} {step.unit} = "
                         + " + ".join(f"{c.header} {c.cell(p)}" for c in parts) + f" {parts[-1].unit}")
    lines += workload_metrics.text_lines(report)
    modes = sorted({r.mode for r in report.ranks})
    sources = sorted({r.rank_source for r in report.ranks})
    lines.append(
        "mode: " + "; ".join(f"{m} ({_MODES[m]})" for m in modes) + f" · ranks from {', '.join(sources)}"
    )
    if report.options.comm_kernels:
        lines.append(f"extra comm kernels: {', '.join(report.options.comm_kernels)}")
    if report.options.comm_backends:
        lines.append(f"extra comm backends: {', '.join(report.options.comm_backends)}")
    lines.extend(f"filter {f}" for f in report.filters)
    if not report.filters:
        lines.append("window: whole trace (no step dropped, no event filtered; see OVERLAP.md)")
    lines.extend(f"warning: {w}" for w in report.warnings)
    return lines


def render(report: Report, by: str = "rank") -> str:
    """The report as a plain-text table: ``by`` is ``rank`` (default), ``step``, ``kind`` or
    ``collective`` (the cross-rank section: :mod:`overlapprof.renderers.collectives_table`)."""
    if by not in BY:
        raise ValueError(f"by must be one of {BY}, not {by!r}")
    if by == "collective":
        return ct.render(report)
    header, rows = {"rank": _rank_rows, "step": _step_rows, "kind": _kind_rows}[by](report)
    table = text_table(header, rows) if rows else f"(no {by}s to show)"
    why = causes_table.rank_table(report) if by == "rank" else None
    if why is not None:
        table += ("\n\nwhy exposed: each exposed µs has one cause, the first that holds (OVERLAP.md section 6); "
                  "late ranks: who was waited for, followed to the rank not waiting\n" + why)
    slowed = interference_lines.rank_table(report) if by == "rank" else None
    if slowed is not None:
        table += ("\n\nslowed while overlapped: compute run beside communication, per compute class its mean "
                  "duration inside / outside communication (OVERLAP.md section 6.4); net gain = overlapped - slowed\n"
                  + slowed)
    head = [line] if (line := unmeasured_devices(report)) else []
    if report.advice is not None and (first := advice_text.lead(report.advice)):
        head = [*first, "", *head]  # what to change first leads (a run directory the replay read)
    return "\n".join([*head, table, "", *summary_lines(report)]) + "\n"


class TableRenderer(Renderer):
    """A plain-text table: one row per rank, step or kind (--by), then the summary and the notes."""

    name = "table"
    extensions = ("txt",)
    shows_warnings = True

    def __init__(self, by: str = "rank"):
        self.by = by

    def render(self, report: Report) -> str:
        return render(report, by=self.by)
