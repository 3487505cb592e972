"""One walk over a chunk's args (chunk_args) gives what each reader of them gives alone: the
correlations, the record_param_comms kinds and the communication records."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from overlapprof.analysis.rank import classify as C
from overlapprof.analysis.rank.scan import _complete as S_complete, read_serially
from overlapprof.analysis.records.fields import OWN_FIELDS, Values
from overlapprof.analysis.records.recorder import CommRecorder
from overlapprof.errors import TraceError
from overlapprof.trace.decode import ROWS_DECODER
from overlapprof.trace.reader import LayoutError, TraceReader

import synthetic as S

DATA = Path(__file__).parent / "data"
TRACES = sorted(p for p in DATA.rglob("*.json*") if p.is_file() and p.name != "run.json")


def _records_alone(path, values: Values, own: bool, arrays: dict):
    """The records of a recorder that reads every chunk's events itself (``CommRecorder.add``,
    what chunk_args falls back to), with the categories and names the scan gave (``arrays``)."""
    recorder = CommRecorder(C.compile_comm_kernels(()), values, own)
    reader, row0 = TraceReader(path, ROWS_DECODER), 0
    try:
        chunks = list(reader.chunks())
    except LayoutError:
        chunks = list(TraceReader(path, ROWS_DECODER).chunks(generic=True))
    for chunk in chunks:
        xe = [e for e, done in zip(chunk.events, S_complete(chunk.events)) if done]
        if not xe:
            continue
        recorder.add(xe, arrays["codes"][row0 : row0 + len(xe)], arrays["name_ids"][row0 : row0 + len(xe)], row0)
        row0 += len(xe)
    return recorder


def _read(path, own: bool, alone: bool = False):
    """The scan's columns and the records; ``alone``: the scan read without a recorder (its own
    decoding of the args) and the records by a recorder alone, else both in one walk."""
    values = Values()
    recorder = CommRecorder(C.compile_comm_kernels(()), values, own) if not alone else None
    arrays, unclassified, _, threads, recorder = read_serially(path, values.index, recorder)
    if alone:
        recorder = _records_alone(path, values, own, arrays)
    records = recorder.records(arrays["thread"], list(threads))
    return arrays, unclassified, list(threads), values, records


def _value(column: np.ndarray, at: int, decode):
    if at < 0 or column.size == 0:
        return None
    value = column[at]
    return decode(value)


def _record_values(values: Values, records) -> list[dict]:
    """Each record row's fields as values (absent: None), whatever columns held them."""
    out = []
    for k, row in enumerate(records.rows.tolist()):
        at = int(records.args_at[k])
        got = {"row": row, "thread": int(records.thread_of(records.rows[k : k + 1])[0])}
        for name, column in records.strings.items():
            got[name] = _value(column, at, lambda c, f=values.strings[name]: f.values[c] if c >= 0 else None)
        for name, column in records.numbers.items():
            got[name] = _value(column, at, lambda v: None if math.isnan(v) else v)
        for name in OWN_FIELDS if records.own is not None else ():
            got[name] = records.own[name][at] if at >= 0 else None
        out.append(got)
    return out


def _same_reading(path, own: bool) -> None:
    one = _read(path, own)
    apart = _read(path, own, alone=True)
    (a_arrays, a_unclassified, a_threads, a_values, a_records) = one
    (b_arrays, b_unclassified, b_threads, b_values, b_records) = apart
    assert a_arrays.keys() == b_arrays.keys()
    for name in a_arrays:
        np.testing.assert_array_equal(a_arrays[name], b_arrays[name], err_msg=name)
    assert (a_unclassified, a_threads, a_values.names) == (b_unclassified, b_threads, b_values.names)
    assert _record_values(a_values, a_records) == _record_values(b_values, b_records)
    assert a_records.rows.size > 0 or "mtia" in str(path) or "cpu_only" in str(path)


@pytest.mark.parametrize("own", [False, True], ids=["records", "own-args"])
@pytest.mark.parametrize("path", TRACES, ids=lambda p: f"{p.parent.name}/{p.name[:24]}")
def test_one_walk_reads_what_each_reader_reads(path, own):
    _same_reading(path, own)


