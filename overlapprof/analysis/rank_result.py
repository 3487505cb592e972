"""What one rank's analysis gives back (:class:`RankResult`), and the pieces of its measuring that
the analyzer runs twice: the first time in :func:`~overlapprof.analysis.analyzer.analyze_group`,
again when a rank's async sends end at their partners' receives (:func:`measured_again`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from overlapprof.analysis.crossrank.inputs import CrossRankInput, crossrank_input
from overlapprof.analysis.exposure.inputs import ExposureInput, exposure_input
from overlapprof.analysis.interference import attach as attach_interference
from overlapprof.analysis.rank.events import RankEvents, filtered, last_step_dropped
from overlapprof.analysis.rank.metrics import rank_report
from overlapprof.errors import OverlapprofError
from overlapprof.report import Options, RankReport
from overlapprof.trace.kineto import EPOCH_MIN_US, base_us


@dataclass
class RankResult:
    """What a worker sends back for one group of files: small, picklable."""

    files: list[str]
    report: RankReport | None = None
    dist_rank: int | None = None
    world_size: int | None = None
    backend: str | None = None
    window: tuple[float, float] | None = None  # absolute recorded window, µs (None: unknown clock)
    warnings: list[str] = field(default_factory=list)
    error: OverlapprofError | None = None
    crossrank_input: CrossRankInput | None = None  # the rank's share of the cross-rank analysis (rank not settled)
    hta_steps: frozenset[str] | None = None  # --like-hta: the rank's ProfilerStep names
    exposure_input: ExposureInput | None = None  # the rank's share of the causes of exposure (with crossrank_input)
    recording: tuple | None = None  # what identifies the recording's content (see one_run.one_recording_each)
    lookalikes: dict[str, int] = field(default_factory=dict)  # compute kernels named like communication: counts
    op_shapes: list | None = None  # per file, the host ops with their input shapes (asked: op_shapes)
    remeasure: object = None  # CPU mode: what measures the rank again with its sends' ends (rank.remeasure)
    base: int | None = None  # the trace's baseTimeNanoseconds


def apply_filters(ev: RankEvents, options: Options, label: str, warnings: list[str]) -> None:
    """The HTA-style filters of the options, in place (OVERLAP.md section 2: off by default)."""
    ev.steps, cutoff = last_step_dropped(ev.steps, options.drop_last_step, label, warnings)
    launch = options.require_launch and ev.mode == "gpu"
    for name in ("comm", "compute", "memory"):
        setattr(ev, name, filtered(getattr(ev, name), launch, cutoff))


def event_bounds(ev: RankEvents) -> tuple[float, float] | None:
    """The classified events' earliest start and latest end (µs; None: none)."""
    sets = [s for s in (ev.comm, ev.compute, ev.memory) if len(s)]
    if not sets:
        return None
    return min(float(s.start.min()) for s in sets), max(float(s.end.max()) for s in sets)


def recorded_window(bounds: tuple[float, float] | None, base_ns: int | None) -> tuple[float, float] | None:
    """The rank's recorded window on an absolute clock (µs), when the trace allows it; ``bounds``:
    its events' earliest start and latest end on the trace's clock."""
    if bounds is None:
        return None
    lo, hi = bounds
    if not base_ns and lo < EPOCH_MIN_US:
        return None
    return lo + base_us(base_ns), hi + base_us(base_ns)


def report_and_exposure(result: RankResult, ev, unions, table, measured: tuple, options: Options,
                        both=None) -> RankReport:
    """The rank's report from its unions, records and interference, and its exposure input:
    what :func:`measured_again` makes again when the rank's sends end earlier (``both``: see
    :func:`~overlapprof.analysis.rank.metrics.rank_report`)."""
    sets = {} if result.crossrank_input is not None else None
    records = table.records() if options.comm_records and table is not None else None
    report = rank_report(unions, ev.files, ev.mode, ev.events, records, exposed_out=sets, both=both)
    attach_interference(report, *measured)
    if sets is not None:
        result.exposure_input = exposure_input(ev.mode, unions, ev.host_sync, sets, table, ev.calls)
    if options.lanes:
        from overlapprof.analysis.lanes import rank_lanes

        report.lanes = rank_lanes(unions, report.steps, result.base)
    return report


def measured_again(result: RankResult, ev, options: Options) -> None:
    """``result``'s report, exposure input and cross-rank share made again from ``ev``, its rank
    measured again (:meth:`~overlapprof.analysis.rank.remeasure.Remeasure.again`), in place."""
    old = result.report
    share = None
    if result.crossrank_input is not None:
        share = result.crossrank_input = crossrank_input(ev.headers, result.base)
    report = report_and_exposure(result, ev, ev.unions, ev.table, ev.interference, options)
    if options.like_hta:
        report.metrics = old.metrics  # HolisticTraceAnalysis's, which the ends do not change
    report.rank, report.rank_source = old.rank, old.rank_source
    report.files = old.files  # as given (a Dask worker measured absolute paths)
    report.world_size, report.backend = old.world_size, old.backend
    report.device_not_measured = old.device_not_measured
    if share is not None:
        share.world_size = result.world_size
        share.attach(ev.table, ev.unions.comm, ev.unions.exposed, report.metrics.exposed_comm_us)
    result.report = report
