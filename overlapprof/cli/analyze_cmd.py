"""``overlapprof analyze``: overlap ratio and exposed communication of PyTorch profiler traces."""

from __future__ import annotations

from pathlib import Path

import click

from overlapprof.cli.common import (MEMORY_BUDGET, ProgressBar, analyze_options, command, reading_options,
                                    unwind_on_sigterm)
from overlapprof.cli.formats import emit_outputs, not_an_input, output_options, planned_outputs


def _cluster(address, scheduler_file, timeout, workers):
    """The DaskScheduler of the --dask-* options, or None (raises InputError on a bad combination)."""
    if address is None and scheduler_file is None:
        return None
    from overlapprof.analysis.engine.pool import DaskScheduler
    from overlapprof.errors import InputError

    if address is not None and scheduler_file is not None:
        raise InputError("give --dask-scheduler or --dask-scheduler-file, not both")
    if workers is not None:
        raise InputError("--workers is for local processes; with a Dask scheduler its workers run the ranks")
    return DaskScheduler(address=address, scheduler_file=scheduler_file, timeout=timeout)


@command("analyze", epilog="Exit codes: 0 success; 2 bad input, or an output path refused (one 'Error: ...' "
         "line on stderr); 1 the work failed on a Dask cluster, or no room for the events' files on disk; "
         "130 interrupted (Ctrl-C); 143 terminated (SIGTERM).")
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=str))
@click.option("--by", type=click.Choice(["rank", "step", "kind", "collective"]), default="rank", show_default=True,
              help="Rows of the table and CSV: one per rank, per ProfilerStep or per kind of communication; "
                   "collective: collectives matched across ranks (wait vs transfer, stragglers, bandwidth).")
@click.option("--json", "json_out", is_flag=False, flag_value="-", default=None, metavar="[FILE]",
              callback=not_an_input,
              help="The full report as JSON, to FILE or (alone, or '-') to stdout instead of the table.")
@click.option("--csv", "csv_out", is_flag=False, flag_value="-", default=None, metavar="[FILE]",
              callback=not_an_input,
              help="The --by rows as CSV, to FILE or (alone, or '-') to stdout instead of the table.")
@output_options("report")
@click.option("--comm-backend", "comm_backends", multiple=True, metavar="NAME",
              help="CPU mode: also count NAME:<op> annotations as communication (besides gloo, nccl, mpi, "
                   "ucc, xccl, hccl). Repeatable.")
@click.option("--comm-ops", is_flag=True,
              help="Keep one record per communication operation in the JSON report.")
@click.option("--like-hta", is_flag=True,
              help="Each rank's numbers exactly as HolisticTraceAnalysis 0.5.0's get_comm_comp_overlap computes "
                   "them (implies --drop-last-step --require-launch).")
@MEMORY_BUDGET
@click.option("--workers", type=click.IntRange(min=1), default=None, metavar="N",
              help="Processes that analyze ranks in parallel, or that decode the pieces of one large "
                   "trace file (default: one per CPU).")
@click.option("--dask-scheduler", metavar="tcp://HOST:PORT", default=None,
              help="Analyze the ranks on this Dask distributed cluster (pip install 'overlapprof[cluster]'); "
                   "with threads to spare, a large file's byte ranges too. The workers read the traces at "
                   "their paths: they must be on a filesystem every worker shares.")
@click.option("--dask-scheduler-file", type=click.Path(path_type=str), default=None, metavar="PATH",
              help="Like --dask-scheduler, with the address from the file that `dask scheduler "
                   "--scheduler-file`, dask-mpi or dask-jobqueue writes.")
@click.option("--dask-timeout", type=click.FloatRange(min=0, min_open=True), default=30.0, show_default=True,
              metavar="SECONDS", help="How long to wait for the Dask scheduler, then for its first worker.")
@reading_options
def analyze(paths, by, json_out, csv_out, comm_backends, comm_ops, like_hta, memory_budget, workers, dask_scheduler,
            dask_scheduler_file, dask_timeout, quiet, **kw):
    """Overlap ratio and exposed communication of PyTorch profiler traces.

    PATHS are trace files (.json or .json.gz, any name; Nsight Systems exports, .sqlite), folders
    of traces, or run directories of `overlapprof run`; a report saved with --json FILE is re-rendered. Numbers follow
    OVERLAP.md: the whole trace counts unless a filter option is given.
    """
    from overlapprof.report import Report
    from overlapprof.trace.discover import is_saved_report

    outputs = planned_outputs("report", json_out, csv_out, kw.pop("fmt"), kw.pop("output"))  # a refused path costs nothing
    if len(paths) == 1 and Path(paths[0]).is_file() and is_saved_report(Path(paths[0])):
        report = Report.load(paths[0])
    else:
        from overlapprof.analysis.analyzer import analyze_with_inputs

        cluster = _cluster(dask_scheduler, dask_scheduler_file, dask_timeout, workers)
        unwind_on_sigterm()
        progress = ProgressBar("analyzing ranks", quiet)
        try:
            analyzed = analyze_with_inputs(list(paths), analyze_options(
                kw, comm_backends=comm_backends, like_hta=like_hta, comm_ops=comm_ops, memory_budget=memory_budget,
                workers=workers, progress=progress, dask_scheduler=cluster))
        finally:
            progress.close()
        report = analyzed.report
        if cluster is None and report.run is not None:
            from overlapprof.analysis.advise import for_report

            report.advice = for_report(report, workers=workers, analyzed=analyzed)  # the text leads with it
    emit_outputs(outputs, report, quiet, report.warnings, by=by)
