"""A Report as CSV: one row per rank, step or kind; raw numbers (µs, ratios as fractions).

A missing value (a ratio without communication) is an empty cell.
"""

from __future__ import annotations

import csv
import io

from overlapprof.report import Report

BY = ("rank", "step", "kind", "collective")
METRICS = ("comm_us", "compute_us", "overlapped_us", "exposed_comm_us", "overlap_ratio", "memory_us")


def _values(m, names) -> list:
    return ["" if (v := getattr(m, n)) is None else v for n in names]


def rows(report: Report, by: str = "rank") -> tuple[list[str], list[list]]:
    """The header and rows ``render`` writes."""
    if by == "rank":
        head = ["rank", "rank_source", "mode", *METRICS, "steps", "events"]
        body = [[r.rank, r.rank_source, r.mode, *_values(r.metrics, METRICS), len(r.steps), r.events] for r in report.ranks]
    elif by == "step":
        extra = ("start_us", "step_us", "exposed_share")
        head = ["rank", "step", *extra, *METRICS]
        body = [[r.rank, s.step, *_values(s, extra), *_values(s, METRICS)] for r in report.ranks for s in r.steps]
    elif by == "kind":
        head = ["rank", "kind", "count", *METRICS]
        body = [[r.rank, k.kind, k.count, *_values(k, METRICS)] for r in report.ranks for k in r.kinds]
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
