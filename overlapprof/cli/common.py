"""What the commands share: the one error path, the options that change how runs are read,
loading the runs to compare, and writing an output (through :mod:`overlapprof.renderers.outputs`)."""

from __future__ import annotations

import click

# The "Exit codes" paragraph of each command's help.
EXIT_CODES_READING = ("Exit codes: 0 success; 2 bad input, or an output path refused (one 'Error: ...' "
                      "line on stderr); 1 no room for the events' files on disk; 130 interrupted (Ctrl-C); "
                      "143 terminated (SIGTERM).")
EXIT_CODES_PLAIN = ("Exit codes: 0 success; 2 bad input, or an output path refused (one 'Error: ...' "
                    "line on stderr); 130 interrupted (Ctrl-C).")

MEMORY_BUDGET = click.option(
    "--memory-budget", "memory_budget", default=None, metavar="SIZE",
    help="Memory each rank process keeps the trace's rows in while measured (e.g. 512MB, 4GB; 0: every row on "
         "disk). Past it the rest go to $TMPDIR (about 15% of the JSON's size), a time bucket at a time: the same "
         "report; memory then grows with the operations, not the events. A rank that fits touches no disk. "
         "Default: 1GiB.")


class CommandError(click.ClickException):
    """The one way a command ends on an error: ``Error: <message>`` (one line) on stderr and
    ``exit_code`` (2: bad input; 1: the command's work failed; 130: interrupted)."""

    def __init__(self, message, exit_code: int = 2):
        super().__init__(" ".join(str(message).split("\n")))
        self.exit_code = exit_code

    def show(self, file=None) -> None:
        click.echo(f"Error: {self.format_message()}", err=True)


class OneLineErrors:
    """Mixed into every command and the group: the library's OverlapprofError, click's usage
    errors and Ctrl-C become a :class:`CommandError`, so each ends the same way."""

    def make_context(self, info_name, args, parent=None, **extra):
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.UsageError as exc:
            raise _converted(exc) from None

    def invoke(self, ctx):
        from overlapprof.errors import OverlapprofError

        try:
            return super().invoke(ctx)
        except click.UsageError as exc:
            raise _converted(exc) from None
        except OverlapprofError as exc:  # bad input (2), unless the error says the work failed
            raise CommandError(exc, getattr(exc, "exit_code", 2)) from None
        except Terminated:
            raise CommandError("terminated", 143) from None
        except KeyboardInterrupt:
            raise CommandError("interrupted", 130) from None


class Terminated(KeyboardInterrupt):
    """SIGTERM (a job scheduler's), raised where the work is, so that it unwinds as Ctrl-C does:
    temporary files removed, worker processes ended."""


def unwind_on_sigterm() -> None:
    """Make SIGTERM raise :class:`Terminated` in this (the main) thread, for the commands that
    analyze traces."""
    import signal
    import threading

    def terminated(signum, frame):
        raise Terminated

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, terminated)


def _converted(exc: click.UsageError) -> click.ClickException:
    if isinstance(exc, click.exceptions.NoArgsIsHelpError):
        return exc  # `overlapprof` alone prints the help
    where = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
    return CommandError(f"{exc.format_message()}{where}", exc.exit_code)


class Command(OneLineErrors, click.Command):
    """A subcommand with the one error path."""


def command(name: str, epilog: str = EXIT_CODES_READING, **settings):
    """``@click.command`` for a subcommand: the one error path, and its exit codes in its help."""
    return click.command(name=name, cls=Command, epilog=epilog, **settings)


def fail(message, exit_code: int = 2):
    """End the command: ``Error: <message>`` on stderr, exit ``exit_code``."""
    raise CommandError(message, exit_code)


def note(message: str, quiet: bool = False) -> None:
    if not quiet:
        click.echo(f"overlapprof: {message}", err=True)


class ProgressBar:
    """Progress over ranks: a click progress bar on stderr when it is a terminal (created on the
    first report), else nothing, so a log file gets no line per rank (1,000 ranks, 1,000 lines).
    Called as ``progress(done, total, name)``."""

    def __init__(self, label: str, quiet: bool = False):
        import sys

        self.label = label
        self.enabled = not quiet and sys.stderr.isatty()
        self.bar = None

    def __call__(self, done: int, total: int, name) -> None:
        if not self.enabled or total < 2:
            return
        if self.bar is None:
            import sys

            self.bar = click.progressbar(length=total, label=self.label, file=sys.stderr)
            self.bar.__enter__()
        from pathlib import Path

        self.bar.update(1, Path(str(name)).name)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.__exit__(None, None, None)
            self.bar = None


