"""A Comparison as CSV: one row per variant (baseline first), raw numbers (µs, ratios as
fractions, factors as plain numbers); a missing value is an empty cell."""

from __future__ import annotations

import csv
import io

from overlapprof.report import Comparison, VariantStats

COLUMNS = [name for name in VariantStats.__struct_fields__ if name not in ("inputs", "options")]


def render(c: Comparison) -> str:
    """The comparison as CSV text, with a ``basis`` and a ``baseline`` column."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([*COLUMNS, "basis", "baseline", "inputs"])
    for v in c.variants:
        cells = ["" if (x := getattr(v, name)) is None else x for name in COLUMNS]
        writer.writerow([*cells, c.basis, c.baseline, ";".join(v.inputs)])
    return out.getvalue()
