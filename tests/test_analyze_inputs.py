"""Inputs of `overlapprof analyze`: discovery, ranks, run directories, bad input, CLI outputs."""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import overlapprof
import overlapprof.analysis.analyzer as A
from overlapprof.cli import main
from overlapprof.errors import InputError, OverlapprofError, ReportError, TraceError
from overlapprof.report import Report

import synthetic as S

DATA = Path(__file__).parent / "data"
GOOD = [S.kernel("ncclKernel_AllReduce", 0, 10, stream=20), S.kernel("gemm", 5, 10)]


def cli(*args):
    return CliRunner().invoke(main, ["analyze", *map(str, args)])


def assert_one_line_error(result, *needles):
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert "Traceback" not in result.output
    for needle in needles:
        assert needle in lines[0], lines[0]


BAD_FILES = {
    "not-json.json": (b"this is not json {", "not valid JSON"),
    "truncated.json.gz": (gzip.compress(json.dumps(S.trace(GOOD)).encode())[:-20], "truncated gzip"),
    "no-events.json": (b'{"schemaVersion": 1, "distributedInfo": {"rank": 0}}', "no 'traceEvents'"),
    "empty.json": (b'{"traceEvents": []}', "empty trace"),
    "empty-file.json": (b"", "empty file"),
    "only-metadata.json": (json.dumps(S.trace([])).encode(), "no complete ('X') events"),
    "missing-ts.json": (json.dumps(S.trace([{"ph": "X", "cat": "kernel", "name": "k", "dur": 3}])).encode(),
                        "event 1: 'ts' is missing"),
    "missing-dur.json": (json.dumps(S.trace([{"ph": "X", "cat": "kernel", "name": "k", "ts": 3}])).encode(),
                         "event 1: 'dur' is missing"),
    "string-ts.json": (json.dumps(S.trace([{"ph": "X", "cat": "kernel", "name": "k", "ts": "3", "dur": 1}])).encode(),
                       "event 1: 'ts' is not a number"),
    "null-dur.json": (json.dumps(S.trace([{"ph": "X", "cat": "kernel", "name": "k", "ts": 3, "dur": None}])).encode(),
                      "event 1: 'dur' is missing"),
    "array.json": (b"[1, 2]", "event 0: not an object (got int)"),  # the JSON Array Format, of no events
    "string.json": (b"\"traceEvents\"", "not a PyTorch profiler trace"),
    "huge-ts.json": (b'{"traceEvents": [{"ph": "X", "ts": 1e999, "dur": 1}]}', "event 0: 'ts'"),
}


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_bad_file_is_one_line_exit_2(tmp_path, name):
    data, problem = BAD_FILES[name]
    path = S.write(tmp_path / name, data, gz=False)
    assert_one_line_error(cli(path), name, problem)
    with pytest.raises(TraceError, match=re.escape(problem)):
        overlapprof.analyze(path, workers=1)


def test_missing_path(tmp_path):
    assert_one_line_error(cli(tmp_path / "nope.json"), "nope.json", "no such file")


def test_folder_without_traces(tmp_path):
    (tmp_path / "notes.txt").write_text("hi")
    assert_one_line_error(cli(tmp_path), "no trace files")


def test_two_files_claiming_one_rank(tmp_path):
    a = S.write(tmp_path / "a.json", S.trace(GOOD, rank=1, world_size=2))
    b = S.write(tmp_path / "b.json", S.trace(GOOD, rank=1, world_size=2))
    assert_one_line_error(cli(a, b), "rank 1", "a.json", "b.json")
    # By file name too.
    c = S.write(tmp_path / "x" / "rank-3.json", S.trace(GOOD)) if (tmp_path / "x").mkdir() is None else None
    d = S.write(tmp_path / "rank3.json.gz", S.trace(GOOD))
    assert_one_line_error(cli(c, d), "rank 3", "file name")


