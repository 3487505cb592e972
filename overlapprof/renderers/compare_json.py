"""The full Comparison as JSON (what ``Comparison.save`` writes and ``Comparison.load`` reads):
the variants' numbers first, then the Reports they come from."""

from __future__ import annotations

from overlapprof.renderers.base import Renderer
from overlapprof.report import Comparison


def render(c: Comparison, indent: int = 2) -> str:
    return c.to_json(indent=indent) + "\n"


class ComparisonJsonRenderer(Renderer):
    """The full comparison (numbers and the reports) as JSON."""

    name = "json"
    subject = "comparison"
    extensions = ("json",)

    def render(self, c: Comparison) -> str:
        return render(c)
