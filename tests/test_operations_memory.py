"""The per-operation data of an operation-dense trace: columns, not Python objects per operation,
and the same report whatever the memory budget (issue 36, the memory item)."""

from __future__ import annotations

import importlib.util
import tracemalloc
from pathlib import Path

import msgspec
import numpy as np
import pytest

import real_data

from overlapprof.analysis.analyzer import analyze_with_inputs
from overlapprof.analysis.crossrank.matching import match
from overlapprof.analysis.records import operations, table

_spec = importlib.util.spec_from_file_location("gen_traces", Path(__file__).parents[1] / "benchmarks" / "gen_traces.py")
gen_traces = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen_traces)


@pytest.fixture(scope="module")
def dense(tmp_path_factory) -> Path:
    """One generated rank, an operation every 10 events (as the gate's traces)."""
    folder = tmp_path_factory.mktemp("dense")
    gen_traces.generate(folder, ranks=1, events=60_000)
    return folder


def test_matching_keeps_columns_per_operation(dense):
    """A lone rank leaves every operation unmatched: the matching holds them as columns (a row
    and a reason code each), not a dict entry and an int object each (86 bytes an operation)."""
    matching = analyze_with_inputs([str(dense)], workers=1).matching
    ops = matching.ops
    n = len(ops)
    assert n > 5000
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        m = match(ops, {0}, True, matching.row_shift)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    rows = m.unmatched_rows()
    codes, reasons = m.unmatched_reasons()
    assert np.array_equal(np.sort(rows), np.arange(n)) and codes.size == n
    assert reasons == ["no other rank has a trace here"]
    assert held / n < 24, f"{held / n:.0f} bytes an operation held by the matching"


def test_dense_trace_one_report_whatever_the_budget(dense):
    """Every row on disk (budget 0) or none (the default): the same report, the cross-rank
    section, the causes and every operation's window (--comm-ops) included."""
    default = analyze_with_inputs([str(dense)], workers=1, comm_ops=True).report
    spilled = analyze_with_inputs([str(dense)], workers=1, comm_ops=True, memory_budget="0").report
    assert default.crossrank is not None and sum(u.count for u in default.crossrank.unmatched) > 5000
    assert default.ranks[0].exposure is not None
    strip = lambda r: {k: v for k, v in msgspec.to_builtins(r).items() if k != "options"}  # noqa: E731
    assert strip(spilled) == strip(default)


@pytest.mark.parametrize("folder", ["dense", *(real_data.DATA / "cuda").iterdir()], ids=lambda f: Path(f).name)
def test_blocks_of_operations_give_one_report(folder, dense, monkeypatch):
    """The per-operation data made a few operations at a time (the table's in blocks of 7, the operations' of 5, instead of 65,536):
    the same report, float for float, every operation's window and record included."""
    path = dense if folder == "dense" else folder
    strip = lambda r: {k: v for k, v in msgspec.to_builtins(r).items() if k != "options"}  # noqa: E731
    whole = strip(analyze_with_inputs([str(path)], workers=1, comm_ops=True).report)
    assert folder != "dense" or whole["ranks"][0]["comm_ops"]
    monkeypatch.setattr(table, "TABLE_BLOCK", 7)
    monkeypatch.setattr(operations, "OPS_BLOCK", 5)
    assert strip(analyze_with_inputs([str(path)], workers=1, comm_ops=True).report) == whole


def test_a_table_past_the_budget_is_made_into_the_store(dense, monkeypatch):
    """Past its store's budget a rank's table is made a block at a time into a bin of the store
    (at budget 0: on disk, nothing of it in memory while its record rows are) and read back
    once they are let go of: the same report, float for float, every record included."""
    from overlapprof.analysis.rank import bucket_records

    strip = lambda r: {k: v for k, v in msgspec.to_builtins(r).items() if k != "options"}  # noqa: E731
    whole = strip(analyze_with_inputs([str(dense)], workers=1, comm_ops=True).report)
    monkeypatch.setattr(table, "TABLE_BLOCK", 1000)
    made, stored = bucket_records.gpu_table, []

    def entry(*args):
        out = made(*args)
        stored.append((type(out).__name__, out.bin.file is not None and not out.bin.parts, out.bin.rows)
                      if isinstance(out, table.StoredTable) else type(out).__name__)
        return out

    monkeypatch.setattr(bucket_records, "gpu_table", entry)
    assert strip(analyze_with_inputs([str(dense)], workers=1, comm_ops=True, memory_budget="0").report) == whole
    assert stored == [("StoredTable", True, len(whole["ranks"][0]["comm_ops"]))]
    stored.clear()  # a rank that fits its budget fills the table's columns in memory, as before
    assert strip(analyze_with_inputs([str(dense)], workers=1, comm_ops=True).report) == whole
    assert stored == ["CommTable"]


def test_argument_columns_wait_in_the_store(dense, monkeypatch):
    """The recorder's argument columns (string codes and numbers, about 100 bytes an operation)
    are a bin of the rank's store while the file is read and while the table is made from them:
    on disk at budget 0, with only each argument row's file row (8 bytes) in memory when the
    records are made, and no whole column of them when the table is."""
    from overlapprof.analysis.rank import bucket_records

    seen = []
    made = bucket_records.gpu_table

    def entry(f, comm, values, needs, store=None):
        r = f.recorder
        seen.append((r._bin.file is not None, r._bin.rows, sum(a.nbytes for a in r._arg_rows),
                     [p for parts in (*r._strings.values(), *r._numbers.values()) for p in parts]))
        return made(f, comm, values, needs, store)

    tabled = []
    make_table = bucket_records.comm_table

    def table_entry(rec, values, **kw):
        tabled.append((rec.args.file is not None, rec.args.rows, [v.size for v in (*rec.strings.values(), *rec.numbers.values())]))
        return make_table(rec, values, **kw)

    monkeypatch.setattr(bucket_records, "gpu_table", entry)
    monkeypatch.setattr(bucket_records, "comm_table", table_entry)
    analyze_with_inputs([str(dense)], workers=1, memory_budget="0")
    [(on_disk, rows, in_memory, kept)] = seen
    assert on_disk and rows > 5000 and not kept
    assert in_memory == 8 * rows
    [(on_disk, rows_then, sizes)] = tabled  # the table is made from the bin, not from whole columns
    assert on_disk and rows_then == rows and not any(sizes)
