"""Every rank's measured unions, step by step, on one clock: what ``overlapprof export`` draws.

Asked for with ``analyze(..., lanes=True)``, each :class:`~overlapprof.report.RankReport` gets
:class:`Lanes`: per step, the unions the step's metrics were measured on, clipped to the step's
window W = [``start_us``, ``end_us``) (``end_us`` = ``start_us + step_us``):

- ``compute`` = U(compute of the step's events) ∩ W, so Σ lengths = the step's ``compute_us``
- ``comm`` = U(comm of the step's events) ∩ W, Σ = ``comm_us``
- ``exposed`` = ``comm`` \\ ``compute``, Σ = ``exposed_comm_us``

(the step's events are those OVERLAP.md section 3 puts in it: by launch, else by start; they lie
inside W by the definition of ``step_us``, so the clipping only guards the lanes). A trace
without ProfilerSteps gives one window, the whole trace, with ``step`` None.

**One clock.** Times are µs on the run's common clock, relative to the *export origin* (the
earliest window start of any rank), so every rank's lanes share one axis that starts at 0. A
rank's common-clock time is ``ts + clock_shift_us``, with ``clock_shift_us`` = (its trace's
``baseTimeNanoseconds`` − the lowest of the ranks') / 1000 + its ``--align-clocks`` offset
(:mod:`overlapprof.analysis.crossrank.clocks`; 0 without it) − the origin. ``Lanes.clocks`` says how
comparable the ranks are: ``shared`` (one host), ``aligned`` or ``unaligned`` (several hosts
whose clocks were not aligned: lanes of different hosts may be offset by what NTP left) or
``unchecked`` (no cross-rank analysis: ``--no-comms``, or no communication; one host assumed).

:func:`select_events` adds the trace's own complete events of one step or time window
(:class:`TraceSlice`), re-read from the rank's files and placed on the same axis.
"""

from __future__ import annotations

import msgspec
import numpy as np

from overlapprof.analysis import intervals as iv
from overlapprof.analysis.records.recorder import hashable
from overlapprof.errors import InputError
from overlapprof.report.lanes import Lanes, SliceEvent, StepLanes, TraceSlice
from overlapprof.trace.kineto import base_us

Pairs = list[tuple[float, float]]


def _pairs(u: iv.Intervals, shift: float = 0.0) -> Pairs:
    return list(zip((u[0] + shift).tolist(), (u[1] + shift).tolist()))


def rank_lanes(u, steps, base_ns: int | None) -> Lanes:
    """The Lanes of one rank (on its own ``ts`` clock until :func:`place` shifts them), from the
    unions of its classified events (:class:`~overlapprof.analysis.rank.unions.RankUnions`) and
    its StepMetrics."""
    from overlapprof.analysis.rank.unions import COMM, COMPUTE

    if steps:
        windows = [(s.step, s.start_us, s.start_us + s.step_us) for s in steps]
        sets = [[u.step(c, k) for k in range(len(steps))] for c in (COMM, COMPUTE)]
    else:
        present = [s for s in u.spans if s is not None]
        if not present:
            return Lanes(clock_base_us=base_us(base_ns))
        windows = [(None, min(s[0] for s in present), max(s[1] for s in present))]
        sets = [[u.comm], [u.compute]]
    out = []
    for k, (number, start, end) in enumerate(windows):
        w = (np.array([start]), np.array([end]))
        comm, compute = iv.intersection(sets[0][k], w), iv.intersection(sets[1][k], w)
        out.append(StepLanes(step=number, start_us=start, end_us=end, compute=_pairs(compute), comm=_pairs(comm),
                             exposed=_pairs(iv.difference(comm, compute))))
    return Lanes(clock_base_us=base_us(base_ns), steps=out)


def place(ranks, crossrank) -> None:
    """Put every rank's lanes on the export axis, in place (see the module docstring).

    ``crossrank``: the report's CrossRank (None without the cross-rank analysis); its ``clocks``
    and per-rank ``clock_offset_us`` are the alignment."""
    have = [r for r in ranks if r.lanes is not None]
    if not have:
        return
    lowest = min(r.lanes.clock_base_us for r in have)
    offsets = {c.rank: c.clock_offset_us for c in crossrank.ranks} if crossrank is not None else {}
    clocks = crossrank.clocks if crossrank is not None else "unchecked"
    shift = {r.rank: r.lanes.clock_base_us - lowest + (offsets.get(r.rank, 0.0) if clocks == "aligned" else 0.0)
             for r in have}
    starts = [s.start_us + shift[r.rank] for r in have for s in r.lanes.steps]
    origin = min(starts) if starts else 0.0
    for r in have:
        d = shift[r.rank] - origin
        r.lanes.clock_shift_us, r.lanes.clocks = d, clocks
        for s in r.lanes.steps:
            s.start_us, s.end_us = s.start_us + d, s.end_us + d
            for name in ("compute", "comm", "exposed"):
                setattr(s, name, [(a + d, b + d) for a, b in getattr(s, name)])


def representative_step(report) -> int | None:
    """The step the report's own timeline shows (the same ProfilerStep on every rank), else None."""
    return next((r.timeline.step for r in report.ranks if r.timeline is not None and r.timeline.step is not None),
                None)


