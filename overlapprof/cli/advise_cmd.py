"""``overlapprof advise``: what to change first and what it buys, from the traces of one run."""

from __future__ import annotations

import click

from overlapprof.cli.common import check_output, command, emit, export_options, export_reading, note, unwind_on_sigterm


@command("advise")
@click.argument("run", type=click.Path(path_type=str))
@click.option("--json", "json_out", is_flag=False, flag_value="-", default=None, metavar="[FILE]",
              help="The advice as JSON, to FILE or (alone, or '-') to stdout instead of the text.")
@click.option("--top", type=click.IntRange(min=1), default=None, metavar="K",
              help="At most K changes (and with --verify, the K to rerun; default: all, and 1 for --verify).")
@click.option("--verify", is_flag=True,
              help="Rerun the workload (a run of `overlapprof run`) with the top change(s), one at a time and "
                   "together, and print predicted against realized; for your own job, the change and the command "
                   "that checks it.")
@click.option("--reference-bandwidth", "reference_bandwidth", default=None, metavar="RATE",
              help="The bandwidth the transfer model takes where the trace has too few sizes to fit (e.g. 25GB/s).")
@click.option("--workers", type=int, default=None, help="Processes that read the traces (default: the cores).")
@export_options
@click.option("-q", "--quiet", is_flag=True, help="No progress on stderr.")
def advise(run, json_out, top, verify, reference_bandwidth, workers, step_range, rank_map, quiet):
    """The changes that would shorten RUN's step, ranked: each in your terms (a workload option, a
    DDP/FSDP argument, a line of code to move), the cause it removes, its predicted step and saving
    (on top of the changes above it) with an interval, and what the prediction assumed. Predicted
    by replaying RUN's traced steps (`overlapprof whatif`).
    """
    from pathlib import Path

    from overlapprof.analysis.advise import advise as make, own_job, predicted
    from overlapprof.report.advice import Verification
    from overlapprof.renderers.advice_text import render

    check_output(json_out, "json")
    unwind_on_sigterm()
    result = make([run], top=top, workers=workers, reference_bandwidth=reference_bandwidth,
                  reading=export_reading(step_range, rank_map))
    if verify:
        if not result.items:
            result.verification = Verification(traced_step_us=result.traced_step_us,
                                               note="nothing to verify: the advice has no change to make")
        elif result.workload is None:
            result.verification = own_job(result, run, top or 1)
        else:
            from overlapprof.launch.verify import verify as rerun

            result.verification = rerun(Path(run), result.changes(), top=top or 1, out=None,
                                        progress=lambda line: note(line, quiet))
            predicted([run], result.verification, workers)
    if json_out:
        emit(result.to_json() + "\n", json_out, "json", quiet)
    if json_out != "-":
        click.echo(render(result), nl=False)
