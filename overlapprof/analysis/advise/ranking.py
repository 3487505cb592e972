"""The greedy joint ranking: each round replays every remaining candidate's values *on top of the
items already chosen* (their change strings joined by commas into one whatif change), keeps each
candidate's best value, and takes, of those listed by the rules below, the one whose joint step
is shortest. Its saving is the step before it (the previous item's joint step; the unchanged
replay for the first) minus its joint step, so savings add up and never count a gain twice.

An item is kept only when its saving is clearly above the noise: at least
:data:`~overlapprof.report.advice.MIN_SAVING` of the traced step (:data:`~.assumed.DEMOTED_MARGIN`
times that for a change whose new overlap lands on ranks whose slowdown the trace does not
measure and whose host the replay does not charge for it, :mod:`.assumed`), at least the standard
error of a saving from the median step it starts from (:meth:`~.replayer.Replayer.noise`: the traced steps for
the first item, the replayed ones of the items above for the next, from their spread or, when
larger, from how they drift along the run; a smaller saving is not told from the run's noise),
and the low end of its
paired interval (the saving of each (rank, step) replayed both ways, 2.5th percentile) at least
−MIN_SAVING of the step: no replayed step made slower by more than the minimum saving. Each round takes the shortest joint step among the candidates that
pass; a round where none does ends the ranking, and they are *rejected*, each with its best joint
step and which rule it failed. A candidate whose best value fails them offers its next best that passes
instead. A candidate none of whose values the trace can model becomes a hint.
"""

from __future__ import annotations

from overlapprof.analysis.advise.assumed import DEMOTED, DEMOTED_MARGIN
from overlapprof.analysis.advise.replayer import Outcome, Replayer
from overlapprof.analysis.advise.rules import Candidate
from overlapprof.analysis.replay.sharing import SHARED
from overlapprof.report.advice import MIN_SAVING, Hint, Item, Rejected

TIE = 1e-3  # values of a knob whose steps differ by less than this share are as good as each other


def _best(replayer: Replayer, applied: list[str], before: Outcome, c: Candidate):
    """(value, outcome, tried, reason): the value of ``c`` whose joint step is shortest. A value
    whose new overlap lands on a rank where overlap is assumed to cost what it buys
    (:mod:`.assumed`) is not stood behind: left out, its replayed saving said in ``reason``."""
    tried: dict[str, float] = {}
    best, reason = None, None
    for v in c.values:
        o = replayer.predict(",".join(applied + [v]))
        if not o.prediction.modelled:
            reason = reason or o.prediction.reason
            continue
        if hint := [r for r in replayer.unmeasured(before, o) if replayer.assumptions[r].hint]:
            saved = (before.prediction.step_us - o.prediction.step_us) / 1000
            how = ("charged that share" if replayer.crowded[hint[0]].share is not None
                   else "taking the new overlap as free")
            reason = reason or (f"on rank {hint[0]}, {replayer.assumptions[hint[0]].words}; the replay, {how}, "
                                f"gives {saved:.3f} ms a step less ({v}): check it with --verify")
            continue
        tried[v] = o.prediction.step_us
        if best is None or o.prediction.step_us < best[1].prediction.step_us - max(TIE, c.margin) * abs(
                best[1].prediction.step_us):
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
        rounds = [(c, *_best(replayer, applied, before, c)) for c in remaining]
        for c, v, o, tried, reason in rounds:
            if v is None and not applied:
                hints.append(Hint(rule=c.rule, change=c.values[0], action=c.action(c.values[0]),
                                  why=f"not predicted from this trace: {reason}"))
        rounds = [_listable(replayer, applied, before, r, floor) for r in rounds if r[1] is not None]
        if not rounds:
            break
        passing = [r for r in rounds if _why_not(replayer, before, r[2], floor) is None]
        if not passing:
            for c2, v2, o2, _, _ in sorted(rounds, key=lambda r: r[2].prediction.step_us):
                rejected.append(Rejected(rule=c2.rule, change=v2, step_us=o2.prediction.step_us,
                                         why=_why_not(replayer, before, o2, floor)))
            break
        c, v, o, tried, _ = min(passing, key=lambda r: r[2].prediction.step_us)
        saving, low, high = replayer.saving(before, o)
        p = o.prediction
        items.append(Item(
            rank=len(items) + 1, rule=c.rule, change=v, joint_change=",".join(applied + [v]), action=c.action(v),
            cause=c.cause, step_us=p.step_us, low_us=p.low_us, high_us=p.high_us, saving_us=saving,
            saving_low_us=low, saving_high_us=high, speedup=traced / p.step_us if p.step_us and traced else None,
            confidence=[*c.confidence, *_per_ranks(replayer, replayer.unmeasured(before, o)),
                        *(n for n in p.notes if n.startswith(SHARED))],
            tried=tried))
        applied.append(v)
        before = o
        remaining = [r[0] for r in rounds if r[0] is not c]
    return items, rejected, hints


