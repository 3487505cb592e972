"""The plots: matplotlib figures of a Report or a Comparison, as SVG/PNG/PDF bytes or files.

matplotlib is imported here only (never by the CLI at start-up), and without pyplot: figures are
``matplotlib.figure.Figure`` objects rendered by the Agg/SVG/PDF backends, so there is no global
state, no display and nothing to close. Colours follow the Okabe-Ito palette (readable with
colour-blindness): compute blue, hidden (overlapped) communication green, exposed communication
vermillion.

- :func:`timeline_figure` — per rank, one step: a compute lane and a communication lane, the
  communication split into hidden (overlapped with compute) and exposed spans, the exposed ones
  coloured by their cause (OVERLAP.md section 6) when the report has them.
- :func:`exposure_figure` — per rank, whole trace: exposed vs hidden communication.
- :func:`causes_figure` — per variant (or rank): exposed communication per step, stacked by cause.
- :func:`comparison_figure` — per variant: step time vs its overlap bound (and the comm-free
  bound, and the baseline's overlap bound as the prediction), communication hidden vs exposed,
  compute (with the speedup, overlap ratio and compute slowdown written on the bars).
"""

from __future__ import annotations

import contextlib
import io
import logging
import re
from pathlib import Path

from overlapprof.errors import InputError
from overlapprof.renderers.compare_table import NOT_TRUSTED, judged
from overlapprof.renderers.format import factor, ms, percent, to_ms

COMPUTE = "#0072B2"
HIDDEN = "#009E73"
EXPOSED = "#D55E00"
STEP = "#BBBBBB"
BOUND = "#56B4E9"
INK = "#222222"
# The causes of exposed communication (report.exposure.CAUSES), Okabe-Ito where it has colours left.
CAUSE_COLOURS = {"late_peer": "#CC79A7", "host_blocked": "#E69F00", "queued": "#F0E442", "no_window": EXPOSED,
                 "window_short": "#6E6E6E"}
FORMATS = ("png", "svg", "pdf")

_STYLE = {
    "font.size": 9,
    "axes.edgecolor": "#999999",
    "axes.labelcolor": INK,
    "axes.titlesize": 10,
    "axes.titleweight": "bold",
    "axes.titlelocation": "left",
    "axes.spines.top": False,
    "axes.spines.right": False,
    "xtick.color": "#555555",
    "ytick.color": INK,
    "legend.frameon": False,
    "text.parse_math": False,  # labels are data (file names, variants): a "$" is not TeX
    "svg.fonttype": "path",  # text as shapes: the SVG needs no font on the reader's machine
    "svg.hashsalt": "overlapprof",  # stable element ids: the same report gives the same bytes
}


def new_figure(width: float, height: float):
    """A matplotlib Figure (no pyplot) with constrained layout, width × height inches."""
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def style():
    """The plots' rc settings, as a context manager around drawing a figure."""
    import matplotlib

    return matplotlib.rc_context(_STYLE)


def timeline_span_ms(report) -> float:
    """The longest representative step (or trace window) of the report's ranks, in ms."""
    spans = [r.timeline.span_us for r in report.ranks if r.timeline is not None]
    return to_ms(max(spans)) if spans else 0.0


def _bars(ax, y: float, pairs, height: float, color: str, **kw) -> None:
    if pairs:
        ax.broken_barh([(to_ms(a), to_ms(b - a)) for a, b in pairs], (y - height / 2, height), color=color,
                       linewidth=0, **kw)


def _minus(spans, holes):
    """``spans`` minus ``holes`` (both sorted, disjoint [start, end] pairs)."""
    out, k = [], 0
    for start, end in spans:
        while k < len(holes) and holes[k][1] <= start:
            k += 1
        j, cur = k, start
        while j < len(holes) and holes[j][0] < end:
            if holes[j][0] > cur:
                out.append((cur, holes[j][0]))
            cur = max(cur, holes[j][1])
            j += 1
        if cur < end:
            out.append((cur, end))
    return out


