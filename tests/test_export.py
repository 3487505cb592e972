"""`overlapprof export`: all ranks of a real 2-rank run on one Chrome trace-event timeline.

Checked against the trace-event format's rules (what Perfetto's JSON importer and chrome://tracing
take), against the report's own numbers (the lanes are the unions it measured), against the trace
files read independently (the selected events), and, where headless Chromium can open
chrome://tracing, by its own trace-viewer importer."""

from __future__ import annotations

import gzip
import json
import math
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from browser import Page, chromium_path
from overlapprof import analyze
from overlapprof.cli import main
from overlapprof.renderers.timeline_trace import COMM_TID, COMPUTE_TID, EXPOSED_TID, STEP_TID, TRACE_TID0


def _strict(text: str):
    def reject(constant):
        raise ValueError(f"non-JSON constant {constant}")
    return json.loads(text, parse_constant=reject)


def _export(*args):
    return CliRunner().invoke(main, ["export", *map(str, args)])


def _check_format(data: dict) -> tuple[list[dict], list[dict]]:
    """The trace-event format's rules for what we write; returns (metadata, complete events)."""
    assert isinstance(data, dict) and isinstance(data["traceEvents"], list)
    assert data["displayTimeUnit"] in ("ms", "ns")
    meta = [e for e in data["traceEvents"] if e["ph"] == "M"]
    slices = [e for e in data["traceEvents"] if e["ph"] == "X"]
    assert len(meta) + len(slices) == len(data["traceEvents"]), "only X and M events"
    for e in data["traceEvents"]:
        assert type(e["pid"]) is int and type(e["tid"]) is int and e["pid"] > 0, e
        assert isinstance(e["name"], str) and e["name"], e
    for e in meta:
        assert e["name"] in ("process_name", "process_sort_index", "thread_name", "thread_sort_index"), e
        key = "name" if e["name"].endswith("_name") else "sort_index"
        assert isinstance(e["args"][key], str if key == "name" else int), e
    for e in slices:
        for key in ("ts", "dur"):
            assert type(e[key]) in (int, float) and math.isfinite(e[key]), e
        assert e["dur"] >= 0 and e["ts"] >= 0, e
    assert [e["ts"] for e in slices] == sorted(e["ts"] for e in slices), "complete events sorted by ts"
    named = {(e["pid"], e["tid"]) for e in meta if e["name"] == "thread_name"}
    assert {(e["pid"], e["tid"]) for e in slices} <= named, "every lane has a thread_name"
    processes = {e["pid"] for e in meta if e["name"] == "process_name"}
    assert {e["pid"] for e in slices} <= processes
    return meta, slices


def _lane(slices, pid, tid, step=None):
    """The slices of one lane (of one step's, by the step number in their args)."""
    return [e for e in slices if e["pid"] == pid and e["tid"] == tid
            and (step is None or e.get("args", {}).get("step") == step)]


@pytest.fixture(scope="module")
def exported(runs, tmp_path_factory):
    out = tmp_path_factory.mktemp("export") / "timeline.json"
    result = _export(runs.ring["sync"], "-o", out)
    assert result.exit_code == 0, result.output
    assert f"timeline written to {out}" in result.stderr
    return out, _strict(out.read_text()), analyze([str(runs.ring["sync"])])


def test_progress_is_not_a_line_per_rank_off_a_terminal(runs, tmp_path):
    """Into a file or pipe (here, click's runner) stderr gets the summary and the written note,
    however many ranks: no 'analyzed rank k/n' or 'reading rank r's events' per rank."""
    out = tmp_path / "t.json"
    result = _export(runs.ring["sync"], "-o", out)
    assert result.exit_code == 0, result.output
    lines = result.stderr.splitlines()
    assert lines == ["overlapprof: 2 ranks, " + lines[0].split("2 ranks, ")[-1], f"overlapprof: timeline written to {out}"], lines


