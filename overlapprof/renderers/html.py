"""A Comparison (one or more runs) as ONE self-contained HTML page.

Nothing is fetched when the page opens: the style sheet is inline, the plots are SVG images in
``data:`` URIs (text drawn as shapes, so no font is needed), and there is no script. Every string
that comes from a trace, a path or run.json is escaped: a trace is data.

The page is a list of sections, each a function of the :class:`Page` that returns HTML (or None
to leave the section out): ``PAGE_SECTIONS`` for the whole page, ``RUN_SECTIONS`` for each run
(variant). A new section is one function added to one of these lists.
"""

from __future__ import annotations

import base64
import html
import json
import time
from dataclasses import dataclass
from typing import Callable

from overlapprof.renderers import collectives_table as ct
from overlapprof.renderers import columns, compare_table, workload_metrics
from overlapprof.renderers.base import Renderer
from overlapprof.renderers.format import PLACEHOLDER, RANK_SUMS, TRANSFER_RULE, WAIT_RULE, metric, ms, percent
from overlapprof.renderers.table import unmeasured_devices
from overlapprof.report import PER_STEP, Comparison, Report


def _e(value) -> str:
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
    return f'<figure><img alt="{_e(alt)}" src="data:image/svg+xml;base64,{data}">{cap}</figure>'


def table(header: list[str], rows: list[list[str]], cls: str = "", attrs: str = "") -> str:
    """An HTML table; cells are HTML already (escape strings before). Numeric columns align right."""
    head = "".join(f"<th>{h}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return (f'<div class="scroll"><table class="{cls}"{attrs}><thead><tr>{head}</tr></thead>'
            f"<tbody>{body}</tbody></table></div>")


def _section(title: str, body: str, anchor: str = "", level: int = 2) -> str:
    ident = f' id="{_e(anchor)}"' if anchor else ""
    return f"<section{ident}><h{level}>{_e(title)}</h{level}>{body}</section>"


# ---- whole-page sections -------------------------------------------------------------------

def _header(page: Page) -> str:
    c = page.comparison
    first = c.variants[0]
    facts = [
        ("workload", first.workload) if first.workload else ("inputs", "profiler traces (not an overlapprof run)"),
        ("ranks", first.ranks),
        ("device", first.device or PLACEHOLDER),  # a run's; traces do not say
        ("backend", first.backend or PLACEHOLDER),
        ("basis", c.basis),
    ]
    chips = "".join(f'<span class="chip"><b>{_e(k)}</b> {_e(v)}</span>' for k, v in facts)
    cards, per = [], " / step" if c.basis == PER_STEP else ""
    for v in c.variants:
        ratio = v.overlap_ratio
        bar = ('<div class="bar none"></div>' if ratio is None
               else f'<div class="bar"><i style="width:{100 * ratio:.1f}%"></i></div>')
        if len(c.variants) < 2:
            speed_row = ""
        elif v.label == c.baseline:
            speed_row = '<div class="kv"><span>speedup</span><b>baseline</b></div>'
        else:
            speed_row = "".join(
                f'<div class="kv" data-speedup="{kind}"><span>{name}</span><b>{_e(compare_table.judged(v, field))}</b></div>'
                for kind, name, field in (("profiled", f"speedup vs {_e(c.baseline)}, profiled", "speedup"),
                                          ("unprofiled", "unprofiled steps (host)", "host_speedup"))
                if kind == "profiled" or getattr(v, field) is not None)
        cards.append(
            f'<div class="card"><div class="name">{_e(v.label)}</div>'
            f'<div class="big">{percent(ratio)}</div><div class="sub">of communication hidden</div>{bar}'
            f'<div class="kv"><span>exposed comm{per}</span><b>{ms(v.exposed_comm_us)} ms</b></div>'
            f'<div class="kv"><span>step (median)</span><b>{ms(v.step_us)} ms</b></div>'
            + (f'<div class="kv" title="the shortest step overlap could give (OVERLAP.md section 6)">'
               f'<span>overlap bound</span><b>{ms(v.overlap_bound_us)} ms</b></div>'
               if v.overlap_bound_us is not None else "")
            + (f'<div class="kv" data-verdict><span>verdict</span><b>{_e(v.verdict.split(":")[0])}</b></div>'
               if v.verdict else "") + f'{speed_row}'
            + (f'<div class="kv" title="one medium shared by all ranks, not a port per rank">'
               f'<span>link</span><b>{_e(v.link)}</b></div>' if v.link else "") + "</div>"
        )
    title = " vs ".join(v.label for v in c.variants)
    return (f"<header><h1>overlapprof · {_e(first.workload or 'traces')}: {_e(title)}</h1>"
            f'<div class="chips">{chips}</div><div class="cards">{"".join(cards)}</div></header>')