def reading_options(command):
    """The options that change how traces are read, shared by analyze, compare, report and plot:
    --comm-kernel, the HTA filters, --no-comms, --align-clocks, --cycle, --allow-partial,
    --reference-bandwidth, -q."""
    for decorator in reversed([
        click.option("--comm-kernel", "comm_kernels", multiple=True, metavar="REGEX",
                     help="Also count kernels matching REGEX (any case) as communication. Repeatable."),
        click.option("--drop-last-step", is_flag=True,
                     help="Like HolisticTraceAnalysis: leave out events of each rank's last ProfilerStep."),
        click.option("--require-launch", is_flag=True,
                     help="Like HolisticTraceAnalysis: leave out GPU events whose launch is not in the trace."),
        click.option("--no-comms", is_flag=True,
                     help="Skip the cross-rank analysis (matching, wait vs transfer, bandwidth): faster on traces "
                          "dense with communication."),
        click.option("--align-clocks", is_flag=True,
                     help="Align the clocks of different hosts (of every rank, when traces name no host) so that "
                          "matched collectives end together; the offsets are reported."),
        click.option("--cycle", type=click.IntRange(min=1), default=None, metavar="N",
                     help="Only each rank's N-th profiler cycle (1: the first), of a run recorded with --repeat or "
                          "of a folder of tensorboard_trace_handler files whose processes saved several (default: "
                          "every cycle, each rank's together)."),
        click.option("--allow-partial", is_flag=True,
                     help="Report the good ranks when some traces are bad (each bad one becomes a warning)."),
        click.option("--reference-bandwidth", metavar="RATE", default=None,
                     help="The bus bandwidth a rank's transfer should reach (nccl-tests' busbw, e.g. 25GB/s, or a "
                          "link rate, e.g. 2gbit): transfer time beyond it is reported as slow transfer. Default: "
                          "the shared link of a --link-rate run."),
        *EXPORT_OPTIONS,
        click.option("-q", "--quiet", is_flag=True, help="No progress or notes on stderr."),
    ]):
        command = decorator(command)
    return command


EXPORT_OPTIONS = [  # how an Nsight Systems export is read: every command that reads traces takes them
    click.option("--step-range", metavar="NAME", default=None,
                 help="Nsight Systems exports: the NVTX range that marks a step (default: ProfilerStep#N "
                      "ranges, else the whole capture)."),
    click.option("--rank-map", metavar="PID=RANK,...", default=None,
                 help="Nsight Systems exports: the rank of each process (default: by device, in input order)."),
]


def export_options(command):
    """--step-range and --rank-map alone (whatif, advise: the replay reads a run as analyze does)."""
    for decorator in reversed(EXPORT_OPTIONS):
        command = decorator(command)
    return command


def export_reading(step_range: str | None, rank_map: str | None) -> dict:
    """Those of :data:`EXPORT_OPTIONS` that were given, as ``analyze`` takes them."""
    return {k: v for k, v in (("step_range", step_range), ("rank_map", rank_map)) if v is not None}


def analyze_options(kw: dict, **fields):
    """The :class:`~overlapprof.analysis.options.AnalyzeOptions` of :func:`reading_options` (and
    :data:`MEMORY_BUDGET`, where a command has it), popped from a command's ``kw`` (-q stays),
    with a command's own ``fields``."""
    from overlapprof.analysis.options import AnalyzeOptions

    reading = {"comm_kernels": kw.pop("comm_kernels"), "drop_last_step": kw.pop("drop_last_step"),
               "require_launch": kw.pop("require_launch"), "allow_partial": kw.pop("allow_partial"),
               "align_clocks": kw.pop("align_clocks"), "comms": not kw.pop("no_comms"),
               "reference_bandwidth": kw.pop("reference_bandwidth"), "cycle": kw.pop("cycle"),
               "step_range": kw.pop("step_range"), "rank_map": kw.pop("rank_map")}
    if "memory_budget" in kw:
        reading["memory_budget"] = kw.pop("memory_budget")
    return AnalyzeOptions(**reading, **fields)


def analysis_options(command):
    """The options of the commands that take several runs: --label, then :func:`reading_options`
    and :data:`MEMORY_BUDGET`."""
    command = MEMORY_BUDGET(reading_options(command))
    return click.option("--label", "labels", multiple=True, metavar="NAME",
                        help="Name of each input, in order (default: run.json's variant, else the "
                             "input's name). Give one per input.")(command)


def load_comparison(paths, labels, quiet, options, advice: bool = False):
    """The Comparison of the inputs (run directories, trace sets, saved reports or one saved
    comparison), the first as baseline, each run's report with its advice when ``advice``;
    bad input raises (the one error path: exit 2)."""
    from overlapprof.compare import compare
    from overlapprof.compare.inputs import load_reports

    if labels and len(labels) != len(paths):
        fail(f"{len(labels)} --label for {len(paths)} inputs; give one per input")

    def progress(k, n, path):
        if n > 1:
            note(f"analyzing {path} ({k + 1}/{n})", quiet)

    unwind_on_sigterm()
    reports, saved_labels = load_reports(paths, options, progress=progress, advice=advice)
    return compare(reports, list(labels) or saved_labels)


def check_output(dest, what: str, named: bool = True) -> None:
    """Refuse (exit 2) an output path before any work is done (see overlapprof.renderers.outputs)."""
    if dest is not None and str(dest) != "-":
        from overlapprof.renderers.outputs import check_output as check

        check(dest, what, named)


def emit(data: str | bytes, dest, what: str, quiet: bool, named: bool = True) -> None:
    """Write an output: to stdout when ``dest`` is '-', else through the one atomic writer."""
    if str(dest) == "-":
        click.echo(data, nl=False)
        return
    from overlapprof.renderers.outputs import write_output

    write_output(dest, data, what, named)
    note(f"{what} written to {dest}", quiet)