def timeline_figure(report, *, title: str | None = None, xmax_ms: float | None = None):
    """Per rank, its representative step (``RankReport.timeline``): compute on one lane,
    communication on the next, hidden spans green and exposed spans vermillion. ``xmax_ms``
    fixes the x axis (to compare variants on one scale)."""
    from matplotlib.patches import Patch

    ranks = [r for r in report.ranks if r.timeline is not None]
    with style():
        fig = new_figure(10, 0.9 + 0.62 * max(1, len(ranks)))
        ax = fig.add_subplot()
        labels, ticks = [], []
        for k, r in enumerate(ranks):
            t, y = r.timeline, -2.0 * k
            span = to_ms(t.span_us)
            ax.axhspan(y - 1.45, y + 0.45, xmin=0, xmax=1, color="#F7F7F7" if k % 2 else "white", zorder=0)
            ax.broken_barh([(0, span)], (y - 1.45, 1.9), color="#EDEDED", linewidth=0, zorder=0.5)
            _bars(ax, y, t.compute, 0.7, COMPUTE)
            if t.exposed_by_cause:
                for cause, pairs in t.exposed_by_cause.items():
                    _bars(ax, y - 1, pairs, 0.7, CAUSE_COLOURS.get(cause, EXPOSED))
            else:
                _bars(ax, y - 1, _minus(t.comm, t.overlapped), 0.7, EXPOSED)
            _bars(ax, y - 1, t.overlapped, 0.7, HIDDEN)
            mark = f"step #{t.step}" if t.step is not None else "whole trace"
            ax.text(span, y + 0.42, f" {mark} · {ms(t.span_us)} ms", fontsize=7, color="#777777", va="top")
            labels += [f"rank {r.rank}  compute", "comm"]
            ticks += [y, y - 1]
        ax.set_yticks(ticks, labels)
        ax.tick_params(axis="y", length=0, labelsize=8)
        ax.set_ylim(-2.0 * len(ranks) + 0.4, 0.6)
        ax.set_xlim(0, (xmax_ms or max(timeline_span_ms(report), 1e-3)) * 1.12)
        ax.set_xlabel("time since the step's start (ms)")
        ax.spines["left"].set_visible(False)
        ax.set_title(title or "One step per rank (the middle ProfilerStep by number)")
        if not ranks:
            ax.text(0.5, 0.5, "no timeline: no communication or compute events", transform=ax.transAxes,
                    ha="center", va="center", color="#777777")
        handles = [Patch(color=COMPUTE, label="compute"), Patch(color=HIDDEN, label="comm hidden (overlapped)")]
        causes = [c for c in CAUSE_COLOURS if any(c in r.timeline.exposed_by_cause for r in ranks)]
        if causes:
            handles += [Patch(color=CAUSE_COLOURS[c], label=f"exposed: {c}") for c in causes]
        else:
            handles.append(Patch(color=EXPOSED, label="comm exposed"))
        fig.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 4), fontsize=8)
    return fig


def causes_figure(rows, *, title: str | None = None, unit: str = "mean ms per step"):
    """Exposed communication stacked by cause, one bar per ``(label, Exposure)`` of ``rows``
    (variants, or ranks); each bar's total is its exposed communication."""
    rows = [(label, e) for label, e in rows if e is not None]
    with style():
        fig = new_figure(10, 1.0 + 0.4 * max(2, len(rows)))
        ax = fig.add_subplot()
        ys = [-k for k in range(len(rows))]
        left = [0.0] * len(rows)
        for cause, colour in CAUSE_COLOURS.items():
            values = [to_ms(getattr(e, f"{cause}_us")) for _, e in rows]
            if any(values):
                ax.barh(ys, values, left=left, color=colour, height=0.6, label=cause)
                left = [a + b for a, b in zip(left, values)]
        top = max(left + [1e-3])
        for y, total, (_, e) in zip(ys, left, rows):
            largest = e.largest()
            text = f"{ms(e.total_us())} ms" + (f" · mostly {largest[0]}" if largest else "")
            ax.text(total + top * 0.01, y, text, va="center", fontsize=8, color="#444444")
        ax.set_yticks(ys, [label for label, _ in rows])
        ax.tick_params(axis="y", length=0)
        ax.set_xlim(0, top * 1.35)
        ax.set_xlabel(f"exposed communication ({unit})")
        ax.grid(axis="x", color="#EEEEEE", linewidth=0.8)
        ax.set_axisbelow(True)
        ax.set_title(title or "Why communication is exposed")
        if not rows:
            ax.text(0.5, 0.5, "no causes: no communication matched across ranks", transform=ax.transAxes,
                    ha="center", va="center", color="#777777")
        handles, labels = ax.get_legend_handles_labels()
        if handles:
            fig.legend(handles, labels, loc="outside lower center", ncols=len(handles), fontsize=8)
    return fig


