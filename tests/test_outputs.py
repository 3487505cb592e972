"""The CLI's outputs and errors (issues 11 and 13): nothing already written is lost, one atomic
writer, one error path, exit codes in every help. Real commands (click's CliRunner on
``overlapprof.cli.main``) on real 2-rank ring runs (the session's ``runs`` fixture)."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

from overlapprof.cli import main
from overlapprof.errors import OutputError
from overlapprof.renderers.outputs import write_output

COMMANDS = ("run", "analyze", "compare", "report", "plot", "view")


def _snapshot(folder: Path) -> dict[str, bytes]:
    """Every file below ``folder`` (hidden ones too) and its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _one_line_error(result, exit_code: int = 2) -> str:
    assert result.exit_code == exit_code, (result.exit_code, result.output)
    assert "Traceback" not in result.output, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    return lines[0]


@pytest.fixture(scope="module")
def run_copy(runs, tmp_path_factory) -> dict[str, Path]:
    """Copies of the ring's run directories: the tests try to write into them."""
    root = tmp_path_factory.mktemp("protected")
    return {v: Path(shutil.copytree(d, root / d.name)) for v, d in runs.ring.items()}


# The four the issue reproduced (each exited 0 and replaced the file), then others of the kind.
INSIDE_RUN = [
    ("report", ["-o", "{A}/ranks/rank0.json"]),
    ("report", ["-o", "{A}/logs/rank0.stdout.log"]),
    ("report", ["-o", "{A}/nodes/node0.json"]),
    ("analyze", ["--json", "{A}/ranks/rank1.json"]),
    ("analyze", ["--csv", "{A}/logs/rank1.stderr.log"]),
    ("compare", ["--json", "{A}/ranks/new.json"]),  # a new file inside is refused too
    ("report", ["-o", "{A}/report.html"]),  # no output of ours belongs in a run directory
    ("plot", ["-o", "{A}/scalars/timeline.png"]),
]


@pytest.mark.parametrize("cmd, args", INSIDE_RUN, ids=[f"{c} {a[-1]}" for c, a in INSIDE_RUN])
def test_no_output_inside_a_run_directory(run_copy, cmd, args):
    a, b = run_copy["sync"], run_copy["async"]
    before = _snapshot(a)
    inputs = [str(a)] if cmd in ("analyze", "plot") else [str(a), str(b)]
    result = CliRunner().invoke(main, [cmd, *inputs, *[x.format(A=a) for x in args]])
    line = _one_line_error(result)
    assert f"inside run directory {a.resolve()}" in line and "run's data" in line
    assert _snapshot(a) == before  # every file unchanged, nothing added (no temporary left either)


def test_never_over_a_trace_or_a_run_json_anywhere(run_copy, tmp_path):
    a, b = run_copy["sync"], run_copy["async"]
    trace = next(a.glob("rank0.*.pt.trace.json"))
    loose = Path(shutil.copy(trace, tmp_path / "rank0.json"))  # a trace by content, not by name
    named = tmp_path / "new.pt.trace.json"  # by name, not there yet
    outside = tmp_path / "kept"
    outside.mkdir()
    run_json = Path(shutil.copy(a / "run.json", outside / "run.json"))
    before = _snapshot(tmp_path)
    cli = CliRunner()
    for args, why in ((["analyze", str(a), "--json", str(loose)], "which is a trace"),
                      (["compare", str(a), str(b), "--csv", str(loose)], "which is a trace"),
                      (["report", str(a), "-o", str(named)], "which is a trace"),
                      (["plot", str(a), "-o", str(run_json)], "which holds a run's data"),
                      (["analyze", str(a), "--json", str(trace)], "which is a trace")):
        line = _one_line_error(cli.invoke(main, args))
        assert "refusing to write the" in line and why in line, line
    assert _snapshot(tmp_path) == before and not named.exists()


def test_a_link_into_a_run_directory_is_refused(run_copy, tmp_path):
    a = run_copy["sync"]
    link = tmp_path / "out.json"
    link.symlink_to(a / "ranks" / "rank0.json")
    before = _snapshot(a)
    line = _one_line_error(CliRunner().invoke(main, ["analyze", str(a), "--json", str(link)]))
    assert "inside run directory" in line and link.is_symlink() and _snapshot(a) == before


def test_outputs_outside_are_written_whole_and_replaced_when_named(run_copy, tmp_path):
    a, b = run_copy["sync"], run_copy["async"]
    out = tmp_path / "report.json"
    cli = CliRunner()
    for _ in range(2):  # the second replaces the first: the user named the file
        result = cli.invoke(main, ["analyze", str(a), "--json", str(out)])
        assert result.exit_code == 0, result.output
        assert f"json written to {out}" in result.stderr
        assert json.loads(out.read_text())["schema"].startswith("overlapprof.report/")
    for args in (["compare", str(a), str(b), "--csv", str(tmp_path / "cmp.csv"), "-q"],
                 ["report", str(a), str(b), "-o", str(tmp_path / "page.html"), "-q"],
                 ["plot", str(a), "-o", str(tmp_path / "t.svg"), "-q"]):
        result = cli.invoke(main, args)
        assert result.exit_code == 0 and result.stderr == "", result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cmp.csv", "page.html", "report.json", "t.svg"]
    assert (tmp_path / "cmp.csv").read_text().count("\n") == 3  # header, sync, async
    beside = a.parent / "beside.svg"  # the folder holding run directories is not one
    result = cli.invoke(main, ["plot", str(a), "-o", str(beside), "-q"])
    assert result.exit_code == 0 and beside.read_bytes().lstrip().startswith(b"<?xml"), result.output
    beside.unlink()