def _per_ranks(replayer: Replayer, ranks: list[int]) -> list[str]:
    """What is stood behind on ``ranks`` (:mod:`.assumed`), one line per distinct wording
    ("ranks 0, 1: ...")."""
    by: dict[str, list[int]] = {}
    for r in ranks:
        by.setdefault(replayer.assumptions[r].words, []).append(r)
    return [f"rank{'s' if len(rs) > 1 else ''} {', '.join(map(str, rs))}: {words}" for words, rs in by.items()]


def _why_not(replayer: Replayer, before: Outcome, o: Outcome, floor: float) -> str | None:
    """Why ``o`` is not listed on top of ``before`` (None: it is): its saving under the minimum
    (the demoted one for a change resting on an unmeasured slowdown), under the traced steps'
    spread, or its paired interval reaching a slower step."""
    saving, low, high = replayer.saving(before, o)
    if saving < 0:
        return "it makes the step slower"
    if saving < floor:
        return f"it saves {saving / 1000:.3f} ms, under {100 * MIN_SAVING:.0f}% of the step"
    if saving < DEMOTED_MARGIN * floor and any(replayer.assumptions[r].kind == DEMOTED
                                               for r in replayer.unmeasured(before, o)):
        return (f"it saves {saving / 1000:.3f} ms, under {100 * MIN_SAVING * DEMOTED_MARGIN:.0f}% of the step: its new "
                "overlap's slowdown is not measured on this trace, so it needs twice the minimum")
    error, spread, drift = replayer.noise(before)
    if saving < error:
        how = " from how its steps drift (its batches of consecutive steps' medians)" if drift else ""
        return (f"it saves {saving / 1000:.3f} ms, under the standard error of a saving from the median step it "
                f"starts from ({error / 1000:.3f} ms{how}, its steps' spread {spread / 1000:.3f} ms): not told from noise")
    if low < -floor:  # a replayed step slower by less than the minimum saving is noise, not harm
        return (f"not clearly above the noise: some replayed steps get slower by more than {100 * MIN_SAVING:.0f}% "
                f"of the step ({low / 1000:.3f} to {high / 1000:.3f} ms a step saved)")
    return None


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


def _listable(replayer: Replayer, applied: list[str], before: Outcome, r: tuple, floor: float) -> tuple:
    """The round ``r`` of a candidate with, where its best value is not listed, its next best that
    is (a bucket size whose one replayed step gets slower may have a neighbour the replay stands
    behind, as on a 2 Gbit/s link where 0.5 MiB lost a step and 0.25 MiB did not); else as it was.
    With a margin (prefetch), a value past the best one was judged not worth its cost: never offered."""
    c, v, o, tried, reason = r
    if _why_not(replayer, before, o, floor) is None:
        return r
    ruled_out = set(c.values[c.values.index(v) + 1:]) if c.margin and v in c.values else set()
    for v2 in sorted(tried, key=tried.get):
        o2 = replayer.predict(",".join(applied + [v2]))  # cached: _best replayed it
        if v2 != v and v2 not in ruled_out and _why_not(replayer, before, o2, floor) is None:
            return c, v2, o2, tried, reason
    return r
