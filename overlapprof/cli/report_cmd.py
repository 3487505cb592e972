"""``overlapprof report``: one self-contained HTML page with tables and plots."""

from __future__ import annotations

from pathlib import Path

import click

from overlapprof.cli.common import analysis_options, analyze_options, check_output, command, emit, load_comparison, note

DEFAULT_OUT = "report.html"


@command("report")
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=str))
@click.option("-o", "--output", type=click.Path(path_type=Path), default=None, metavar="FILE",
              help=f"The HTML file to write (default: ./{DEFAULT_OUT}, never over an existing file; "
                   "a file named here is replaced; never inside a run directory).")
@click.option("--prediction", type=click.Path(path_type=str), default=None, metavar="FILE",
              help="A prediction saved by `whatif --json FILE`: shown next to each run that is not its traced run.")
@analysis_options
def report(paths, output, prediction, labels, quiet, **kw):
    """Write ONE self-contained HTML page (no network needed to open it) about one or more runs:
    the summary tables, a per-rank timeline of one step, exposed vs hidden communication per
    rank, the variant comparison (with several runs, the first as baseline) and each run's
    metadata.

    PATHS are run directories, folders or files of traces (one run each), saved reports, or one
    saved comparison.
    """
    from overlapprof.renderers import get

    named = output is not None
    dest = output if named else Path(DEFAULT_OUT)
    check_output(dest, "report", named)
    saved = None
    if prediction is not None:
        from overlapprof.analysis.replay.predict import load_prediction

        saved = load_prediction(prediction)
    comparison = load_comparison(paths, labels, quiet, analyze_options(kw), advice=True)  # the page leads with it
    if saved is not None:
        from overlapprof.analysis.replay.predict import beside

        comparison.predictions = beside(saved, comparison.variants)
    for warning in comparison.warnings:
        note(f"warning: {warning}", quiet)
    note("drawing the plots", quiet)
    emit(get("html", "comparison")().render(comparison), dest, "report", quiet, named)