def _advice(page: Page) -> str | None:
    """What to change first and what it buys, per run the replay read (``Report.advice``)."""
    from overlapprof.renderers.advice_text import lead
    from overlapprof.renderers.advice_text import ms as ams  # no "-0.000"

    parts = []
    for label, report in page.runs:
        a = report.advice
        if a is None or not (lines := lead(a)):
            continue
        items = "".join(f"<li>{_e(i.action)}: <b>{ams(i.saving_us)} ms</b> a step less [{ams(i.saving_low_us)}-"
                        f"{ams(i.saving_high_us)}], step {ams(i.step_us)} ms</li>" for i in a.items)
        parts.append(f'<p data-advice><b>{_e(label)}</b>: {_e(" ".join(x.strip() for x in lines).removeprefix("advice: "))}</p>'
                     + (f"<ol>{items}</ol>" if len(a.items) > 1 else ""))
    return _section("What to change first", "".join(parts), "advice") if parts else None


def _comparison(page: Page) -> str | None:
    c = page.comparison
    if len(c.variants) < 2:
        return None
    from overlapprof.renderers import plots

    shown = (*columns.PAGE_VARIANTS, *(columns.PAGE_HOST if any(v.host_unprofiled_step_us is not None for v in c.variants)
                                       else ()), *(columns.PAGE_LOAD if any(v.other_cpu is not None for v in c.variants) else ()))
    rows = [[_e(v.label) + (' <span class="tag">baseline</span>' if v.label == c.baseline else ""), *columns.cells(shown, v)]
            for v in c.variants]
    predicted = [[_e(v.label), ms(v.predicted_step_us), *columns.cells(columns.PAGE_PREDICTED, v)]
                 for v in c.variants[1:] if v.predicted_step_us is not None]
    body = (table(["variant", *columns.heads(shown)], rows, "numbers comparison")
            + (table(["variant", f"predicted: {_e(c.baseline)}'s overlap bound ms", *columns.heads(columns.PAGE_PREDICTED)],
                     predicted, "numbers prediction") if predicted else "")
            + "".join(f'<p class="note">{_e(n)}</p>' for n in compare_table.notes(c))
            + figure(plots.comparison_figure(c), "variant comparison chart",
                     "Bars: step time with its overlap bound (the shortest step overlap could give; the tick: "
                     "the comm-free bound, step − exposed; the dashed line: the baseline's overlap bound, the "
                     "prediction), communication hidden vs exposed, and compute (a slowdown shows contention)."))
    if any(v.exposure is not None for v in c.variants):
        body += figure(plots.causes_figure([(v.label, v.exposure) for v in c.variants],
                                           title="Why communication is exposed, per variant"),
                       "exposed communication by cause per variant",
                       "Each bar: a variant's exposed communication per step (mean), stacked by cause; "
                       "definitions below.")
    return _section("Variants compared", body, "compare")


def _runs(page: Page) -> str:
    parts = []
    for k, (label, report) in enumerate(page.runs):
        inner = "".join(s for s in (build(page, label, report) for build in RUN_SECTIONS) if s)
        parts.append(f'<section class="run" id="run-{k}"><h2>{_e(label)}</h2>{inner}</section>')
    return "".join(parts)


