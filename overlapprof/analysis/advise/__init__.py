"""``advise(paths) -> Advice``: what to change first and what it buys.

From a run's causes of exposure (:mod:`.facts`), the rules make candidate changes, each with the
values of its knob to search (:mod:`.rules`); the what-if replay, read once (:mod:`.replayer`),
predicts them, ranked greedily by their joint prediction (:mod:`.ranking`: only savings clearly
above the noise are listed), with what is assumed where the trace cannot measure what new overlap
costs (:mod:`.assumed`); each is said in the user's terms (:mod:`.terms`). docs/advise.md
describes each rule.
"""

from __future__ import annotations

from overlapprof import __version__
from overlapprof.analysis.advise import facts as _facts
from overlapprof.analysis.advise import terms
from overlapprof.analysis.advise.ranking import bandwidth_hint, ranked
from overlapprof.analysis.advise.replayer import Replayer
from overlapprof.analysis.advise.rules import candidates
from overlapprof.report.advice import MIN_SAVING, Advice


def advise(paths, top: int | None = None, workers: int | None = None,
           reference_bandwidth: str | None = None, analyzed=None, reading: dict | None = None) -> Advice:
    """The Advice for the traced run of ``paths`` (a run directory or traces); ``top``: at most
    that many items; ``analyzed``: the run's Analyzed, when it was just analyzed (not read again);
    ``reading``: more options of ``analyze`` (an Nsight Systems export's ``step_range``, ``rank_map``)."""
    paths = [str(p) for p in paths]
    rp = Replayer(paths, workers=workers, reference_bandwidth=reference_bandwidth, analyzed=analyzed, reading=reading)
    report = rp.report
    traced = rp.traced_step_us or 0.0
    f = _facts.read(report, rp.tr, traced)
    out = Advice(version=__version__, inputs=paths, traced_step_us=rp.traced_step_us,
                 replayed_step_us=rp.base.prediction.step_us, workload=f.workload)
    if rp.traced_step_us and rp.base.prediction.step_us:
        err = rp.base.prediction.step_us / rp.traced_step_us - 1
        if abs(err) > 0.01:
            out.notes.append(f"the replay with nothing changed gives {rp.base.prediction.step_us / 1000:.3f} ms, "
                             f"{100 * err:+.1f}% off the traced step: every prediction carries that error")
    if not f.kinds or report.summary.comm_us <= 0:
        out.verdict = "no communication in this run: nothing for overlap to hide, nothing to change"
        return out
    if f.exposed_us < MIN_SAVING * traced:
        out.verdict = (f"communication exposed {f.exposed_us / 1000:.3f} ms a step, "
                       f"{100 * f.share(f.exposed_us):.1f}% of the {traced / 1000:.3f} ms step: nothing worth changing")
        return out
    f.said = terms.prepare(rp, f)
    cpu = any(r.mode == "cpu" for r in report.ranks)
    cands, hints, noise = candidates(f, rp.tr, rp.model.fits, cpu, rp.one_bucket_placed)
    items, rejected, unmodelled = ranked(rp, cands, top)
    out.items, out.rejected = items, rejected + noise
    out.hints = unmodelled + hints + _unlisted_straggler(cands, items, rejected) + _unlisted_host_sync(
        cands, items, rejected, unmodelled)
    if (h := bandwidth_hint(rp, items)) is not None:
        out.hints.append(h)
    if not items:
        out.verdict = (f"nothing worth changing: no change is predicted to save {100 * MIN_SAVING:.0f}% or more of the "
                       f"{traced / 1000:.3f} ms step clearly above the noise ({f.exposed_us / 1000:.3f} ms of it is "
                       "exposed communication)")
    return out


__all__ = ["advise", "for_report", "own_job", "predicted"]


