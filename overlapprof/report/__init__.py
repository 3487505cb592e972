"""The report schema: everything ``overlapprof analyze`` and ``compare`` measured, as plain typed data.

Every other part of overlapprof imports these structs; this package imports nothing of ours but
:mod:`overlapprof.errors`, and no numpy (``import overlapprof.report`` stays light for a report
reader or a renderer). Metric names and formulas are those of OVERLAP.md; times are
microseconds. Modules:

- :mod:`~overlapprof.report.metrics`: per rank, step and kind (OVERLAP.md sections 2 and 3) and the summary
- :mod:`~overlapprof.report.crossrank`: the cross-rank section (matched collectives, waits, bandwidth)
- :mod:`~overlapprof.report.records`: one record per communication kernel or annotation
- :mod:`~overlapprof.report.exposure`: why communication is exposed (causes) and what overlap could buy (bounds)
- :mod:`~overlapprof.report.lanes`: every step's unions on one clock, for the all-ranks export
- :mod:`~overlapprof.report.document`: the Report and its Options; JSON save/load
- :mod:`~overlapprof.report.comparison`: variants compared against a baseline
- :mod:`~overlapprof.report.workload`: the workload's own metrics (``ctx.metric``)

Layout (``schema`` is first in the JSON, which is how a saved report is recognised)::

    Report
      schema, version, inputs, options, filters, warnings, run
      ranks: [RankReport]            one per rank, sorted by rank
        rank, rank_source, files, mode, world_size, backend, events, *_events
        metrics: Metrics             OVERLAP.md section 2, whole trace
        steps:   [StepMetrics]       per ProfilerStep#N (section 3), each with its Partition
        median_step_us               median of the steps' step_us
        partition: Partition | None  step time = compute + exposed comm + exposed memory + idle
        kinds:   [KindMetrics]       per kind of communication (section 3)
        timeline: Timeline | None    unions of one representative step, for plots
        exposure: Exposure | None    exposed communication split by cause (also per step and kind)
        *_bound_us, verdict          what overlap could buy: comm-free and overlap bounds
        operations: [OperationWindow] | None   per operation: window, slack, exposed (when asked)
        comm_records: [CommRecord] | None   one per communication kernel or annotation (when asked)
        lanes: Lanes | None          every step's unions on the run's common clock (export; when asked)
        p2p: PointToPoint | None     CPU mode: what is known of the async send/recv operations' ends
      summary: Summary               across ranks (section 3)
      crossrank: CrossRank | None    matched collectives: wait vs transfer, stragglers, bandwidth
      workload_metrics: [WorkloadMetric]   the workload's ctx.metric values, from run.json

    Comparison
      schema, version, baseline, basis, warnings
      variants: [VariantStats]       one per variant, the baseline first
      reports:  [Report]             what the numbers come from
"""

from overlapprof.report.comparison import BOOTSTRAP, CI_LEVEL, PER_STEP, SEED, WHOLE_TRACE, Comparison, VariantStats
from overlapprof.report.crossrank import (
    BandwidthRow,
    ClockDomain,
    CollectiveInstance,
    CrossRank,
    KindMatch,
    ProcessGroup,
    RankWaits,
    Straggler,
    Unmatched,
    WarmupOp,
)
from overlapprof.report.document import SCHEMA, Options, Report
from overlapprof.report.exposure import (ACTIVITIES, BOUND_FORMS, CAUSES, FIRST_ORDER, WINDOWS, Exposure, OperationWindow,
                                         held_fixed)
from overlapprof.report.lanes import Lanes, SliceEvent, StepLanes, TraceSlice
from overlapprof.report.metrics import KindMetrics, Metrics, Partition, PointToPoint, RankReport, StepMetrics, Summary, Timeline
from overlapprof.report.records import CommRecord
from overlapprof.report.workload import WorkloadMetric

__all__ = [
    "ACTIVITIES", "BOOTSTRAP", "BOUND_FORMS", "CAUSES", "CI_LEVEL", "Exposure", "FIRST_ORDER", "OperationWindow", "WINDOWS", "PER_STEP", "SEED", "WHOLE_TRACE", "BandwidthRow", "ClockDomain",
    "CollectiveInstance", "CommRecord", "Comparison", "CrossRank", "KindMatch", "KindMetrics", "Lanes",
    "Metrics", "Options", "Partition", "PointToPoint", "ProcessGroup", "RankReport", "RankWaits", "Report",
    "SCHEMA", "SliceEvent", "StepLanes", "StepMetrics", "Straggler", "Summary", "Timeline", "TraceSlice", "Unmatched", "VariantStats",
    "WarmupOp", "WorkloadMetric", "held_fixed",
]