def _odd_args_events() -> list[str]:
    """Events, as JSON text, whose args the one walk must read as the readers alone do: absent,
    null, empty, fields null, a key spelled with escapes, record fields on a kernel, copies and
    memsets among the record rows, a CUDA sync event waiting on an event record."""
    params = {"Collective name": "allreduce", "Process Group Name": 0, "Process Group Ranks": "[0, 1]",
              "Group size": 2, "In msg nelems": 4, "Out msg nelems": 4, "dtype": "Float", "Seq": 3,
              "Input Dims": [[4]], "Src Rank": "1", "Dst Rank": None}
    nccl = S.kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 150, 20, correlation=2)
    nccl["args"].update({"Collective name": "allreduce", "Process Group Name": "0", "Seq": 3, "dtype": None})
    memset = S.memcpy(300, 5, correlation=4)
    memset["cat"], memset["name"] = "gpu_memset", "Memset (Device)"
    sync = {"ph": "X", "cat": "cuda_sync", "name": "Stream Wait Event", "pid": 0, "tid": 7, "ts": 320, "dur": 1,
            "args": {"correlation": 6, "wait_on_cuda_event_record_corr_id": 5}}
    no_args = S.cpu_op("aten::mm", 400, 3)
    del no_args["args"]
    null_args = S.runtime(410, 1, 7)
    null_args["args"] = None
    events = [
        S.step(0, 0, 1000),
        S.cpu_op(C.PARAM_COMMS, 100, 5, args=params),
        S.runtime(101, 2, 2), nccl,
        S.runtime(200, 2, 3), S.memcpy(250, 10, correlation=3),
        S.runtime(290, 2, 4), memset,
        S.runtime(310, 1, 5, name="cudaEventRecord"), sync,
        S.cpu_op("c10d::send", 330, 9, args={"Concrete Inputs": ["", "", "1", "0"]}),
        S.annotation("nccl:send 0->1", 331, 8, args={"Collective name": "send", "Seq": None}),
        no_args, null_args, S.cpu_op("record_param_comms", 420, 2, args={}),
        S.kernel("ncclDevKernel_SendRecv", 450, 30, correlation=7),
    ]
    texts = [json.dumps(e) for e in events]
    escaped = json.dumps(S.cpu_op(C.PARAM_COMMS, 500, 2, args={"Group size": 2})).replace(
        '"Group size"', '"Group\\u0020size"')
    return texts + [escaped]


def _kineto(texts: list[str]) -> str:
    head = json.dumps({"schemaVersion": 1, "distributedInfo": {"rank": 0, "world_size": 2, "backend": "nccl"}})
    return head[:-1] + ', "traceEvents": [\n  ' + ",\n  ".join(texts) + "\n]}\n"


@pytest.mark.parametrize("own", [False, True], ids=["records", "own-args"])
def test_odd_args_read_alike(tmp_path, own):
    texts = _odd_args_events()
    path = S.write(tmp_path / "odd.json", _kineto(texts))
    _same_reading(path, own)
    arrays, _, _, values, records = _read(path, own)
    got = _record_values(values, records)
    assert {r["seq"] for r in got} >= {3.0}  # the kernel's own and record_param_comms' fields
    assert 2.0 in {r["group_size"] for r in got}  # the key spelled with escapes, read
    # A record row whose field does not fit (a string group size) leaves that row's args out,
    # as the recorder alone does; the rest of the chunk reads alike.
    odd = json.loads(texts[1])
    odd["args"]["Group size"] = "two"
    path = S.write(tmp_path / "odder.json", _kineto([*texts[:1], json.dumps(odd), *texts[2:]]))
    _same_reading(path, own)


def test_a_bad_correlation_is_worded_alike(tmp_path):
    texts = _odd_args_events()
    kernel = json.loads(texts[3])
    kernel["args"]["correlation"] = "two"
    path = S.write(tmp_path / "bad.json", _kineto([*texts[:3], json.dumps(kernel), *texts[4:]]))
    errors = []
    for alone in (False, True):
        with pytest.raises(TraceError) as info:
            _read(path, False, alone)
        errors.append(str(info.value))
    assert errors[0] == errors[1] and "event 3: 'args.correlation'" in errors[0]
