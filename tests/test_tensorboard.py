"""Run directories as TensorBoard logdirs (one real TensorBoard process), the overlap scalars, and
the traces as Chrome trace JSON (what Perfetto UI and chrome://tracing open)."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner

from overlapprof import analyze
from overlapprof.cli import main
from overlapprof.renderers.tensorboard import SCALAR_DIR, TAGS, scalar_points, write_scalars

PLUGIN = "/data/plugin/pytorch_profiler"


def _get(url: str):
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.loads(response.read())


def _q(**params) -> str:
    return urllib.parse.urlencode(params)


def _wait_loaded(url: str, runs: set[str], timeout: float = 120) -> None:
    """torch-tb-profiler scans the logdir every 10 s and parses traces in worker processes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        answer = _get(f"{url}{PLUGIN}/runs")
        if set(answer["runs"]) >= runs and not answer["loading"]:
            return
        time.sleep(0.5)
    raise AssertionError(f"runs not loaded in {timeout} s: {answer}")


@pytest.fixture
def busy_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_view_serves_traces_and_scalars(runs, busy_port):
    """`overlapprof view` on the folder of the session's runs, with its port taken: it picks
    another, writes missing scalars, and TensorBoard's plugins answer with the runs' data."""
    sync, async_, allreduce = runs.ring["sync"], runs.ring["async"], runs.allreduce
    # `overlapprof run` wrote scalars already; take one away so that `view` writes it again.
    for f in sorted((allreduce / SCALAR_DIR).rglob("*"), reverse=True):
        f.rmdir() if f.is_dir() else f.unlink()
    (allreduce / SCALAR_DIR).rmdir()
    view = subprocess.Popen([sys.executable, "-m", "overlapprof", "view", str(runs.root), "--port", str(busy_port)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = view.stdout.readline()
        match = re.match(r"TensorBoard: (http://127\.0\.0\.1:(\d+))/ ", line)
        assert match, line + view.stderr.read() if view.poll() is not None else line
        url, port = match.group(1), int(match.group(2))
        assert port != busy_port
        assert (allreduce / SCALAR_DIR / "rank0").is_dir()

        names = {p.name for p in (sync, async_, allreduce)}
        _wait_loaded(url, names)
        for run in names:
            workers = _get(f"{url}{PLUGIN}/workers?{_q(run=run, view='Overview')}")
            assert workers == ["rank0", "rank1"], run  # one worker per rank
            assert {"Overview", "Operator", "Trace"} <= set(_get(f"{url}{PLUGIN}/views?{_q(run=run)}"))
        # Collectives (all_reduce) give the Distributed view, with all ranks together.
        assert "Distributed" in _get(f"{url}{PLUGIN}/views?{_q(run=allreduce.name)}")
        assert _get(f"{url}{PLUGIN}/workers?{_q(run=allreduce.name, view='Distributed')}") == ["All"]
        span = _get(f"{url}{PLUGIN}/spans?{_q(run=allreduce.name, worker='All')}")[0]
        ops = _get(f"{url}{PLUGIN}/distributed/commops?{_q(run=allreduce.name, worker='All', span=span)}")["data"]
        report = analyze([str(allreduce)])
        for rank in (0, 1):
            calls = {row[0]: row[1] for row in ops[f"rank{rank}"]["rows"]}
            ours = next(k.count for k in report.rank(rank).kinds if k.kind == "all_reduce")
            assert calls == {"gloo:all_reduce": ours} and ours > 0

        # Scalars: the Scalars plugin (no profiler plugin needed) returns the report's numbers.
        tags = _get(f"{url}/data/plugin/scalars/tags")
        for run_dir in (sync, async_, allreduce):
            report = analyze([str(run_dir)])
            points = scalar_points(report)
            for rank in (0, 1):
                run = f"{run_dir.name}/{SCALAR_DIR}/rank{rank}"
                assert set(tags[run]) == set(TAGS), run
                for tag in ("overlap/exposed_comm_us", "overlap/ratio", "overlap/step_us"):
                    got = _get(f"{url}/data/plugin/scalars/scalars?{_q(run=run, tag=tag)}")
                    want = [(step, values[tag]) for step, values in points[rank] if tag in values]
                    assert [(step, value) for _, step, value in got] == want, (run, tag)
                steps = [s.step for s in report.rank(rank).steps]
                assert [p[0] for p in points[rank]] == steps and steps
        # TensorBoard and the plugin's workers (which parsed the traces), in a group of their own
        tensorboard = _children(view.pid)
        group = [pid for pid in _pids() if _pgid(pid) == tensorboard[0]]
        assert len(tensorboard) == 1 and len(group) > 1, (tensorboard, group)
    finally:
        view.send_signal(signal.SIGTERM)  # a job scheduler's stop: as Ctrl-C (one except clause), TensorBoard stops
        try:
            view.wait(timeout=30)
        finally:
            view.kill()
    assert view.returncode == 0, view.stderr.read()
    with pytest.raises(OSError):
        urllib.request.urlopen(f"{url}/data/logdir", timeout=5)
    assert [pid for pid in group if _alive(pid)] == []  # nothing keeps the port
    notes = view.stderr.read()
    assert ("offline, the Scalars tab works (the overlap metrics per step and rank) and so does `overlapprof "
            "report`") in notes and "every view of the PyTorch Profiler tab" in notes


def _pids():
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]


def _pgid(pid):
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def _children(pid):
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def _alive(pid):
    try:
        state = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("State:"))
    except (OSError, StopIteration):
        return False
    return "zombie" not in state