def test_ranks_of_different_runs(tmp_path):
    a = S.write(tmp_path / "a.json", S.trace(GOOD, rank=0, world_size=2))
    b = S.write(tmp_path / "b.json", S.trace(GOOD, rank=1, world_size=4))
    assert_one_line_error(cli(a, b), "different runs", "world_size")
    c = S.write(tmp_path / "c.json", S.trace(GOOD, rank=1, world_size=2, backend="gloo"))
    assert_one_line_error(cli(a, c), "different runs", "backend")
    # Same job shape, but recorded a day apart (baseTimeNanoseconds gives the absolute clock).
    d = S.write(tmp_path / "d.json", S.trace(GOOD, rank=0, world_size=2, base_ns=1_700_000_000 * 10**9))
    e = S.write(tmp_path / "e.json", S.trace(GOOD, rank=1, world_size=2, base_ns=1_700_086_400 * 10**9))
    assert_one_line_error(cli(d, e), "different runs", "h after")
    f = S.write(tmp_path / "f.json", S.trace(GOOD, rank=5, world_size=2))
    assert_one_line_error(cli(a, f), "outside world_size")
    # The two real trace_filter ranks are one run.
    assert cli(DATA / "trace_filter").exit_code == 0


def test_allow_partial_keeps_good_ranks(tmp_path):
    good = S.write(tmp_path / "rank0.json", S.trace(GOOD))
    bad = S.write(tmp_path / "rank1.json", b"{ nope", gz=False)
    assert_one_line_error(cli(good, bad), "rank1.json", "not valid JSON")
    result = cli(good, bad, "--allow-partial")
    assert result.exit_code == 0
    assert "warning: skipped" in result.output and "rank1.json" in result.output
    report = overlapprof.analyze([good, bad], allow_partial=True, workers=1)
    assert [r.rank for r in report.ranks] == [0] and any("rank1.json" in w for w in report.warnings)
    # All bad: still an error.
    assert_one_line_error(cli(bad, "--allow-partial"), "rank1.json")


def test_rank_sources(tmp_path):
    def events(k):  # three recordings, not one copied (that would be refused: test_layouts.py)
        return [S.kernel("ncclKernel_AllReduce", 0, 10 + k, stream=20), S.kernel("gemm", 5, 10)]

    S.write(tmp_path / "sampled_rank-5.json", S.trace(events(0)))
    S.write(tmp_path / "worker_a.json", S.trace(events(1)))
    S.write(tmp_path / "worker_b.json.gz", S.trace(events(2), rank=2, world_size=8))
    S.write(tmp_path / "notes.txt", b"not a trace")
    report = overlapprof.analyze(tmp_path, workers=1)
    assert [(r.rank, r.rank_source) for r in report.ranks] == [(0, "order"), (2, "distributedInfo"), (5, "file name")]


def _run_dir(tmp_path, repeat=2, world_size=2):
    """A run directory as `overlapprof run` writes it (see overlapprof/launch/directory.py)."""
    run = tmp_path / "ring-20260101-000000-async"
    (run / "logs").mkdir(parents=True)
    traces = {}
    for rank in range(world_size):
        names = []
        for cycle in range(repeat):
            t0 = 1000 * cycle
            events = [S.step(cycle + 1, t0, 100), S.kernel("ncclKernel_AllReduce", t0, 10, stream=20),
                      S.kernel("gemm", t0 + 5, 10 + rank)]
            name = f"rank{rank}.{cycle}.pt.trace.json"
            S.write(run / name, S.trace(events, rank=rank, world_size=world_size, backend="gloo"))
            names.append(name)
        traces[str(rank)] = names
    (run / "logs" / "rank0.error.json").write_text("{}")
    run_json = {"schema_version": 1, "workload": {"name": "ring"}, "variant": "async", "world_size": world_size,
                "traces": traces}
    (run / "run.json").write_text(json.dumps(run_json))
    return run


def test_run_directory_with_repeated_cycles(tmp_path):
    run = _run_dir(tmp_path)
    report = overlapprof.analyze(run, workers=1)
    assert [r.rank for r in report.ranks] == [0, 1]
    r0 = report.rank(0)
    assert len(r0.files) == 2 and [s.step for s in r0.steps] == [1, 2]
    assert (r0.metrics.comm_us, r0.metrics.overlapped_us) == (20, 10)
    assert report.run["variant"] == "async" and report.run["workload"]["name"] == "ring"
    # Without run.json's list (a run cut short) the directory's traces are grouped by rank.
    (run / "run.json").write_text(json.dumps({"schema_version": 1, "traces": {}}))
    again = overlapprof.analyze(run, workers=1)
    assert [(r.rank, len(r.files)) for r in again.ranks] == [(0, 2), (1, 2)]


def test_run_directory_missing_rank_warns(tmp_path):
    run = _run_dir(tmp_path, repeat=1)
    data = json.loads((run / "run.json").read_text())
    data["world_size"] = 3
    (run / "run.json").write_text(json.dumps(data))
    # world_size in distributedInfo is 2 but run.json says 3: only the warning matters here
    report = overlapprof.analyze(run, workers=1)
    assert any("no trace for ranks [2]" in w for w in report.warnings)