def test_export_follows_the_trace_event_format(exported):
    _, data, report = exported
    meta, slices = _check_format(data)
    names = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
    assert names == {r.rank + 1: f"rank {r.rank}" for r in report.ranks}
    lanes = {(e["pid"], e["tid"]): e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    for r in report.ranks:
        assert [lanes[r.rank + 1, t] for t in (STEP_TID, COMPUTE_TID, COMM_TID, EXPOSED_TID)] == [
            "steps", "compute", "communication", "exposed communication"]
    assert data["otherData"]["clocks"] == "shared"


def test_lanes_are_the_unions_the_report_measured(exported):
    _, data, report = exported
    _, slices = _check_format(data)
    for r in report.ranks:
        pid = r.rank + 1
        steps = _lane(slices, pid, STEP_TID)
        assert [e["name"] for e in steps] == [f"ProfilerStep#{s.step}" for s in r.steps] and steps
        for e, s in zip(steps, r.steps):
            assert e["dur"] == pytest.approx(s.step_us)
            assert e["args"]["exposed_comm_us"] == s.exposed_comm_us
            lo, hi = e["ts"], e["ts"] + e["dur"]
            for tid, want in ((COMPUTE_TID, s.compute_us), (COMM_TID, s.comm_us), (EXPOSED_TID, s.exposed_comm_us)):
                lane = _lane(slices, pid, tid, s.step)
                assert all(lo - 1e-6 <= x["ts"] and x["ts"] + x["dur"] <= hi + 1e-6 for x in lane), "clipped"
                assert sum(x["dur"] for x in lane) == pytest.approx(want, rel=1e-9, abs=1e-6), (r.rank, s.step, tid)
            # The exposed lane lies inside the communication lane and outside the compute lane.
            comm, compute = _lane(slices, pid, COMM_TID, s.step), _lane(slices, pid, COMPUTE_TID, s.step)
            for x in _lane(slices, pid, EXPOSED_TID, s.step):
                a, b = x["ts"], x["ts"] + x["dur"]
                assert any(c["ts"] - 1e-6 <= a and b <= c["ts"] + c["dur"] + 1e-6 for c in comm)
                assert not any(c["ts"] + 1e-6 < b and a < c["ts"] + c["dur"] - 1e-6 for c in compute)


def test_ranks_share_one_clock(exported):
    """Ring steps are chained by blocking send/recv: the same ProfilerStep of the two ranks
    overlaps in time on the common axis (it would not on clocks offset by the traces' bases)."""
    _, data, report = exported
    _, slices = _check_format(data)
    by_rank = {r.rank: {e["name"]: e for e in _lane(slices, r.rank + 1, STEP_TID)} for r in report.ranks}
    common = set(by_rank[0]) & set(by_rank[1])
    assert common
    for name in common:
        a, b = by_rank[0][name], by_rank[1][name]
        assert a["ts"] < b["ts"] + b["dur"] and b["ts"] < a["ts"] + a["dur"], (name, a, b)
    assert min(e["ts"] for e in slices) == 0


def _raw_events(files):
    events = []
    for f in files:
        text = gzip.open(f, "rt").read() if str(f).endswith(".gz") else Path(f).read_text()
        events += json.loads(text)["traceEvents"]
    return events


def _trace_events_of_rank(slices, rank):
    return [e for e in slices if e["pid"] == rank + 1 and e["tid"] >= TRACE_TID0]


def test_default_selection_is_the_reports_step_with_every_trace_event(exported):
    _, data, report = exported
    _, slices = _check_format(data)
    step = report.ranks[0].timeline.step
    assert f"ProfilerStep#{step}" in data["otherData"]["selection"]
    for r in report.ranks:
        ours = _trace_events_of_rank(slices, r.rank)
        marker = [e for e in ours if e["name"] == f"ProfilerStep#{step}"]
        lane = next(e for e in _lane(slices, r.rank + 1, STEP_TID) if e["name"] == f"ProfilerStep#{step}")
        assert len(marker) == 1 and marker[0]["ts"] == pytest.approx(lane["ts"])
        # The same events, read from the trace files with json: those starting inside the step.
        raw = _raw_events(r.files)
        raw_step = next(e for e in raw if e.get("ph") == "X" and e.get("name") == f"ProfilerStep#{step}")
        shift = lane["ts"] - raw_step["ts"]
        want = [e for e in raw
                if e.get("ph") == "X" and "dur" in e and raw_step["ts"] <= e["ts"] < raw_step["ts"] + lane["dur"]]
        assert sorted(e["name"] for e in ours) == sorted(e["name"] for e in want)
        assert sorted(e["ts"] for e in ours) == pytest.approx(sorted(e["ts"] + shift for e in want), abs=1e-3)
        assert any(e["name"].startswith("c10d::") for e in ours)  # the communication calls are there


def test_step_and_window_choose_the_events(runs, tmp_path, exported):
    _, data, report = exported
    first = report.ranks[0].steps[0].step
    out = tmp_path / "step.json"
    assert _export(runs.ring["sync"], "-o", out, "--step", first, "-q").exit_code == 0
    _, slices = _check_format(_strict(out.read_text()))
    assert [e for e in _trace_events_of_rank(slices, 0) if e["name"] == f"ProfilerStep#{first}"]
    assert not [e for e in _trace_events_of_rank(slices, 0) if e["name"].startswith("ProfilerStep#")
                and e["name"] != f"ProfilerStep#{first}"]

    out = tmp_path / "window.json"
    assert _export(runs.ring["sync"], "-o", out, "--window", "0:5", "-q").exit_code == 0
    window = _strict(out.read_text())
    _, slices = _check_format(window)
    assert window["otherData"]["selection"] == "trace events starting in 0-5 ms"
    ours = [e for r in report.ranks for e in _trace_events_of_rank(slices, r.rank)]
    assert ours and all(0 <= e["ts"] < 5000 for e in ours)
    # The lanes are always every step, whatever is selected.
    assert len(_lane(slices, 1, STEP_TID)) == len(report.ranks[0].steps)


def _listing(folder: Path):
    return sorted((p.relative_to(folder), p.stat().st_size) for p in folder.rglob("*"))


@pytest.mark.parametrize("args, message", [
    (["-o", "{run}/timeline.json"], "inside run directory"),
    (["-o", "{run}/logs/timeline.json"], "inside run directory"),
    (["-o", "{trace}"], "which is a trace"),
    (["-o", "{tmp}"], "is a folder"),
    (["-o", "{tmp}/t.json", "--step", "999"], "no ProfilerStep#999"),
    (["-o", "{tmp}/t.json", "--window", "5"], "START:END"),
    (["-o", "{tmp}/t.json", "--window", "9:2"], "0 <= START < END"),
    (["-o", "{tmp}/t.json", "--window", "100000:200000"], "after the timeline ends"),
    (["-o", "{tmp}/t.json", "--step", "1", "--window", "0:1"], "not both"),
])
def test_bad_input_is_one_line_exit_2_and_nothing_is_lost(runs, tmp_path, args, message):
    run = runs.ring["sync"]
    trace = sorted(run.glob("rank0*.pt.trace.json*"))[0]
    before = _listing(run)
    args = [a.format(run=run, trace=trace, tmp=tmp_path) for a in args]
    result = _export(run, *args, "-q")
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("Error: ") and message in result.stderr and result.stderr.count("\n") == 1
    assert _listing(run) == before
    assert not (tmp_path / "t.json").exists()


def test_exporting_again_replaces_the_export_but_never_a_trace(runs, tmp_path):
    """An export is trace-event JSON, yet its own: exporting again to its path replaces it (it
    was refused as "a trace" until 2026-12-07); a profiler's trace copied under a plain name is not."""
    out = tmp_path / "timeline.json"
    for step in (None, 20):
        result = _export(runs.ring["sync"], "-o", out, *(["--step", step] if step else []), "-q")
        assert result.exit_code == 0, result.output
    assert "ProfilerStep#20" in json.loads(out.read_text())["otherData"]["selection"]
    copied = tmp_path / "plain.json"
    copied.write_bytes(sorted(runs.ring["sync"].glob("rank0*.pt.trace.json*"))[0].read_bytes())
    result = _export(runs.ring["sync"], "-o", copied, "-q")
    assert result.exit_code == 2 and "which is a trace" in result.stderr, result.output


def test_missing_run_is_one_line_exit_2(tmp_path):
    result = _export(tmp_path / "nosuch", "-o", tmp_path / "t.json")
    assert result.exit_code == 2 and "no such run directory" in result.stderr and result.stderr.count("\n") == 1


IMPORT = """(() => {
  const text = %s;
  const model = new tr.Model();
  const importer = new tr.importer.Import(model, new tr.importer.ImportOptions());
  importer.importTraces([text]);
  const procs = Object.values(model.processes).map(p => ({
      pid: p.pid, name: p.name,
      threads: Object.values(p.threads).map(t => ({name: t.name, slices: t.sliceGroup.slices.length}))}));
  return {procs, warnings: model.importWarnings.map(w => w.message)};
})()"""


@pytest.mark.skipif(chromium_path() is None, reason="chromium is not installed (scripts/setup.sh --test installs it)")
def test_chrome_tracing_imports_the_export(exported):
    """chrome://tracing's own importer (the trace viewer's tr.Model) reads the file: one process
    per rank, named lanes, as many slices as we wrote, no import warning."""
    path, data, report = exported
    with Page() as page:
        # Chromium keeps its debugging pages (chrome://tracing among them) off until
        # chrome://chrome-urls' button turns them on.
        page.open("chrome://chrome-urls")
        page.evaluate("(() => { const app = document.querySelector('chrome-urls-app');"
                      " const b = app && app.shadowRoot && app.shadowRoot.querySelector('cr-button');"
                      " if (b) b.click(); return !!b; })()")
        time.sleep(1)
        error = page.call("Page.navigate", url="chrome://tracing").get("errorText")
        time.sleep(2)
        ready = not error and page.evaluate("typeof tr !== 'undefined' && typeof tr.Model === 'function'")
        if not ready:
            pytest.skip(f"chrome://tracing does not load in headless Chromium here ({error or 'no trace viewer'})")
        facts = page.evaluate(IMPORT % json.dumps(path.read_text()))
    assert facts["warnings"] == []
    procs = {p["pid"]: p for p in facts["procs"]}
    assert set(procs) == {r.rank + 1 for r in report.ranks}
    for r in report.ranks:
        p = procs[r.rank + 1]
        assert p["name"] == f"rank {r.rank}"
        threads = {t["name"]: t["slices"] for t in p["threads"]}
        steps = len(r.steps)
        assert threads["steps"] == steps
        wrote = sum(1 for e in data["traceEvents"] if e["ph"] == "X" and e["pid"] == r.rank + 1)
        assert sum(threads.values()) == wrote


def test_html_report_names_the_export(exported, runs):
    from overlapprof.compare import compare
    from overlapprof.renderers import html

    _, _, report = exported
    page = html.render(compare([report], ["sync"]))
    assert f"overlapprof export {runs.ring['sync']} -o timeline.json" in page
    assert "ui.perfetto.dev" in page and "chrome://tracing" in page