def exposure_figure(report, *, title: str | None = None, xmax_ms: float | None = None):
    """Per rank (whole trace): hidden and exposed communication, stacked, in ms."""
    ranks = report.ranks
    with style():
        fig = new_figure(10, 0.9 + 0.34 * max(2, len(ranks)))
        ax = fig.add_subplot()
        ys = [-k for k in range(len(ranks))]
        hidden = [to_ms(r.metrics.overlapped_us) for r in ranks]
        exposed = [to_ms(r.metrics.exposed_comm_us) for r in ranks]
        ax.barh(ys, hidden, color=HIDDEN, height=0.62, label="hidden (overlapped)")
        ax.barh(ys, exposed, left=hidden, color=EXPOSED, height=0.62, label="exposed")
        top = max([h + e for h, e in zip(hidden, exposed)] + [1e-3])
        for y, h, e, r in zip(ys, hidden, exposed, ranks):
            ratio = r.metrics.overlap_ratio
            hidden = f"{percent(ratio)} hidden" if ratio is not None else "no comm"
            text = f"{ms(r.metrics.exposed_comm_us)} ms exposed · {hidden}"
            ax.text(h + e + top * 0.01, y, text, va="center", fontsize=8, color="#444444")
        ax.set_yticks(ys, [f"rank {r.rank}" for r in ranks])
        ax.tick_params(axis="y", length=0)
        ax.set_xlim(0, (xmax_ms or top) * 1.28)
        ax.set_xlabel("communication over the whole trace (ms)")
        ax.grid(axis="x", color="#EEEEEE", linewidth=0.8)
        ax.set_axisbelow(True)
        ax.set_title(title or "Exposed vs hidden communication per rank")
        fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", ncols=2, fontsize=8)
    return fig


def exposure_span_ms(report) -> float:
    """The largest communication total of the report's ranks, in ms (to share an x axis)."""
    return max([to_ms(r.metrics.comm_us) for r in report.ranks] + [0.0])


def _annotate(ax, ys, ends, texts, top):
    for y, end, text in zip(ys, ends, texts):
        if text:
            ax.text(end + top * 0.02, y, text, va="center", fontsize=8, color=INK)


def comparison_figure(comparison):
    """Three panels, one bar per variant: step time (median) with its bound, communication per
    step (hidden + exposed), compute per step; speedup, overlap ratio and compute slowdown are
    written next to the bars."""
    vs = comparison.variants
    ys = [-k for k in range(len(vs))]
    with style():
        fig = new_figure(10, 1.3 + 0.42 * max(2, len(vs)))
        step_ax, comm_ax, comp_ax = fig.subplots(1, 3, sharey=True)
        med = "median per step" if comparison.basis.startswith("per-step") else "median rank, whole trace"
        if vs[0].step_us is not None:
            steps = [to_ms(v.step_us or 0) for v in vs]
            step_ax.barh(ys, steps, color=STEP, height=0.66, label="step")
            bounds = [v.overlap_bound_us for v in vs]
            if all(b is not None for b in bounds):
                step_ax.barh(ys, [to_ms(b) for b in bounds], color=BOUND, height=0.36, label="overlap bound")
            step_ax.plot([to_ms(v.comm_free_bound_us or 0) for v in vs], ys, linestyle="none", marker="|",
                         markersize=14, color=INK, label="comm-free bound: step − exposed")
            if vs[0].overlap_bound_us is not None and len(vs) > 1:
                step_ax.axvline(to_ms(vs[0].overlap_bound_us), color=INK, linestyle="--", linewidth=0.8,
                                label=f"predicted: {vs[0].label}'s overlap bound")
            texts = ["baseline" if k == 0 else (judged(v, "speedup", interval=False) if v.speedup else "")
                     for k, v in enumerate(vs)]
            _annotate(step_ax, ys, steps, texts, max(steps + [1e-3]))
            step_ax.set_xlim(0, max(steps + [1e-3]) * 1.35)
        else:
            step_ax.text(0.5, 0.5, "no ProfilerSteps:\nno step time", transform=step_ax.transAxes, ha="center",
                         va="center", color="#777777")
        step_ax.set_title("Step time (median)")
        hidden = [to_ms(v.comm_us - v.exposed_comm_us) for v in vs]
        exposed = [to_ms(v.exposed_comm_us) for v in vs]
        comm_ax.barh(ys, hidden, color=HIDDEN, height=0.66, label="hidden")
        comm_ax.barh(ys, exposed, left=hidden, color=EXPOSED, height=0.66, label="exposed")
        ends = [h + e for h, e in zip(hidden, exposed)]
        hidden_text = [f"{percent(v.overlap_ratio)} hidden" if v.overlap_ratio is not None else "no comm" for v in vs]
        _annotate(comm_ax, ys, ends, hidden_text, max(ends + [1e-3]))
        comm_ax.set_xlim(0, max(ends + [1e-3]) * 1.45)
        comm_ax.set_title("Communication")
        compute = [to_ms(v.compute_us) for v in vs]
        comp_ax.barh(ys, compute, color=COMPUTE, height=0.66, label="compute")
        texts = ["baseline" if k == 0 else NOT_TRUSTED if "compute_slowdown" in v.not_trusted else
                 (f"{factor(v.compute_slowdown)} time" if v.compute_slowdown else "") for k, v in enumerate(vs)]
        _annotate(comp_ax, ys, compute, texts, max(compute + [1e-3]))
        comp_ax.set_xlim(0, max(compute + [1e-3]) * 1.45)
        comp_ax.set_title("Compute")
        for ax in (step_ax, comm_ax, comp_ax):
            ax.set_xlabel(f"ms ({med})", fontsize=8)
            ax.grid(axis="x", color="#EEEEEE", linewidth=0.8)
            ax.set_axisbelow(True)
            ax.tick_params(axis="y", length=0)
        step_ax.set_yticks(ys, [v.label for v in vs])
        handles = [h for ax in (step_ax, comm_ax, comp_ax) for h in ax.get_legend_handles_labels()[0]]
        fig.legend(handles=handles, loc="outside lower center", ncols=len(handles), fontsize=8)
    return fig


