"""``overlapprof whatif``: predict the step of a changed run from the traces of this one."""

from __future__ import annotations

import click

from overlapprof.cli.common import check_output, command, export_options, export_reading, fail, unwind_on_sigterm
from overlapprof.cli.formats import Output, emit_outputs


@command("whatif")
@click.argument("run", type=click.Path(path_type=str))
@click.option("--set", "changes", multiple=True, metavar="NAME=VALUE[,NAME=VALUE]",
              help="A change to predict (repeat for several; commas combine changes into one): link_rate=4gbit, "
                   "bandwidth=x2, compute=x0.5, no_straggler=R, async=KIND (or KIND@end), bucket_cap_mb=N (DDP), "
                   "prefetch=N (FSDP), micro_batches=N (a pipeline), no_host_sync (every barrier removed).")
@click.option("--check", "check", type=click.Path(path_type=str), default=None, metavar="RUN2",
              help="The run that made the (one) change: compare the prediction with its measured step.")
@click.option("--reference-bandwidth", "reference_bandwidth", default=None, metavar="RATE",
              help="The bandwidth the transfer model takes where the trace has too few sizes to fit (e.g. 25GB/s).")
@click.option("--json", "json_out", is_flag=False, flag_value="-", default=None, metavar="[FILE]",
              help="The result as JSON, to FILE or (alone, or '-') to stdout instead of the text.")
@click.option("--workers", type=int, default=None, help="Processes that read the traces (default: the cores).")
@export_options
@click.option("-q", "--quiet", is_flag=True, help="No notes on stderr.")
def whatif(run, changes, check, reference_bandwidth, json_out, workers, step_range, rank_map, quiet):
    """Replay the traced steps of RUN (a run directory or traces) with each change, and print per
    change the predicted step (median, with the 2.5-97.5th percentile of the replayed steps), the
    speedup against the traced run, the causes of exposure after it and what then limits the step.
    With nothing changed the replay gives the traced step back; its error is printed first.
    """
    from overlapprof.analysis.replay.predict import whatif as predict
    from overlapprof.renderers import get

    if not changes:
        fail("give at least one change with --set NAME=VALUE")
    outputs = [Output(get("json", "whatif"), json_out)] if json_out else []
    if json_out != "-":
        outputs.append(Output(get("table", "whatif"), "-"))
    for o in outputs:
        check_output(o.dest, o.renderer.name)
    unwind_on_sigterm()
    result = predict([run], list(changes), reference_bandwidth=reference_bandwidth, check=check, workers=workers,
                     reading=export_reading(step_range, rank_map))
    emit_outputs(outputs, result, quiet, [])
