"""The greedy joint ranking: each round replays every remaining candidate's values *on top of the
items already chosen* (their change strings joined by commas into one whatif change), keeps each
candidate's best value, and takes the candidate whose joint step is shortest. Its saving is the
step before it (the previous item's joint step; the unchanged replay for the first) minus its
joint step, so savings add up and never count a gain twice.

An item is kept when its saving is at least :data:`~overlapprof.report.advice.MIN_SAVING` of the
traced step and the low end of its paired interval (the saving of each (rank, step) replayed both
ways, 2.5th percentile) is above −saving: no replayed step loses more than the median one gains.
The first candidate that fails ends the ranking: it and the rest are *rejected*, with their best
joint step and why. A candidate none of whose values the trace can model becomes a hint.
"""

from __future__ import annotations

from overlapprof.analysis.advise.replayer import Outcome, Replayer
from overlapprof.analysis.advise.rules import Candidate
from overlapprof.report.advice import MIN_SAVING, Hint, Item, Rejected

TIE = 1e-3  # values of a knob whose steps differ by less than this share are as good as each other


def _best(replayer: Replayer, applied: list[str], c: Candidate):
    """(value, outcome, tried, reason): the value of ``c`` whose joint step is shortest."""
    tried: dict[str, float] = {}
    best, reason = None, None
    for v in c.values:
        o = replayer.predict(",".join(applied + [v]))
        if not o.prediction.modelled:
            reason = reason or o.prediction.reason
            continue
        tried[v] = o.prediction.step_us
        if best is None or o.prediction.step_us < best[1].prediction.step_us - TIE * abs(best[1].prediction.step_us):
            best = (v, o)
        elif c.prefer_last and o.prediction.step_us <= best[1].prediction.step_us + TIE * abs(best[1].prediction.step_us):
            best = (v, o)  # as good: the later value (for buckets, the larger: fewer operations)
    return (best[0], best[1], tried, reason) if best else (None, None, tried, reason)


def ranked(replayer: Replayer, candidates: list[Candidate], top: int | None = None
           ) -> tuple[list[Item], list[Rejected], list[Hint]]:
    """The items, the rejected candidates and the unmodellable ones as hints (module docstring)."""
    traced = replayer.traced_step_us or 0.0
    floor = MIN_SAVING * traced
    before: Outcome = replayer.base
    applied: list[str] = []
    items: list[Item] = []
    rejected: list[Rejected] = []
    hints: list[Hint] = []
    remaining = list(candidates)
    while remaining and (top is None or len(items) < top):
        rounds = [(c, *_best(replayer, applied, c)) for c in remaining]
        for c, v, o, tried, reason in rounds:
            if v is None and not applied:
                hints.append(Hint(rule=c.rule, change=c.values[0], action=c.action(c.values[0]),
                                  why=f"not modelled from this trace: {reason}"))
        rounds = [r for r in rounds if r[1] is not None]
        if not rounds:
            break
        c, v, o, tried, _ = min(rounds, key=lambda r: r[2].prediction.step_us)
        saving, low, high = replayer.saving(before, o)
        if saving < floor or low < -saving:
            for c2, v2, o2, _, _ in sorted(rounds, key=lambda r: r[2].prediction.step_us):
                s2, lo2, hi2 = replayer.saving(before, o2)
                why = ("it makes the step slower" if s2 < 0 else
                       f"it saves {s2 / 1000:.3f} ms, under {100 * MIN_SAVING:.0f}% of the step" if s2 < floor else
                       f"a replayed step loses more than the median one gains ({lo2 / 1000:.3f} to {hi2 / 1000:.3f} "
                       "ms a step)")
                rejected.append(Rejected(rule=c2.rule, change=v2, step_us=o2.prediction.step_us, why=why))
            break
        p = o.prediction
        items.append(Item(
            rank=len(items) + 1, rule=c.rule, change=v, joint_change=",".join(applied + [v]), action=c.action(v),
            cause=c.cause, step_us=p.step_us, low_us=p.low_us, high_us=p.high_us, saving_us=saving,
            saving_low_us=low, saving_high_us=high, speedup=traced / p.step_us if p.step_us and traced else None,
            confidence=list(c.confidence),
            tried=tried))
        applied.append(v)
        before = o
        remaining = [r[0] for r in rounds if r[0] is not c]
    return items, rejected, hints


def bandwidth_hint(replayer: Replayer, items: list[Item]) -> Hint | None:
    """A link twice as fast, on top of the items: a hint with its replayed number (hardware, not a
    setting), when it saves at least MIN_SAVING of the traced step."""
    applied = [i.change for i in items]
    base = replayer.predict(",".join(applied)) if applied else replayer.base
    o = replayer.predict(",".join(["bandwidth=x2"] + applied))  # first: it scales the traced transfers
    traced = replayer.traced_step_us or 0.0
    if not o.prediction.modelled or base.prediction.step_us is None:
        return None
    saving = base.prediction.step_us - o.prediction.step_us
    if saving < MIN_SAVING * traced:
        return None
    on_top = " on top of the items above" if items else ""
    return Hint(rule="bandwidth", change="bandwidth=x2",
                action="a link (or interconnect) twice as fast",
                why=f"hardware, not a setting: replayed, {saving / 1000:.3f} ms a step less{on_top} "
                    f"({o.prediction.step_us / 1000:.3f} ms)")
