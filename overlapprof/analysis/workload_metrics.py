"""The workload's ``ctx.metric`` values of a run directory, summarized for the Report
(:class:`~overlapprof.report.workload.WorkloadMetric`: what the fields mean)."""

from __future__ import annotations

import statistics

from overlapprof.report.workload import WorkloadMetric


def workload_metrics(run) -> list[WorkloadMetric]:
    """One WorkloadMetric per name in the ranks' records of ``run`` (a RunRecord), sorted by name."""
    values: dict[str, dict[int, dict[str, list[float]]]] = {}
    for rank, info in run.ranks.items():
        for name, by_kind in info.metrics.items():
            values.setdefault(name, {})[int(rank)] = by_kind
    out = []
    for name, ranks in sorted(values.items()):
        profiled = any(by_kind.get("profiled") for by_kind in ranks.values())
        picked = {rank: (by_kind.get("profiled", []) if profiled else [v for vs in by_kind.values() for v in vs])
                  for rank, by_kind in ranks.items()}
        pooled = [v for vs in picked.values() for v in vs]
        if not pooled:
            continue
        out.append(WorkloadMetric(
            name=name, steps="profiled" if profiled else "all", count=len(pooled),
            median=statistics.median(pooled), min=min(pooled), max=max(pooled),
            by_rank={rank: statistics.median(vs) for rank, vs in sorted(picked.items()) if vs}))
    return out