def _definitions(page: Page) -> str:
    rows = [
        ["comm", "|U(comm)|: union of communication intervals (communication-library kernels: NCCL/RCCL, ...; on CPU, "
                 "&lt;backend&gt;:&lt;op&gt; spans)"],
        ["compute", "|U(compute)|: union of the other kernels (CPU: cpu_op spans)"],
        ["hidden (overlapped)", "|U(comm) ∩ U(compute)|"],
        ["exposed", "comm − hidden: communication nothing else was running under"],
        ["overlap", f"hidden / comm ({PLACEHOLDER} when there is no communication)"],
        ["comm-free bound", "step − exposed: the step if communication cost nothing (the ceiling of any "
                            "communication fix)"],
        ["overlap bound", "the shortest step overlap could give: max(compute, transfer) + other, or with "
                          "windows compute + the transfer that cannot hide in its window + other; floors: the "
                          "shared link's bytes / rate, the host cores' compute (OVERLAP.md section 6)"],
        ["late_peer", "exposed while an operation waited for a late rank (named: the one not itself waiting)"],
        ["host_blocked", "exposed while the host was in a synchronization (cuda sync, .item(), a barrier)"],
        ["queued", "exposed while an issued operation waited for its channel (process group, stream)"],
        ["no_window", "exposed in an operation with no compute in its window (a blocking call)"],
        ["window_short", "exposed after the compute in the operation's window ran out"],
        ["compute slowdown", "compute / baseline compute: &gt; 1x when overlap slows compute down"],
    ]
    version = _e(page.comparison.version)
    stamp = time.strftime("%Y-%m-%d %H:%M")
    return _section("What the numbers mean", table(["name", "definition"], rows, "defs")
                    + f'<p class="note">Definitions: OVERLAP.md. Generated by overlapprof {version} on {stamp}.</p>',
                    "definitions")


# ---- per-run sections ----------------------------------------------------------------------

def _rank_table(page: Page, label: str, report: Report) -> str:
    header = columns.heads(columns.PAGE_RANK)
    rows = [[_e(cell) for cell in columns.cells(columns.PAGE_RANK, r)] for r in report.ranks]
    s = report.summary
    lines = [f"Pooled overlap {percent(s.pooled_ratio)}; most exposed: rank {s.most_exposed_rank}"
             f" ({ms(s.most_exposed_us)} ms)" if s.ranks_with_comm else "No communication found."]
    if host_only := unmeasured_devices(report):
        lines.insert(0, host_only[:1].upper() + host_only[1:] + ".")
    if s.median_step_us is not None:
        lines.append(f"Step time: median {ms(s.median_step_us)} ms, p90 {ms(s.p90_step_us)} ms.")
    lines += [f"Filter: {f}" for f in report.filters] or ["Window: whole trace (every event counts)."]
    notes = "".join(f'<p class="note">{_e(x)}</p>' for x in lines)
    notes += "".join(f'<p class="warn">warning: {_e(w)}</p>' for w in report.warnings)
    attrs = f' data-variant="{_e(label)}" data-ranks="{len(report.ranks)}"'
    return _section("Per rank (whole trace)", table(header, rows, "numbers ranks", attrs) + notes, level=3)


def _partition(page: Page, label: str, report: Report) -> str | None:
    if not any(r.partition for r in report.ranks):
        return None
    header = ["rank", *columns.heads(columns.PARTITION)]
    rows = [[str(r.rank), *columns.cells(columns.PARTITION, p)] for r in report.ranks if (p := r.partition) is not None]
    note = ('<p class="note">Every millisecond of a step, once: compute, then communication not under '
            'compute (exposed), then memory copies under neither, then idle (none of them: host work, '
            'gaps). The four add up to the step time; means over each rank\'s steps.</p>')
    return _section("Step time, accounted for", table(header, rows, "numbers partition",
                                                      f' data-variant="{_e(label)}"') + note, level=3)


