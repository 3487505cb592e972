"""The workload's own numbers in a Report: what a workload recorded with ``ctx.metric`` (or a loop
with ``prof.metric``), read from the run directory's run.json by the analyzer.

Plain typed data (msgspec Structs, no numpy), computed by
:mod:`overlapprof.analysis.workload_metrics` and read by the renderers.
"""

from __future__ import annotations

import msgspec


class WorkloadMetric(msgspec.Struct, kw_only=True):
    """One metric, its values pooled over the ranks (run.json ``ranks.<r>.metrics.<name>``).

    - ``name``: as recorded, its unit in the name (``recv_host_ms``, ``scatter_src_kept_bytes``).
    - ``steps``: the kind of step the values come from: ``profiled`` when there are values from
      profiled steps (the steps the traces hold), else ``all`` (every kind pooled: "warmup",
      "unprofiled", "setup"...).
    - ``count``: values pooled; ``median``, ``min``, ``max``: of those values (the median
      interpolated between the middle two).
    - ``by_rank``: each rank's median of its values.
    """

    name: str
    steps: str
    count: int
    median: float
    min: float
    max: float
    by_rank: dict[int, float] = {}
