"""Layouts users have: execution traces beside Kineto traces, two recordings of one process."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

import overlapprof
from overlapprof.cli import main
from overlapprof.errors import InputError

# A real Kineto trace without distributedInfo (AMD MI250, from HTA's test data).
KINETO = Path(__file__).parent / "data" / "amd_trace" / "mi250_minitoy_train_ROCm6_2_kineto.json.gz"
# The start of a PyTorch / Chakra execution trace (PARAM's layout): schema, process, nodes.
ET = {"schema": "1.0.2-chakra.0.0.4", "pid": 4242, "time": "2024-05-01 10:00:00", "start_ts": 100, "finish_ts": 900,
      "nodes": [{"name": "[pytorch|profiler|execution_trace|process]", "id": 1, "ctrl_deps": 1, "inputs": {},
                 "outputs": {}, "attrs": []}]}


def _run(*args):
    return CliRunner().invoke(main, ["analyze", *map(str, args), "--no-comms", "-q"])


def test_execution_trace_beside_kineto_trace_is_skipped_with_a_note(tmp_path):
    shutil.copy(KINETO, tmp_path / "rank0.pt.trace.json.gz")
    (tmp_path / "rank0_et.json").write_text(json.dumps(ET))
    report = overlapprof.analyze(tmp_path, comms=False)
    assert [Path(f).name for r in report.ranks for f in r.files] == ["rank0.pt.trace.json.gz"]
    assert any("skipped 1 execution trace" in w and "rank0_et.json" in w for w in report.warnings)


def test_execution_trace_alone_is_refused_saying_what_it_is(tmp_path):
    (tmp_path / "rank0_et.json").write_text(json.dumps(ET))
    res = _run(tmp_path)
    assert res.exit_code == 2 and "only execution traces" in res.output and "Traceback" not in res.output
    res = _run(tmp_path / "rank0_et.json")
    assert res.exit_code == 2 and res.output.startswith("Error: ") and "execution trace" in res.output


def test_one_worker_recorded_twice_is_refused_with_the_list(tmp_path):
    for span in ("1700000000001", "1700000090001"):
        shutil.copy(KINETO, tmp_path / f"worker0.{span}.pt.trace.json.gz")
    shutil.copy(KINETO, tmp_path / "worker1.1700000000002.pt.trace.json.gz")
    with pytest.raises(InputError, match=r"2 recordings of 1 process.*worker0: worker0\.1700000000001\.pt\.trace\.json\.gz, "
                                         r"worker0\.1700000090001"):
        overlapprof.analyze(tmp_path, comms=False)
    res = _run(*sorted(tmp_path.iterdir()))
    assert res.exit_code == 2 and "different runs of one process" in res.output and "overlapprof compare" in res.output


def test_different_workers_are_ranks(tmp_path):
    shutil.copy(KINETO, tmp_path / "worker0.1700000000001.pt.trace.json.gz")
    shutil.copy(KINETO, tmp_path / "worker1.1700000000002.pt.trace.json.gz")
    report = overlapprof.analyze(tmp_path, comms=False)
    assert [r.rank for r in report.ranks] == [0, 1]