def test_parallel_workers_give_the_same_report(tmp_path):
    serial = overlapprof.analyze(DATA / "trace_filter", workers=1)
    old = A.PARALLEL_MIN_BYTES
    A.PARALLEL_MIN_BYTES = 0
    try:
        parallel = overlapprof.analyze(DATA / "trace_filter", workers=2)
    finally:
        A.PARALLEL_MIN_BYTES = old
    assert parallel.ranks == serial.ranks and parallel.summary == serial.summary


def test_outputs(tmp_path):
    folder = DATA / "trace_filter"
    table = cli(folder)
    assert table.exit_code == 0
    assert "overlap" in table.stdout and "14.95%" in table.stdout and "19.93%" in table.stdout
    assert "pooled 17.38%" in table.stdout and "most on rank 0" in table.stdout
    steps = cli(folder, "--by", "step")
    assert "#551" in steps.stdout and "11.81%" in steps.stdout
    kinds = cli(folder, "--by", "kind")
    assert "all_to_all" in kinds.stdout and "send_recv" not in kinds.stdout  # v2: kind of the issuing collective
    js = cli(folder, "--json")
    assert js.exit_code == 0
    report = Report.from_json(js.stdout)
    assert report.ranks[0].metrics.comm_us == 396199
    csv_text = cli(folder, "--csv", "-", "--by", "step").stdout.splitlines()
    assert csv_text[0].startswith("rank,step,start_us,step_us,exposed_share,comm_us")
    assert len(csv_text) == 5
    out = tmp_path / "report.json"
    both = cli(folder, "--json", out, "--csv", tmp_path / "r.csv")
    assert both.exit_code == 0 and "14.95%" in both.stdout  # table still printed
    assert Report.load(out) == report
    # A saved report is re-rendered without the traces.
    again = cli(out, "--by", "kind")
    assert again.exit_code == 0 and again.stdout == kinds.stdout


def test_cli_never_overwrites_a_trace(tmp_path):
    trace = S.write(tmp_path / "rank0.json", S.trace(GOOD))
    before = trace.read_bytes()
    result = cli("--json", trace, DATA / "trace_filter")
    assert result.exit_code == 2 and "refusing" in result.output
    assert trace.read_bytes() == before
    from overlapprof.trace.discover import is_trace_file

    assert is_trace_file(trace) and is_trace_file(DATA / "mtia" / "mtia_rank_0.json.gz")
    (tmp_path / "notes.json").write_text('{"a": 1}')
    assert not is_trace_file(tmp_path / "notes.json") and not is_trace_file(tmp_path / "absent.json")


def test_cli_usage_errors():
    assert cli().exit_code == 2
    assert cli(DATA / "trace_filter", "--by", "nope").exit_code == 2
    assert cli(DATA / "trace_filter", "--workers", "0").exit_code == 2
    assert_one_line_error(cli(DATA / "trace_filter", "--comm-kernel", "(unclosed"), "not a valid regular expression")


def test_bad_report_file(tmp_path):
    p = tmp_path / "r.json"
    p.write_text('{"schema": "something/else"}')
    with pytest.raises(ReportError, match="not an overlapprof report"):
        Report.load(p)
    p.write_text('{"schema": "overlapprof.report/1", "ranks": 3}')
    with pytest.raises(ReportError, match="damaged"):
        Report.load(p)
    assert_one_line_error(cli(p), "r.json")


def test_errors_are_overlapprof_errors():
    assert issubclass(TraceError, OverlapprofError) and issubclass(InputError, OverlapprofError)