def test_scalars_are_never_overwritten(runs, tmp_path):
    report = analyze([str(runs.ring["sync"])])
    first = write_scalars(report, tmp_path)
    assert first == tmp_path / SCALAR_DIR and sorted(p.name for p in first.iterdir()) == ["rank0", "rank1"]
    stamp = sorted(first.rglob("events.out.tfevents.*"))
    assert len(stamp) == 2 and write_scalars(report, tmp_path) is None
    assert sorted(first.rglob("events.out.tfevents.*")) == stamp
    assert not list(tmp_path.glob(".*.tmp"))


@pytest.mark.parametrize("target, message", [
    ("missing", "no such run directory"), ("run.json", "not a directory"), ("logs", "nothing for TensorBoard")])
def test_view_bad_path_is_one_line_exit_2(runs, target, message):
    path = runs.ring["sync"] / target if target in ("run.json", "logs") else runs.root / target
    out = CliRunner().invoke(main, ["view", str(path), "-q"])
    assert out.exit_code == 2 and out.stderr.startswith("Error: ") and message in out.stderr
    assert out.stderr.count("\n") == 1


# Chrome Trace Event Format: fields each phase needs to be drawn by Perfetto / chrome://tracing.
REQUIRED = {
    "X": {"name", "ts", "dur", "pid", "tid"},
    "B": {"name", "ts", "pid", "tid"},
    "E": {"ts", "pid", "tid"},
    "i": {"name", "ts", "pid", "s"},
    "I": {"name", "ts", "pid"},
    "C": {"name", "ts", "pid", "args"},
    "M": {"name", "pid", "args"},
    "s": {"id", "ts", "pid", "tid"},
    "t": {"id", "ts", "pid", "tid"},
    "f": {"id", "ts", "pid", "tid"},
}


def _strict(text: str):
    """JSON as Perfetto's parser takes it: NaN and Infinity are not JSON."""
    def reject(constant):
        raise ValueError(f"non-JSON constant {constant}")
    return json.loads(text, parse_constant=reject)


def test_traces_are_chrome_trace_json(runs):
    traces = [t for d in (*runs.ring.values(), runs.allreduce) for t in sorted(d.glob("rank*.pt.trace.json*"))]
    assert len(traces) == 6
    for trace in traces:
        data = _strict(trace.read_text())
        events = data["traceEvents"]
        assert isinstance(events, list) and events, trace
        phases = set()
        for e in events:
            phases.add(e["ph"])
            assert e["ph"] in REQUIRED, (trace.name, e)
            missing = REQUIRED[e["ph"]] - set(e)
            assert not missing, (trace.name, e["ph"], missing)
            for key in ("ts", "dur"):
                if key in e:
                    assert isinstance(e[key], (int, float)) and math.isfinite(e[key]), (trace.name, e)
        assert "X" in phases
        assert data["distributedInfo"]["world_size"] == 2


def test_view_of_a_missing_path_fails_before_starting_anything(tmp_path):
    from click.testing import CliRunner

    from overlapprof.cli.view_cmd import view
    result = CliRunner().invoke(view, [str(tmp_path / "nosuch")])
    assert result.exit_code == 2
    assert "starting TensorBoard" not in result.output
    assert "no such run directory" in result.output


def _children_commands(pid: int) -> list[str]:
    """The command names (``comm``) of the live child processes of ``pid`` (Linux /proc)."""
    names = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        comm, rest = text[text.index("(") + 1:text.rindex(")")], text[text.rindex(")") + 2:].split()
        if int(rest[1]) == pid:
            names.append(comm)
    return names


def test_plain_tensorboard_shows_the_scalars(runs):
    """`tensorboard --logdir DIR --port P`, as a user starts it (default loader: the fast Rust data
    server where it is installed): every rank's overlap scalars are listed and equal the report's
    numbers (rounded to float32, the one scalar type that loader reads)."""
    from overlapprof.renderers.tensorboard import as_float32

    tensorboard = Path(sys.executable).with_name("tensorboard")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    process = subprocess.Popen([str(tensorboard), "--logdir", str(runs.root), "--port", str(port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://localhost:{port}"
    wanted = {f"{d.name}/{SCALAR_DIR}/rank{r}" for d in (runs.ring["sync"], runs.allreduce) for r in (0, 1)}
    try:
        deadline, tags = time.monotonic() + 120, {}
        while time.monotonic() < deadline:
            try:
                tags = _get(f"{url}/data/plugin/scalars/tags")
            except OSError:
                tags = {}
            if wanted <= set(tags) and all(set(tags[run]) == set(TAGS) for run in wanted):
                break
            assert process.poll() is None, process.stderr.read()[-2000:]
            time.sleep(1)
        try:
            import tensorboard_data_server  # noqa: F401  the fast loader's binary, shipped by TensorBoard's deps

            fast = True
        except ImportError:
            fast = False
        if fast:  # the default loader was the Rust data server, a child process named "server"
            assert "server" in _children_commands(process.pid), _children_commands(process.pid)
        assert wanted <= set(tags), sorted(tags)
        for run_dir in (runs.ring["sync"], runs.allreduce):
            report = analyze([str(run_dir)])
            for rank in (0, 1):
                run = f"{run_dir.name}/{SCALAR_DIR}/rank{rank}"
                assert set(tags[run]) == set(TAGS), run
                steps = report.rank(rank).steps
                for tag, attr in (("overlap/exposed_comm_us", "exposed_comm_us"), ("overlap/ratio", "overlap_ratio"),
                                  ("overlap/step_us", "step_us")):
                    got = _get(f"{url}/data/plugin/scalars/scalars?{_q(run=run, tag=tag)}")
                    want = [(s.step, as_float32(getattr(s, attr))) for s in steps if getattr(s, attr) is not None]
                    assert [(step, value) for _, step, value in got] == want and want, (run, tag)
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
