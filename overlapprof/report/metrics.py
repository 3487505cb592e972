"""The per-rank numbers of a Report: OVERLAP.md's metrics per rank, step and kind, and their summary.

Plain typed data (msgspec Structs, no numpy), computed by :mod:`overlapprof.analysis.rank` and
:mod:`overlapprof.analysis.analyzer`, read by the renderers. Metric names and formulas are those
of OVERLAP.md; times are microseconds.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from overlapprof.report.exposure import Exposure, OperationWindow
from overlapprof.report.interference import Interference
from overlapprof.report.labels import FRACTION, US, shown
from overlapprof.report.records import CommRecord
from overlapprof.report.lanes import Lanes


def by_rank(items: list, rank: int):
    """The item of ``items`` (RankReports, RankWaits) whose ``rank`` is ``rank`` (KeyError if absent)."""
    for item in items:
        if item.rank == rank:
            return item
    raise KeyError(rank)


class Metrics(msgspec.Struct, kw_only=True):
    """OVERLAP.md section 2, in µs. U(X) is the union of the intervals [ts, ts+dur) of class X.

    - ``comm_us`` = |U(comm)|, ``compute_us`` = |U(compute)|
    - ``overlapped_us`` = |U(comm) ∩ U(compute)|
    - ``exposed_comm_us`` = ``comm_us`` − ``overlapped_us`` = |U(comm) \\ U(compute)|
    - ``overlap_ratio`` = ``overlapped_us / comm_us``; None when ``comm_us`` = 0
    - ``memory_us`` = |U(memory)| (``gpu_memcpy``/``gpu_memset``), neither comm nor compute

    Each field's label and unit (:mod:`overlapprof.report.labels`) make its column in the text
    tables, the CSV, the DataFrames and the TensorBoard scalars.
    """

    comm_us: Annotated[float, shown("comm", US, "union of communication")]
    overlapped_us: Annotated[float, shown("overlapped", US, "communication under compute")]
    exposed_comm_us: Annotated[float, shown("exposed", US, "communication not under compute")]
    overlap_ratio: Annotated[float | None, shown("overlap", FRACTION, "overlapped / comm", tag="ratio")]
    compute_us: Annotated[float, shown("compute", US, "union of compute")]
    memory_us: Annotated[float, shown("memory", US, "union of memory copies and sets, neither comm nor compute")] = 0.0


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
    - ``exposure``: ``exposed_comm_us`` split by cause (:class:`~overlapprof.report.Exposure`).
    - ``comm_free_bound_us`` = ``step_us − exposed_comm_us``: the step if communication cost
      nothing (the ceiling of any communication optimization).
    - ``overlap_bound_us``: the shortest step overlap could give (OVERLAP.md section 6.2; the
      rank's ``overlap_bound_form`` says which form). With lock-stepped ranks, every rank's
      step of one number has the same bound.
    - ``slowed_us``: the step's compute slowed by communication beside it, and
      ``net_overlap_gain_us`` = ``overlapped_us − slowed_us`` (OVERLAP.md section 6.4,
      :class:`~overlapprof.report.Interference`; None when not measured).
    """

    step: int
    start_us: float
    step_us: Annotated[float, shown("step", US, "step wall span")]
    exposed_share: Annotated[float | None, shown("exposed share", FRACTION, "exposed_comm_us / step_us")]
    partition: Partition | None = None
    exposure: Exposure | None = None
    comm_free_bound_us: float | None = None
    overlap_bound_us: float | None = None
    slowed_us: float | None = None
    net_overlap_gain_us: float | None = None


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
    exposure: Exposure | None = None  # the kind's exposed communication split by cause (its own operations)


class Timeline(msgspec.Struct, kw_only=True):
    """The unions of one representative step (the middle complete step by number, the same
    ProfilerStep on every rank), for plots.

    Intervals are ``[start, end]`` pairs in µs relative to ``start_us``. Each list holds at most
    ``overlapprof.analysis.rank.metrics.TIMELINE_CAP`` intervals (the first ones in time);
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
    # the exposed spans by cause (Exposure's causes; same clock and cap as the lists above)
    exposed_by_cause: dict[str, list[tuple[float, float]]] = {}


class PointToPoint(msgspec.Struct, kw_only=True):
    """CPU mode: what is known of the ends of a rank's asynchronous point-to-point operations
    (OVERLAP.md section 1): a send or recv span during which its thread did other work. gloo
    records such a span from the issue to the ``wait()``, not to the transfer's end.

    - ``async_ops``: the rank's asynchronous send/recv operations
    - ``ends_from_peer``: async sends whose communication ends at the end of the blocking receive
      matched to them, earlier than their span's (the span is cut there)
    - ``upper_bound``: async operations whose transfer's end nothing shows (an async recv; a send
      whose receive is async or not in the traces): their span, as recorded, is an upper bound
    - ``upper_bound_us``: |U(those spans)| (µs): the communication whose end is an upper bound
    """

    async_ops: int
    ends_from_peer: int
    upper_bound: int
    upper_bound_us: float


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
    # one record per communication kernel or annotation (only when asked: --comm-ops)
    comm_records: list[CommRecord] | None = msgspec.field(default=None, name="comm_ops")
    partition: Partition | None = None  # the mean of the steps' partitions; None without steps
    median_step_us: float | None = None  # median of the steps' step_us (interpolated, as Summary's); None without steps
    lanes: Lanes | None = None  # every step's unions on the run's common clock (only when asked: export)
    # Why communication is exposed and what overlap could buy (OVERLAP.md section 6; medians over steps):
    exposure: Exposure | None = None  # metrics.exposed_comm_us split by cause
    comm_free_bound_us: float | None = None  # median of the steps' comm_free_bound_us
    comm_free_speedup: float | None = None  # median_step_us / comm_free_bound_us
    overlap_bound_us: float | None = None  # median of the steps' overlap_bound_us
    overlap_bound_speedup: float | None = None  # median_step_us / overlap_bound_us
    overlap_bound_form: str | None = None  # how the bound was computed, in words (its form and floors)
    hidden_of_hideable: float | None = None  # overlapped_us / min(comm_us, compute_us)
    verdict: str | None = None  # one line a user can act on
    operations: list[OperationWindow] | None = None  # per operation: window, slack, exposed (--comm-ops)
    # {category: events} of device activity OVERLAP.md does not classify, when none it does was found: the device
    # was not measured, and the metrics are the host's (CPU mode). None otherwise.
    device_not_measured: dict[str, int] | None = None
    # CPU mode with the cross-rank section: the ends of the async point-to-point operations (None: the rank has none)
    p2p: PointToPoint | None = None
    # compute slowed by communication beside it, per compute class (OVERLAP.md section 6.4)
    interference: Interference | None = None


class Summary(msgspec.Struct, kw_only=True):
    """Across ranks (OVERLAP.md section 3).

    - ``min_ratio``/``median_ratio``/``max_ratio``: of ``overlap_ratio`` over the ranks that have
      one (``ranks_with_comm``), with the ranks of the min and the max.
    - ``most_exposed_rank``: the rank with the largest ``exposed_comm_us`` (``most_exposed_us``).
    - ``pooled_ratio`` = Σ ``overlapped_us`` / Σ ``comm_us`` (None when Σ ``comm_us`` = 0).
    - ``comm_us``, ``overlapped_us``, ``exposed_comm_us``: the sums over ranks.
    - ``median_step_us``, ``p90_step_us``: of ``step_us`` pooled over every rank's steps.
    - ``exposure``: the ranks' causes added up (None when no rank has them).
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
    exposure: Exposure | None = None
