"""The renderer registry (overlapprof.renderers.base): a renderer is a class; defining it registers
it, and the commands pick it by name or by an output file's extension with no edit of theirs."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from overlapprof.cli import main
from overlapprof.errors import InputError
from overlapprof.renderers import Renderer, for_path, get, registered
from overlapprof.report import Comparison, Report

DATA = Path(__file__).parent / "data"


class MarkdownRanks(Renderer):
    """Markdown: one line per rank (a renderer the package does not have)."""

    name = "test-markdown"
    extensions = ("md", "markdown")

    def __init__(self, by: str = "rank"):
        self.by = by

    def render(self, report: Report) -> str:
        return "".join(f"- rank {r.rank}: {r.metrics.exposed_comm_us:.1f} µs exposed ({self.by})\n" for r in report.ranks)


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("saved") / "report.json"
    result = CliRunner().invoke(main, ["analyze", str(DATA / "trace_filter"), "--json", str(path), "-q"])
    assert result.exit_code == 0, result.output
    return path


def test_a_new_renderer_is_picked_by_name_and_by_extension_through_the_cli(saved, tmp_path):
    assert get("test-markdown", "report") is MarkdownRanks
    assert for_path(tmp_path / "x.markdown", "report") is MarkdownRanks
    report = Report.load(saved)
    expected = MarkdownRanks(by="step").render(report)
    assert expected.count("- rank ") == len(report.ranks) == 2

    by_name = CliRunner().invoke(main, ["analyze", str(saved), "--format", "test-markdown", "--by", "step"])
    assert by_name.exit_code == 0, by_name.output
    assert by_name.stdout == expected

    out = tmp_path / "ranks.md"
    by_extension = CliRunner().invoke(main, ["analyze", str(saved), "--by", "step", "-o", str(out), "-q"])
    assert by_extension.exit_code == 0, by_extension.output
    assert out.read_text() == expected and by_extension.stdout == ""  # the output went to the file, not the table

    helped = CliRunner().invoke(main, ["analyze", "--help"])
    assert "test-markdown" in helped.stdout and "one line per rank" in helped.stdout


def test_an_extension_no_renderer_writes_is_one_line_and_nothing_is_analyzed(tmp_path):
    result = CliRunner().invoke(main, ["analyze", str(DATA / "no-such-input"), "-o", str(tmp_path / "x.xyz")])
    assert result.exit_code == 2
    assert result.stderr.strip().count("\n") == 0 and "no report renderer writes .xyz" in result.stderr


def test_the_builtin_renderers_are_registered_by_subject():
    assert {"table", "json", "csv"} <= set(registered("report"))
    assert {"table", "json", "csv", "html"} <= set(registered("comparison"))
    assert set(registered("comparison", binary=True)) == {"timeline", "exposure", "causes", "comparison", "straggler"}
    assert set(registered("report", lanes=True)) == {"chrome-trace"}
    assert for_path("page.htm", "comparison").name == "html" and for_path("t.txt", "report").name == "table"
    with pytest.raises(InputError, match="no report renderer named 'html'"):
        get("html", "report")
    with pytest.raises(TypeError, match="subject"):
        type("Odd", (Renderer,), {"name": "odd", "subject": "trace"})


def test_every_registered_renderer_renders_what_it_says(saved):
    from overlapprof.compare import compare

    report = Report.load(saved)
    comparison = compare([report, Report.load(saved)], ["a", "b"])
    for subject, value in (("report", report), ("comparison", comparison)):
        for name, cls in registered(subject).items():
            out = cls.with_options(by="step").render(value)
            assert isinstance(out, bytes if cls.binary else str) and out, (subject, name)
    assert registered("comparison")["json"]().render(comparison) == comparison.to_json(indent=2) + "\n"
    assert Comparison.from_json(registered("comparison")["json"]().render(comparison)) == comparison
    image = registered("comparison", binary=True)["timeline"](fmt="png").render(comparison)
    assert image.startswith(b"\x89PNG")


def test_plot_offers_each_registered_chart_with_its_description():
    helped = CliRunner().invoke(main, ["plot", "--help"])
    for name, cls in registered("comparison", binary=True).items():
        assert name in helped.stdout
    assert "wait vs transfer in matched" in " ".join(helped.stdout.split())
