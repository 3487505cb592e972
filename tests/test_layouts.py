"""Layouts users have: execution traces beside Kineto traces, profiler cycles of one process."""

from __future__ import annotations

import gzip
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
TRACE_FILTER = Path(__file__).parent / "data" / "trace_filter"
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


def test_workers_with_different_cycle_counts_are_refused_with_the_way_out(tmp_path):
    """worker0 saved 2 profiler cycles, worker1 1: a second cycle would lack a rank, so the whole is
    refused, naming --cycle 1, which keeps both ranks (the cycles of a real tensorboard_trace_handler
    folder: test_handler_cycles.py)."""
    for span in ("1700000000001", "1700000090001"):
        shutil.copy(KINETO, tmp_path / f"worker0.{span}.pt.trace.json.gz")
    shutil.copy(KINETO, tmp_path / "worker1.1700000000002.pt.trace.json.gz")
    with pytest.raises(InputError, match=r"the processes saved different numbers of profiler cycles \(worker0 2, "
                                         r"worker1 1\): a cycle would lack ranks; analyze the cycle every process "
                                         r"has with --cycle N \(N up to 1\)"):
        overlapprof.analyze(tmp_path, comms=False)
    res = _run(*sorted(tmp_path.iterdir()))
    assert res.exit_code == 2 and res.output.startswith(f"Error: {tmp_path}: the processes saved different numbers")
    res = _run(tmp_path, "--cycle", 2)
    assert res.exit_code == 2 and "--cycle 2: " in res.output and "give --cycle 1 to 1" in res.output


def test_different_workers_are_ranks(tmp_path):
    shutil.copy(TRACE_FILTER / "sampled_rank-0.json.gz", tmp_path / "worker0.1700000000001.pt.trace.json.gz")
    shutil.copy(TRACE_FILTER / "sampled_rank-1.json.gz", tmp_path / "worker1.1700000000002.pt.trace.json.gz")
    report = overlapprof.analyze(tmp_path, comms=False)
    assert [r.rank for r in report.ranks] == [0, 1]


def test_gzipped_execution_trace_beside_kineto_trace_is_skipped_too(tmp_path):
    """PARAM's tests keep their execution traces gzipped: the sniff looks inside the gzip."""
    shutil.copy(KINETO, tmp_path / "rank0.pt.trace.json.gz")
    with gzip.open(tmp_path / "rank0_et.json.gz", "wt") as f:
        json.dump(ET, f)
    report = overlapprof.analyze(tmp_path, comms=False)
    assert [Path(f).name for r in report.ranks for f in r.files] == ["rank0.pt.trace.json.gz"]
    assert any("skipped 1 execution trace" in w and "rank0_et.json.gz" in w for w in report.warnings)
    res = _run(tmp_path / "rank0_et.json.gz")
    assert res.exit_code == 2 and "an execution trace (Chakra/PARAM" in res.output


def test_one_recording_twice_is_refused_by_its_content(tmp_path):
    """A copy of a rank's trace without its distributedInfo, under a name that says nothing: the
    same events, not a second rank (before: ranks 0 and 1, no note)."""
    shutil.copy(TRACE_FILTER / "sampled_rank-0.json.gz", tmp_path / "a.json.gz")
    with gzip.open(TRACE_FILTER / "sampled_rank-0.json.gz", "rt") as f:
        trace = json.load(f)
    del trace["distributedInfo"]
    (tmp_path / "b.json").write_text(json.dumps(trace))
    with pytest.raises(InputError, match=r"a\.json\.gz and .*b\.json hold the same recording \(\d+ events at the same "
                                         r"times\), not two ranks"):
        overlapprof.analyze(tmp_path, comms=False)
    res = _run(tmp_path)
    assert res.exit_code == 2 and res.output.count("\n") == 1 and "the same recording" in res.output


def _trace(path: Path) -> dict:
    with gzip.open(path, "rt") as f:
        return json.load(f)


def _same_numbers(a, b) -> None:
    assert (a.mode, a.metrics, [s.step_us for s in a.steps]) == (b.mode, b.metrics, [s.step_us for s in b.steps])


