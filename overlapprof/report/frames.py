"""A Report as pandas DataFrames, for notebooks: ``Report.to_pandas()``.

pandas is imported only when this is called (``pip install overlapprof[pandas]``). Times are
µs and ratios fractions, as in the Report (whose structs document every column); a missing value
(None) is NaN.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from overlapprof.report.labels import labelled, of_rows
from overlapprof.report.metrics import Metrics, StepMetrics

if TYPE_CHECKING:
    import pandas

    from overlapprof.report.document import Report

_METRICS = tuple(label.name for label in labelled(Metrics))  # the labelled fields
_PARTITION = ("compute_us", "exposed_comm_us", "exposed_memory_us", "idle_us")
_WAITS = ("wait_us", "transfer_us", "exposed_wait_us", "wait_share", "caused_wait_us")
_CAUSES = tuple(f"{c}_us" for c in ("late_peer", "host_blocked", "queued", "no_window", "window_short")) + (
    "slow_transfer_us",)
_RANK_BOUNDS = ("comm_free_bound_us", "comm_free_speedup", "overlap_bound_us", "overlap_bound_speedup",
                "overlap_bound_form", "hidden_of_hideable", "verdict")
_STEP_BOUNDS = ("comm_free_bound_us", "overlap_bound_us")
_COLLECTIVE = ("kind", "group", "method", "key", "step", "rank", "start_us", "duration_us", "transfer_us",
               "last_rank", "skew_us", "bytes", "group_size", "warmup")


@dataclass
class Frames:
    """The tables of a Report, one DataFrame each (sorted by rank, then step or kind):

    - ``ranks``: one row per rank: ``rank``, ``rank_source``, ``mode``, ``world_size``,
      ``backend``, OVERLAP.md's metrics (``comm_us``, ``overlapped_us``, ``exposed_comm_us``,
      ``overlap_ratio``, ``compute_us``, ``memory_us``: Metrics' labelled fields), ``steps``, ``median_step_us``,
      ``events``, the mean step's partition (``partition_compute_us`` ...
      ``partition_idle_us``), and with the cross-rank section its waits (``wait_us``,
      ``transfer_us``, ``exposed_wait_us``, ``wait_share``, ``caused_wait_us``); why its
      communication was exposed (``late_peer_us``, ``host_blocked_us``, ``queued_us``,
      ``no_window_us``, ``window_short_us``, ``slow_transfer_us``: OVERLAP.md section 6) and
      what overlap could buy (``comm_free_bound_us``, ``comm_free_speedup``,
      ``overlap_bound_us``, ``overlap_bound_speedup``, ``overlap_bound_form``,
      ``hidden_of_hideable``, ``verdict``).
    - ``steps``: one row per (rank, ProfilerStep): ``rank``, ``step``, ``start_us``,
      ``step_us``, ``exposed_share`` (StepMetrics' own labelled fields), the metrics, the step's partition, its causes and bounds
      (``comm_free_bound_us``, ``overlap_bound_us``).
    - ``kinds``: one row per (rank, kind of communication): ``rank``, ``kind``, ``count``, the
      metrics (the kind's communication against all the rank's compute) and its causes.
    - ``collectives``: one row per (matched collective instance, rank) of the cross-rank
      section: ``kind``, ``group``, ``method``, ``key``, ``step``, ``rank``, ``start_us`` (common
      clock), ``duration_us`` (the rank's), and the instance's ``transfer_us``, ``last_rank``,
      ``skew_us``, ``bytes``, ``group_size``, ``warmup``; empty without the section
      (``comms=False``). Each rank's wait summed over instances is in ``ranks``.
    - ``workload_metrics``: one row per (metric, rank): ``name``, ``steps``, ``rank``,
      ``median`` (the rank's), from run.json's ``ctx.metric`` values.
    """

    ranks: pandas.DataFrame
    steps: pandas.DataFrame
    kinds: pandas.DataFrame
    collectives: pandas.DataFrame
    workload_metrics: pandas.DataFrame


def _fields(struct: Any, names: tuple[str, ...], prefix: str = "") -> dict[str, Any]:
    values = msgspec.structs.asdict(struct) if struct is not None else {}
    return {prefix + n: values.get(n) for n in names}


def to_pandas(report: Report) -> Frames:
    """The Report's tables as DataFrames (see :class:`Frames`)."""
    try:
        import pandas
    except ImportError:
        from overlapprof.errors import ReportError

        raise ReportError("Report.to_pandas() needs pandas: pip install 'overlapprof[pandas]'") from None
    waits = {w.rank: w for w in report.crossrank.ranks} if report.crossrank is not None else {}
    step_own = tuple(label.name for label in of_rows([s for r in report.ranks for s in r.steps], StepMetrics)
                     if label.name not in _METRICS)
    ranks, steps, kinds = [], [], []
    for r in report.ranks:
        row = {"rank": r.rank, "rank_source": r.rank_source, "mode": r.mode, "world_size": r.world_size,
               "backend": r.backend, **_fields(r.metrics, _METRICS), "steps": len(r.steps),
               "median_step_us": r.median_step_us, "events": r.events,
               **_fields(r.partition, _PARTITION, "partition_"), **_fields(r.exposure, _CAUSES),
               **_fields(r, _RANK_BOUNDS)}
        if waits:
            row.update(_fields(waits.get(r.rank), _WAITS))
        ranks.append(row)
        for s in r.steps:
            steps.append({"rank": r.rank, "step": s.step, "start_us": s.start_us, **_fields(s, step_own),
                          **_fields(s, _METRICS),
                          **_fields(s.partition, _PARTITION, "partition_"), **_fields(s.exposure, _CAUSES),
                          **_fields(s, _STEP_BOUNDS)})
        kinds += [{"rank": r.rank, "kind": k.kind, "count": k.count, **_fields(k, _METRICS), **_fields(k.exposure, _CAUSES)}
                  for k in r.kinds]
    collectives = []
    for inst in report.crossrank.instances if report.crossrank is not None else ():
        for rank, start, duration in zip(inst.ranks, inst.starts_us, inst.durations_us):
            collectives.append({**_fields(inst, _COLLECTIVE), "rank": rank, "start_us": start,
                                "duration_us": duration})
    metrics = [{"name": m.name, "steps": m.steps, "rank": rank, "median": value}
               for m in report.workload_metrics for rank, value in m.by_rank.items()]
    partition = [f"partition_{n}" for n in _PARTITION]
    rank_columns = ["rank", "rank_source", "mode", "world_size", "backend", *_METRICS, "steps", "median_step_us",
                    "events", *partition, *(_WAITS if waits else ()), *_CAUSES, *_RANK_BOUNDS]
    return Frames(
        ranks=pandas.DataFrame(ranks, columns=rank_columns),
        steps=pandas.DataFrame(steps, columns=["rank", "step", "start_us", *step_own, *_METRICS,
                                               *partition, *_CAUSES, *_STEP_BOUNDS]),
        kinds=pandas.DataFrame(kinds, columns=["rank", "kind", "count", *_METRICS, *_CAUSES]),
        collectives=pandas.DataFrame(collectives, columns=list(_COLLECTIVE)),
        workload_metrics=pandas.DataFrame(metrics, columns=["name", "steps", "rank", "median"]),
    )
