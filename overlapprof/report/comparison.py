"""A Comparison of variants: each one's numbers and the factors against the baseline.

Plain typed data (msgspec Structs, no numpy), computed by :mod:`overlapprof.compare` and read by
the renderers; it saves and loads like a Report and carries its Reports, so that it re-renders
(table, CSV, HTML) without the traces.

The values are *per-step* (``basis`` = ``PER_STEP``) when every variant's traces have
ProfilerSteps: each the median over the pooled (rank, step) pairs of the variant. Otherwise
(``WHOLE_TRACE``) the median over ranks of each rank's totals, and step times, bound and
speedup are None. Medians and percentiles interpolate linearly (numpy's default), as in
``Report.summary``.

Per variant (µs unless named otherwise; OVERLAP.md's metrics):

- ``step_us``, ``step_p90_us``: median and 90th percentile of ``step_us`` (linear interpolation,
  as in ``Report.summary``).
- ``comm_us``, ``overlapped_us``, ``exposed_comm_us``, ``compute_us``: medians of the metric.
- ``overlap_ratio`` = Σ ``overlapped_us`` / Σ ``comm_us`` over the same steps (or ranks);
  None without communication.
- ``comm_free_bound_us``: median of ``step_us − exposed_comm_us``: the step if communication
  cost nothing, the ceiling of *any* communication optimization (compression, a faster link,
  overlap). ``comm_free_speedup`` = ``step_us / comm_free_bound_us``. (Saved comparisons of
  earlier versions call them ``bound_us`` and ``ideal_speedup``; they load as these.)
- ``overlap_bound_us``: median of the steps' ``overlap_bound_us`` (OVERLAP.md section 6.2): the
  shortest step overlap could give; ``overlap_bound_speedup`` = ``step_us / overlap_bound_us``.
- ``hidden_of_hideable`` = Σ ``overlapped_us`` / Σ min(``comm_us``, ``compute_us``) over the same
  steps (or ranks): how much of what could hide did.
- ``exposure``: the mean per step (or rank) of each cause of exposed communication, so the five
  add up to the mean ``exposed_comm_us`` (a stacked bar); ``verdict``: the verdict of the rank
  with the most exposed communication.
- ``workload_metrics``: each of the workload's ``ctx.metric`` values (Report.workload_metrics),
  its median, by name.
- ``host_step_us``, ``host_step_p90_us``, ``host_unprofiled_step_us``: from ``run.json`` when
  the input is an ``overlapprof run`` directory: step times measured on the host around each
  step call (profiled steps; and the unprofiled ones, free of profiler overhead), pooled over
  ranks. None otherwise.

Against the baseline (None for the baseline itself, or when an operand is missing):

- ``speedup`` = baseline ``step_us`` / ``step_us`` (> 1: faster than the baseline).
- ``host_speedup`` = baseline ``host_unprofiled_step_us`` / ``host_unprofiled_step_us``.
- ``exposed_saved_us`` = baseline ``exposed_comm_us`` − ``exposed_comm_us`` (> 0: less exposed);
  ``exposed_saved_frac`` = that / baseline ``exposed_comm_us``.
- ``compute_slowdown`` = ``compute_us`` / baseline ``compute_us``: > 1 means the same compute
  took longer, e.g. because overlapped communication competes for cores, SMs or memory
  bandwidth. A higher overlap ratio can hide such a slowdown; this number shows it.
- **Predict, then check.** ``predicted_step_us`` = the baseline's ``overlap_bound_us``: the best
  step an overlapping variant can reach. ``step_vs_predicted`` = ``step_us / predicted_step_us``
  (1.00x: it reached the bound); ``bound_reached`` = (baseline ``step_us`` − ``step_us``) /
  (baseline ``step_us`` − ``predicted_step_us``): the share of what overlap could buy that the
  variant bought (None when the baseline is at its bound).
- **Beyond the bound.** The bounds hold the baseline's compute and idle time fixed, and its
  windows (the windows form; the first-order form: its transfers). A variant whose step is below
  one of them beyond the spread (the interval of its step / that bound entirely below 1x, or of
  ``bound_reached`` entirely above 100%) changed what it holds fixed: ``beyond_bound`` =
  ``compute`` (below the baseline's comm-free bound: its compute or idle time), else ``windows``
  or ``transfers`` (below its overlap bound). A ``bound_reached`` above 100% within the spread
  is ``beyond_bound`` = ``noise``: it reached the bound. ``bound_reached`` and its interval are
  then None: a share of what overlap could buy is never above 100%.

Every factor (and ``comm_free_speedup``, ``overlap_bound_speedup``, ``step_vs_predicted``,
``bound_reached``) has a ``*_ci`` = ``[low, high]``: the central ``CI_LEVEL``
bootstrap interval of the factor over ``BOOTSTRAP`` resamples with seed ``SEED`` (how: the
module docstring of :mod:`overlapprof.compare`).

``not_trusted`` names the factors the machine's load explains (:class:`overlapprof.rundir.run_record.MachineLoad`:
the other processes' share of the CPU differed between the baseline's steps and the variant's
by a load factor at least as large as the difference measured): shown as not trusted, with a
rerun suggested, instead of a verdict. When ``speedup`` is, so is every number derived from the
same profiled step timings: ``exposed_saved_us``, ``step_vs_predicted`` and ``bound_reached``
(with ``beyond_bound``).
"""

