"""``overlapprof export``: all ranks of a run on one timeline, as a Chrome trace-event JSON file."""

from __future__ import annotations

import math
from pathlib import Path

import click

from overlapprof.cli.common import (EXIT_CODES_PLAIN, ProgressBar, analyze_options, check_output, command, emit, fail,
                                    note, reading_options)


def parse_window(text: str) -> tuple[float, float]:
    """``START:END`` in ms (decimals allowed) -> (start, end) in µs; ValueError with the reason."""
    parts = text.split(":")
    if len(parts) != 2:
        raise ValueError(f"--window {text!r}: give START:END in ms, e.g. --window 12.5:40")
    try:
        start, end = (float(p) for p in parts)
    except ValueError:
        raise ValueError(f"--window {text!r}: START and END must be numbers of ms, e.g. --window 12.5:40") from None
    if not (math.isfinite(start) and math.isfinite(end)) or start < 0 or end <= start:
        raise ValueError(f"--window {text!r}: need 0 <= START < END (ms from the timeline's start)")
    return start * 1000, end * 1000


@command("export", epilog=EXIT_CODES_PLAIN)
@click.argument("run", type=click.Path(path_type=str))
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True, metavar="FILE",
              help="The JSON file to write (e.g. timeline.json); never inside a run directory or over a trace.")
@click.option("--step", type=int, default=None, metavar="N",
              help="Add the trace's own events of ProfilerStep#N (default: the step the report's timeline shows).")
@click.option("--window", default=None, metavar="START:END",
              help="Instead of a step, add the trace's own events that start in this window: ms from the "
                   "timeline's start (time 0 in Perfetto), e.g. 12.5:40.")
@reading_options
def export(run, output, step, window, quiet, **kw):
    """Write ONE Chrome trace-event JSON file with every rank of RUN (a run directory, or a
    folder or files of traces of one job) on one timeline: a process per rank, with lanes for
    its steps, compute, communication and exposed communication (the unions the analysis
    measured, clipped per step), plus the trace's own events of one step (--step) or time window
    (--window), so that you see which rank exposes what, side by side.

    Open it in Perfetto (https://ui.perfetto.dev, "Open trace file"; it stays in the browser) or
    chrome://tracing ("Load").
    """
    from overlapprof import analyze
    from overlapprof.analysis import lanes as L
    from overlapprof.renderers import get

    if step is not None and window is not None:
        fail("give --step or --window, not both")
    try:
        window_us = parse_window(window) if window is not None else None
    except ValueError as exc:
        fail(exc)
    if output.is_dir():
        fail(f"{output} is a folder; name the timeline file, e.g. -o {output / 'timeline.json'}")
    if output.suffix == ".gz":
        fail(f"{output}: the timeline is plain JSON; name it e.g. timeline.json")
    check_output(output, "timeline")
    if not Path(run).exists():
        fail(f"{run}: no such run directory or trace")

    progress = ProgressBar("analyzing ranks", quiet)
    try:
        report = analyze([run], analyze_options(kw, lanes=True, progress=progress))
    finally:
        progress.close()
    progress = ProgressBar("reading their events", quiet)
    try:
        L.select_events(report, step=step, window_us=window_us, progress=lambda k, n, rank: progress(k, n, f"rank {rank}"))
    finally:
        progress.close()
    for warning in report.warnings:
        note(f"warning: {warning}", quiet)
    clocks = next((r.lanes.clocks for r in report.ranks if r.lanes), None)
    if clocks == "unaligned":
        note("warning: the ranks are on several hosts whose clocks were not aligned; their lanes may be "
             "offset by what NTP left (--align-clocks aligns them)", quiet)
    events = sum(len(r.lanes.events.events) for r in report.ranks if r.lanes and r.lanes.events)
    note(f"{len(report.ranks)} ranks, {events} trace events", quiet)
    emit(get("chrome-trace", "report", lanes=True)().render(report), output, "timeline", quiet)
