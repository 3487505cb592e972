"""`overlapprof plot` and the figures of `overlapprof.renderers.plots`."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from matplotlib.colors import to_hex

from overlapprof import analyze
from overlapprof.cli import main
from overlapprof.compare import compare
from overlapprof.renderers import plots

MAGIC = {"png": b"\x89PNG\r\n\x1a\n", "svg": b"<?xml", "pdf": b"%PDF-"}


@pytest.fixture(scope="module")
def async_report(runs):
    return analyze([str(runs.ring["async"])])


def _drawn_ms(fig) -> dict[str, float]:
    """Total width of the bars of each colour in the figure's first axes, in ms."""
    totals: dict[str, float] = {}
    for collection in fig.axes[0].collections:
        color = to_hex(collection.get_facecolor()[0]).upper()
        for path in collection.get_paths():
            xs = path.vertices[:, 0]
            totals[color] = totals.get(color, 0.0) + float(xs.max() - xs.min())
    return totals


def test_timeline_draws_each_ranks_step(async_report):
    fig = plots.timeline_figure(async_report)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["rank 0  compute", "comm", "rank 1  compute", "comm"]
    drawn = _drawn_ms(fig)
    length = lambda pairs: sum(b - a for a, b in pairs) / 1000  # noqa: E731
    lines = [r.timeline for r in async_report.ranks]
    assert drawn[plots.COMPUTE] == pytest.approx(sum(length(t.compute) for t in lines))
    assert drawn[plots.HIDDEN] == pytest.approx(sum(length(t.overlapped) for t in lines))
    # Exposed spans are drawn in the colour of their cause, and together they are comm − hidden.
    exposed = sum(drawn.get(colour, 0.0) for colour in set(plots.CAUSE_COLOURS.values()))
    assert exposed == pytest.approx(sum(length(t.comm) - length(t.overlapped) for t in lines))
    for cause, colour in plots.CAUSE_COLOURS.items():
        assert drawn.get(colour, 0.0) == pytest.approx(sum(length(t.exposed_by_cause.get(cause, [])) for t in lines))
    assert drawn[plots.HIDDEN] > 0 and exposed > 0


def test_minus_cuts_holes_out_of_spans():
    assert plots._minus([(0, 10), (20, 30)], [(2, 3), (5, 22), (29, 40)]) == [(0, 2), (3, 5), (22, 29)]
    assert plots._minus([(0, 1)], []) == [(0, 1)] and plots._minus([(0, 1)], [(0, 1)]) == []


def test_comparison_figure_has_a_bar_per_variant(runs, async_report):
    c = compare([analyze([str(runs.ring["sync"])]), async_report])
    fig = plots.comparison_figure(c)
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["sync", "async"]
    steps = [p.get_width() for p in fig.axes[0].patches if to_hex(p.get_facecolor()).upper() == plots.STEP]
    assert steps == pytest.approx([v.step_us / 1000 for v in c.variants])


