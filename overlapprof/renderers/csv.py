"""A Report as CSV: one row per rank, step or kind; raw numbers (µs, ratios as fractions).

A missing value (a ratio without communication) is an empty cell.
"""

from __future__ import annotations

import csv
import io

from overlapprof.renderers.base import Renderer
from overlapprof.renderers.causes_table import CSV_CAUSES, csv_values
from overlapprof.report import Metrics, Report, StepMetrics
from overlapprof.report.labels import labelled, of_rows

BY = ("rank", "step", "kind", "collective")
METRICS = tuple(label.name for label in labelled(Metrics))  # report.Metrics' labelled fields
SLOWED = ("slowed_us", "net_overlap_gain_us")  # OVERLAP.md section 6.4 (a rank's: its interference's)
RANK_BOUNDS = ("median_step_us", "comm_free_bound_us", "comm_free_speedup", "overlap_bound_us", "overlap_bound_speedup",
               "hidden_of_hideable")


def step_fields(steps: list) -> tuple[str, ...]:
    """The labelled fields of ``steps`` (StepMetrics, or a subclass with more) beside the metrics."""
    return tuple(label.name for label in of_rows(steps, StepMetrics) if label.name not in METRICS)


def _values(m, names) -> list:
    return ["" if (v := getattr(m, n)) is None else v for n in names]


def rows(report: Report, by: str = "rank") -> tuple[list[str], list[list]]:
    """The header and rows ``render`` writes."""
    if by == "rank":
        head = ["rank", "rank_source", "mode", *METRICS, "steps", "events", *CSV_CAUSES, *RANK_BOUNDS, *SLOWED]
        body = [[r.rank, r.rank_source, r.mode, *_values(r.metrics, METRICS), len(r.steps), r.events,
                 *csv_values(r.exposure), *_values(r, RANK_BOUNDS),
                 *(_values(r.interference, SLOWED) if r.interference is not None else [""] * len(SLOWED))]
                for r in report.ranks]
    elif by == "step":
        extra = ("start_us", *step_fields([s for r in report.ranks for s in r.steps]))
        bounds = ("comm_free_bound_us", "overlap_bound_us")
        head = ["rank", "step", *extra, *METRICS, *CSV_CAUSES, *bounds, *SLOWED]
        body = [[r.rank, s.step, *_values(s, extra), *_values(s, METRICS), *csv_values(s.exposure), *_values(s, bounds),
                 *_values(s, SLOWED)] for r in report.ranks for s in r.steps]
    elif by == "kind":
        head = ["rank", "kind", "count", *METRICS, *CSV_CAUSES]
        body = [[r.rank, k.kind, k.count, *_values(k, METRICS), *csv_values(k.exposure)] for r in report.ranks
                for k in r.kinds]
    elif by == "collective":  # the cross-rank section's bandwidth rows
        from overlapprof.renderers.collectives_table import csv_rows

        head, body = csv_rows(report)
    else:
        raise ValueError(f"by must be one of {BY}, not {by!r}")
    return head, body


def render(report: Report, by: str = "rank") -> str:
    """The report as CSV text (``by``: rank, step, kind or collective)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    head, body = rows(report, by)
    writer.writerow(head)
    writer.writerows(body)
    return out.getvalue()


class CsvRenderer(Renderer):
    """The --by rows as CSV, raw numbers (µs, ratios as fractions)."""

    name = "csv"
    extensions = ("csv",)

    def __init__(self, by: str = "rank"):
        self.by = by

    def render(self, report: Report) -> str:
        return render(report, by=self.by)
