"""`overlapprof report`: one self-contained HTML page, opened in real headless Chromium."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from browser import Page, chromium_path
from overlapprof import analyze
from overlapprof.cli import main
from overlapprof.compare import compare
from overlapprof.renderers import html

PAGE_FACTS = """(() => {
  const imgs = [...document.images].map(i => ({alt: i.alt, w: i.naturalWidth, h: i.naturalHeight,
                                               done: i.complete, src: i.src.slice(0, 26)}));
  const ranks = [...document.querySelectorAll('table.ranks')].map(t => ({
      variant: t.dataset.variant, rows: [...t.tBodies[0].rows].map(r => r.cells[0].textContent)}));
  const cmp = document.querySelector('table.comparison');
  const speedups = [...document.querySelectorAll('.card [data-speedup]')].map(d => ({
      kind: d.dataset.speedup, text: d.querySelector('b').textContent}));
  const partitions = [...document.querySelectorAll('table.partition')].map(t => ({
      variant: t.dataset.variant, cells: [...t.tBodies[0].rows].map(r => [...r.cells].map(c => c.textContent))}));
  return {imgs, ranks, title: document.title, speedups, partitions,
          compare: cmp ? [...cmp.tBodies[0].rows].map(r => r.cells[0].textContent) : null,
          h2: [...document.querySelectorAll('h2')].map(h => h.textContent),
          overflowing: [...document.querySelectorAll('.scroll')].filter(d => d.scrollWidth > d.clientWidth).length,
          width: document.documentElement.scrollWidth};
})()"""


@pytest.fixture(scope="module")
def report_html(runs, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("report") / "report.html"
    result = CliRunner().invoke(main, ["report", str(runs.ring["sync"]), str(runs.ring["async"]), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert f"report written to {out}" in result.stderr
    return out


@pytest.mark.skipif(chromium_path() is None, reason="chromium is not installed (scripts/setup.sh --test installs it)")
def test_page_renders_in_chromium(report_html, tmp_path):
    with Page() as page:
        page.open(report_html.as_uri())
        facts = page.evaluate(PAGE_FACTS)
        shot = page.screenshot()
        errors, requests = page.errors(), page.requests()
    (tmp_path / "report.png").write_bytes(shot)
    if os.environ.get("OVERLAPPROF_SCREENSHOT"):  # to look at it: OVERLAPPROF_SCREENSHOT=/tmp/shot.png
        Path(os.environ["OVERLAPPROF_SCREENSHOT"]).write_bytes(shot)
    assert errors == []
    # Nothing but the file itself and its inline data: images is requested.
    assert [u for u in requests if not u.startswith(("file://", "data:"))] == []
    assert requests[0] == report_html.as_uri()
    # Timeline + exposure per run, and the comparison chart; every one decoded and drawn.
    alts = [i["alt"] for i in facts["imgs"]]
    ours = ["variant comparison chart", "sync timeline", "sync exposed vs hidden", "async timeline",
            "async exposed vs hidden"]
    assert [a for a in alts if a in ours] == ours  # in this order; other sections may add charts
    assert all(i["done"] and i["w"] > 300 and i["h"] > 100 for i in facts["imgs"]), facts["imgs"]
    assert all(i["src"].startswith("data:image/svg+xml;base64") for i in facts["imgs"])
    assert facts["ranks"] == [{"variant": "sync", "rows": ["0", "1"]}, {"variant": "async", "rows": ["0", "1"]}]
    assert [c.split()[0] for c in facts["compare"]] == ["sync", "async"]
    assert facts["h2"][:4] == ["What to change first", "Variants compared", "sync", "async"]  # the advice leads
    # The async card shows both speedups, each with its interval: profiled, and unprofiled (host).
    assert [s["kind"] for s in facts["speedups"]] == ["profiled", "unprofiled"]
    # a factor the machine's load explains is "not trusted (load)" instead (the load rule, tested on its own)
    assert all(re.fullmatch(r"\d+\.\d\dx \[\d+\.\d\d-\d+\.\d\d\]|not trusted \(load\)", s["text"])
               for s in facts["speedups"]), facts
    # Each run's step partition: compute + exposed comm + exposed memory + idle = step, per rank.
    assert [p["variant"] for p in facts["partitions"]] == ["sync", "async"]
    for p in facts["partitions"]:
        for rank, step, *parts in p["cells"]:
            assert abs(sum(map(float, parts)) - float(step)) <= 0.003, p
    assert facts["width"] <= 1200 and facts["overflowing"] == 0  # nothing overflows sideways
    assert shot[:8] == b"\x89PNG\r\n\x1a\n" and len(shot) > 50_000


def test_page_is_self_contained(report_html):
    text = report_html.read_text()
    assert "<script" not in text and "http://" not in text.replace('xmlns="http://', "")
    assert not re.search(r"""(src|href)=["'](?!data:|#)""", text)
    assert "default-src 'none'" in text  # the browser would refuse any fetch anyway


def test_trace_strings_are_escaped(runs):
    report = analyze([str(runs.ring["async"])])
    evil = '<script>alert("x")</script><img src=x onerror=alert(1)> $\\frac{$'
    report.run["name"] = evil
    report.run["options"]["size"] = evil
    report.run["workload"]["path"] = evil
    report.warnings.append(evil)
    report.ranks[0].mode = evil
    page = html.render(compare([report], labels=[evil]))
    assert "<script" not in page and "<img src=x" not in page
    assert page.count("&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;") >= 5


def test_single_run_has_no_comparison_section(runs):
    page = html.render(compare([analyze([str(runs.ring["sync"])])]))
    assert "Variants compared" not in page and "variant comparison chart" not in page
    assert 'alt="sync timeline"' in page and 'alt="sync exposed vs hidden"' in page
    assert 'data-variant="sync" data-ranks="2"' in page


def test_never_writes_over_traces_or_unnamed_files(runs, tmp_path, monkeypatch):
    sync = runs.ring["sync"]
    trace = next(sync.glob("rank0.*.pt.trace.json"))
    before = trace.read_bytes()
    cli = CliRunner()
    for target in (trace, sync / "run.json", sync):
        out = cli.invoke(main, ["report", str(sync), "-o", str(target)])
        assert out.exit_code == 2 and out.stderr.startswith("Error: ") and out.stderr.count("\n") == 1
    assert trace.read_bytes() == before
    monkeypatch.chdir(tmp_path)
    Path("report.html").write_text("mine")
    out = cli.invoke(main, ["report", str(sync)])
    assert out.exit_code == 2 and "name the output with -o" in out.stderr
    assert Path("report.html").read_text() == "mine"
    out = cli.invoke(main, ["report", str(sync), "-o", "report.html", "-q"])
    assert out.exit_code == 0 and Path("report.html").read_text().startswith("<!DOCTYPE html>")


def test_header_chips_say_what_is_known(runs):
    """A run's page names its workload, device and backend; a page of profiler traces says they
    are not a run, and gives the backend their distributedInfo records without calling it a device."""
    chips = lambda page: dict(re.findall(r'<span class="chip"><b>([^<]*)</b> ([^<]*)</span>', page))  # noqa: E731
    run = chips(html.render(compare([analyze([str(runs.ring["sync"])])])))
    assert run["workload"] == "ring" and run["device"] == "cpu" and run["backend"] == "gloo"
    traces = chips(html.render(compare([analyze([str(Path(__file__).parent / "data" / "trace_filter")])])))
    assert "workload" not in traces and "not an overlapprof run" in traces["inputs"]
    assert traces["device"] == "-" and traces["backend"] == "nccl"
