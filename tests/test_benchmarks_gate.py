"""benchmarks/gate.py (analyze_bench --gate): its inputs, its golden check and its table."""

from __future__ import annotations

import gzip
import importlib.util
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data"

_spec = importlib.util.spec_from_file_location("gate", REPO / "benchmarks" / "gate.py")
gate = sys.modules["gate"] = importlib.util.module_from_spec(_spec)  # a dataclass's module must be known
_spec.loader.exec_module(gate)


def test_small_traces_are_every_folder_of_traces_but_mtia():
    cpu_only = DATA / "cpu_only"
    (trace,) = cpu_only.glob("*.json.gz")
    assert gate.text_bytes(cpu_only) == len(gzip.decompress(trace.read_bytes()))
    names = [d.relative_to(DATA).as_posix() for d in gate.small_folders()]
    assert "mtia" not in names and "negative_queue_length" in names and "cuda/ddp-async" in names
    assert "cuda" not in names  # it holds run directories, no traces of its own


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_difference_names_where_reports_differ(tmp_path, monkeypatch):
    new = {"options": {"comm_ops": True}, "ranks": [{"ratio": 0.5, "steps": [1, 2]}], "x": float("nan")}
    old = {"options": {"comm_ops": True, "bounded_memory": False}, "ranks": [{"ratio": 0.25, "steps": [1]}],
           "x": float("nan")}
    a = _write(tmp_path / "a.json", json.dumps(new))
    b = _write(tmp_path / "b.json", json.dumps(old))
    assert gate.difference(a, b) == ("$.options.bounded_memory (old only), $.ranks[0].ratio, "
                                     "$.ranks[0].steps (2 items against 1)")
    assert gate.difference(a, b, shown=1) == "$.options.bounded_memory (old only), ..."
    assert gate.difference(a, b, ignore=frozenset({"$.options.bounded_memory", "$.ranks"})) is None
    same = _write(tmp_path / "c.json", json.dumps(new, indent=2))
    assert gate.difference(a, same) is None  # JSON-equal, bytes aside; NaN equals NaN
    monkeypatch.setattr(gate, "DIFF_IN_MEMORY", 0)  # too large to parse: the first line that differs
    assert gate.difference(same, _write(tmp_path / "d.json", json.dumps(old, indent=2))) == (
        "line 3: '\"comm_ops\": true' against '\"comm_ops\": true,'")


def test_golden_check_runs_each_trees_own_cli(tmp_path):
    assert gate.golden({"new": REPO, "old": REPO}, DATA / "cpu_only", 1, tmp_path) is None
    assert list(tmp_path.iterdir()) == []  # the reports are removed
    # A "tree" without overlapprof: the child refuses to analyze with another tree's package.
    found = gate.golden({"new": REPO, "old": tmp_path}, DATA / "cpu_only", 0, tmp_path)
    assert found.startswith("old tree failed: AssertionError")


def test_table_and_bad_input():
    rows = [gate.Row("5. golden", "every input", "1 of 2 equal", "a: $.x | y", "", "FAIL"),
            gate.Row("1. speed", "≤ 0.65x old", "1 s", "2 s", "0.500x", "PASS")]
    lines = gate.markdown(rows, "title").splitlines()
    assert lines[:3] == ["title", "", "| gate item | target | new | old | new/old | verdict |"]
    assert lines[4:] == ["| 5. golden | every input | 1 of 2 equal | a: $.x \\| y |  | FAIL |",
                         "| 1. speed | ≤ 0.65x old | 1 s | 2 s | 0.500x | PASS |"]
    with pytest.raises(SystemExit, match="--gate: 'no-such-rev' is not a revision of this repository"):
        gate.run("no-such-rev", [50.0], 1, None, False, None, "python")
