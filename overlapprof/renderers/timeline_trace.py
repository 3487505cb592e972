"""All ranks on one timeline: a Report with lanes as one Chrome trace-event JSON file.

What Perfetto (ui.perfetto.dev, "Open trace file") and chrome://tracing ("Load") open. The
format (Google's "Trace Event Format" document): a JSON object whose ``traceEvents`` holds

- one *process* per rank (``pid`` = rank + 1, named ``rank N`` by a ``process_name`` metadata
  event, ordered by ``process_sort_index`` = rank; pid 0 is avoided, which Perfetto's importer
  treats as the idle process);
- per rank, *threads* (lanes) named by ``thread_name`` and ordered by ``thread_sort_index``:
  ``steps`` (one slice per ProfilerStep, its metrics in ``args``), ``compute``,
  ``communication`` and ``exposed communication`` (the clipped unions of
  :mod:`overlapprof.analysis.lanes`), then one lane per thread of the trace holding the selected
  original events;
- complete events (``ph`` "X") with ``ts`` and ``dur`` in µs (numbers, ``dur`` ≥ 0), sorted by
  ``ts`` (longer first at equal ``ts``, so enclosing slices come before what they enclose).

Everything is read from the report: the analyzer placed every interval on the run's common clock
(``displayTimeUnit`` ms). ``otherData`` says what was exported and how the clocks were aligned.
"""

from __future__ import annotations

import msgspec

from overlapprof.renderers.base import Renderer
from overlapprof.report import Report

STEP_TID, COMPUTE_TID, COMM_TID, EXPOSED_TID = 1, 2, 3, 4
TRACE_TID0 = 10  # the trace's own threads: TRACE_TID0 + index into TraceSlice.threads
LANE_NAMES = {STEP_TID: "steps", COMPUTE_TID: "compute", COMM_TID: "communication",
              EXPOSED_TID: "exposed communication"}
CATEGORY = "overlapprof"


def _meta(name: str, pid: int, tid: int, value) -> dict:
    key = "name" if name.endswith("_name") else "sort_index"
    return {"ph": "M", "name": name, "pid": pid, "tid": tid, "args": {key: value}}


def _slice(name: str, cat: str, ts: float, dur: float, pid: int, tid: int, args=None) -> dict:
    event = {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": pid, "tid": tid}
    if args:
        event["args"] = args
    return event


def _step_args(rank_report, number) -> dict:
    step = next((s for s in rank_report.steps if s.step == number), None)
    m = step if step is not None else rank_report.metrics
    args = {"comm_us": m.comm_us, "compute_us": m.compute_us, "overlapped_us": m.overlapped_us,
            "exposed_comm_us": m.exposed_comm_us, "overlap_ratio": m.overlap_ratio}
    if step is not None:
        args["step_us"] = step.step_us
    return args


def trace_events(report: Report) -> tuple[list[dict], list[dict]]:
    """(metadata events, complete events sorted by ts) of the export."""
    meta, slices = [], []
    for r in report.ranks:
        if r.lanes is None:
            continue
        pid = r.rank + 1
        meta += [_meta("process_name", pid, 0, f"rank {r.rank}"), _meta("process_sort_index", pid, 0, r.rank)]
        for tid, name in LANE_NAMES.items():
            meta += [_meta("thread_name", pid, tid, name), _meta("thread_sort_index", pid, tid, tid)]
        for s in r.lanes.steps:
            label = f"ProfilerStep#{s.step}" if s.step is not None else "whole trace"
            slices.append(_slice(label, CATEGORY, s.start_us, s.end_us - s.start_us, pid, STEP_TID,
                                 _step_args(r, s.step)))
            of_step = {"step": s.step} if s.step is not None else None
            for tid, pairs in ((COMPUTE_TID, s.compute), (COMM_TID, s.comm), (EXPOSED_TID, s.exposed)):
                slices += [_slice(LANE_NAMES[tid], CATEGORY, a, b - a, pid, tid, of_step) for a, b in pairs]
        chosen = r.lanes.events
        if chosen is None:
            continue
        for k, label in enumerate(chosen.threads):
            meta += [_meta("thread_name", pid, TRACE_TID0 + k, f"trace: {label}"),
                     _meta("thread_sort_index", pid, TRACE_TID0 + k, TRACE_TID0 + k)]
        slices += [_slice(e.name, e.cat or "trace", e.ts, e.dur, pid, TRACE_TID0 + e.thread,
                          e.args if isinstance(e.args, dict) else None) for e in chosen.events]
    slices.sort(key=lambda e: (e["ts"], -e["dur"]))
    return meta, slices


def _selection_text(report: Report) -> str:
    chosen = next((r.lanes.events for r in report.ranks if r.lanes and r.lanes.events), None)
    if chosen is None:
        return "no trace events selected"
    if chosen.step is not None:
        return f"trace events of ProfilerStep#{chosen.step}"
    return f"trace events starting in {chosen.start_us / 1000:g}-{chosen.end_us / 1000:g} ms"


def render(report: Report) -> str:
    """The Chrome trace-event JSON text of a report analyzed with lanes (and selected events)."""
    meta, slices = trace_events(report)
    clocks = next((r.lanes.clocks for r in report.ranks if r.lanes), "unchecked")
    other = {
        "producer": f"overlapprof {report.version}",
        "inputs": report.inputs,
        "selection": _selection_text(report),
        "clocks": clocks,
        "lanes": "compute, communication, exposed communication: OVERLAP.md unions per step, clipped to the step",
    }
    if report.crossrank is not None and clocks == "aligned":
        other["clock_offsets_us"] = {str(d.name): d.offset_us for d in report.crossrank.domains}
    data = {"displayTimeUnit": "ms", "otherData": other, "traceEvents": meta + slices}
    return msgspec.json.encode(data).decode() + "\n"


class ChromeTraceRenderer(Renderer):
    """All ranks on one timeline, as Chrome trace-event JSON for Perfetto (``overlapprof export``)."""

    name = "chrome-trace"
    extensions = ("json",)
    lanes = True

    def render(self, report: Report) -> str:
        return render(report)