def test_the_writer_replaces_through_a_temporary_and_keeps_the_mode(tmp_path):
    dest = tmp_path / "out.csv"
    dest.write_text("old")
    dest.chmod(0o640)
    write_output(dest, "new,text\n", "csv")
    assert dest.read_text() == "new,text\n" and stat.S_IMODE(dest.stat().st_mode) == 0o640
    fresh = write_output(tmp_path / "fresh.bin", b"\x00\x01", "plot")
    umask = os.umask(0)
    os.umask(umask)
    assert fresh.read_bytes() == b"\x00\x01" and stat.S_IMODE(fresh.stat().st_mode) == 0o666 & ~umask
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fresh.bin", "out.csv"]  # no temporary left
    with pytest.raises(OutputError, match="exists; name the output"):
        write_output(dest, "x", "report", named=False)
    with pytest.raises(OutputError, match="is a folder"):
        write_output(tmp_path, "x", "report")
    assert dest.read_text() == "new,text\n"


# -- one error path: usage errors, the library's errors and refused outputs all end alike

BAD = [
    (["analyze"], "Missing argument 'PATHS...'"),
    (["analyze", "{A}", "--by", "nope"], "Invalid value for '--by'"),
    (["analyze", "{tmp}/nosuch"], "nosuch"),
    (["analyze", "{A}", "--json", "-", "--csv", "-"], "cannot both go to stdout"),
    (["compare", "{A}"], "give at least two runs"),
    (["compare", "{A}", "{tmp}/nosuch"], "no such run directory or file"),
    (["compare", "{A}", "{A}", "--label", "x"], "1 --label for 2 inputs"),
    (["report", "{A}", "-o", "{tmp}/missing/r.html"], "does not exist"),
    (["plot", "{A}", "-o", "{tmp}/t.jpg"], "unknown image format"),
    (["plot", "{A}", "--chart", "comparison", "-o", "{tmp}/c.png"], "needs at least two inputs"),
    (["run", "workloads/ring.py", "--nnodes", "2"], "--nnodes > 1 needs --run-id"),
    (["run", "{tmp}/nosuch.py"], "not found"),
    (["nosuch"], "No such command 'nosuch'"),
]


@pytest.mark.parametrize("args, message", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_every_error_is_one_line_and_exit_2(run_copy, tmp_path, args, message):
    a = run_copy["sync"]
    before = _snapshot(a)
    result = CliRunner().invoke(main, [x.format(A=a, tmp=tmp_path) for x in args])
    assert message in _one_line_error(result)
    assert _snapshot(a) == before


@pytest.mark.parametrize("cmd", COMMANDS)
def test_every_help_states_its_exit_codes(cmd):
    result = CliRunner().invoke(main, [cmd, "--help"])
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    assert "Exit codes: 0 " in text and "; 2 bad input" in text, text[-400:]
    if cmd != "view":
        assert "130 interrupted" in text
    if cmd in ("run", "view"):
        assert "; 1 " in text


def test_the_reading_options_are_the_same_on_every_reading_command():
    shared = ("--comm-kernel", "--drop-last-step", "--require-launch", "--no-comms", "--align-clocks",
              "--allow-partial", "--quiet")
    helps = {}
    for cmd in ("analyze", "compare", "report", "plot"):
        command = main.get_command(None, cmd)
        helps[cmd] = {opt: p.help for p in command.params for opt in p.opts if opt in shared}
        assert set(helps[cmd]) == set(shared), cmd
    assert all(h == helps["analyze"] for h in helps.values())


def test_view_refuses_before_starting_tensorboard(tmp_path):
    (tmp_path / "empty").mkdir()
    for target in ("nosuch", "empty"):
        result = CliRunner().invoke(main, ["view", str(tmp_path / target)])
        line = _one_line_error(result)
        assert "starting TensorBoard" not in result.output and str(tmp_path / target) in line


# -- --list-variants: columns hold with long names

LONG_WORKLOAD = '''
VARIANTS = {"sync": "short", "overlapped_with_a_very_long_name": "long-named variant"}
OPTIONS = {"size": (64, "matrix side"),
           "keep_the_scatter_list_between_steps": (False, "a long option name"),
           "learning_rate_for_the_optimizer": (0.001, "a long default")}

def setup(ctx):
    return None

def step(ctx, state):
    pass
'''


def test_list_variants_columns_hold_with_long_names(tmp_path):
    path = tmp_path / "longnames.py"
    path.write_text(LONG_WORKLOAD)
    result = CliRunner().invoke(main, ["run", str(path), "--list-variants"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    variants = lines[2:lines.index("options (--opt key=value, or after --):")]
    options = lines[len(variants) + 3:]
    assert len(variants) == 2 and len(options) >= 3, lines  # (the launcher adds slow_rank, slow_ms)
    help_columns = {line.index(text) for line, text in zip(variants, ("short", "long-named variant"))}
    assert len(help_columns) == 1  # the variants' texts start in one column
    rows = [re.match(r"^  (\S+)  +(\S+)  +(\S.*)$", line) for line in options]
    assert all(rows), options  # name, default and help apart by at least two spaces
    assert [m.group(1) for m in rows][:3] == ["size", "keep_the_scatter_list_between_steps",
                                              "learning_rate_for_the_optimizer"]
    assert len({m.start(2) for m in rows}) == 1 and len({m.start(3) for m in rows}) == 1
    assert {m.start(2) for m in rows} == help_columns  # variant texts and option defaults share a column