def _unlisted_straggler(cands, items, rejected) -> list:
    """A straggler the replay does not shorten (its lateness lies outside the work in its traced
    steps: between them, or in transfers) is still named, as a hint without a number."""
    from overlapprof.report.advice import Hint

    out = []
    for c in cands:
        if c.rule == "no_straggler" and not any(i.rule == c.rule for i in items):
            r = next((r for r in rejected if r.rule == c.rule), None)
            said = f" (replayed: {(r.step_us or 0) / 1000:.3f} ms, {r.why})" if r is not None and r.step_us else ""
            out.append(Hint(rule=c.rule, change=c.values[0], action=c.action(c.values[0]),
                            why=f"{c.cause}, but removing its extra work inside its traced steps is not predicted to "
                                f"save reliably{said}: what makes it late may lie outside them (between its steps, or "
                                "in its transfers)"))
    return out


def _unlisted_host_sync(cands, items, rejected, unmodelled) -> list:
    """Barriers whose removal is not listed stay named, as the hint without a number they were."""
    from overlapprof.report.advice import Hint

    out = []
    for c in cands:
        if c.rule == "host_sync" and not any(i.rule == c.rule for i in items + unmodelled):
            r = next((r for r in rejected if r.rule == c.rule), None)
            said = f" (replayed: {(r.step_us or 0) / 1000:.3f} ms, {r.why})" if r is not None and r.step_us else ""
            out.append(Hint(rule=c.rule, change=c.values[0], action=c.action(c.values[0]),
                            why=f"{c.cause}, but removing the barriers is not predicted to save reliably{said}"))
    return out


def own_job(advice: Advice, run: str, top: int = 1):
    """The Verification of a user's own job (not a run of ``overlapprof run``, so nothing to rerun
    here): the exact change to make, and the commands that check it after."""
    from overlapprof.report.advice import Verification

    items = advice.items[:max(top, 1)]
    if not items:
        return Verification(traced_step_us=advice.traced_step_us,
                            note="nothing to verify: the advice has no change to make")
    joint = items[-1].joint_change
    lines = ["this run is not one of `overlapprof run`: make the change in your job, then profile it again",
             *[f"  change {i.rank}: {i.action}" for i in items],
             "profile it again with overlapprof.profile (the same schedule) into NEW, then check the prediction:",
             f"  overlapprof whatif {run} --set {joint} --check NEW",
             f"  overlapprof compare {run} NEW"]
    return Verification(traced_step_us=advice.traced_step_us, note="\n".join(lines))


def for_report(report, workers: int | None = None, analyzed=None) -> Advice | None:
    """The Advice of an analyzed run directory (``report.run`` set, one input, with steps and
    communication), to lead its report; None where there is none to give (traces that are not
    a run directory, no ProfilerStep, nothing the replay can read). Without ``analyzed`` (the
    Analyzed the report came from) it reads the traces again."""
    from overlapprof.errors import OverlapprofError

    if report.run is None or len(report.inputs) != 1 or not any(r.steps for r in report.ranks):
        return None
    if report.summary.comm_us <= 0:
        return None
    try:
        return advise(report.inputs, workers=workers, analyzed=analyzed)
    except OverlapprofError:
        return None
    except Exception as exc:  # noqa: BLE001 - the report must not fail for its advice: said, not raised
        report.warnings.append(f"advice not computed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        return None


def predicted(paths, verification, workers: int | None = None) -> None:
    """Fill in, in place, each tried set of ``verification`` that lacks its prediction: the replay
    of its changes together (``whatif``), and ``within`` where the realized step is known."""
    from overlapprof.analysis.replay.predict import whatif

    missing = [s for s in verification.sets if s.predicted_step_us is None and s.changes]
    if not missing:
        return
    result = whatif([str(p) for p in paths], [",".join(s.changes) for s in missing], workers=workers)
    for s, p in zip(missing, result.predictions):
        if p.modelled:
            s.predicted_step_us, s.predicted_low_us, s.predicted_high_us = p.step_us, p.low_us, p.high_us
            if s.realized_step_us is not None and s.within is None:
                s.within = p.low_us <= s.realized_step_us <= p.high_us