def _selection(report, step: int | None, window_us: tuple[float, float] | None) -> dict[int, tuple]:
    """Per rank: (step, start, end) on the export axis of the events to select."""
    out = {}
    for r in report.ranks:
        if r.lanes is None:
            raise InputError("the report was analyzed without lanes (analyze(..., lanes=True))")
        if window_us is not None:
            out[r.rank] = (None, *window_us)
            continue
        if step is None:
            out[r.rank] = (None, r.lanes.steps[0].start_us, r.lanes.steps[0].end_us) if r.lanes.steps else None
            continue
        match = next((s for s in r.lanes.steps if s.step == step), None)
        if match is None:
            have = [s.step for s in r.lanes.steps if s.step is not None]
            shown = f"steps {min(have)}-{max(have)}" if have else "no ProfilerSteps"
            raise InputError(f"--step {step}: rank {r.rank}'s trace has no ProfilerStep#{step} ({shown})")
        out[r.rank] = (step, match.start_us, match.end_us)
    return out


def _label(names: dict, pid, tid) -> str:
    process = names.get(("process", pid)) or f"pid {pid}"
    thread = names.get(("thread", pid, tid)) or f"tid {tid}"
    return f"{process} / {thread}"


def _read_slice(files: list[str], shift: float, step, start: float, end: float, step_range=None) -> TraceSlice:
    """The complete events of ``files`` that start in [start, end) on the export axis
    (``step_range``: an Nsight Systems export's step range, see ``AnalyzeOptions``)."""
    from overlapprof.trace import nsys
    from overlapprof.trace.decode import THREAD_ROW_DECODER
    from overlapprof.trace.reader import LayoutError, TraceReader

    names: dict = {}
    threads: dict = {}
    picked: list[tuple] = []
    negative = 0
    lo, hi = start - shift, end - shift  # on the trace's own ts clock
    for path in files:
        if nsys.is_sqlite(path):  # an export's rows, as the scan reads them
            from overlapprof.analysis.rank.nsys_scan import events_between

            rows, labels = events_between(path, lo, hi, step_range)
            for name, cat, ts, dur, k in rows:
                lane = threads.setdefault(("nsys", path, k), len(threads))
                names[("nsys", path, k)] = labels[k]
                picked.append((name, cat, ts + shift, dur, lane, None))
            continue
        for generic in (False, True):
            reader = TraceReader(path, THREAD_ROW_DECODER)
            try:
                rows = [(e.ph, e.cat, e.name, e.ts, e.dur, e.pid, e.tid, e.args)
                          for chunk in reader.chunks(generic=generic) for e in chunk.events
                          if e.ph == "M" or (e.ph == "X" and e.ts is not None and lo <= e.ts < hi)]
                break
            except LayoutError:
                continue
        for ph, cat, name, ts, dur, pid, tid, args in rows:
            pid, tid = hashable(pid), hashable(tid)
            if ph == "M":
                if name in ("process_name", "thread_name"):
                    value = _arg_name(args)
                    key = ("process", pid) if name == "process_name" else ("thread", pid, tid)
                    if value and key not in names:
                        names[key] = value
                continue
            if dur is None:
                continue
            if dur < 0:
                negative, dur = negative + 1, 0.0
            lane = threads.setdefault((pid, tid), len(threads))
            picked.append((name, cat, float(ts) + shift, float(dur), lane, _args(args)))
    labels = [names[key] if key[0] == "nsys" else _label(names, *key) for key in threads]
    picked.sort(key=lambda e: (e[2], -e[3]))
    return TraceSlice(step=step, start_us=start, end_us=end, threads=labels, negative_durations=negative,
                      events=[SliceEvent(name=n, cat=c, ts=t, dur=d, thread=k, args=a) for n, c, t, d, k, a in picked])


def _arg_name(raw) -> str | None:
    """``args.name`` of a metadata event (``process_name``/``thread_name``), else None."""
    value = _args(raw)
    return str(value.get("name")) if isinstance(value, dict) and value.get("name") is not None else None


def _args(raw):
    """An event's args as decoded JSON (None when absent or unreadable)."""
    if not raw:
        return None
    try:
        return msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return None


def select_events(report, step: int | None = None, window_us: tuple[float, float] | None = None,
                  progress=None) -> None:
    """Fill each rank's ``lanes.events`` with its trace events of ProfilerStep ``step``, or of
    ``window_us`` = (start, end) µs on the export axis, or (neither) of the report's
    representative step; events that *start* in the step or window are taken. InputError when a
    rank lacks the step or the window is empty of steps. ``progress(k, n, rank)`` per rank."""
    if step is None and window_us is None:
        step = representative_step(report)
    if window_us is not None:
        start, end = window_us
        if not 0 <= start < end:
            raise InputError(f"--window: START must be at least 0 and below END (got {start / 1000:g}:{end / 1000:g} ms)")
        last = max((s.end_us for r in report.ranks if r.lanes for s in r.lanes.steps), default=0.0)
        if start >= last:
            raise InputError(f"--window starts at {start / 1000:g} ms, after the timeline ends ({last / 1000:.3f} ms)")
    chosen = _selection(report, step, window_us)
    for k, r in enumerate(report.ranks):
        if progress:
            progress(k, len(report.ranks), r.rank)
        if chosen[r.rank] is None:
            continue
        number, start, end = chosen[r.rank]
        r.lanes.events = _read_slice(r.files, r.lanes.clock_shift_us, number, start, end, report.options.step_range)
