"""The report schema (issue 11): the JSON names a saved report keeps, and one number computed once."""

from __future__ import annotations

from pathlib import Path

import overlapprof
from overlapprof.report import Report

DATA = Path(__file__).parent / "data"


def test_saved_report_keeps_its_json_names_and_loads_them(tmp_path):
    """``crossrank`` and ``comm_records`` are the attributes; the JSON keeps ``comms`` and
    ``comm_ops`` (reports saved before the rename load)."""
    report = overlapprof.analyze(DATA / "nccl_parser_config", comm_ops=True, workers=1)
    text = report.to_json()
    assert '"comms":' in text and '"comm_ops":' in text and '"crossrank"' not in text and '"comm_records"' not in text
    again = Report.from_json(text)
    assert again == report and again.options.comm_records and again.options.crossrank
    assert again.ranks[0].comm_records and again.ranks[0].comm_records[0].kind


def test_rank_median_step_is_the_summarys_median():
    """A one-rank report: the row's median step and the summary's are one number (the analyzer
    computes it; the renderers only format it)."""
    from overlapprof.renderers import html, table
    from overlapprof.compare import compare

    report = overlapprof.analyze(DATA / "negative_queue_length", workers=1, comms=False, drop_last_step=True)
    (rank,) = report.ranks
    steps = sorted(s.step_us for s in rank.steps)
    assert len(steps) == 4 and steps[1] != steps[2]  # even: the lower median (a renderer's own) would differ
    assert rank.median_step_us == report.summary.median_step_us
    cell = f"{rank.median_step_us / 1000:.3f}"
    assert table.render(report).splitlines()[2].split()[-1] == cell
    assert f"<td>{cell}</td>" in html.render(compare([report]))
