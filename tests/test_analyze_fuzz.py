"""Random mutations of real traces: no traceback ever escapes.

The library raises only OverlapprofError subclasses (or returns a Report); the CLI exits 0, or
exits 2 with one ``Error:`` line.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import overlapprof
from overlapprof.cli import main
from overlapprof.errors import OverlapprofError
from overlapprof.report import Report

DATA = Path(__file__).parent / "data"


def _load(name):
    return json.loads(gzip.decompress((DATA / name).read_bytes()))


def _small_gpu_trace():
    """A few hundred events of trace_filter rank 0: steps, comm kernels and launches, some compute."""
    full = _load("trace_filter/sampled_rank-0.json.gz")
    events = full["traceEvents"]
    keep_corr = {e["args"]["correlation"] for e in events if e.get("cat") == "kernel" and "nccl" in e["name"]}
    kept = [
        e for i, e in enumerate(events)
        if i % 25 == 0 or "ProfilerStep" in str(e.get("name")) or e.get("name") == "record_param_comms"
        or (e.get("args") or {}).get("correlation") in keep_corr
    ]
    return {"distributedInfo": full["distributedInfo"], "traceEvents": kept}


def _serialize(trace, lines: bool) -> bytes:
    """JSON text: on one line, or in Kineto's layout (each event on a '\\n  {' line: the streaming reader)."""
    if not lines or not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        return json.dumps(trace).encode()
    rest = {k: v for k, v in trace.items() if k != "traceEvents"}
    head = json.dumps(rest)[:-1] + (", " if rest else "")
    body = ",\n  ".join(json.dumps(e) for e in trace["traceEvents"])
    return (head + '"traceEvents": [\n  ' + body + "\n]}").encode()


BASES = {"cpu": _load("cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"), "gpu": _small_gpu_trace()}
FIELDS = ["ph", "cat", "name", "ts", "dur", "pid", "tid", "args"]
ARG_FIELDS = ["correlation", "External id", "stream", "device", "Process Group Ranks", "In msg nelems",
              "Collective name", "Input Dims"]
ODD_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8), st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


@st.composite
def structural(draw):
    """Delete or retype fields of random events, or of the top level."""
    trace = json.loads(json.dumps(BASES[draw(st.sampled_from(sorted(BASES)))]))
    events = trace["traceEvents"]
    for _ in range(draw(st.integers(1, 4))):
        what = draw(st.sampled_from(["delete", "retype", "retype-arg", "top", "drop-events", "dup"]))
        e = events[draw(st.integers(0, len(events) - 1))] if events else {}
        e = e if isinstance(e, dict) else {}
        if what == "delete" and e:
            e.pop(draw(st.sampled_from(FIELDS)), None)
        elif what == "retype" and e:
            e[draw(st.sampled_from(FIELDS))] = draw(ODD_VALUES)
        elif what == "retype-arg" and isinstance(e.get("args"), dict):
            e["args"][draw(st.sampled_from(ARG_FIELDS))] = draw(ODD_VALUES)
        elif what == "top":
            trace[draw(st.sampled_from(["traceEvents", "distributedInfo", "baseTimeNanoseconds"]))] = draw(ODD_VALUES)
            events = trace["traceEvents"] if isinstance(trace.get("traceEvents"), list) else []
        elif what == "drop-events" and events:
            k = draw(st.integers(0, len(events)))
            del events[k:]
        elif what == "dup" and e:
            events.append(dict(e))
    return _serialize(trace, draw(st.booleans()))


@st.composite
def byte_level(draw):
    """Flip bytes or truncate the JSON text or its gzip."""
    data = _serialize(BASES[draw(st.sampled_from(sorted(BASES)))], draw(st.booleans()))
    compressed = draw(st.booleans())
    if compressed:
        data = gzip.compress(data)
    data = bytearray(data)
    for _ in range(draw(st.integers(0, 6))):
        i = draw(st.integers(0, len(data) - 1))
        data[i] = draw(st.integers(0, 255))
    if draw(st.booleans()):
        data = data[: draw(st.integers(0, len(data)))]
    return bytes(data)


def _check(tmp_path: Path, data: bytes, name: str) -> None:
    path = tmp_path / name
    path.write_bytes(data)
    try:
        report = overlapprof.analyze(path, workers=1)
    except OverlapprofError as exc:
        assert "\n" not in str(exc) and str(path) in str(exc)
    else:
        assert isinstance(report, Report)
        assert Report.from_json(report.to_json()) == report
    result = CliRunner().invoke(main, ["analyze", str(path)])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert result.exit_code in (0, 2), result.output
    if result.exit_code == 2:
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr


FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@FUZZ
@given(data=structural())
def test_structural_mutations(tmp_path, data):
    _check(tmp_path, data, "mutated.json")


@FUZZ
@given(data=byte_level())
def test_byte_mutations(tmp_path, data):
    _check(tmp_path, data, "mutated.json.gz")


@pytest.mark.parametrize("payload", ["__import__('os').system('touch pwned')", "!!python/object:os.system", "\x80\x04cos\nsystem"])
def test_trace_content_is_only_data(tmp_path, payload, monkeypatch):
    """Names that look like code or pickles are just names: nothing is run."""
    monkeypatch.chdir(tmp_path)
    trace = {"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": payload, "ts": 0, "dur": 5, "args": {}},
                             {"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "ts": 0, "dur": 5}]}
    (tmp_path / "t.json").write_text(json.dumps(trace))
    report = overlapprof.analyze(tmp_path / "t.json", workers=1)
    assert report.ranks[0].metrics.overlap_ratio == 1.0
    assert not (tmp_path / "pwned").exists()
