"""Why communication is exposed, as text: the causes and bounds of a Report, rows and lines.

Read by the analyze table (:mod:`overlapprof.renderers.table`), ``--by collective`` and the CSV.
Definitions are those of :mod:`overlapprof.report.exposure` (OVERLAP.md section 6); times in ms.
"""

from __future__ import annotations

from collections import Counter

from overlapprof.renderers import columns as C
from overlapprof.renderers.format import count, factor, human_bytes, late_ranks, ms, text_table
from overlapprof.report import CAUSES, Report, held_fixed

CSV_CAUSES = [f"{c}_us" for c in CAUSES] + ["slow_transfer_us"]


def csv_values(exposure) -> list:
    """The causes (µs) and the slow-transfer overlay for a CSV row; empty cells without them."""
    if exposure is None:
        return [""] * len(CSV_CAUSES)
    return [getattr(exposure, f"{c}_us") for c in CAUSES] + \
        ["" if exposure.slow_transfer_us is None else exposure.slow_transfer_us]


def rank_table(report: Report) -> str | None:
    """One row per rank: its exposed communication by cause, who it waited for, its bounds."""
    ranks = [r for r in report.ranks if r.exposure is not None]
    if not ranks:
        return None
    slow = any(r.exposure.slow_transfer_us is not None for r in ranks)
    columns = (*C.RANK_CAUSES, *([C.SLOW_TRANSFER] if slow else []), *C.RANK_BOUNDS)
    head, rows = C.heads(columns), [C.cells(columns, r) for r in ranks]
    return text_table(head, rows)


def summary_lines(report: Report) -> list[str]:
    """The verdict (of the most exposed rank, with how many ranks share its kind), the bounds'
    form and what the causes could not see."""
    lines = []
    ranks = [r for r in report.ranks if r.verdict]
    if ranks:
        worst = report.rank(report.summary.most_exposed_rank) if report.summary.most_exposed_rank is not None else ranks[0]
        worst = worst if worst.verdict else ranks[0]
        kinds = Counter(r.verdict.split(":")[0] for r in ranks)
        kind = worst.verdict.split(":")[0]
        lines.append(f"verdict ({kinds[kind]} of {len(ranks)} ranks {kind}; rank {worst.rank}, the most exposed): "
                     f"{worst.verdict}")
        others = ", ".join(f"{k} on {n}" for k, n in kinds.items() if k != kind)
        if others:
            lines.append(f"  other ranks: {others}")
    stepped = [r for r in report.ranks if r.comm_free_bound_us is not None and r.median_step_us]
    if stepped:
        r = stepped[0] if report.summary.most_exposed_rank is None else next(
            (x for x in stepped if x.rank == report.summary.most_exposed_rank), stepped[0])
        lines.append(f"bounds (rank {r.rank}, medians per step): step {ms(r.median_step_us)} ms; comm-free "
                     f"{ms(r.comm_free_bound_us)} ms ({factor(r.comm_free_speedup)}: the ceiling of any "
                     f"communication fix); overlap {ms(r.overlap_bound_us)} ms ({factor(r.overlap_bound_speedup)}: "
                     f"what overlap could buy within {held_fixed(r.overlap_bound_form)})")
    lines.extend(f"note: {n}" for n in report.exposure_notes)
    return lines


def collective_table(report: Report) -> str | None:
    """``--by collective``: each kind × size's operations' exposed time by cause, over ranks."""
    c = report.crossrank
    rows = [b for b in (c.bandwidth if c is not None else []) if b.exposure is not None]
    if not rows:
        return None
    head = ["kind", "n", "bytes", "exposed ms", *C.heads(C.EXPOSURE_CAUSES), "late ranks (ms)"]
    body = [[b.kind, count(b.group_size), human_bytes(b.bytes), ms(b.exposure.total_us()), *C.cells(C.EXPOSURE_CAUSES, b.exposure),
             late_ranks(b.exposure)] for b in rows]
    return text_table(head, body)
