"""``overlapprof plot``: one chart as an image (PNG, SVG or PDF, from the file's suffix)."""

from __future__ import annotations

from pathlib import Path

import click

from overlapprof.cli.common import analysis_options, analyze_options, check_output, command, emit, fail, load_comparison
from overlapprof.cli.formats import ListedOption, RendererChoice

_COUNTS = {2: "two", 3: "three"}


@command("plot")
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=str))
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True, metavar="FILE",
              help="The image to write: .png, .svg or .pdf (never inside a run directory).")
@click.option("--chart", type=RendererChoice("comparison", binary=True), cls=ListedOption, default="timeline",
              show_default=True, help="The chart:")
@click.option("--dpi", type=click.IntRange(min=30, max=600), default=144, show_default=True,
              help="Resolution of a PNG.")
@analysis_options
def plot(paths, output, chart, dpi, labels, quiet, **kw):
    """Draw a chart of a run (a run directory, traces or a saved report) to an image file; the
    format comes from the file's suffix (.png, .svg, .pdf).

    With several inputs, the timeline and exposure charts show the first one; the comparison
    chart needs two or more (the first is the baseline).
    """
    from overlapprof.errors import InputError
    from overlapprof.renderers import get, plots

    renderer = get(chart, "comparison", binary=True)
    if len(paths) < renderer.min_inputs:
        fail(f"--chart {chart} needs at least {_COUNTS.get(renderer.min_inputs, renderer.min_inputs)} inputs")
    check_output(output, "plot")
    fmt = plots.format_of(output)
    comparison = load_comparison(paths, labels, quiet, analyze_options(kw))
    try:
        image = renderer(fmt=fmt, dpi=dpi).render(comparison)
    except InputError as exc:  # what the first input lacks for this chart
        fail(f"{paths[0]}: {exc}")
    emit(image, output, "plot", quiet)
