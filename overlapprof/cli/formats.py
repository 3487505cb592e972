"""Which renderer writes each output of a command, and where: the options that pick renderers
from the registry (:mod:`overlapprof.renderers.base`) by name (``--format``, ``--chart``) or by
an output file's extension (``-o``), and writing the outputs they planned. A renderer added to
the registry is offered here, and listed by ``--help``, with no edit to this package."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path

import click

from overlapprof.cli.common import check_output, emit, fail
from overlapprof.rundir import RUN_FILE


class RendererChoice(click.Choice):
    """The names of the registered renderers of ``subject`` (``binary``: the images), read from
    the registry when click needs them (help, parsing), never when the command is defined."""

    def __init__(self, subject: str, binary: bool = False):
        self.subject, self.binary = subject, binary
        super().__init__((), case_sensitive=True)

    @property
    def choices(self):
        from overlapprof.renderers import registered

        return tuple(registered(self.subject, self.binary))

    @choices.setter
    def choices(self, value) -> None:  # click.Choice.__init__ sets it; the registry is the source
        pass


class ListedOption(click.Option):
    """An option of type :class:`RendererChoice` whose help ends with each renderer's name and
    one-line description."""

    def get_help_record(self, ctx):
        from overlapprof.renderers import registered

        intro = self.help
        listed = registered(self.type.subject, self.type.binary)
        self.help = f"{intro} " + "; ".join(f"{name}: {cls.description()}" for name, cls in listed.items()) + "."
        try:
            return super().get_help_record(ctx)
        finally:
            self.help = intro


def output_options(subject: str):
    """``--format NAME`` and ``-o/--output FILE`` for the text renderers of ``subject``
    (``report`` or ``comparison``); the command reads them as ``fmt`` and ``output``."""

    def decorate(command):
        command = click.option(
            "-o", "--output", "output", type=click.Path(path_type=str), default=None, metavar="FILE",
            help="Write the --format output to FILE instead of stdout (replaced if it exists; never inside a run "
                 "directory or over a trace); without --format, FILE's extension picks the renderer.")(command)
        return click.option(
            "--format", "fmt", type=RendererChoice(subject), cls=ListedOption, default=None,
            help="What to write (to stdout, or to -o FILE) instead of the table:")(command)

    return decorate


def not_an_input(ctx, param, value):
    """Click callback of ``--json``/``--csv [FILE]``: a FILE that is an existing folder was meant
    as the input (``--json RUN`` takes RUN as the file's name, and then says PATHS is missing), so
    it is refused with the two ways to say it."""
    if value is not None and value != "-" and Path(value).is_dir():
        opt = param.opts[0]
        what = "a run directory" if (Path(value) / RUN_FILE).is_file() else "a folder"
        fail(f"{opt} {value}: {value} is {what}, not the file to write {opt[2:].upper()} to: give the file first "
             f"({opt} FILE {value}), or '-' for stdout ({opt} - {value})")
    return value


# The default output's module, imported alone: a plain run imports no other renderer.
_TABLES = {"report": "overlapprof.renderers.table", "comparison": "overlapprof.renderers.compare_table"}


@dataclass
class Output:
    """One output of a command: the renderer class and where it goes ('-': stdout)."""

    renderer: type
    dest: str


def planned_outputs(subject: str, json_out, csv_out, fmt: str | None, output) -> list[Output]:
    """The outputs of --json, --csv, --format and -o, each path checked before any work (exit 2
    when refused). Without --format and -o, the table goes to stdout unless --json or --csv does."""
    from overlapprof.renderers import for_path, get

    if json_out == "-" and csv_out == "-":
        fail("--json and --csv cannot both go to stdout; give one of them a FILE")
    outputs = [Output(get(name, subject), dest) for name, dest in (("json", json_out), ("csv", csv_out)) if dest]
    to_stdout = any(o.dest == "-" for o in outputs)
    if fmt is not None or output is not None:
        dest = "-" if output is None else str(output)
        if dest == "-" and to_stdout:
            fail(f"--format {fmt} and --json/--csv cannot both go to stdout; give one of them a FILE")
        renderer = get(fmt, subject, binary=False) if fmt else for_path(dest, subject, binary=False)
        outputs.append(Output(renderer, dest))
    elif not to_stdout:
        importlib.import_module(_TABLES[subject])
        outputs.append(Output(get("table", subject), "-"))
    for o in outputs:
        check_output(o.dest, o.renderer.name)
    return outputs


def emit_outputs(outputs: list[Output], subject, quiet: bool, warnings, **options) -> None:
    """Render ``subject`` (a Report or a Comparison) with each planned renderer (given the
    ``options`` it takes: ``by``) and write it. When no output states the warnings, they go to
    stderr first."""
    if not quiet and not any(o.renderer.shows_warnings for o in outputs):
        for warning in warnings:
            click.echo(f"warning: {warning}", err=True)
    for o in outputs:
        emit(o.renderer.with_options(**options).render(subject), o.dest, o.renderer.name, quiet)