def to_bytes(fig, fmt: str = "svg", dpi: int = 144) -> bytes:
    """The figure rendered as ``fmt`` (png, svg or pdf), every text drawn with glyphs
    (:func:`drawable`)."""
    import warnings

    if fmt not in FORMATS:
        raise InputError(f"unknown image format {fmt!r} (use one of {', '.join(FORMATS)})")
    out = io.BytesIO()
    metadata = {"Date": None} if fmt == "svg" else {}
    with style(), _quiet_fonts(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Glyph .* missing from font")  # drawable() leaves none missing
        _drawable_texts(fig)
        fig.savefig(out, format=fmt, dpi=dpi, metadata=metadata or None, facecolor="white")
    return out.getvalue()


@contextlib.contextmanager
def _quiet_fonts():
    """matplotlib's font manager logs a line for a weight a font lacks ("findfont: Failed to find
    font weight bold for ..., now using 400"): the nearest weight is what is wanted here."""
    log = logging.getLogger("matplotlib.font_manager")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


_CHARMAPS: dict[str, set[int]] = {}  # font file -> the code points it has glyphs for


def _charmap(path: str) -> set[int]:
    if path not in _CHARMAPS:
        from matplotlib.ft2font import FT2Font

        try:
            _CHARMAPS[path] = set(FT2Font(path).get_charmap())
        except (OSError, RuntimeError):
            _CHARMAPS[path] = set()
    return _CHARMAPS[path]


def drawable(text: str, weight="normal", style="normal") -> tuple[str, list[str]]:
    """``(text, font families)`` to draw ``text`` (a label from data: a folder, a variant) with
    glyphs in that weight and style: the plots' font first, then installed fonts whose file for
    them has the characters it lacks (a non-Latin folder name: CJK, Arabic, ...); a run of
    characters no installed font has is written as ``[U+XXXX U+YYYY]``, never drawn as boxes."""
    from matplotlib import font_manager

    def file_of(family):
        props = font_manager.FontProperties(family=family, weight=weight, style=style)
        return font_manager.findfont(props, fallback_to_default=False)

    with _quiet_fonts():
        return _drawable(text, file_of)


def _drawable(text: str, file_of) -> tuple[str, list[str]]:
    from matplotlib import font_manager

    missing = {ord(c) for c in text if not c.isspace()} - _charmap(file_of("DejaVu Sans"))
    families = ["DejaVu Sans"]
    for name in dict.fromkeys(e.name for e in font_manager.fontManager.ttflist) if missing else ():
        path = file_of(name)
        if "LastResort" in path:  # matplotlib's: a box for every character, what this avoids
            continue
        if found := missing & _charmap(path):
            families.append(name)
            missing -= found
        if not missing:
            break
    if missing:
        text = re.sub("[" + "".join(re.escape(chr(c)) for c in missing) + "]+",
                      lambda m: "[" + " ".join(f"U+{ord(c):04X}" for c in m.group()) + "]", text)
    return text, families


def _drawable_texts(fig) -> None:
    from matplotlib.text import Text

    for t in fig.findobj(Text):
        if any(ord(c) > 0x24F for c in t.get_text()):  # beyond Latin: DejaVu Sans may lack it
            text, families = drawable(t.get_text(), t.get_weight(), t.get_style())
            t.set_text(text)
            t.set_fontfamily(families)


def format_of(path: str | Path) -> str:
    """The image format of an output path, from its suffix; InputError for any other suffix."""
    suffix = Path(path).suffix.lower().lstrip(".")
    if suffix not in FORMATS:
        raise InputError(f"{path}: unknown image format {suffix or '(no suffix)'!r}; name the file .png, .svg or .pdf")
    return suffix
