"""Each rank's share of the causes and bounds (:class:`ExposureInput`), built where the rank was read.

The worker that measured a rank keeps the sets the causes are measured on: the rank's compute
and communication unions, its exposed communication (whole trace, per step and per kind: the sets
whose lengths are ``exposed_comm_us``), and its host synchronizations. The rank's operations
(with their issue, need and channel) travel in its
:class:`~overlapprof.analysis.crossrank.inputs.CrossRankInput`; the waits come from matching.
Everything is on the rank's own trace clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from overlapprof.analysis import intervals as iv


@dataclass
class ExposureInput:
    """One rank's sets (µs, its own clock). ``steps``: the segmented U(comm) \\ U(compute) of its
    steps (segment = index in the report's ``steps``); ``kinds``: kind code -> U(comm of the kind)
    \\ U(compute); ``host_sync``: the union of its host synchronizations
    (:func:`~overlapprof.analysis.rank.classify.is_host_sync`); ``windows``: whether the trace
    says where each operation's result was needed (CPU mode: the issuing thread's activity; GPU
    mode: CUDA event-sync records, without which the operation's end is taken instead)."""

    mode: str
    compute: iv.Intervals
    comm: iv.Intervals
    exposed: iv.Intervals
    host_sync: iv.Intervals
    steps: iv.Segmented = iv.EMPTY_BY
    kinds: dict[int, iv.Intervals] = field(default_factory=dict)
    windows: bool = True  # whether the trace says where each operation's result was needed
    # CPU mode: the union of the rank's communication calls (c10d::*), the time its issuing
    # threads spent inside them (the replay's lanes leave it out of what a compute change scales)
    calls: iv.Intervals = iv.EMPTY


def exposure_input(mode: str, unions, host_sync: iv.Intervals, sets: dict, table=None,
                   calls: iv.Intervals | None = None) -> ExposureInput:
    """The ExposureInput of a rank: ``unions`` its
    :class:`~overlapprof.analysis.rank.unions.RankUnions`, ``sets`` what
    :func:`~overlapprof.analysis.rank.metrics.rank_report` put in its ``exposed_out``, ``table``
    its communication records (GPU mode: whether any says when its result was needed), ``calls``
    the union of its communication calls (CPU mode)."""
    parts = sets.get("steps") or []
    steps = tuple(np.concatenate([p[k] for p in parts]) for k in range(3)) if parts else iv.EMPTY_BY
    return ExposureInput(mode=mode, compute=unions.compute, comm=unions.comm, exposed=unions.exposed,
                         host_sync=host_sync, steps=steps, kinds=dict(sets.get("kinds") or {}),
                         windows=mode == "cpu" or (table is not None and bool((~np.isnan(table.need_ts)).any())),
                         calls=calls if mode == "cpu" and calls is not None else iv.EMPTY)
