"""``overlapprof compare``: variants side by side, the first as baseline."""

from __future__ import annotations

from pathlib import Path

import click

from overlapprof.cli.common import analysis_options, analyze_options, command, fail, load_comparison
from overlapprof.cli.formats import emit_outputs, not_an_input, output_options, planned_outputs


@command("compare")
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=str))
@click.option("--json", "json_out", is_flag=False, flag_value="-", default=None, metavar="[FILE]",
              callback=not_an_input,
              help="The full comparison (numbers and the reports) as JSON, to FILE or (alone, or '-') "
                   "to stdout instead of the table.")
@click.option("--csv", "csv_out", is_flag=False, flag_value="-", default=None, metavar="[FILE]",
              callback=not_an_input,
              help="One row per variant as CSV, to FILE or (alone, or '-') to stdout instead of the table.")
@click.option("--prediction", type=click.Path(path_type=str), default=None, metavar="FILE",
              help="A prediction saved by `whatif --json FILE`: shown next to each variant that is not its traced run.")
@output_options("comparison")
@analysis_options
def compare(paths, json_out, csv_out, prediction, labels, quiet, **kw):
    """Compare runs: step time, communication, exposed communication, overlap ratio and compute
    per variant, and against the first (the baseline): speedup, exposed communication saved,
    compute slowdown. Each variant has two bounds: the comm-free bound (step - exposed
    communication: the step if communication cost nothing) and the overlap bound (the shortest
    step overlap could give, holding the run's compute and its windows, or transfers, fixed). The
    baseline's overlap bound is the prediction for the others: step / predicted, and the share of
    what overlap could buy, or, for a variant below a bound, what it changed.

    PATHS are run directories of `overlapprof run`, folders or files of traces (one variant
    each), saved reports (`analyze --json FILE`), or one saved comparison (`compare --json FILE`).
    Values are per-step medians when the traces have ProfilerSteps, else whole-trace values.
    """
    from overlapprof.trace.discover import is_saved_comparison

    if len(paths) < 2 and not (Path(paths[0]).is_file() and is_saved_comparison(Path(paths[0]))):
        fail("give at least two runs to compare (the first is the baseline)")
    outputs = planned_outputs("comparison", json_out, csv_out, kw.pop("fmt"), kw.pop("output"))  # a refused path costs nothing
    saved = None
    if prediction is not None:
        from overlapprof.analysis.replay.predict import load_prediction

        saved = load_prediction(prediction)
    comparison = load_comparison(paths, labels, quiet, analyze_options(kw))
    if saved is not None:
        from overlapprof.analysis.replay.predict import beside

        comparison.predictions = beside(saved, comparison.variants)
    emit_outputs(outputs, comparison, quiet, comparison.warnings)
    if comparison.predictions and not any(o.dest == "-" and o.renderer.name != "table" for o in outputs):
        from overlapprof.renderers.whatif_table import beside as lines

        click.echo(lines(comparison.predictions), nl=False)
