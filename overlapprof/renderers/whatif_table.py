"""``overlapprof whatif``'s text: the replay's check, the transfer model, then one row per change
(predicted step with its interval, speedup, causes of exposure after it, what limits it)."""

from __future__ import annotations

from overlapprof.renderers.base import Renderer
from overlapprof.renderers.format import factor, ms, percent, text_table
from overlapprof.report.whatif import WhatIf


def _causes(p) -> str:
    e = p.exposure
    if e is None:
        return "-"
    parts = [(name, getattr(e, f"{name}_us")) for name in ("late_peer", "queued", "no_window", "window_short")]
    shown = [f"{name} {ms(us)}" for name, us in parts if us >= 0.0005]
    return ", ".join(shown) or "none"


def render(w: WhatIf) -> str:
    lines = [f"traced step (median over {len(w.ranks)} ranks' steps): {ms(w.traced_step_us)} ms; replayed "
             f"unchanged: {ms(w.replayed_step_us)} ms ({percent(w.replay_error, signed=True)})"
             + (f"; link: {w.link}" if w.link else "")]
    lines.append("per rank, replayed vs traced: " + ", ".join(
        f"{r.rank}: {ms(r.replayed_step_us)} vs {ms(r.traced_step_us)} ms ({percent(r.error, signed=True)})"
        for r in w.ranks))
    if w.transfer:
        rows = [[f.kind, str(f.group_size), str(f.operations), str(f.sizes), f.source,
                 "-" if f.latency_us is None else f"{f.latency_us:.1f}",
                 "-" if f.bandwidth_gbps is None else f"{f.bandwidth_gbps:.3f}",
                 percent(f.median_abs_residual), percent(f.max_abs_residual)] for f in w.transfer]
        lines += ["", "transfer model (transfer = latency + bus bytes / bandwidth):",
                  text_table(["kind", "ranks", "ops", "sizes", "from", "latency us", "bandwidth GB/s",
                              "median |resid|", "max |resid|"], rows)]
    rows, unmodelled = [], []
    for p in w.predictions:
        if not p.modelled:
            unmodelled.append(f"cannot be modelled from this trace: {p.reason}")
            continue
        rows.append([p.change, ms(p.step_us), f"{ms(p.low_us)}-{ms(p.high_us)}", factor(p.speedup), _causes(p),
                     p.limit or "-"])
    if rows:
        lines += ["", text_table(["change", "step ms", "95% of steps ms", "speedup", "exposed a step after (ms)",
                                  "what limits the step then"], rows)]
    lines += unmodelled
    for p in w.predictions:
        lines += list(p.notes)
        if p.check is not None:
            lines += check_lines(p).splitlines()
    lines += [f"note: {n}" for n in w.notes]
    return "\n".join(lines) + "\n"


def check_lines(p) -> str:
    """A checked prediction's error, and whether the checked run's compute moved."""
    c = p.check
    verdict = "within" if c.within else "outside"
    out = (f"check {p.change} against {c.run}: measured {ms(c.measured_step_us)} ms "
           f"({ms(c.measured_low_us)}-{ms(c.measured_high_us)}), predicted {ms(p.step_us)} ms: error "
           f"{percent(c.error, signed=True)}, {verdict} the predicted spread ({ms(p.low_us)}-{ms(p.high_us)} ms)\n")
    if c.compute_ratio is not None and abs(c.compute_ratio - 1) > 0.1:
        out += (f"  the checked run's compute a step was {c.compute_ratio:.2f}x what the change predicts from the "
                "traced run's: the machine (load, clocks) or the change's interference (communication threads beside "
                "compute) moved it, which the replay does not model\n")
    return out


def beside(rows) -> str:
    """Predictions next to measured variants (``Comparison.predictions``), a line each."""
    return "".join(
        f"prediction {b.change} (from {', '.join(b.traced)}) beside {b.variant}: predicted {ms(b.step_us)} ms "
        f"({ms(b.low_us)}-{ms(b.high_us)}), measured {ms(b.measured_step_us)} ms: error "
        f"{percent(b.error, signed=True)}, {'within' if b.within else 'outside'} the predicted spread\n" for b in rows)


class WhatIfTableRenderer(Renderer):
    """What each change would buy, as text."""

    name = "table"
    subject = "whatif"
    extensions = ("txt",)
    shows_warnings = True

    def render(self, w: WhatIf) -> str:
        return render(w)
