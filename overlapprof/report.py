"""The Report: everything ``overlapprof analyze`` measured, as plain typed data.

A Report is what :func:`overlapprof.analyze` returns and what every renderer reads. It saves to
and loads from JSON (``Report.save``/``Report.load``), so a report is re-rendered without
re-reading traces. Metric names and formulas are those of OVERLAP.md; times are microseconds.

Layout (``schema`` is first in the JSON, which is how a saved report is recognised)::

    Report
      schema, version, inputs, options, filters, warnings, run
      ranks: [RankReport]            one per rank, sorted by rank
        rank, rank_source, files, mode, world_size, backend, events, *_events
        metrics: Metrics             OVERLAP.md section 2, whole trace
        steps:   [StepMetrics]       per ProfilerStep#N (section 3), each with its Partition
        partition: Partition | None  step time = compute + exposed comm + exposed memory + idle
        kinds:   [KindMetrics]       per kind of communication (section 3)
        timeline: Timeline | None    unions of one representative step, for plots
        comm_ops: [CommOp] | None    one record per comm operation (only when asked)
      summary: Summary               across ranks (section 3)
      comms: Comms | None            matched collectives: wait vs transfer, stragglers, bandwidth
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from overlapprof.analysis.comm_ops import CommOp
from overlapprof.analysis.comms import Comms
from overlapprof.errors import ReportError

SCHEMA = "overlapprof.report/1"


class Metrics(msgspec.Struct, kw_only=True):
    """OVERLAP.md section 2, in µs. U(X) is the union of the intervals [ts, ts+dur) of class X.

    - ``comm_us`` = |U(comm)|, ``compute_us`` = |U(compute)|
    - ``overlapped_us`` = |U(comm) ∩ U(compute)|
    - ``exposed_comm_us`` = ``comm_us`` − ``overlapped_us`` = |U(comm) \\ U(compute)|
    - ``overlap_ratio`` = ``overlapped_us / comm_us``; None when ``comm_us`` = 0
    - ``memory_us`` = |U(memory)| (``gpu_memcpy``/``gpu_memset``), neither comm nor compute
    """

    comm_us: float
    compute_us: float
    overlapped_us: float
    exposed_comm_us: float
    overlap_ratio: float | None
    memory_us: float = 0.0


class Partition(msgspec.Struct, kw_only=True):
    """Every microsecond of a step window W = [``start_us``, ``start_us + step_us``) in exactly
    one of four parts (TraceLens style), from the unions of the step's own events (µs):

    - ``compute_us`` = |U(compute) ∩ W|
    - ``exposed_comm_us`` = |(U(comm) \\ U(compute)) ∩ W|
    - ``exposed_memory_us`` = |(U(memory) \\ (U(compute) ∪ U(comm))) ∩ W|
    - ``idle_us`` = |W \\ (U(compute) ∪ U(comm) ∪ U(memory))|: time with none of them (host
      work the trace does not classify, launch gaps, waiting)

    The parts are disjoint and cover W, so ``compute_us + exposed_comm_us + exposed_memory_us +
    idle_us = step_us`` (to float rounding). A rank's partition is the mean over its steps
    (means, unlike medians, keep the sum).
    """

    compute_us: float
    exposed_comm_us: float
    exposed_memory_us: float
    idle_us: float
    step_us: float


class StepMetrics(Metrics, kw_only=True):
    """The metrics over the events of step ``ProfilerStep#<step>``, plus:

    - ``start_us``: the ProfilerStep span's start (trace clock, µs).
    - ``step_us``: the step's wall span, from the ProfilerStep's start to the latest end of the
      ProfilerStep span and of the events that belong to the step (GPU work that runs past the
      step's CPU end counts).
    - ``exposed_share`` = ``exposed_comm_us / step_us`` (None when ``step_us`` = 0).
    """

    step: int
    start_us: float
    step_us: float
    exposed_share: float | None
    partition: Partition | None = None


class KindMetrics(Metrics, kw_only=True):
    """The metrics of one kind of communication (its own comm intervals vs all the rank's compute).

    ``count`` is the number of operations of the kind: in GPU mode its comm events; in CPU mode
    its ``c10d::*`` calls plus the ``<backend>:<op>`` spans that are not part of one (a span that
    starts inside a call on its thread is part of it; a span on a worker thread is part of the
    earliest untaken call of its kind that started before it), so a ``c10d::allreduce_`` and its
    ``gloo:all_reduce`` count once, as ``--by collective`` and torch-tb-profiler count them.
    """

    kind: str
    count: int


class Timeline(msgspec.Struct, kw_only=True):
    """The unions of one representative step (the middle complete step by number, the same
    ProfilerStep on every rank), for plots.

    Intervals are ``[start, end]`` pairs in µs relative to ``start_us``. Each list holds at most
    ``overlapprof.analysis.metrics.TIMELINE_CAP`` intervals (the first ones in time);
    ``truncated`` says when one was cut. Without ProfilerSteps, ``step`` is None and the window is
    the whole trace.
    """

    step: int | None
    start_us: float
    span_us: float
    comm: list[tuple[float, float]]
    compute: list[tuple[float, float]]
    overlapped: list[tuple[float, float]]
    truncated: bool = False


class RankReport(msgspec.Struct, kw_only=True):
    """One rank. ``rank_source`` says where the rank number came from: ``distributedInfo``,
    ``run.json``, ``file name`` or ``order`` (sorted input order, when nothing else says).

    """

    rank: int
    rank_source: str
    files: list[str]
    mode: str
    metrics: Metrics
    steps: list[StepMetrics]
    kinds: list[KindMetrics]
    events: int
    comm_events: int
    compute_events: int
    memory_events: int
    world_size: int | None = None
    backend: str | None = None
    timeline: Timeline | None = None
    comm_ops: list[CommOp] | None = None
    partition: Partition | None = None  # the mean of the steps' partitions; None without steps


class Summary(msgspec.Struct, kw_only=True):
    """Across ranks (OVERLAP.md section 3).

    - ``min_ratio``/``median_ratio``/``max_ratio``: of ``overlap_ratio`` over the ranks that have
      one (``ranks_with_comm``), with the ranks of the min and the max.
    - ``most_exposed_rank``: the rank with the largest ``exposed_comm_us`` (``most_exposed_us``).
    - ``pooled_ratio`` = Σ ``overlapped_us`` / Σ ``comm_us`` (None when Σ ``comm_us`` = 0).
    - ``comm_us``, ``overlapped_us``, ``exposed_comm_us``: the sums over ranks.
    - ``median_step_us``, ``p90_step_us``: of ``step_us`` pooled over every rank's steps.
    """

    ranks: int
    ranks_with_comm: int
    min_ratio: float | None = None
    min_ratio_rank: int | None = None
    median_ratio: float | None = None
    max_ratio: float | None = None
    max_ratio_rank: int | None = None
    most_exposed_rank: int | None = None
    most_exposed_us: float | None = None
    pooled_ratio: float | None = None
    comm_us: float = 0.0
    overlapped_us: float = 0.0
    exposed_comm_us: float = 0.0
    median_step_us: float | None = None
    p90_step_us: float | None = None


class Options(msgspec.Struct, kw_only=True):
    """The analysis options. Every option off = OVERLAP.md's whole-trace window."""

    comm_kernels: list[str] = []
    comm_backends: list[str] = []  # CPU mode: backends added to OVERLAP.md's `<backend>:<op>` list
    drop_last_step: bool = False
    require_launch: bool = False
    like_hta: bool = False
    allow_partial: bool = False
    comm_ops: bool = False
    comms: bool = True
    align_clocks: bool = False


class Report(msgspec.Struct, kw_only=True):
    """The result of an analysis; see the module docstring for the layout.

    ``filters`` describes, in words, each option that changes which events count (empty by
    default). ``warnings`` lists what the reader should know (skipped ranks, odd events).
    ``run`` is the ``run.json`` of an ``overlapprof run`` directory, when one was analyzed.
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
    comms: Comms | None = None

    def rank(self, rank: int) -> RankReport:
        """The RankReport of ``rank`` (KeyError if absent)."""
        for r in self.ranks:
            if r.rank == rank:
                return r
        raise KeyError(rank)

    def to_json(self, indent: int = 2) -> str:
        """The report as JSON text (``indent=0`` for one line)."""
        data = msgspec.json.encode(self)
        return (msgspec.json.format(data, indent=indent) if indent else data).decode()

    @classmethod
    def from_json(cls, text: str | bytes, source: str = "report") -> Report:
        """A Report from JSON text; ReportError (one line) when it is not an overlapprof report."""
        try:
            head = msgspec.json.decode(text, type=_Head)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise ReportError(f"{source}: not an overlapprof report ({exc})") from None
        if head.schema != SCHEMA:
            raise ReportError(f"{source}: not an overlapprof report (schema {head.schema!r}, expected {SCHEMA!r})")
        try:
            return msgspec.json.decode(text, type=cls)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise ReportError(f"{source}: damaged overlapprof report ({exc})") from None

    def save(self, path: str | Path) -> None:
        """Write the report as JSON to ``path`` (through a temporary file, then renamed)."""
        path = Path(path)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(self.to_json() + "\n")
        tmp.replace(path)

    @classmethod
    def load(cls, path: str | Path) -> Report:
        """Read a report saved with :meth:`save` (or ``--json FILE``)."""
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            raise ReportError(f"{path}: cannot read ({exc.strerror or exc})") from None
        return cls.from_json(data, source=str(path))


class _Head(msgspec.Struct):
    schema: str | None = None

