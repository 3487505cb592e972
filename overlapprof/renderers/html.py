"""A Comparison (one or more runs) as ONE self-contained HTML page.

Nothing is fetched when the page opens: the style sheet is inline, the plots are SVG images in
``data:`` URIs (text drawn as shapes, so no font is needed), and there is no script. Every string
that comes from a trace, a path or run.json is escaped: a trace is data.

The page is a list of sections, each a function of the :class:`~.html_parts.Page` that returns
HTML (or None to leave the section out): ``PAGE_SECTIONS`` here for the whole page,
``RUN_SECTIONS`` in :mod:`.html_runs` for each run (variant); :mod:`.html_parts` holds what they
are made of. A new section is one function added to one of these lists.
"""

from __future__ import annotations

import time

from overlapprof.renderers import columns, compare_table, workload_metrics
from overlapprof.renderers.base import Renderer
from overlapprof.renderers.format import PLACEHOLDER, metric, ms, percent
from overlapprof.renderers.html_parts import Page, PageSection, esc, figure, section, table
from overlapprof.renderers.html_runs import RUN_SECTIONS
from overlapprof.report import PER_STEP, Comparison


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
    chips = "".join(f'<span class="chip"><b>{esc(k)}</b> {esc(v)}</span>' for k, v in facts)
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
                f'<div class="kv" data-speedup="{kind}"><span>{name}</span><b>{esc(compare_table.judged(v, field))}</b></div>'
                for kind, name, field in (("profiled", f"speedup vs {esc(c.baseline)}, profiled", "speedup"),
                                          ("unprofiled", "unprofiled steps (host)", "host_speedup"))
                if kind == "profiled" or getattr(v, field) is not None)
        cards.append(
            f'<div class="card"><div class="name">{esc(v.label)}</div>'
            f'<div class="big">{percent(ratio)}</div><div class="sub">of communication hidden</div>{bar}'
            f'<div class="kv"><span>exposed comm{per}</span><b>{ms(v.exposed_comm_us)} ms</b></div>'
            f'<div class="kv"><span>step (median)</span><b>{ms(v.step_us)} ms</b></div>'
            + (f'<div class="kv" title="the shortest step overlap could give (OVERLAP.md section 6)">'
               f'<span>overlap bound</span><b>{ms(v.overlap_bound_us)} ms</b></div>'
               if v.overlap_bound_us is not None else "")
            + (f'<div class="kv" data-verdict><span>verdict</span><b>{esc(v.verdict.split(":")[0])}</b></div>'
               if v.verdict else "") + f'{speed_row}'
            + (f'<div class="kv" title="one medium shared by all ranks, not a port per rank">'
               f'<span>link</span><b>{esc(v.link)}</b></div>' if v.link else "") + "</div>"
        )
    title = " vs ".join(v.label for v in c.variants)
    return (f"<header><h1>overlapprof · {esc(first.workload or 'traces')}: {esc(title)}</h1>"
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
        items = "".join(f"<li>{esc(i.action)}: <b>{ams(i.saving_us)} ms</b> a step less [{ams(i.saving_low_us)}-"
                        f"{ams(i.saving_high_us)}], step {ams(i.step_us)} ms</li>" for i in a.items)
        parts.append(f'<p data-advice><b>{esc(label)}</b>: {esc(" ".join(x.strip() for x in lines).removeprefix("advice: "))}</p>'
                     + (f"<ol>{items}</ol>" if len(a.items) > 1 else ""))
    return section("What to change first", "".join(parts), "advice") if parts else None


def _comparison(page: Page) -> str | None:
    c = page.comparison
    if len(c.variants) < 2:
        return None
    from overlapprof.renderers import plots

    shown = (*columns.PAGE_VARIANTS, *(columns.PAGE_HOST if any(v.host_unprofiled_step_us is not None for v in c.variants)
                                       else ()), *(columns.PAGE_LOAD if any(v.other_cpu is not None for v in c.variants) else ()))
    rows = [[esc(v.label) + (' <span class="tag">baseline</span>' if v.label == c.baseline else ""), *columns.cells(shown, v)]
            for v in c.variants]
    predicted = [[esc(v.label), ms(v.predicted_step_us), *columns.cells(columns.PAGE_PREDICTED, v)]
                 for v in c.variants[1:] if v.predicted_step_us is not None]
    body = (table(["variant", *columns.heads(shown)], rows, "numbers comparison")
            + (table(["variant", f"predicted: {esc(c.baseline)}'s overlap bound ms", *columns.heads(columns.PAGE_PREDICTED)],
                     predicted, "numbers prediction") if predicted else "")
            + "".join(f'<p class="note">{esc(n)}</p>' for n in compare_table.notes(c))
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
    return section("Variants compared", body, "compare")


def _runs(page: Page) -> str:
    parts = []
    for k, (label, report) in enumerate(page.runs):
        inner = "".join(s for s in (build(page, label, report) for build in RUN_SECTIONS) if s)
        parts.append(f'<section class="run" id="run-{k}"><h2>{esc(label)}</h2>{inner}</section>')
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
    version = esc(page.comparison.version)
    stamp = time.strftime("%Y-%m-%d %H:%M")
    return section("What the numbers mean", table(["name", "definition"], rows, "defs")
                    + f'<p class="note">Definitions: OVERLAP.md. Generated by overlapprof {version} on {stamp}.</p>',
                    "definitions")


def _variant_metrics(page: Page) -> str | None:
    c = page.comparison
    if len(c.variants) < 2 or not (names := workload_metrics.names(c)):
        return None
    rows = [[esc(name), *(esc(metric(v.workload_metrics.get(name))) for v in c.variants)] for name in names]
    body = table(["workload metric (median)", *(esc(v.label) for v in c.variants)], rows, "numbers")
    return section("Workload metrics compared (ctx.metric)", body, "workload-metrics")


def _predictions(page: Page) -> str | None:
    """`--prediction FILE`: a whatif prediction next to each measured variant."""
    rows = [[esc(b.change), esc(", ".join(b.traced)), esc(b.variant), ms(b.step_us), f"{ms(b.low_us)}-{ms(b.high_us)}",
             ms(b.measured_step_us), percent(b.error, signed=True), "yes" if b.within else "no"]
            for b in page.comparison.predictions]
    return section("Predicted, then measured", table(
        ["change", "predicted from", "measured run", "predicted ms", "95% of steps ms", "measured ms", "error",
         "within"], rows), "predictions") if rows else None


PAGE_SECTIONS: list[PageSection] = [_header, _advice, _comparison, _predictions, _variant_metrics, _runs, _definitions]

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
            f"<title>{esc(title)}</title><style>{_CSS}</style></head><body><main>{body}</main></body></html>\n")


class HtmlRenderer(Renderer):
    """One self-contained HTML page: tables, plots, each run's metadata."""

    name = "html"
    subject = "comparison"
    extensions = ("html", "htm")
    shows_warnings = True

    def render(self, comparison: Comparison) -> str:
        return render(comparison)