def _timeline(page: Page, label: str, report: Report) -> str | None:
    if not any(r.timeline for r in report.ranks):
        return None
    from overlapprof.renderers import plots

    truncated = any(r.timeline and r.timeline.truncated for r in report.ranks)
    caption = ("One ProfilerStep, the same on every rank: the middle one by number (the last step left out "
               "when there are three or more). Compute on one lane, communication on the next: "
               "green where it ran under compute (hidden); where it did not (exposed), coloured by why.")
    if truncated:
        caption += " Some lanes hold only the first intervals of the step (capped)."
    fig = plots.timeline_figure(report, title=f"{label}: one step per rank", xmax_ms=page.timeline_xmax_ms)
    return _section("Timeline of one step", figure(fig, f"{label} timeline", _e(caption)) + _export_hint(report),
                    level=3)


def _export_hint(report: Report) -> str:
    """How to see every step of every rank, zoomable, with the trace's own events."""
    run = report.inputs[0] if len(report.inputs) == 1 else "RUN"
    command = f"overlapprof export {run} -o timeline.json"
    return (f'<p class="note export">All ranks and every step on one zoomable timeline, with the trace\'s own '
            f'events of one step: <code>{_e(command)}</code>, then open <code>timeline.json</code> in '
            f'Perfetto (ui.perfetto.dev, "Open trace file") or chrome://tracing ("Load").</p>')


def _exposure(page: Page, label: str, report: Report) -> str:
    from overlapprof.renderers import plots

    fig = plots.exposure_figure(report, title=f"{label}: exposed vs hidden communication",
                                xmax_ms=page.exposure_xmax_ms)
    return _section("Exposed vs hidden communication", figure(fig, f"{label} exposed vs hidden"), level=3)


def _causes(page: Page, label: str, report: Report) -> str | None:
    """Why communication is exposed on each rank, what overlap could buy, and the verdict."""
    from overlapprof.renderers import causes_table as ca
    from overlapprof.renderers import plots

    ranks = [r for r in report.ranks if r.exposure is not None]
    if not ranks:
        notes = "".join(f'<p class="note">{_e(n)}</p>' for n in report.exposure_notes)
        return _section("Why exposed", notes, level=3) if notes else None
    shown = (*columns.RANK_CAUSES, *columns.RANK_BOUNDS)
    header, rows = columns.heads(shown), [[_e(cell) for cell in columns.cells(shown, r)] for r in ranks]
    fig = plots.causes_figure([(f"rank {r.rank}", r.exposure) for r in ranks], unit="ms, whole trace",
                              title=f"{label}: why communication is exposed, per rank")
    lines = ca.summary_lines(report)
    body = (table(header, rows, "numbers causes", f' data-variant="{_e(label)}"')
            + "".join(f'<p class="note">{_e(x)}</p>' for x in lines)
            + figure(fig, f"{label} causes", "Each exposed microsecond has one cause, the first that holds: "
                     "late_peer, host_blocked, queued, no_window, window_short (OVERLAP.md section 6)."))
    return _section("Why exposed, and what overlap could buy", body, level=3)


def _stragglers(page: Page, label: str, report: Report) -> str | None:
    """Waiting vs transferring per rank and who the others waited for (Report.crossrank)."""
    from overlapprof.renderers.straggler_plot import has_chart, straggler_figure

    if not has_chart(report):
        return None
    fig = straggler_figure(report, title=f"{label}: waiting vs transferring per rank")
    caption = (f"Collectives matched across ranks: {TRANSFER_RULE}, {WAIT_RULE}; left, {RANK_SUMS}; "
               "right, the wait a rank's late arrivals caused the others.")
    rows = [[str(s.rank), ms(s.caused_wait_us), percent(s.share), str(s.last_arrivals)]
            for s in report.crossrank.stragglers[:8]]
    body = figure(fig, f"{label} stragglers", _e(caption))
    if rows:
        body += table(["rank", "others' wait caused ms", "share of all wait", "arrived last"], rows, "numbers")
    notes = [line for line in ct.detail_lines(report) if not line.startswith("waited for:")]  # the table has them
    body += "".join(f'<p class="note">{_e(x)}</p>' for x in notes)
    return _section("Stragglers: waiting vs transferring", body, level=3)


def _kv(mapping) -> str:
    if not isinstance(mapping, dict) or not mapping:
        return PLACEHOLDER
    return " ".join(f'<code>{_e(k)}={_e(v)}</code>' for k, v in mapping.items())


