"""The command line: thin. Each command parses, calls the library, and renders.

Subcommands live one per module in this package and are imported lazily, so ``overlapprof
--help`` imports neither torch nor the analyzer.
"""

import importlib

import click

from overlapprof import __version__
from overlapprof.cli.common import OneLineErrors

# command name -> (module, attribute, one-line help shown by `overlapprof --help`)
_COMMANDS = {
    "run": ("overlapprof.cli.run_cmd", "run", "Launch ranks, run a workload, record and analyze traces."),
    "analyze": ("overlapprof.cli.analyze_cmd", "analyze", "Overlap ratio and exposed communication of traces."),
    "compare": ("overlapprof.cli.compare_cmd", "compare", "Variants side by side: speedup, exposed comm saved, compute slowdown."),
    "report": ("overlapprof.cli.report_cmd", "report", "One self-contained HTML page with tables and plots."),
    "plot": ("overlapprof.cli.plot_cmd", "plot", "A chart (timeline of one step, ...) as PNG, SVG or PDF."),
    "export": ("overlapprof.cli.export_cmd", "export", "All ranks on one timeline: a Chrome trace JSON for Perfetto."),
    "view": ("overlapprof.cli.view_cmd", "view", "TensorBoard on run directories: traces and overlap scalars."),
    "whatif": ("overlapprof.cli.whatif_cmd", "whatif", "Predict a changed run's step by replaying this run's traces."),
    "advise": ("overlapprof.cli.advise_cmd", "advise", "What to change first and what it buys, predicted by the replay."),
}


class LazyGroup(OneLineErrors, click.Group):
    """A click group that imports a subcommand's module only when that command is used; errors
    end every command the same way (cli.common.OneLineErrors)."""

    def list_commands(self, ctx):
        return list(_COMMANDS)

    def get_command(self, ctx, name):
        if name not in _COMMANDS:
            return None
        module, attr, _ = _COMMANDS[name]
        return getattr(importlib.import_module(module), attr)

    def format_commands(self, ctx, formatter):
        rows = [(name, help_) for name, (_, _, help_) in _COMMANDS.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]},
             epilog="Exit codes: 0 success; 1 a run or a command's work failed; 2 bad input "
                    "(one 'Error: ...' line); 130 interrupted (Ctrl-C). Each command's help "
                    "states its own.")
@click.version_option(__version__, prog_name="overlapprof")
def main():
    """Compute/communication overlap profiler for PyTorch distributed."""
