"""The charts of ``overlapprof plot``: one renderer per chart, each an image (PNG, SVG or PDF) of a
Comparison drawn by :mod:`overlapprof.renderers.plots` or :mod:`overlapprof.renderers.straggler_plot`.

A chart of one run draws the Comparison's first report. A chart that cannot be drawn from what
the report holds raises InputError with the reason (the command names the input).
"""

from __future__ import annotations

from typing import ClassVar

from overlapprof.errors import InputError
from overlapprof.renderers.base import Renderer
from overlapprof.renderers.plots import FORMATS


class Chart(Renderer):
    """A chart as image bytes: ``fmt`` png, svg or pdf; ``dpi`` for a PNG."""

    subject = "comparison"
    binary = True
    extensions = FORMATS
    min_inputs: ClassVar[int] = 1
    """How many inputs (variants) the chart needs."""

    def __init__(self, fmt: str = "png", dpi: int = 144):
        self.fmt, self.dpi = fmt, dpi

    def figure(self, comparison):
        raise NotImplementedError

    def render(self, comparison) -> bytes:
        from overlapprof.renderers import plots

        return plots.to_bytes(self.figure(comparison), self.fmt, dpi=self.dpi)


def _first(comparison):
    return comparison.reports[0], comparison.variants[0].label


class TimelineChart(Chart):
    """One step per rank, compute and communication lanes (exposed spans coloured by cause)."""

    name = "timeline"

    def figure(self, comparison):
        from overlapprof.renderers import plots

        report, label = _first(comparison)
        return plots.timeline_figure(report, title=f"{label}: one step per rank")


class ExposureChart(Chart):
    """Exposed vs hidden communication per rank."""

    name = "exposure"

    def figure(self, comparison):
        from overlapprof.renderers import plots

        report, label = _first(comparison)
        return plots.exposure_figure(report, title=f"{label}: exposed vs hidden communication")


class CausesChart(Chart):
    """Why communication is exposed, per rank (one input) or per variant (two or more)."""

    name = "causes"

    def figure(self, comparison):
        from overlapprof.renderers import plots

        if len(comparison.variants) > 1:
            return plots.causes_figure([(v.label, v.exposure) for v in comparison.variants],
                                       title="Why communication is exposed, per variant")
        report, label = _first(comparison)
        return plots.causes_figure([(f"rank {r.rank}", r.exposure) for r in report.ranks], unit="ms, whole trace",
                                   title=f"{label}: why communication is exposed, per rank")


class ComparisonChart(Chart):
    """The variants (two or more inputs): step time and bounds, communication, compute."""

    name = "comparison"
    min_inputs = 2

    def figure(self, comparison):
        from overlapprof.renderers import plots

        return plots.comparison_figure(comparison)


class StragglerChart(Chart):
    """Per rank, wait vs transfer in matched collectives and the wait caused to others."""

    name = "straggler"

    def figure(self, comparison):
        from overlapprof.renderers import straggler_plot

        report, label = _first(comparison)
        if report.crossrank is None and not report.options.crossrank:
            raise InputError("no cross-rank section (--no-comms leaves it out), so no straggler chart")
        if not straggler_plot.has_chart(report):
            raise InputError("no collective matched across ranks, so no straggler chart "
                             "(it needs traces of two or more ranks of one job)")
        return straggler_plot.straggler_figure(report, title=f"{label}: waiting vs transferring")
