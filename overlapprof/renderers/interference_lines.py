"""Compute slowed by communication beside it, as text: a Report's interference (OVERLAP.md
section 6.4, :mod:`overlapprof.report.interference`), a row per rank and its most overlapped
compute classes. Read by the analyze table (:mod:`overlapprof.renderers.table`); times in ms."""

from __future__ import annotations

from overlapprof.renderers import columns as C
from overlapprof.renderers.format import PLACEHOLDER, factor, ms, text_table
from overlapprof.report import Report

SHOWN_CLASSES = 3  # per rank, the most overlapped ones


def _class(c) -> str:
    samples = f"n={c.inside} in/{c.outside} out"
    if c.factor is None:
        return f"{c.name} {PLACEHOLDER} (too few spans: {samples})"
    return f"{c.name} {factor(c.factor)} ({samples}, {ms(c.slowed_us)} ms slowed)"


def rank_table(report: Report) -> str | None:
    """One row per rank with communication overlapped: overlapped, slowed, net gain, the time of
    classes too few spans measured; then per rank its most overlapped classes and factors."""
    ranks = [r for r in report.ranks if r.interference is not None and r.metrics.overlapped_us > 0]
    if not ranks:
        return None
    lines = [text_table(C.heads(C.RANK_INTERFERENCE), [C.cells(C.RANK_INTERFERENCE, r) for r in ranks])]
    for r in ranks:
        shown = r.interference.classes[:SHOWN_CLASSES]
        if shown:
            lines.append(f"rank {r.rank}: " + "; ".join(_class(c) for c in shown))
    return "\n".join(lines)


def step_columns(report: Report) -> bool:
    """Whether a step table shows the slowed and net-gain columns."""
    return any(s.slowed_us is not None for r in report.ranks for s in r.steps)
