"""The saved documents: the :class:`Report` of an analysis and its :class:`Options`; JSON in and out.

A Report is what :func:`overlapprof.analyze` returns and what every renderer reads. It saves to
and loads from JSON (``Report.save``/``Report.load``), so a report is re-rendered without
re-reading traces; a :class:`~overlapprof.report.comparison.Comparison` saves the same way.

JSON in and out is :mod:`overlapprof.report.codec`'s, shared by every saved document. JSON keys
are the attribute names, except three kept from before the names were made to mean one
thing each (so reports saved earlier still load): ``Report.crossrank`` is ``"comms"``,
``RankReport.comm_records`` and ``Options.comm_records`` are ``"comm_ops"``, ``Options.crossrank``
is ``"comms"``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from overlapprof.report.advice import Advice
from overlapprof.report.codec import decode, load, save, to_json
from overlapprof.report.crossrank import CrossRank
from overlapprof.report.metrics import RankReport, Summary, by_rank
from overlapprof.report.workload import WorkloadMetric

if TYPE_CHECKING:
    from overlapprof.report.frames import Frames

SCHEMA = "overlapprof.report/1"


class Options(msgspec.Struct, kw_only=True):
    """The options a report was analyzed with, as it records them: only those that change the
    numbers, checked and normalized (``AnalyzeOptions.recorded`` makes them from the options
    ``analyze`` was asked, :class:`overlapprof.analysis.options.AnalyzeOptions`, which also say
    how the work runs). Every option off = OVERLAP.md's whole-trace window."""

    comm_kernels: list[str] = []
    comm_backends: list[str] = []  # CPU mode: backends added to OVERLAP.md's `<backend>:<op>` list
    drop_last_step: bool = False
    require_launch: bool = False
    like_hta: bool = False
    allow_partial: bool = False
    # keep one CommRecord per communication kernel or annotation in each RankReport (--comm-ops)
    comm_records: bool = msgspec.field(default=False, name="comm_ops")
    # match communication across ranks into Report.crossrank (off: --no-comms)
    crossrank: bool = msgspec.field(default=True, name="comms")
    align_clocks: bool = False
    lanes: bool = False  # give each rank its Lanes (overlapprof export)
    # the bandwidth (bytes/s, per rank) a transfer should reach: beyond it is slow transfer (--reference-bandwidth)
    reference_bandwidth: float | None = None
    cycle: int | None = None  # only each rank's N-th profiler cycle (--cycle); None: every cycle
    step_range: str | None = None  # Nsight Systems exports: the NVTX range that marks a step (--step-range)
    rank_map: dict[int, int] = {}  # Nsight Systems exports: pid -> rank (--rank-map)


class Report(msgspec.Struct, kw_only=True):
    """The result of an analysis; see the module docstring for the layout.

    ``filters`` describes, in words, each option that changes which events count (empty by
    default). ``warnings`` lists what the reader should know (skipped ranks, odd events).
    ``run`` is the ``run.json`` of an ``overlapprof run`` directory, when one was analyzed, and
    ``workload_metrics`` the workload's ``ctx.metric`` values from it. ``exposure_notes`` say
    what the causes and bounds could not see (no windows, an unknown link or core count, one
    rank only) and how they fell back. ``advice``: what to change first and what it buys
    (:mod:`overlapprof.report.advice`), when the input was a run directory the replay could read
    (``overlapprof analyze``); None otherwise, and in reports saved before it existed.
    """

    schema: str = SCHEMA
    version: str
    inputs: list[str]
    options: Options
    filters: list[str]
    ranks: list[RankReport]
    summary: Summary
    warnings: list[str] = []
    run: dict[str, Any] | None = None
    crossrank: CrossRank | None = msgspec.field(default=None, name="comms")
    workload_metrics: list[WorkloadMetric] = []
    exposure_notes: list[str] = []
    advice: Advice | None = None

    def rank(self, rank: int) -> RankReport:
        """The RankReport of ``rank`` (KeyError if absent)."""
        return by_rank(self.ranks, rank)

    to_json = to_json
    save = save
    load = classmethod(load)  # Report.load(path): a report saved with save (or --json FILE)

    def to_pandas(self) -> Frames:
        """The per-rank, per-step, per-kind, per-collective and workload-metric tables as pandas
        DataFrames (:class:`~overlapprof.report.frames.Frames`); needs pandas (the ``pandas`` extra)."""
        from overlapprof.report.frames import to_pandas

        return to_pandas(self)

    @classmethod
    def from_json(cls, text: str | bytes, source: str = "report") -> Report:
        """A Report from JSON text; ReportError (one line) when it is not an overlapprof report."""
        return decode(cls, text, source, SCHEMA, "report")

