"""The columns of the renderers' tables: one list per table, each column the report field it shows,
its header, its unit and how its value is written (:mod:`overlapprof.renderers.format`).

The analyzer computes every number (its formula and unit are in the report's docstrings and
OVERLAP.md); a table only picks fields and formats them. A labelled field of the report's metrics
(:mod:`overlapprof.report.labels`) is shown from its label; another is shown by adding a
:class:`Column` to the lists of the tables that should show it, here and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

from overlapprof.renderers.compare_table import judged, reached, saved, share
from overlapprof.renderers.format import count, factor, gbps, human_bytes, late_activity, late_ranks, ms, percent
from overlapprof.report import CAUSES, Metrics, StepMetrics
from overlapprof.report.labels import US, Label, labelled, of_rows


@dataclass(frozen=True)
class Column:
    """One column: ``field`` (an attribute of the row's object; dots follow attributes, e.g.
    ``metrics.comm_us``; empty: the object itself, for a cell made of several fields), ``header`` (its name, without the unit), ``unit`` (appended to the
    header: ``ms`` for a time, which the report keeps in µs) and ``fmt`` (value -> cell text)."""

    field: str
    header: str
    unit: str = ""
    fmt: Callable[[Any], str] = str

    @property
    def head(self) -> str:
        """The header with its unit (``comm ms``)."""
        return f"{self.header} {self.unit}" if self.unit else self.header

    def value(self, row) -> Any:
        """The raw value of ``row``'s field (None where a link of the path is None)."""
        for name in self.field.split(".") if self.field else ():
            if row is None:
                return None
            row = getattr(row, name)
        return row

    def cell(self, row) -> str:
        return self.fmt(self.value(row))


def heads(columns) -> list[str]:
    return [c.head for c in columns]


def cells(columns, row) -> list[str]:
    return [c.cell(row) for c in columns]


def under(prefix: str, columns) -> tuple[Column, ...]:
    """The same columns, read from ``row.<prefix>`` (a rank's ``metrics``)."""
    return tuple(replace(c, field=f"{prefix}.{c.field}") for c in columns)


def _time(field: str, header: str) -> Column:
    return Column(field, header, "ms", ms)


def _share(field: str, header: str) -> Column:
    return Column(field, header, "", percent)


def shown(label: Label) -> Column:
    """A labelled report field's column (:mod:`overlapprof.report.labels`): a time in ms, a
    fraction as a percentage."""
    return (_time if label.unit == US else _share)(label.name, label.label)


# report.Metrics, as the text tables show them (a rank's whole trace, a step, a kind), from its
# fields' labels; memory only in the rank table
METRICS = tuple(shown(label) for label in labelled(Metrics) if label.name != "memory_us")
MEMORY = next(shown(label) for label in labelled(Metrics) if label.name == "memory_us")


def step_columns(steps: list = ()) -> tuple[Column, ...]:
    """The step table's columns for ``steps`` (StepMetrics, or a subclass with more labelled
    fields): the step, its own labelled fields, then the metrics."""
    own = [label for label in of_rows(list(steps), StepMetrics) if label not in labelled(Metrics)]
    return (Column("step", "step", "", lambda n: f"#{n}"), *(shown(label) for label in own), *METRICS)


# analyze's text tables (renderers.table); a step's and a kind's rank is the row's first cell
RANK = (Column("rank", "rank"), Column("mode", "mode"), *under("metrics", METRICS), *under("metrics", (MEMORY,)),
        Column("steps", "steps", "", lambda steps: str(len(steps))), _time("median_step_us", "median step"))
# each kind is measured against the rank's whole compute, so that column repeats per rank
KIND = (Column("kind", "kind"), Column("count", "ops"), *METRICS[:-1], _time("compute_us", "rank compute"))

# report.Partition: the step's time, once (the text summary's line and the page's table)
PARTITION = (_time("step_us", "mean step"), _time("compute_us", "compute"), _time("exposed_comm_us", "exposed comm"),
             _time("exposed_memory_us", "exposed memory"), _time("idle_us", "idle"))

