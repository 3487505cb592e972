"""A file keeps only the rows its rank's classification reads (scan.drop_unread_rows: in a file with
kernels, the rows GPU mode reads), and its report is the one every row gives: metrics, steps,
kinds, timeline and communication records alike."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import msgspec
import pytest

import overlapprof
from overlapprof.analysis.columns import Index
from overlapprof.analysis.rank.events import rank_events
from overlapprof.analysis.rank.metrics import rank_report
from overlapprof.analysis.rank.unions import rank_unions
from overlapprof.analysis.rank import classify as C
from overlapprof.analysis.rank import read as RD
from overlapprof.analysis.rank import scan as SC
from overlapprof.renderers import json as json_renderer

import synthetic as S

DATA = Path(__file__).parent / "data"
REAL = sorted(DATA.glob("*/*.json.gz"))


def _report(paths, monkeypatch, *, every_row: bool) -> str:
    with monkeypatch.context() as m:
        if every_row:
            m.setattr(SC, "drop_unread_rows", lambda arrays, names: None)
        return json_renderer.render(overlapprof.analyze(paths, workers=1, comm_ops=True))


def _gpu_events() -> list[dict]:
    """Every kind of row GPU mode reads, and many it does not, in one step of a GPU rank."""
    events = [S.cpu_op("ProfilerStep#3", 0, 400), S.step(4, 400, 400)]
    for t in (0, 400):
        events.append(S.cpu_op("record_param_comms", t + 5, 30, args={
            "Collective name": "allreduce", "Process Group Name": "0", "Process Group Ranks": "[0, 1]",
            "Group size": 2, "Seq": t, "In msg nelems": 64, "Out msg nelems": 64, "dtype": "Float"}))
        events += S.launched("ncclDevKernel_AllReduce_Sum_f32", t + 6, t + 50, 80, stream=20)
        rt, copy = S.launched("Memcpy DtoD", t + 10, t + 60, 30)  # launched inside the call: comm (v2)
        copy["cat"] = "gpu_memcpy"
        events += [rt, copy]
        events.append(S.cpu_op("c10d::broadcast_", t + 100, 20))
        events += S.launched("ncclDevKernel_Broadcast", t + 101, t + 150, 40, stream=20)
        events += S.launched("ampere_sgemm_128x64_nn", t + 40, t + 60, 150)
        events.append(S.annotation("nccl:all_reduce", t + 5, 30))
        for k in range(6):  # CPU ops GPU mode never reads, and an event of no known category
            events.append(S.cpu_op(f"aten::op{k}", t + 40 + 10 * k, 5))
        events.append({"ph": "X", "cat": "python_function", "name": "forward", "pid": 1, "tid": S.MAIN_TID,
                       "ts": t + 1, "dur": 300, "args": {}})
    return events


def _rows_read_reference(path) -> int:
    """The complete events the classification reads, counted from the JSON itself: in a file with
    kernels, GPU events, runtime calls, user annotations, CUDA sync events (the windows of
    communication) and the ``ProfilerStep#N``, ``record_param_comms`` and ``c10d::*`` CPU ops;
    else every event of a known category."""
    events = [e for e in json.loads(gzip.decompress(path.read_bytes()))["traceEvents"] if e.get("ph") == "X"]
    codes = [C.category_code(e.get("cat", "")) for e in events]
    if C.KERNEL not in codes:
        return sum(c not in (C.OTHER, C.UNKNOWN) for c in codes)
    step_or_call = re.compile(r"^(ProfilerStep#\d+|record_param_comms|c10d::.*)$")
    return sum(c in (*C.GPU_CATEGORIES, C.RUNTIME, C.ANNOTATION, C.SYNC)
               or (c == C.CPU_OP and bool(step_or_call.match(e["name"]))) for c, e in zip(codes, events))


def test_real_traces_same_report_and_fewer_rows(monkeypatch):
    fewer = 0
    for path in REAL:
        scan = RD.read_scan(path, Index())
        assert scan.ts.size == _rows_read_reference(path), path
        fewer += scan.ts.size < scan.events
        got = _report([path], monkeypatch, every_row=False)
        assert got == _report([path], monkeypatch, every_row=True), path
    assert fewer >= 6  # the five GPU traces, and mtia's unclassified device activity


@pytest.mark.parametrize("cpu_file_first", [False, True])
def test_synthetic_rank_same_report(tmp_path, monkeypatch, cpu_file_first):
    gpu = S.write(tmp_path / "gpu.json", S.trace(_gpu_events(), rank=0, world_size=2))
    peer = S.write(tmp_path / "peer.json", S.trace(_gpu_events(), rank=1, world_size=2))
    # A rank of two files, one without kernels: the rank is in GPU mode, and that file keeps every row.
    cpu_only = [S.cpu_op("aten::mm", 900, 10), S.cpu_op("record_param_comms", 905, 3), S.step(5, 900, 50)]
    other = S.write(tmp_path / "cpu.json", S.trace(cpu_only, rank=0, world_size=2))
    files = [other, gpu] if cpu_file_first else [gpu, other]
    scan = RD.read_scan(gpu, Index())
    assert scan.ts.size == scan.events - 14  # 12 aten ops and 2 python_function events dropped
    a = overlapprof.analyze([gpu, peer], workers=1, comm_ops=True)
    assert a.ranks[0].mode == "gpu" and a.ranks[0].comm_records and a.ranks[0].kinds
    assert a.ranks[0].events == len(_gpu_events())  # events counts every complete event, dropped or not
    assert _report([gpu, peer], monkeypatch, every_row=False) == _report([gpu, peer], monkeypatch, every_row=True)

    def one_rank(every_row: bool) -> bytes:
        with monkeypatch.context() as m:
            if every_row:
                m.setattr(SC, "drop_unread_rows", lambda arrays, names: None)
            ev = rank_events(files, C.compile_comm_kernels(()), records=True, record_own_args=True)
            return msgspec.json.encode(rank_report(rank_unions(ev), ev.files, ev.mode, ev.events,
                                                   ev.comm_records.records()))

    assert one_rank(False) == one_rank(True)
    assert b'"mode":"gpu"' in one_rank(False)