def _link_row(run: dict) -> str | None:
    link = run.get("link")
    if not isinstance(link, dict):
        return None
    return (f"{link.get('rate')} tbf on lo ({link.get('qdisc') or '?'}): {link.get('medium')}")


def _run_metadata(page: Page, label: str, report: Report) -> str:
    run = report.run
    if not run:
        files = sorted({f for r in report.ranks for f in r.files})
        body = table(["inputs", "trace files"], [["<br>".join(_e(i) for i in report.inputs),
                                                   "<br>".join(_e(f) for f in files)]], "meta")
        return _section("Inputs", body, level=3)
    command = next((n.get("command") for n in (run.get("nodes") or {}).values() if isinstance(n, dict)), None)
    created = run.get("created")
    rows = [
        ("run", run.get("name")),
        ("status", run.get("status")),
        ("workload", (run.get("workload") or {}).get("path") if isinstance(run.get("workload"), dict) else None),
        ("variant", run.get("variant")),
        ("world size", f"{run.get('world_size')} ({run.get('nnodes')} node × {run.get('nproc_per_node')})"),
        ("device · backend", f"{run.get('device')} · {run.get('backend')}"),
        ("link", _link_row(run)),
        ("started", time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(created))
         if isinstance(created, (int, float)) else None),
        ("command", " ".join(map(str, command)) if isinstance(command, list) else None),
    ]
    cells = [[_e(k), f"<code>{_e(v)}</code>" if k == "command" else _e(v)] for k, v in rows if v is not None]
    for key in ("options", "profiler", "versions", "env"):
        cells.append([_e(key), _kv(run.get(key))])
    full = _e(json.dumps(run, indent=1, default=str))
    body = table(["", ""], cells, "meta") + f"<details><summary>run.json</summary><pre>{full}</pre></details>"
    return _section("Run", body, level=3)


def _workload_metrics(page: Page, label: str, report: Report) -> str | None:
    if not report.workload_metrics:
        return None
    rows = [[_e(cell) for cell in row] for row in workload_metrics.rows(report)]
    return _section("Workload metrics (ctx.metric)", table(workload_metrics.HEAD, rows, "numbers"), level=3)


def _variant_metrics(page: Page) -> str | None:
    c = page.comparison
    if len(c.variants) < 2 or not (names := workload_metrics.names(c)):
        return None
    rows = [[_e(name), *(_e(metric(v.workload_metrics.get(name))) for v in c.variants)] for name in names]
    body = table(["workload metric (median)", *(_e(v.label) for v in c.variants)], rows, "numbers")
    return _section("Workload metrics compared (ctx.metric)", body, "workload-metrics")


PageSection = Callable[[Page], "str | None"]
RunSection = Callable[[Page, str, Report], "str | None"]

def _predictions(page: Page) -> str | None:
    """`--prediction FILE`: a whatif prediction next to each measured variant."""
    rows = [[_e(b.change), _e(", ".join(b.traced)), _e(b.variant), ms(b.step_us), f"{ms(b.low_us)}-{ms(b.high_us)}",
             ms(b.measured_step_us), percent(b.error, signed=True), "yes" if b.within else "no"]
            for b in page.comparison.predictions]
    return _section("Predicted, then measured", table(
        ["change", "predicted from", "measured run", "predicted ms", "95% of steps ms", "measured ms", "error",
         "within"], rows), "predictions") if rows else None


PAGE_SECTIONS: list[PageSection] = [_header, _advice, _comparison, _predictions, _variant_metrics, _runs, _definitions]
RUN_SECTIONS: list[RunSection] = [_rank_table, _causes, _partition, _timeline, _exposure, _stragglers, _workload_metrics,
                                  _run_metadata]

