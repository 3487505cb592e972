"""The full Report as JSON (the same text ``Report.save`` writes and ``Report.load`` reads)."""

from __future__ import annotations

from overlapprof.renderers.base import Renderer
from overlapprof.report import Report


def render(report: Report, indent: int = 2) -> str:
    """The report as JSON text, every field included (µs, ratios as fractions, None as null)."""
    return report.to_json(indent=indent) + "\n"


class JsonRenderer(Renderer):
    """The full report as JSON (what --json writes and a command reads back)."""

    name = "json"
    extensions = ("json",)

    def render(self, report: Report) -> str:
        return render(report)
