"""What the compare, report, plot and view commands share: the analysis options, loading the
runs to compare, and writing an output file without ever touching a trace."""

from __future__ import annotations

import sys
from pathlib import Path

import click


def run_reading_options():
    """--allow-partial, --align-clocks, --no-comms: declared once, shared by analyze, compare,
    report and plot."""
    return [
        click.option("--no-comms", is_flag=True,
                     help="Skip the cross-rank analysis (matching, wait vs transfer, bandwidth): faster on traces "
                          "dense with communication."),
        click.option("--align-clocks", is_flag=True,
                     help="Align the clocks of different hosts (of every rank, when traces name no host) so that "
                          "matched collectives end together; the offsets are reported."),
        click.option("--allow-partial", is_flag=True,
                     help="Report the good ranks when some traces are bad (each bad one becomes a warning)."),
    ]


def reading_kwargs(kw: dict) -> dict:
    """The analyze() keywords of the shared reading options popped from a command's ``kw``."""
    return {"allow_partial": kw.pop("allow_partial"), "align_clocks": kw.pop("align_clocks"),
            "comms": not kw.pop("no_comms")}


def analysis_options(command):
    """The options that change how runs are read: --label, --comm-kernel, the HTA filters, -q."""
    for decorator in reversed([
        click.option("--label", "labels", multiple=True, metavar="NAME",
                     help="Name of each input, in order (default: run.json's variant, else the "
                          "input's name). Give one per input."),
        click.option("--comm-kernel", "comm_kernels", multiple=True, metavar="REGEX",
                     help="Also count kernels matching REGEX (any case) as communication. Repeatable."),
        click.option("--drop-last-step", is_flag=True,
                     help="Like HolisticTraceAnalysis: leave out events of each rank's last ProfilerStep."),
        click.option("--require-launch", is_flag=True,
                     help="Like HolisticTraceAnalysis: leave out GPU events whose launch is not in the trace."),
        *run_reading_options(),
        click.option("-q", "--quiet", is_flag=True, help="No progress or notes on stderr."),
    ]):
        command = decorator(command)
    return command


def fail(message) -> None:
    """The one-line error of a bad input: ``Error: ...`` on stderr, exit code 2."""
    click.echo(f"Error: {message}", err=True)
    sys.exit(2)


def note(message: str, quiet: bool = False) -> None:
    if not quiet:
        click.echo(f"overlapprof: {message}", err=True)


def load_comparison(paths, labels, comm_kernels, drop_last_step, require_launch, quiet, **reading):
    """The Comparison of the inputs (run directories, trace sets, saved reports or one saved
    comparison), the first as baseline; bad input ends the command (exit 2)."""
    from overlapprof.compare import compare, load_reports
    from overlapprof.errors import OverlapprofError

    if labels and len(labels) != len(paths):
        raise click.UsageError(f"{len(labels)} --label for {len(paths)} inputs; give one per input")

    def progress(k, n, path):
        if n > 1:
            note(f"analyzing {path} ({k + 1}/{n})", quiet)

    try:
        reports, saved_labels = load_reports(paths, progress=progress, comm_kernels=comm_kernels,
                                             drop_last_step=drop_last_step, require_launch=require_launch,
                                             **reading)
        return compare(reports, list(labels) or saved_labels)
    except OverlapprofError as exc:
        fail(exc)


def check_output(dest: Path, what: str, named: bool = True) -> None:
    """Refuse (exit 2) to write ``what`` over a trace, a run.json or a folder, into a folder that
    does not exist, or, when the user did not name the file (a default name), over any file."""
    from overlapprof.trace.discover import is_trace_file

    if dest.is_dir():
        example = dest / ("report.html" if what == "report" else "timeline.png")
        fail(f"{dest} is a folder; name the {what} file, e.g. -o {example}")
    if dest.name == "run.json" or is_trace_file(dest):
        fail(f"refusing to write the {what} over {dest}, which holds a run's data")
    if not named and dest.exists():
        fail(f"{dest} exists; name the output with -o to replace it")
    if not dest.parent.is_dir():
        fail(f"cannot write {dest}: folder {dest.parent} does not exist")


def write_output(dest: Path, data: str | bytes, what: str, quiet: bool, named: bool = True) -> None:
    """Write an output file (checked by :func:`check_output`) through a temporary file."""
    check_output(dest, what, named)
    tmp = dest.with_name(f".{dest.name}.tmp")
    try:
        tmp.write_bytes(data.encode() if isinstance(data, str) else data)
        tmp.replace(dest)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        fail(f"cannot write {dest}: {exc.strerror or exc}")
    note(f"{what} written to {dest}", quiet)


def after_run(runs) -> None:
    """The end of ``overlapprof run``: for each finished run ``(variant, run_dir)``, print its
    analysis table and write its TensorBoard scalars; with several variants, print their
    comparison (the first as baseline). A run that cannot be analyzed is a note on stderr."""
    from overlapprof import analyze
    from overlapprof.compare import compare
    from overlapprof.errors import OverlapprofError
    from overlapprof.renderers import compare_table, table
    from overlapprof.tensorboard import TensorBoardMissing, write_scalars

    reports, labels, scalars = [], [], True
    for variant, run_dir in runs:
        try:
            report = analyze([str(run_dir)])
        except OverlapprofError as exc:
            note(f"no analysis of {run_dir}: {exc}")
            continue
        click.echo(f"\n{variant}: {run_dir}\n{table.render(report)}", nl=False)
        reports.append(report)
        labels.append(variant)
        try:
            if scalars:
                write_scalars(report, run_dir)
        except TensorBoardMissing as exc:
            note(f"no TensorBoard scalars: {exc}")
            scalars = False
        except OverlapprofError as exc:
            note(str(exc))
    if len(reports) > 1:
        comparison = compare(reports, labels)  # its own warnings end its table
        click.echo(f"\ncomparison ({len(reports)} variants, baseline {labels[0]}):\n"
                   f"{compare_table.render(comparison, report_warnings=False)}", nl=False)
