"""The tables' columns (overlapprof.renderers.columns): one list per table, read by every renderer
that shows the table, so a field is added to a table in one place."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from overlapprof.renderers import columns as C
from overlapprof.renderers import html, table
from overlapprof.renderers.format import ms
from overlapprof.report import Partition, Report

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def report() -> Report:
    import overlapprof

    return overlapprof.analyze(DATA / "trace_filter", workers=1)


def test_the_partition_line_and_the_page_table_read_one_list_and_add_up(report):
    from overlapprof.compare import compare

    assert [c.field for c in C.PARTITION] == ["step_us", *(f for f in Partition.__struct_fields__ if f != "step_us")]
    lines = [line for line in table.summary_lines(report) if " mean step " in line]
    assert len(lines) == len(report.ranks) == 2
    for line, rank in zip(lines, report.ranks):
        step, *parts = (float(x) for x in re.findall(r"\d+\.\d{3}", line))
        assert step == pytest.approx(sum(parts), abs=0.002 * len(parts))  # ms with 3 decimals each
        assert step == pytest.approx(rank.partition.step_us / 1000, abs=0.0005)
        for c in C.PARTITION[1:]:
            assert f"{c.header} {c.cell(rank.partition)}" in line
    page = html.render(compare([report]))
    head = re.search(r'<table class="numbers partition".*?<thead>(.*?)</thead>', page).group(1)
    assert re.findall(r"<th>(.*?)</th>", head) == ["rank", *C.heads(C.PARTITION)]


def test_a_column_reads_its_field_through_links_and_writes_a_missing_value_as_the_placeholder(report):
    rank = report.ranks[0]
    comm = C.Column("metrics.comm_us", "comm", "ms", ms)
    assert comm.head == "comm ms" and comm.cell(rank) == f"{rank.metrics.comm_us / 1000:.3f}"
    assert C.Column("exposure.late_peer_us", "late_peer", "ms", ms).cell(type("R", (), {"exposure": None})()) == "-"
    assert C.heads(C.under("metrics", C.METRICS)) == C.heads(C.METRICS)
    assert C.cells(C.RANK, rank)[:2] == [str(rank.rank), rank.mode]
