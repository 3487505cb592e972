"""The straggler chart: per rank, waiting vs transferring, and the waiting it caused others.

Reads only ``Report.crossrank`` (:mod:`overlapprof.report.crossrank`). Two panels sharing the rank
axis: left, each rank's time in matched collectives split into transfer (blue) and wait
(vermillion), labelled with both (unions within its communication time: operations in flight at
once count once); right, the wait the rank's late arrivals caused the other ranks, the named
straggler in wine (only when the evidence holds: ``CrossRank.straggler``). One legend below both panels. Same
style and palette as :mod:`overlapprof.renderers.plots`.
"""

from __future__ import annotations

from overlapprof.renderers.format import ms, times, to_ms
from overlapprof.renderers.plots import COMPUTE, EXPOSED, INK, new_figure, style

CAUSED = "#CC79A7"
TOP = "#882255"  # wine: darker than CAUSED, and not EXPOSED's vermillion of the charts beside it


def has_chart(report) -> bool:
    """Whether the report has matched instances to chart."""
    return report.crossrank is not None and any(r.matched_ops for r in report.crossrank.ranks)


def straggler_figure(report, *, title: str | None = None):
    """Per rank: transfer + wait (ms, over matched collectives) and wait caused to others (ms)."""
    crossrank = report.crossrank
    ranks = crossrank.ranks
    ys = [-k for k in range(len(ranks))]
    if crossrank.straggler_evidence is None:  # saved before the rule: the top of the list, as then
        top = crossrank.stragglers[0].rank if crossrank.stragglers else None
    else:
        top = crossrank.straggler
    with style():
        fig = new_figure(10, 1.2 + 0.3 * max(2, len(ranks)))
        left, right = fig.subplots(1, 2, sharey=True, width_ratios=(3, 2))
        transfer = [to_ms(r.transfer_us) for r in ranks]
        wait = [to_ms(r.wait_us) for r in ranks]
        left.barh(ys, transfer, color=COMPUTE, height=0.62, label="transfer")
        left.barh(ys, wait, left=transfer, color=EXPOSED, height=0.62, label="wait (duration − transfer)")
        span = max([t + w for t, w in zip(transfer, wait)] + [1e-3])
        for y, t, w, r in zip(ys, transfer, wait, ranks):
            label = f"{ms(r.wait_us)} ms wait + {ms(r.transfer_us)} ms transfer"
            left.text(t + w + span * 0.01, y, label, va="center", fontsize=7.5,
                      color="#444444")
        left.set_xlim(0, span * 1.45)
        left.set_xlabel("time in matched collectives, in flight at once counted once (ms)")
        left.set_title(title or "Waiting vs transferring per rank")
        caused = [to_ms(r.caused_wait_us) for r in ranks]
        colors = [TOP if r.rank == top else CAUSED for r in ranks]
        right.barh(ys, caused, color=colors, height=0.62)
        from matplotlib.patches import Patch

        handles = [Patch(color=CAUSED, label="wait caused to others")]
        if top is not None:
            handles.append(Patch(color=TOP, label=f"straggler (rank {top})"))
        most = max(caused + [1e-3])
        for y, c, r in zip(ys, caused, ranks):
            if r.last_arrivals:
                label = f"{ms(r.caused_wait_us)} ms · last {times(r.last_arrivals)}"
                right.text(c + most * 0.02, y, label, va="center", fontsize=7.5,
                           color=INK)
        right.set_xlim(0, most * 1.6)
        right.set_xlabel("others' wait it caused (ms)")
        right.set_title("Stragglers: who the others waited for")
        for ax in (left, right):
            ax.grid(axis="x", color="#EEEEEE", linewidth=0.8)
            ax.set_axisbelow(True)
            ax.tick_params(axis="y", length=0)
        left.set_yticks(ys, [f"rank {r.rank}" for r in ranks])
        # One legend below both panels: inside the right one it covered the bar labels.
        lines, labels = left.get_legend_handles_labels()
        fig.legend(lines + handles, labels + [h.get_label() for h in handles], loc="outside lower center",
                   ncols=len(labels) + len(handles), fontsize=8)
    return fig