# the page's per-rank table (renderers.html)
PAGE_RANK = (Column("rank", "rank"), Column("mode", "mode"), _time("metrics.comm_us", "comm"),
             _time("metrics.overlapped_us", "hidden"), _time("metrics.exposed_comm_us", "exposed"),
             _share("metrics.overlap_ratio", "overlap"), _time("metrics.compute_us", "compute"), RANK[-2], RANK[-1])

# report.Exposure's causes; a rank's row of "why exposed" (the text table adds SLOW_TRANSFER where a rank has it)
EXPOSURE_CAUSES = tuple(_time(f"{cause}_us", cause) for cause in CAUSES)
RANK_CAUSES = (Column("rank", "rank"), _time("metrics.exposed_comm_us", "exposed"), *under("exposure", EXPOSURE_CAUSES),
               Column("exposure", "late ranks (ms)", "", late_ranks), Column("exposure", "late ranks were", "", late_activity))
SLOW_TRANSFER = _time("exposure.slow_transfer_us", "slow transfer")
RANK_BOUNDS = (_time("overlap_bound_us", "overlap bound"), Column("overlap_bound_speedup", "ceiling", "", factor),
               _share("hidden_of_hideable", "hidden of hideable"))

# report.Interference (OVERLAP.md section 6.4): a rank's row of "slowed while overlapped", and a step's two columns
RANK_INTERFERENCE = (Column("rank", "rank"), _time("metrics.overlapped_us", "overlapped"),
                     _time("interference.slowed_us", "slowed"), _time("interference.net_overlap_gain_us", "net gain"),
                     _time("interference.unmeasured_us", "no factor"))
STEP_INTERFERENCE = (_time("slowed_us", "slowed"), _time("net_overlap_gain_us", "net gain"))

# report.crossrank: a rank's waits (also the last columns of the text rank table), its row, the bandwidth rows
RANK_WAITS = (_time("wait_us", "wait"), _time("transfer_us", "transfer"), _share("wait_share", "wait share"))
CROSSRANK_RANK = (Column("rank", "rank"), Column("ops", "ops"), Column("matched_ops", "matched"), _time("comm_us", "comm"),
                  *RANK_WAITS, _time("exposed_wait_us", "exposed wait"),
                  _share("exposed_wait_share", "exposed wait share"), Column("last_arrivals", "arrived last"),
                  _time("caused_wait_us", "caused wait"), Column("unmatched_ops", "unmatched"))
BANDWIDTH = (Column("kind", "kind"), Column("group_size", "n", "", count), Column("bytes", "bytes", "", human_bytes),
             Column("count", "count"), _time("median_transfer_us", "transfer"), _time("median_wait_us", "wait"),
             _time("median_skew_us", "skew"), Column("algbw_gbps", "algbw", "GB/s", gbps),
             Column("busbw_gbps", "busbw", "GB/s", gbps), Column("method", "method"),
             Column("transfer", "transfer time"))

# report.VariantStats on the page (renderers.html): the comparison table, its host and load
# columns (where a variant has them) and the predictions; the variant's name is the first cell
PAGE_VARIANTS = (_time("step_us", "step"), _time("exposed_comm_us", "exposed"), _share("overlap_ratio", "overlap"),
                 _time("compute_us", "compute"), _time("comm_free_bound_us", "comm-free bound"),
                 _time("overlap_bound_us", "overlap bound"), Column("", "speedup", "", lambda v: judged(v, "speedup")),
                 Column("", "exposed saved", "ms", saved),
                 Column("", "compute slowdown", "", lambda v: judged(v, "compute_slowdown")))
PAGE_HOST = (Column("host_unprofiled_step_us", "host step ms (unprofiled)", "", ms),
             Column("", "host speedup", "", lambda v: judged(v, "host_speedup")))
PAGE_LOAD = (Column("", "others' CPU", "", lambda v: " / ".join(share(v, k) for k in ("unprofiled", "profiled"))),)
PAGE_PREDICTED = (_time("step_us", "step"), Column("", "step / predicted", "", lambda v: judged(v, "step_vs_predicted")),
                  Column("", "share of what overlap could buy", "", reached))