@pytest.mark.parametrize("fmt, chart", [("png", "timeline"), ("svg", "exposure"), ("pdf", "comparison")])
def test_plot_command_writes_the_format_of_the_suffix(runs, tmp_path, fmt, chart):
    out = tmp_path / f"chart.{fmt}"
    args = ["plot", str(runs.ring["sync"]), str(runs.ring["async"]), "--chart", chart, "-o", str(out), "-q"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    data = out.read_bytes()
    assert data.startswith(MAGIC[fmt]) and len(data) > 5000
    if fmt == "png":
        from matplotlib.image import imread

        height, width = imread(str(out)).shape[:2]
        assert width == 1440 and height > 200  # 10 in at 144 dpi


@pytest.mark.parametrize("args, message", [
    (["-o", "{tmp}/t.jpg"], "unknown image format 'jpg'"),
    (["-o", "{tmp}/missing/t.png"], "does not exist"),
    (["-o", "{trace}"], "refusing to write the plot over"),
])
def test_plot_bad_output_is_one_line_exit_2(runs, tmp_path, args, message):
    trace = next(runs.ring["sync"].glob("rank0.*.pt.trace.json"))
    args = [a.format(tmp=tmp_path, trace=trace) for a in args]
    result = CliRunner().invoke(main, ["plot", str(runs.ring["sync"]), *args])
    assert result.exit_code == 2 and result.stderr.count("\n") == 1 and message in result.stderr


def test_straggler_chart_of_a_multi_rank_run_and_refusal_for_one_rank(runs, tmp_path):
    out = tmp_path / "stragglers.png"
    result = CliRunner().invoke(main, ["plot", str(runs.allreduce), "--chart", "straggler", "-o", str(out), "-q"])
    assert result.exit_code == 0, result.output
    assert out.read_bytes().startswith(MAGIC["png"])
    single = next(runs.allreduce.glob("rank0.*.pt.trace.json"))
    result = CliRunner().invoke(main, ["plot", str(single), "--chart", "straggler", "-o", str(tmp_path / "s.png")])
    assert result.exit_code == 2 and "no collective matched across ranks" in result.stderr
    assert result.stderr.count("\n") == 1 and not (tmp_path / "s.png").exists()


def test_causes_chart_stacks_each_cause(runs, async_report, tmp_path):
    """Per rank (one input): a bar per rank, each cause's width its µs; per variant (two inputs)."""
    fig = plots.causes_figure([(f"rank {r.rank}", r.exposure) for r in async_report.ranks])
    drawn = {}
    for patch in fig.axes[0].patches:
        colour = to_hex(patch.get_facecolor()).upper()
        drawn[colour] = drawn.get(colour, 0.0) + patch.get_width()
    for cause, colour in plots.CAUSE_COLOURS.items():
        total = sum(getattr(r.exposure, f"{cause}_us") for r in async_report.ranks) / 1000
        assert drawn.get(colour, 0.0) == pytest.approx(total, abs=1e-9)
    out = tmp_path / "causes.svg"
    result = CliRunner().invoke(main, ["plot", str(runs.ring["sync"]), str(runs.ring["async"]), "--chart", "causes",
                                       "-o", str(out), "-q"])
    assert result.exit_code == 0, result.output
    assert out.read_bytes().startswith(b"<?xml") and b"<svg" in out.read_bytes()


@pytest.mark.parametrize("fmt", ["png", "svg", "pdf"])
def test_a_non_latin_folder_name_draws_without_boxes_or_warnings(runs, tmp_path, fmt):
    """The traces in a folder named in Japanese: the plot's title is the folder's name. No
    warning reaches stderr (before: matplotlib's "Glyph ... missing from font(s) DejaVu Sans",
    one per character), and every character of every text is either in a font that has its glyph
    (an installed CJK font; STIX, which matplotlib ships, has "の") or written U+XXXX."""
    from matplotlib import font_manager
    from matplotlib.ft2font import FT2Font
    from matplotlib.text import Text

    folder = tmp_path / "実験の記録"
    folder.mkdir()
    for trace in sorted(runs.ring["async"].glob("rank*.pt.trace.json")):
        (folder / trace.name).write_bytes(trace.read_bytes())
    result = CliRunner().invoke(main, ["plot", str(folder), "-o", str(tmp_path / f"t.{fmt}")])
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines() == [f"overlapprof: plot written to {tmp_path / f't.{fmt}'}"], result.stderr

    fig = plots.timeline_figure(analyze([str(folder)]), title="実験の記録: one step")
    plots.to_bytes(fig, fmt)
    [title] = [t for t in fig.findobj(Text) if ": one step" in t.get_text()]
    for c in title.get_text():
        fonts = [font_manager.findfont(font_manager.FontProperties(family=f, weight=title.get_weight()))
                 for f in title.get_fontfamily()]
        assert c.isspace() or any(ord(c) in FT2Font(f).get_charmap() for f in fonts), c
    assert "記録" in title.get_text() or "U+8A18 U+9332" in title.get_text()
    text, families = plots.drawable("の")  # a glyph only a fallback font has: it is used, not replaced
    assert text == "の" and len(families) > 1
