"""The HTML page's sections for each run (variant): ``RUN_SECTIONS``, each a function of the
:class:`~overlapprof.renderers.html_parts.Page`, the run's label and its report, returning HTML
or None to leave the section out."""

from __future__ import annotations

import json
import time

from overlapprof.renderers import collectives_table as ct
from overlapprof.renderers import columns, workload_metrics
from overlapprof.renderers.format import PLACEHOLDER, RANK_SUMS, TRANSFER_RULE, WAIT_RULE, ms, percent
from overlapprof.renderers.html_parts import Page, RunSection, esc, figure, section, table
from overlapprof.renderers.table import unmeasured_devices
from overlapprof.report import Report


def _rank_table(page: Page, label: str, report: Report) -> str:
    header = columns.heads(columns.PAGE_RANK)
    rows = [[esc(cell) for cell in columns.cells(columns.PAGE_RANK, r)] for r in report.ranks]
    s = report.summary
    lines = [f"Pooled overlap {percent(s.pooled_ratio)}; most exposed: rank {s.most_exposed_rank}"
             f" ({ms(s.most_exposed_us)} ms)" if s.ranks_with_comm else "No communication found."]
    if host_only := unmeasured_devices(report):
        lines.insert(0, host_only[:1].upper() + host_only[1:] + ".")
    if s.median_step_us is not None:
        lines.append(f"Step time: median {ms(s.median_step_us)} ms, p90 {ms(s.p90_step_us)} ms.")
    lines += [f"Filter: {f}" for f in report.filters] or ["Window: whole trace (every event counts)."]
    notes = "".join(f'<p class="note">{esc(x)}</p>' for x in lines)
    notes += "".join(f'<p class="warn">warning: {esc(w)}</p>' for w in report.warnings)
    attrs = f' data-variant="{esc(label)}" data-ranks="{len(report.ranks)}"'
    return section("Per rank (whole trace)", table(header, rows, "numbers ranks", attrs) + notes, level=3)


def _partition(page: Page, label: str, report: Report) -> str | None:
    if not any(r.partition for r in report.ranks):
        return None
    header = ["rank", *columns.heads(columns.PARTITION)]
    rows = [[str(r.rank), *columns.cells(columns.PARTITION, p)] for r in report.ranks if (p := r.partition) is not None]
    note = ('<p class="note">Every millisecond of a step, once: compute, then communication not under '
            'compute (exposed), then memory copies under neither, then idle (none of them: host work, '
            'gaps). The four add up to the step time; means over each rank\'s steps.</p>')
    return section("Step time, accounted for", table(header, rows, "numbers partition",
                                                      f' data-variant="{esc(label)}"') + note, level=3)


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
    return section("Timeline of one step", figure(fig, f"{label} timeline", esc(caption)) + _export_hint(report),
                    level=3)


def _export_hint(report: Report) -> str:
    """How to see every step of every rank, zoomable, with the trace's own events."""
    run = report.inputs[0] if len(report.inputs) == 1 else "RUN"
    command = f"overlapprof export {run} -o timeline.json"
    return (f'<p class="note export">All ranks and every step on one zoomable timeline, with the trace\'s own '
            f'events of one step: <code>{esc(command)}</code>, then open <code>timeline.json</code> in '
            f'Perfetto (ui.perfetto.dev, "Open trace file") or chrome://tracing ("Load").</p>')


def _exposure(page: Page, label: str, report: Report) -> str:
    from overlapprof.renderers import plots

    fig = plots.exposure_figure(report, title=f"{label}: exposed vs hidden communication",
                                xmax_ms=page.exposure_xmax_ms)
    return section("Exposed vs hidden communication", figure(fig, f"{label} exposed vs hidden"), level=3)


def _causes(page: Page, label: str, report: Report) -> str | None:
    """Why communication is exposed on each rank, what overlap could buy, and the verdict."""
    from overlapprof.renderers import causes_table as ca
    from overlapprof.renderers import plots

    ranks = [r for r in report.ranks if r.exposure is not None]
    if not ranks:
        notes = "".join(f'<p class="note">{esc(n)}</p>' for n in report.exposure_notes)
        return section("Why exposed", notes, level=3) if notes else None
    shown = (*columns.RANK_CAUSES, *columns.RANK_BOUNDS)
    header, rows = columns.heads(shown), [[esc(cell) for cell in columns.cells(shown, r)] for r in ranks]
    fig = plots.causes_figure([(f"rank {r.rank}", r.exposure) for r in ranks], unit="ms, whole trace",
                              title=f"{label}: why communication is exposed, per rank")
    lines = ca.summary_lines(report)
    body = (table(header, rows, "numbers causes", f' data-variant="{esc(label)}"')
            + "".join(f'<p class="note">{esc(x)}</p>' for x in lines)
            + figure(fig, f"{label} causes", "Each exposed microsecond has one cause, the first that holds: "
                     "late_peer, host_blocked, queued, no_window, window_short (OVERLAP.md section 6)."))
    return section("Why exposed, and what overlap could buy", body, level=3)


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
    body = figure(fig, f"{label} stragglers", esc(caption))
    if rows:
        body += table(["rank", "others' wait caused ms", "share of all wait", "arrived last"], rows, "numbers")
    notes = [line for line in ct.detail_lines(report) if not line.startswith("waited for:")]  # the table has them
    body += "".join(f'<p class="note">{esc(x)}</p>' for x in notes)
    return section("Stragglers: waiting vs transferring", body, level=3)


def _kv(mapping) -> str:
    if not isinstance(mapping, dict) or not mapping:
        return PLACEHOLDER
    return " ".join(f'<code>{esc(k)}={esc(v)}</code>' for k, v in mapping.items())


def _link_row(run: dict) -> str | None:
    link = run.get("link")
    if not isinstance(link, dict):
        return None
    return (f"{link.get('rate')} tbf on lo ({link.get('qdisc') or '?'}): {link.get('medium')}")


def _run_metadata(page: Page, label: str, report: Report) -> str:
    run = report.run
    if not run:
        files = sorted({f for r in report.ranks for f in r.files})
        body = table(["inputs", "trace files"], [["<br>".join(esc(i) for i in report.inputs),
                                                   "<br>".join(esc(f) for f in files)]], "meta")
        return section("Inputs", body, level=3)
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
    cells = [[esc(k), f"<code>{esc(v)}</code>" if k == "command" else esc(v)] for k, v in rows if v is not None]
    for key in ("options", "profiler", "versions", "env"):
        cells.append([esc(key), _kv(run.get(key))])
    full = esc(json.dumps(run, indent=1, default=str))
    body = table(["", ""], cells, "meta") + f"<details><summary>run.json</summary><pre>{full}</pre></details>"
    return section("Run", body, level=3)


def _workload_metrics(page: Page, label: str, report: Report) -> str | None:
    if not report.workload_metrics:
        return None
    rows = [[esc(cell) for cell in row] for row in workload_metrics.rows(report)]
    return section("Workload metrics (ctx.metric)", table(workload_metrics.HEAD, rows, "numbers"), level=3)


RUN_SECTIONS: list[RunSection] = [_rank_table, _causes, _partition, _timeline, _exposure, _stragglers, _workload_metrics,
                                  _run_metadata]
