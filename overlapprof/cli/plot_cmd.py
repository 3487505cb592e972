"""``overlapprof plot``: one chart as an image (PNG, SVG or PDF, from the file's suffix)."""

from __future__ import annotations

from pathlib import Path

import click

from overlapprof.cli.common import analysis_options, analyze_options, check_output, command, emit, fail, load_comparison

CHARTS = ("timeline", "exposure", "causes", "comparison", "straggler")


@command("plot")
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=str))
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True, metavar="FILE",
              help="The image to write: .png, .svg or .pdf (never inside a run directory).")
@click.option("--chart", type=click.Choice(CHARTS), default="timeline", show_default=True,
              help="timeline: one step per rank, compute and communication lanes (exposed spans coloured by "
                   "cause); exposure: exposed vs hidden communication per rank; causes: why communication is "
                   "exposed, per rank (one input) or per variant (two or more); comparison: the variants (two or "
                   "more inputs); "
                   "straggler: per rank, wait vs transfer in matched collectives and the wait caused "
                   "to others.")
@click.option("--dpi", type=click.IntRange(min=30, max=600), default=144, show_default=True,
              help="Resolution of a PNG.")
@analysis_options
def plot(paths, output, chart, dpi, labels, quiet, **kw):
    """Draw a chart of a run (a run directory, traces or a saved report) to an image file; the
    format comes from the file's suffix (.png, .svg, .pdf).

    With several inputs, the timeline and exposure charts show the first one; the comparison
    chart needs two or more (the first is the baseline).
    """
    from overlapprof.renderers import plots, straggler_plot

    if chart == "comparison" and len(paths) < 2:
        fail("--chart comparison needs at least two inputs")
    check_output(output, "plot")
    fmt = plots.format_of(output)
    comparison = load_comparison(paths, labels, quiet, analyze_options(kw))
    first, label = comparison.reports[0], comparison.variants[0].label
    if chart == "timeline":
        fig = plots.timeline_figure(first, title=f"{label}: one step per rank")
    elif chart == "exposure":
        fig = plots.exposure_figure(first, title=f"{label}: exposed vs hidden communication")
    elif chart == "causes":
        if len(paths) > 1:
            fig = plots.causes_figure([(v.label, v.exposure) for v in comparison.variants],
                                      title="Why communication is exposed, per variant")
        else:
            fig = plots.causes_figure([(f"rank {r.rank}", r.exposure) for r in first.ranks], unit="ms, whole trace",
                                      title=f"{label}: why communication is exposed, per rank")
    elif chart == "straggler":
        if first.crossrank is None and not first.options.crossrank:
            fail(f"{paths[0]}: no cross-rank section (--no-comms leaves it out), so no straggler chart")
        if not straggler_plot.has_chart(first):
            fail(f"{paths[0]}: no collective matched across ranks, so no straggler chart "
                 "(it needs traces of two or more ranks of one job)")
        fig = straggler_plot.straggler_figure(first, title=f"{label}: waiting vs transferring")
    else:
        fig = plots.comparison_figure(comparison)
    emit(plots.to_bytes(fig, fmt, dpi=dpi), output, "plot", quiet)
