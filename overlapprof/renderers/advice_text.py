"""``overlapprof advise``'s text: one screen, the changes ranked, each line an action with the
step it buys; then the hints (no number), the candidates left out, and a Verification when given.

:func:`lead` is the short form the analyze text and the HTML report start with ("what to change
first and what it buys"). Reads only the :class:`~overlapprof.report.advice.Advice`.
"""

from __future__ import annotations

from overlapprof.renderers.format import ms as _ms
from overlapprof.report.advice import Advice, Item, Verification


def ms(us: float | None) -> str:
    return _ms(0.0 if us is not None and abs(us) < 0.5 else us)  # no "-0.000"


def _item(i: Item) -> list[str]:
    speed = f", {i.speedup:.2f}x the traced step" if i.speedup else ""
    head = (f"{i.rank}. {i.action}")
    buys = (f"   saves {ms(i.saving_us)} ms a step [{ms(i.saving_low_us)}-{ms(i.saving_high_us)}]"
            f"{' on top of the above' if i.rank > 1 else ''}: step {ms(i.step_us)} ms "
            f"[{ms(i.low_us)}-{ms(i.high_us)}]{speed}  (whatif: {i.joint_change})")
    return [head, buys, f"   removes: {i.cause}", f"   assumes: {'; '.join(i.confidence) or 'nothing beyond the replay'}"]


def lead(a: Advice) -> list[str]:
    """The first lines of a report: the top item and what all of them buy, or the verdict."""
    if a.verdict and not a.items:
        hint = [f"        hint (not predicted): {a.hints[0].action}"] if a.hints and a.hints[0].rule != "bandwidth" else []
        return [f"advice: {a.verdict}", *hint]
    if not a.items:
        return []
    first = a.items[0]
    lines = [f"advice: first, {first.action}: {ms(first.saving_us)} ms a step less "
             f"(step {ms(first.step_us)} ms [{ms(first.low_us)}-{ms(first.high_us)}], traced {ms(a.traced_step_us)} ms)"]
    if len(a.items) > 1:
        last = a.items[-1]
        lines.append(f"        all {len(a.items)} changes together: step {ms(last.step_us)} ms "
                     f"({last.speedup:.2f}x); `overlapprof advise` lists them")
    return lines


def verification(v: Verification) -> list[str]:
    lines = ["", "verified (each rerun against a rerun of the traced configuration):" if v.sets else "verify:"]
    for s in v.sets:
        name = ", ".join(s.changes) or "unchanged (the traced configuration, rerun)"
        if s.realized_step_us is None:
            lines.append(f"  {name}: not measured{': ' + s.note if s.note else ''}")
            continue
        spd = f", speedup {s.speedup:.2f}x" if s.speedup else ""
        if s.speedup_low is not None and s.speedup_high is not None:
            spd += f" [{s.speedup_low:.2f}-{s.speedup_high:.2f}]"
        pred = (f"predicted {ms(s.predicted_step_us)} ms [{ms(s.predicted_low_us)}-{ms(s.predicted_high_us)}]"
                if s.predicted_step_us is not None else "no prediction")
        within = "" if s.within is None else ("; realized within the prediction" if s.within else
                                              "; realized OUTSIDE the prediction")
        lines.append(f"  {name}: {pred}, realized {ms(s.realized_step_us)} ms "
                     f"[{ms(s.realized_low_us)}-{ms(s.realized_high_us)}]{spd}{within}"
                     + (f" ({s.run})" if s.run else ""))
        if s.note:
            lines.append(f"    {s.note}")
    if v.note:
        lines += [f"  {line}" for line in v.note.splitlines()]
    return lines


def render(a: Advice) -> str:
    lines = [f"traced step {ms(a.traced_step_us)} ms (median over the (rank, step) pairs); replayed unchanged "
             f"{ms(a.replayed_step_us)} ms"]
    if a.verdict:
        lines.append(a.verdict)
    if a.items:
        lines += ["", "what to change, first the most (each saving on top of the ones above it):"]
        for i in a.items:
            lines += _item(i)
    if a.hints:
        lines += ["", "hints (not predicted: no number the replay stands behind, except where it says):"]
        lines += [f"- {h.action}: {h.why}" for h in a.hints]
    if a.rejected:
        lines += ["", "tried and left out: " + "; ".join(
            f"{r.change} ({'step ' + ms(r.step_us) + ' ms: ' if r.step_us is not None else ''}{r.why})"
            for r in a.rejected)]
    lines += [f"note: {n}" for n in a.notes]
    if a.verification is not None:
        lines += verification(a.verification)
    return "\n".join(lines) + "\n"