def test_subprocess_exit_code_and_stderr(tmp_path):
    """The installed entry point: one line on stderr, exit 2, nothing on stdout."""
    bad = S.write(tmp_path / "bad.json", b'{"traceEvents": [{"ph": "X", "ts": "x", "dur": 1}]}', gz=False)
    proc = subprocess.run([sys.executable, "-m", "overlapprof", "analyze", str(bad)], capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == f"Error: {bad}: event 0: 'ts' is not a number (got str)\n"


def test_analysis_report_renderers_and_compare_run_without_torch():
    """The analyzer, report, compare and every renderer (each one found in the package, so a new
    one is covered) run where torch is not installed, on a real trace."""
    code = (
        "import sys, pkgutil, importlib; sys.modules['torch'] = None\n"
        "import overlapprof, overlapprof.analysis.analyzer, overlapprof.report, overlapprof.compare\n"
        "import overlapprof.renderers as R\n"
        "names = sorted(m.name for m in pkgutil.iter_modules(R.__path__))\n"
        "mods = {n: importlib.import_module(f'overlapprof.renderers.{n}') for n in names}\n"
        "import overlapprof.cli.analyze_cmd\n"
        f"r = overlapprof.analyze({str(DATA / 'cpu_only')!r}, workers=1)\n"
        "c = overlapprof.compare.compare([r, r], labels=['a', 'b'])\n"
        "out = [mods['table'].render(r, by) for by in mods['table'].BY] + [mods['csv'].render(r, by) for by in mods['csv'].BY]\n"
        "out += [mods['json'].render(r), mods['collectives_table'].render(r)]\n"
        "out += [mods[n].render(c) for n in ('compare_table', 'compare_csv', 'compare_json', 'html')]\n"
        "out += [mods['plots'].to_bytes(mods['plots'].exposure_figure(r), 'svg')[:4].decode()]\n"
        "print(names); print('\\n'.join(out[:1]))\n"
        "assert all(out), [k for k, o in enumerate(out) if not o]\n"
        "assert not [m for m in sys.modules if m.startswith('torch') and sys.modules[m] is not None]\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "0.00%" in proc.stdout
    assert "'html'" in proc.stdout and "'straggler_plot'" in proc.stdout and "'format'" in proc.stdout


def test_one_trace_imports_only_what_it_uses():
    """Start-up cost: a plain analysis of one small trace (and its table) imports no process pool,
    no --like-hta or --lanes code and no run-directory code."""
    code = (
        "import sys\n"
        "from overlapprof.cli import main\n"
        f"try: main(['analyze', {str(DATA / 'cpu_only')!r}, '-q'])\n"
        "except SystemExit: pass\n"
        "print(sorted(sys.modules))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = set(eval(proc.stdout.splitlines()[-1]))
    unused = {"overlapprof.analysis.like_hta", "overlapprof.analysis.lanes", "overlapprof.rundir.directory",
              "overlapprof.renderers.csv", "multiprocessing", "concurrent.futures", "tempfile", "socket"}
    assert not loaded & unused, sorted(loaded & unused)


def test_run_file_name_is_rundir_s():
    from overlapprof.rundir import directory
    from overlapprof.trace import discover

    assert discover.RUN_FILE == directory.RUN_FILE  # discover names it without importing rundir


_PARENT = os.getpid()
_REAL_GROUP = A.analyze_group


def _dying_group(files, options, *args, **kwargs):
    """analyze_group that kills the worker process it runs in (picklable: module level)."""
    if os.getpid() != _PARENT:
        os._exit(3)
    return _REAL_GROUP(files, options, *args, **kwargs)


def test_dead_worker_falls_back_to_this_process(monkeypatch):
    """A worker that dies (e.g. killed for memory) costs parallelism, not the analysis."""
    monkeypatch.setattr(A, "analyze_group", _dying_group)
    monkeypatch.setattr(A, "PARALLEL_MIN_BYTES", 0)
    report = overlapprof.analyze(DATA / "trace_filter", workers=2)
    assert [r.rank for r in report.ranks] == [0, 1]
    assert any("worker processes failed" in w for w in report.warnings)


# -- folders holding `overlapprof run` directories (real 2-rank ring runs: the `runs` fixture)


def _numbers(report):
    return [(r.rank, r.metrics.comm_us, r.metrics.overlapped_us) for r in report.ranks]


def test_folder_of_several_runs_is_refused_with_their_list(runs):
    """runs.root holds ring-sync, ring-async and allreduce-async: three jobs, not ranks of one."""
    names = sorted(p.name for p in runs.root.iterdir() if (p / "run.json").is_file())
    assert len(names) == 3
    result = cli(runs.root)
    assert_one_line_error(result, str(runs.root), "3 different runs", "overlapprof compare", *names)
    # The suggested compare lists them in the order they ran: its first is the baseline.
    assert f"overlapprof compare {runs.ring['sync']} {runs.ring['async']} ..." in result.stderr
    with pytest.raises(InputError, match="not ranks of one job"):
        overlapprof.analyze([runs.ring["sync"], runs.ring["async"]], workers=1)


def test_folder_holding_one_run_is_that_run(runs, tmp_path):
    import shutil

    nested = tmp_path / "traces" / "2026"
    shutil.copytree(runs.ring["async"], nested / runs.ring["async"].name)
    direct = overlapprof.analyze(runs.ring["async"], workers=1)
    found = overlapprof.analyze(tmp_path / "traces", workers=1)
    assert _numbers(found) == _numbers(direct) and len(found.ranks) == 2
    assert [r.rank_source for r in found.ranks] == ["distributedInfo"] * 2
    assert found.run["variant"] == "async" and found.run["traces"] == direct.run["traces"]
    # nodes/, ranks/ and logs/ of the run are not taken for traces; a trace beside the run is ambiguous
    S.write(tmp_path / "traces" / "extra.json", S.trace(GOOD))
    assert_one_line_error(cli(tmp_path / "traces"), "holds run directories", "extra.json")


def test_node_parts_of_one_multinode_run_are_one_job(runs, tmp_path):
    """A 2-node run on filesystems that are not shared: one directory per node, same run id and
    name, each with its own rank (made from the real ring run by splitting its ranks)."""
    import shutil

    source = runs.ring["sync"]
    whole = json.loads((source / "run.json").read_text())
    for node, rank in ((0, "0"), (1, "1")):
        part = tmp_path / "collected" / f"node{node}" / source.name
        shutil.copytree(source, part)
        other = whole["traces"]["1" if rank == "0" else "0"][0]
        (part / other).unlink()
        run = dict(whole, run_id="ring-2n", nnodes=2, status="incomplete", missing_ranks=[1 - int(rank)],
                   traces={rank: whole["traces"][rank]}, ranks={rank: whole["ranks"][rank]})
        (part / "run.json").write_text(json.dumps(run))
    report = overlapprof.analyze(tmp_path / "collected", workers=1)
    assert _numbers(report) == _numbers(overlapprof.analyze(source, workers=1))
    assert sorted(report.run["traces"]) == ["0", "1"] and report.run["missing_ranks"] == []
    assert not any("no trace for ranks" in w for w in report.warnings)


def test_own_outputs_are_not_traces(tmp_path):
    """A saved comparison and an exported timeline (trace-event JSON of unions already measured)
    are refused by name, and skipped when found in a folder of traces."""
    traces = tmp_path / "traces"
    traces.mkdir()
    for rank in (0, 1):
        S.write(traces / f"rank{rank}.pt.trace.json", S.trace(GOOD, rank=rank, world_size=2))
    timeline = tmp_path / "timeline.json"
    exported = CliRunner().invoke(main, ["export", str(traces), "-o", str(timeline)])
    assert exported.exit_code == 0, exported.output
    comparison = tmp_path / "cmp.json"
    saved = CliRunner().invoke(main, ["compare", str(traces / "rank0.pt.trace.json"), str(traces / "rank1.pt.trace.json"),
                                      "--json", str(comparison)])
    assert saved.exit_code == 0, saved.output
    assert_one_line_error(cli(timeline), "overlapprof export", "Perfetto")
    assert_one_line_error(cli(comparison), "saved comparison", f"overlapprof compare {comparison}")
    (traces / "timeline.json").write_bytes(timeline.read_bytes())
    assert [r.rank for r in overlapprof.analyze(traces, workers=1).ranks] == [0, 1]  # the timeline is no third rank


@pytest.mark.parametrize("command", ["analyze", "compare"])
def test_a_run_given_as_the_json_file_is_refused_with_the_hint(tmp_path, command):
    """``--json RUN`` takes RUN as the JSON file's name (before: "Missing argument 'PATHS...'");
    a folder as --json or --csv FILE is refused saying how to give both, and nothing is written."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text("{}")
    traces = tmp_path / "traces"
    traces.mkdir()
    for args, says in (
        (["--json", run], f"--json {run}: {run} is a run directory, not the file to write JSON to: give the file "
                          f"first (--json FILE {run}), or '-' for stdout (--json - {run})"),
        (["--csv", traces], f"--csv {traces}: {traces} is a folder, not the file to write CSV to: give the file "
                            f"first (--csv FILE {traces}), or '-' for stdout (--csv - {traces})"),
    ):
        res = CliRunner().invoke(main, [command, *map(str, args)])
        assert (res.exit_code, res.output) == (2, f"Error: {says}\n")
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["run", "run.json", "traces"]
