"""A Comparison as CSV: one row per variant (baseline first), raw numbers (µs, ratios as
fractions, factors as plain numbers); a missing value is an empty cell. An interval ``*_ci``
(``[low, high]``) is two columns, ``*_ci_low`` and ``*_ci_high``."""

from __future__ import annotations

import csv
import io

from overlapprof.renderers.base import Renderer
from overlapprof.report import Comparison, VariantStats

FIELDS = [name for name in VariantStats.__struct_fields__ if name not in ("inputs", "options")]
COLUMNS = [column for name in FIELDS for column in ((f"{name}_low", f"{name}_high") if name.endswith("_ci") else (name,))]


def _cells(value, interval: bool) -> list:
    if interval:
        return ["", ""] if value is None else list(value)
    return ["" if value is None else value]


def render(c: Comparison) -> str:
    """The comparison as CSV text, with a ``basis`` and a ``baseline`` column."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([*COLUMNS, "basis", "baseline", "inputs"])
    for v in c.variants:
        cells = [x for name in FIELDS for x in _cells(getattr(v, name), name.endswith("_ci"))]
        writer.writerow([*cells, c.basis, c.baseline, ";".join(v.inputs)])
    return out.getvalue()


class ComparisonCsvRenderer(Renderer):
    """One row per variant as CSV, raw numbers."""

    name = "csv"
    subject = "comparison"
    extensions = ("csv",)

    def render(self, c: Comparison) -> str:
        return render(c)