_CSS = """
:root{--ink:#1f2328;--muted:#656d76;--line:#d8dee4;--bg:#f6f8fa;--accent:#0072B2;--warn:#9a6700}
*{box-sizing:border-box}
body{margin:0;font:14px/1.5 -apple-system,"Segoe UI",Helvetica,Arial,sans-serif;color:var(--ink);background:#fff}
main{max-width:1120px;margin:0 auto;padding:28px 32px 60px}
h1{font-size:22px;margin:0 0 10px}
h2{font-size:18px;margin:36px 0 10px;padding-bottom:6px;border-bottom:1px solid var(--line)}
h3{font-size:15px;margin:22px 0 8px;color:#333}
.chips{display:flex;flex-wrap:wrap;gap:8px;margin-bottom:16px}
.chip{background:var(--bg);border:1px solid var(--line);border-radius:999px;padding:2px 10px;font-size:12px}
.chip b{color:var(--muted);font-weight:600;margin-right:4px}
.cards{display:flex;flex-wrap:wrap;gap:14px}
.card{border:1px solid var(--line);border-radius:10px;padding:12px 16px;min-width:200px;background:#fff;
 box-shadow:0 1px 2px rgba(0,0,0,.04)}
.card .name{font-weight:700;font-size:15px}
.card .big{font-size:30px;font-weight:700;line-height:1.1;margin-top:4px}
.card .sub{font-size:12px;color:var(--muted);margin-bottom:6px}
.bar{height:6px;border-radius:3px;background:#D55E00;overflow:hidden;margin-bottom:10px}
.bar i{display:block;height:100%;background:#009E73}
.bar.none{background:var(--line)}
.kv{display:flex;justify-content:space-between;gap:16px;font-size:13px}
.kv span{color:var(--muted)}
table{border-collapse:collapse;margin:8px 0;font-size:13px}
th,td{padding:5px 10px;border-bottom:1px solid var(--line);text-align:left;vertical-align:top}
th{background:var(--bg);font-weight:600;vertical-align:bottom}
.scroll{overflow-x:auto;max-width:100%}
table.numbers td,table.numbers th{text-align:right;font-variant-numeric:tabular-nums}
table.numbers td{white-space:normal}
table.numbers td:first-child,table.numbers th:first-child{text-align:left}
table.numbers tbody tr:hover{background:#fafbfc}
table.meta td:first-child{color:var(--muted);white-space:nowrap}
table.meta thead{display:none}
code{font:12px ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;background:var(--bg);padding:1px 5px;
 border-radius:4px;margin:0 4px 2px 0;display:inline-block;word-break:break-all}
.tag{font-size:11px;background:#e7f0f8;color:var(--accent);border-radius:4px;padding:0 5px;margin-left:4px}
figure{margin:10px 0 6px}
figure img{max-width:100%;height:auto;display:block}
figcaption,.note{color:var(--muted);font-size:12.5px;margin:4px 0}
.warn{color:var(--warn);font-size:12.5px;margin:4px 0}
section.run{margin-top:12px}
details{margin-top:8px}summary{cursor:pointer;color:var(--muted)}
pre{background:var(--bg);padding:10px;border-radius:6px;overflow:auto;max-height:360px;font-size:12px}
"""


def render(comparison: Comparison) -> str:
    """The page of a Comparison (one run: ``overlapprof.compare.compare([report])``), as HTML text."""
    from overlapprof.renderers import plots

    reports = comparison.reports
    page = Page(
        comparison=comparison,
        timeline_xmax_ms=max([plots.timeline_span_ms(r) for r in reports] + [0.0]) or 1e-3,
        exposure_xmax_ms=max([plots.exposure_span_ms(r) for r in reports] + [0.0]) or 1e-3,
    )
    body = "".join(s for s in (build(page) for build in PAGE_SECTIONS) if s)
    title = "overlapprof report: " + " vs ".join(v.label for v in comparison.variants)
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; img-src data:; '
            f'style-src \'unsafe-inline\'">'
            f"<title>{_e(title)}</title><style>{_CSS}</style></head><body><main>{body}</main></body></html>\n")


class HtmlRenderer(Renderer):
    """One self-contained HTML page: tables, plots, each run's metadata."""

    name = "html"
    subject = "comparison"
    extensions = ("html", "htm")
    shows_warnings = True

    def render(self, comparison: Comparison) -> str:
        return render(comparison)
