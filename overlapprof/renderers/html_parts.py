"""The pieces every section of the HTML page is made of: escaping, the :class:`Page` the
sections read, a figure, a table, a section."""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass
from typing import Callable

from overlapprof.report import Comparison, Report


def esc(value) -> str:
    return html.escape(str(value), quote=True)


@dataclass
class Page:
    """What the sections read: the comparison (its reports and labels) and shared plot scales."""

    comparison: Comparison
    timeline_xmax_ms: float
    exposure_xmax_ms: float

    @property
    def runs(self) -> list[tuple[str, Report]]:
        return [(v.label, r) for v, r in zip(self.comparison.variants, self.comparison.reports)]


def figure(fig, alt: str, caption: str = "") -> str:
    """A matplotlib figure as an inline SVG ``<img>`` in a ``<figure>``."""
    from overlapprof.renderers import plots

    data = base64.b64encode(plots.to_bytes(fig, "svg")).decode("ascii")
    cap = f"<figcaption>{caption}</figcaption>" if caption else ""
    return f'<figure><img alt="{esc(alt)}" src="data:image/svg+xml;base64,{data}">{cap}</figure>'


def table(header: list[str], rows: list[list[str]], cls: str = "", attrs: str = "") -> str:
    """An HTML table; cells are HTML already (escape strings before). Numeric columns align right."""
    head = "".join(f"<th>{h}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return (f'<div class="scroll"><table class="{cls}"{attrs}><thead><tr>{head}</tr></thead>'
            f"<tbody>{body}</tbody></table></div>")


def section(title: str, body: str, anchor: str = "", level: int = 2) -> str:
    ident = f' id="{esc(anchor)}"' if anchor else ""
    return f"<section{ident}><h{level}>{esc(title)}</h{level}>{body}</section>"


PageSection = Callable[[Page], "str | None"]
RunSection = Callable[[Page, str, Report], "str | None"]
