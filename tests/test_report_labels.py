"""Report fields carry their label and unit (overlapprof.report.labels), and the four outputs that
list them (the text step table, the CSV, the DataFrames, the TensorBoard scalars) take their
columns from it (issue 36): they agree, and a field added with a label appears in all four."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

import msgspec
import pytest

import overlapprof
from overlapprof.renderers import columns as C
from overlapprof.renderers import csv as csv_renderer
from overlapprof.renderers import table
from overlapprof.renderers.tensorboard import TAGS, report_tags, scalar_points
from overlapprof.report import Metrics, Report, StepMetrics
from overlapprof.report.labels import US, labelled, shown

DATA = Path(__file__).parent / "data"


class WiderStep(StepMetrics, kw_only=True):
    """A step with one field more, defined as any report field is: once, with its label."""

    backlog_us: Annotated[float, shown("backlog", US, "communication waiting to start")] = 0.0


@pytest.fixture(scope="module")
def report() -> Report:
    return overlapprof.analyze(DATA / "trace_filter", workers=1)


def _csv_head(report, by="step") -> list[str]:
    return csv_renderer.render(report, by=by).splitlines()[0].split(",")


def test_the_four_column_lists_agree(report):
    pandas = pytest.importorskip("pandas")  # noqa: F841
    step_labels = labelled(StepMetrics)
    names = [label.name for label in step_labels]
    assert names[:6] == ["comm_us", "overlapped_us", "exposed_comm_us", "overlap_ratio", "compute_us", "memory_us"]
    assert {"step_us", "exposed_share"} <= set(names) and "start_us" not in names  # a position, not shown
    text = [c.field for c in C.step_columns(report.ranks[0].steps)]
    csv_head, frame = _csv_head(report), list(report.to_pandas().steps.columns)
    tb = [field for field, _ in TAGS.values()]

    def order(listed):
        return [n for n in listed if n in names]

    # the step's own fields, then the metrics; the text step table leaves memory to the rank table
    assert order(csv_head) == order(frame) == ["step_us", "exposed_share", *names[:6]]
    assert set(order(tb)) == set(names) and len(order(tb)) == len(names)
    assert order(text) == [n for n in order(csv_head) if n != "memory_us"]
    assert [c.field for c in C.METRICS] == [label.name for label in labelled(Metrics) if label.name != "memory_us"]
    assert _csv_head(report, "rank")[3:9] == [label.name for label in labelled(Metrics)]
    heads = C.heads(C.step_columns(report.ranks[0].steps))
    assert "comm ms" in heads and "overlap" in heads and "exposed share" in heads
    assert TAGS["overlap/ratio"][0] == "overlap_ratio" and TAGS["overlap/comm_us"] == ("comm_us", "union of communication, µs")


def test_a_field_added_with_its_label_appears_in_all_four_outputs(report):
    pandas = pytest.importorskip("pandas")  # noqa: F841
    steps = [s for r in report.ranks for s in r.steps]
    assert steps, "trace_filter has ProfilerSteps"
    wider = msgspec.structs.replace(report, ranks=[
        msgspec.structs.replace(r, steps=[WiderStep(**msgspec.structs.asdict(s), backlog_us=1000.0 * (s.step + 1))
                                          for s in r.steps]) for r in report.ranks])
    first = wider.ranks[0].steps[0]
    # text: "backlog ms", in ms
    text = table.render(wider, by="step")
    head = next(line for line in text.splitlines() if "exposed share" in line)
    assert "backlog ms" in head and "backlog ms" not in table.render(report, by="step")
    row = next(line for line in text.splitlines() if re.match(rf"\s*{wider.ranks[0].rank}\s+#{first.step}\s", line))
    assert f"{first.backlog_us / 1000:.3f}" in row.split()
    # CSV: the field's name, raw µs
    lines = csv_renderer.render(wider, by="step").splitlines()
    at = lines[0].split(",").index("backlog_us")
    assert float(lines[1].split(",")[at]) == first.backlog_us and "backlog_us" not in _csv_head(report)
    # DataFrames
    frame = wider.to_pandas().steps
    assert list(frame["backlog_us"]) == [s.backlog_us for r in wider.ranks for s in r.steps]
    # TensorBoard: overlap/<field>, with its description and unit
    assert report_tags(wider)["overlap/backlog_us"] == ("backlog_us", "communication waiting to start, µs")
    points = scalar_points(wider)[wider.ranks[0].rank]
    assert points[0] == (first.step, {**points[0][1], "overlap/backlog_us": first.backlog_us})
    assert "overlap/backlog_us" not in scalar_points(report)[report.ranks[0].rank][0][1]