from __future__ import annotations

from typing import Any

import msgspec

from overlapprof.report.codec import decode, load, save, to_json
from overlapprof.report.document import Report
from overlapprof.report.exposure import Exposure
from overlapprof.report.whatif import Beside

SCHEMA = "overlapprof.comparison/1"
CI_LEVEL = 0.95
BOOTSTRAP = 2000
SEED = 0
PER_STEP = "per-step median"
WHOLE_TRACE = "whole trace"


class VariantStats(msgspec.Struct, kw_only=True):
    """One variant's numbers; see the module docstring for each field's formula."""

    label: str
    inputs: list[str]
    workload: str | None = None
    world_size: int | None = None
    ranks: int
    device: str | None = None
    backend: str | None = None
    link: str | None = None  # "2 Gbit/s shared by 4 ranks" (--link-rate), "loopback (not paced)"
    options: dict[str, Any] | None = None
    samples: int  # (rank, step) pairs, or ranks on the whole-trace basis
    step_us: float | None = None
    step_p90_us: float | None = None
    comm_us: float
    overlapped_us: float
    exposed_comm_us: float
    compute_us: float
    overlap_ratio: float | None = None
    comm_free_bound_us: float | None = None
    comm_free_speedup: float | None = None
    overlap_bound_us: float | None = None
    overlap_bound_speedup: float | None = None
    overlap_bound_form: str | None = None
    hidden_of_hideable: float | None = None
    exposure: Exposure | None = None
    verdict: str | None = None
    host_step_us: float | None = None
    host_step_p90_us: float | None = None
    host_unprofiled_step_us: float | None = None
    speedup: float | None = None
    host_speedup: float | None = None
    exposed_saved_us: float | None = None
    exposed_saved_frac: float | None = None
    compute_slowdown: float | None = None
    predicted_step_us: float | None = None
    step_vs_predicted: float | None = None
    bound_reached: float | None = None
    beyond_bound: str | None = None  # "windows", "transfers", "compute": what the variant changed; "noise" (docstring)
    # Bootstrap intervals [low, high] of the factors above (see "Spread" in the module docstring).
    comm_free_speedup_ci: tuple[float, float] | None = None
    overlap_bound_speedup_ci: tuple[float, float] | None = None
    step_vs_predicted_ci: tuple[float, float] | None = None
    bound_reached_ci: tuple[float, float] | None = None
    speedup_ci: tuple[float, float] | None = None
    host_speedup_ci: tuple[float, float] | None = None
    compute_slowdown_ci: tuple[float, float] | None = None
    workload_metrics: dict[str, float] = {}
    # The machine's load over the variant's steps (run.json; None: not recorded): the 1-minute load average at
    # their start and end, and by kind of step the largest share of the CPU other processes took on a node.
    load_average: tuple[float, float] | None = None
    other_cpu: dict[str, float] | None = None
    # Factors (speedup, host_speedup, compute_slowdown) the load's change could explain, and with speedup the
    # numbers derived from the same steps (exposed_saved_us, step_vs_predicted, bound_reached): not a verdict.
    not_trusted: list[str] = []


class Comparison(msgspec.Struct, kw_only=True):
    """Variants side by side; ``variants[0]`` is the baseline. ``reports`` are the Reports the
    numbers come from, in the same order (so the comparison re-renders without traces)."""

    schema: str = SCHEMA
    version: str
    baseline: str
    basis: str
    variants: list[VariantStats]
    warnings: list[str] = []
    reports: list[Report] = []
    predictions: list[Beside] = []  # `--prediction FILE`: a whatif prediction next to each measured variant

    def variant(self, label: str) -> VariantStats:
        """The VariantStats of ``label`` (KeyError if absent)."""
        for v in self.variants:
            if v.label == label:
                return v
        raise KeyError(label)

    # Saved and loaded the way a Report is (JSON through a temporary file); only the schema differs.
    to_json = to_json
    save = save
    load = classmethod(load)

    @classmethod
    def from_json(cls, text: str | bytes, source: str = "comparison") -> Comparison:
        """A Comparison from JSON text; ReportError (one line) when it is not one. A comparison
        saved before the bounds were named (``bound_us``, ``ideal_speedup``) loads with them
        as ``comm_free_bound_us`` and ``comm_free_speedup``."""
        if isinstance(text, str):
            text = text.encode()
        if b'"ideal_speedup' in text:
            text = _renamed(text)
        return decode(cls, text, source, SCHEMA, "comparison")


_OLD_NAMES = {"bound_us": "comm_free_bound_us", "ideal_speedup": "comm_free_speedup",
              "ideal_speedup_ci": "comm_free_speedup_ci"}


def _renamed(text: bytes) -> bytes:
    """The JSON with the variants' old bound names replaced (unchanged when it does not parse:
    decoding then says why)."""
    try:
        data = msgspec.json.decode(text)
        for v in data.get("variants") or []:
            for old, new in _OLD_NAMES.items():
                if old in v and new not in v:
                    v[new] = v.pop(old)
        return msgspec.json.encode(data)
    except (msgspec.DecodeError, AttributeError, TypeError):
        return text