@pytest.mark.parametrize("name", ["rank_non_gpu/rank_non_gpu.json.gz", "amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz"])
def test_the_json_array_format_is_read(tmp_path, name):
    """The trace-event format's "JSON Array Format" (a top-level array of events, no
    ``traceEvents``; its closing ``]`` optional), made of a real trace's events: the same numbers
    as the trace itself (before: "not a PyTorch profiler trace")."""
    path = Path(__file__).parent / "data" / name
    events = json.dumps(_trace(path)["traceEvents"])
    (tmp_path / "array.json").write_text(events)
    (tmp_path / "open.json").write_text(events[:-1] + ",\n")  # no closing bracket
    want = overlapprof.analyze([path], comms=False).ranks[0]
    for f in ("array.json", "open.json"):
        _same_numbers(overlapprof.analyze([tmp_path / f], comms=False, workers=1).ranks[0], want)


def test_torch_autograd_profilers_layout_is_read(tmp_path):
    """torch's profiler before Kineto wrote the array of events with no category, in processes
    named "CPU functions" and "CUDA functions": read as cpu_ops and kernels (here a real MI250
    trace rewritten so; the kernels' union is the same compute)."""
    legacy = []
    for e in _trace(KINETO)["traceEvents"]:
        if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "kernel"):
            legacy.append({k: v for k, v in e.items() if k != "cat"} | {
                "pid": "CPU functions" if e["cat"] == "cpu_op" else "CUDA functions", "args": {}})
    (tmp_path / "legacy.json").write_text(json.dumps(legacy))
    got = overlapprof.analyze([tmp_path / "legacy.json"], comms=False).ranks[0]
    want = overlapprof.analyze([KINETO], comms=False).ranks[0]
    assert got.mode == "gpu" and got.metrics.compute_us == want.metrics.compute_us > 0


def _recategorized(tmp_path: Path, name: str, change) -> Path:
    trace = _trace(KINETO)
    trace["traceEvents"] = [change(dict(e)) for e in trace["traceEvents"]]
    out = tmp_path / name
    out.write_text(json.dumps(trace))
    return out


@pytest.mark.parametrize("device", ["privateuse1", "aiu_kernel"])
def test_a_device_of_categories_not_classified_is_said_up_front(tmp_path, device):
    """The MI250's device work under a category OVERLAP.md does not classify (a bare privateuse1,
    IBM Spyre's aiu): the device was not measured, and the table says so first, then what its
    numbers are instead (the host's); a host-side category it does not know is not device work."""
    def change(e):
        if e.get("cat") in ("kernel", "gpu_memcpy"):
            e["cat"] = device
        elif e.get("cat") == "cpu_op" and e.get("name", "").startswith("aten::empty"):
            e["cat"] = "my_host_ranges"  # on the host's process: no warning
        return e

    path = _recategorized(tmp_path, "t.json", change)
    report = overlapprof.analyze([path], comms=False)
    assert report.ranks[0].mode == "cpu" and report.ranks[0].device_not_measured == {device: 16}
    [warning] = [w for w in report.warnings if "does not classify" in w]
    assert f"(the device was not measured: its numbers are its host's (cpu_ops as compute)): {device} (16 events)" in warning
    res = _run(path)
    first = res.output.splitlines()[0]
    assert first.startswith(f"host activity only: rank 0's device was not measured ({device}: 16 events")
    assert "the numbers are the host's (CPU mode): cpu_ops as compute" in first
    assert "overlap ratio (host activity only" in res.output or "no communication found" in res.output


def test_kinetos_own_categories_on_a_gpu_are_warned(tmp_path):
    """cuda_profiler_range on the GPU's lane: left out with a warning (before: silently); the GPU's
    kernels are measured, so no headline."""
    path = _recategorized(tmp_path, "t.json", lambda e: e | {"cat": "cuda_profiler_range"}
                          if e.get("cat") == "gpu_memcpy" else e)
    report = overlapprof.analyze([path], comms=False)
    assert report.ranks[0].mode == "gpu" and report.ranks[0].device_not_measured is None
    assert any("(read in GPU mode): cuda_profiler_range (2 events)" in w for w in report.warnings)
    assert not _run(path).output.startswith("host activity only")


def test_mtias_headline_says_the_device_was_not_measured():
    report = overlapprof.analyze([Path(__file__).parent / "data" / "mtia"], comms=False)
    assert report.ranks[0].device_not_measured == {"mtia_ccp_events": 25814}
    res = _run(Path(__file__).parent / "data" / "mtia")
    assert res.output.startswith("host activity only: rank 0's device was not measured (mtia_ccp_events: 25814 events")
