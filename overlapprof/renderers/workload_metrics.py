"""The workload's own metrics (``ctx.metric``; Report.workload_metrics, VariantStats.workload_metrics)
as the analyze table, the comparison table and the HTML page show them."""

from __future__ import annotations

from overlapprof.renderers.format import metric, rank_list
from overlapprof.report import Comparison, Report

HEAD = ["workload metric", "steps", "values", "median", "min", "max", "by rank (median)"]


def rows(report: Report) -> list[list[str]]:
    """One row per metric, cells as in ``HEAD``."""
    return [[m.name, m.steps, str(m.count), metric(m.median), metric(m.min), metric(m.max),
             ", ".join(f"{r}: {metric(v)}" for r, v in m.by_rank.items())] for m in report.workload_metrics]


def text_lines(report: Report) -> list[str]:
    """The analyze table's lines: one per metric."""
    return [f"workload metric {m.name}: median {metric(m.median)} (min {metric(m.min)}, max {metric(m.max)}; "
            f"{m.count} values from {'profiled' if m.steps == 'profiled' else 'all'} steps of ranks "
            f"{rank_list(list(m.by_rank))})" for m in report.workload_metrics]


def names(c: Comparison) -> list[str]:
    """Every metric name of the compared variants, in order of appearance."""
    return list(dict.fromkeys(name for v in c.variants for name in v.workload_metrics))


def compare_rows(c: Comparison) -> list[tuple[str, object]]:
    """The comparison table's rows (a heading, then one per metric: each variant's median)."""
    if not names(c):
        return []
    rows: list[tuple[str, object]] = [("workload metrics (ctx.metric), median:", None)]
    for name in names(c):
        rows.append((f"  {name}", lambda v, name=name: metric(v.workload_metrics.get(name))))
    return rows
