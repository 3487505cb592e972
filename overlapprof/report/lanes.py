"""A rank's measured unions on the run's common clock, step by step: what ``overlapprof export`` draws.

Plain typed data (no numpy), filled by :mod:`overlapprof.analysis.lanes` (whose docstring gives
the clock and the clipping) and read by :mod:`overlapprof.renderers.timeline_trace`. Times are µs.
"""

from __future__ import annotations

from typing import Any

import msgspec

Pairs = list[tuple[float, float]]


class StepLanes(msgspec.Struct, kw_only=True):
    """One step's clipped unions (µs on the export axis); see the module docstring."""

    step: int | None
    start_us: float
    end_us: float
    compute: Pairs
    comm: Pairs
    exposed: Pairs


class SliceEvent(msgspec.Struct, kw_only=True, array_like=True):
    """A complete (``ph`` X) trace event: ``ts`` on the export axis, ``dur`` ≥ 0 (µs), on lane
    ``thread`` (an index into ``TraceSlice.threads``), with its own ``args``."""

    name: str
    cat: str
    ts: float
    dur: float
    thread: int
    args: Any = None


class TraceSlice(msgspec.Struct, kw_only=True):
    """The trace events of the chosen step (``step``) or window ([``start_us``, ``end_us``) on
    the export axis): those that start in it. ``threads``: one label per (process, thread) of
    the trace that has such events, from its ``process_name``/``thread_name`` metadata."""

    step: int | None
    start_us: float
    end_us: float
    threads: list[str]
    events: list[SliceEvent]
    negative_durations: int = 0


class Lanes(msgspec.Struct, kw_only=True):
    """A rank's steps on the export axis (see the module docstring); ``events`` once selected."""

    clock_base_us: float  # the trace's baseTimeNanoseconds / 1000 (0 without one)
    clock_shift_us: float = 0.0  # added to the trace's ts to place it on the export axis
    clocks: str = "shared"
    steps: list[StepLanes] = []
    events: TraceSlice | None = None
