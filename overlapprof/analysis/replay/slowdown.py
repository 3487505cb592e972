"""Compute slowed beside communication, in every prediction (issue 35, part 3).

The report measures, per rank and compute class, how much slower compute runs while communication
runs beside it (:mod:`overlapprof.analysis.interference`: the class's ``factor``, and ``slowed_us``
= ``o × (1 − 1/factor)`` for ``o`` µs of it under communication). A rank's factor here is the one
that gives its measured slowed time over all its measured classes: ``f = Σ o_c / Σ (o_c / f_c)``.

A change moves compute beside communication (an operation made async: the compute after it now
runs while it moves) or away from it (an all-gather issued earlier, fewer buckets). Per lane and
step, the compute *beside* an operation is counted the same way on the traced lane and on the
rewritten one: walking the keys, an operation issued is open until its need, for at most its
transfer's µs of the lane's work (unmatched: its duration); each piece of work's compute is beside
for the part of it that an open operation's remaining µs cover. With ``O`` the step's compute
beside communication traced and ``O'`` rewritten, the step's compute changes by ``(1 − 1/f) ×
(O' − O)``: each µs newly under communication pays the measured extra, each µs that left it stops
paying it. It is added to the pieces newly beside (in proportion to their beside µs), or taken
from the pieces not beside (in proportion to their compute). With nothing changed ``O' = O``: the
replay still gives the traced steps back.

What it leaves out: the open operations' µs also pass while the lane waits in a need (not
counted), and compute that outlasts the transfer beside it is charged for the transfer's µs only.
"""

from __future__ import annotations

import numpy as np

from overlapprof.analysis.replay.copying import copy_time
from overlapprof.analysis.replay.timeline import BOUND, ISSUE, NEED, Traced


def rank_factors(report) -> dict[int, float]:
    """Rank -> its factor ``Σ o_c / Σ (o_c / f_c)`` over its classes with a measured factor and
    time under communication; ranks without one, or whose factor is at most 1 (compute no slower
    beside communication: nothing to charge), are left out."""
    out = {}
    for r in report.ranks:
        if r.interference is None:
            continue
        classes = [c for c in r.interference.classes if c.factor and c.overlapped_us > 0]
        o = sum(c.overlapped_us for c in classes)
        base = sum(c.overlapped_us / c.factor for c in classes)
        if o > 0 and base > 0 and o > base:  # a factor below 1 (faster beside communication) is noise
            out[r.rank] = o / base
    return out


def beside(tr: Traced, lane, span=None) -> list[float]:
    """Per key of ``lane``, the compute of the work after it that an open operation covers (µs).
    ``span``: per instance, the µs of it that count (default: its transfer; NaN counts none)."""
    left: dict[int, float] = {}  # open operation -> its transfer's µs not yet covered
    out = []
    for kind, ref, work, compute in zip(lane.kind, lane.ref, lane.work, lane.compute):
        if kind == ISSUE:
            inst = int(tr.inst[ref])
            if span is not None:
                left[ref] = float(np.nan_to_num(span[inst])) if 0 <= inst < len(span) else 0.0
            else:
                left[ref] = float(tr.transfer[inst]) if inst >= 0 else float(tr.dur[ref])
        elif kind == NEED:
            left.pop(ref, None)
        reach = max(left.values(), default=0.0)
        out.append(compute * min(1.0, reach / work) if work > 0 else 0.0)
        for row in left:
            left[row] = max(0.0, left[row] - work)
    return out


def _steps(lane) -> list[int | None]:
    """Per key, its step index (None: outside the steps)."""
    out, cur = [], None
    for kind, ref in zip(lane.kind, lane.ref):
        if kind == BOUND:
            cur = ref // 2 if ref % 2 == 0 else None
        out.append(cur)
    return out


def slow(traced: Traced, new: Traced, factors: dict[int, float], crowded: dict | None = None,
         scaled: float = 1.0) -> list[str]:
    """Rewrite ``new`` (a rewritten copy of ``traced``) in place for the compute its change puts
    beside communication or takes away from it; a note per rank that changed. ``crowded``: rank
    -> :class:`~overlapprof.analysis.replay.cores.Crowded` for the ranks on a crowded CPU host:
    a rank without a factor is charged the cores' share of the transfers where it is measured
    (over loopback: the copying its compute is moved beside); a loopback rank with one, the
    larger of the two (charged for compute moved beside, given back for compute moved away).
    ``scaled``: the factor the change multiplied every lane's compute by (``compute=xF``): the
    compute the trace measured beside communication was measured there, slowed or not, so scaled
    it stays as measured, and only ``O' − F × O`` has moved."""
    notes = []
    crowded = crowded or {}
    traced_copy = None
    for r, lane in new.lanes.items():
        f = factors.get(r)
        old = traced.lanes.get(r)
        if old is None:
            continue
        o_old, o_new = [scaled * o for o in _per_step(old, beside(traced, old))], beside(new, lane)
        c = crowded.get(r)
        share = c.share if c is not None else None
        copies = c is not None and c.rates is not None and share is not None  # over loopback
        charge = (1 - 1 / f if not copies else max(1 - 1 / f, share)) if f else share  # None: not measured
        q_old = q_new = None  # over loopback: the compute beside the operations' copying
        if copies:
            if traced_copy is None:
                traced_copy = copy_time(traced, c.rates)
            q_old = [scaled * q for q in _per_step(old, beside(traced, old, traced_copy))]
            q_new = beside(new, lane, copy_time(new, c.rates))
        if charge is None:
            more = (sum(o_new) - sum(o_old)) / max(len(lane.steps), 1)
            if more > 0.01 * max(sum(lane.work) / max(len(lane.steps), 1), 1e-9):
                notes.append(f"interference: rank {r}'s trace measures no slowdown of its compute beside communication "
                             f"(none ran beside it, or none ran slower): the {more / 1000:.3f} ms a step this change "
                             "moves beside it are not charged (on a CPU run whose ranks and backend threads outnumber "
                             "the cores, it will run slower than predicted)")
            continue
        steps = _steps(lane)
        moved = 0.0
        shift = 0.0
        for k in range(len(lane.steps)):
            keys = [j for j, s in enumerate(steps) if s == k]
            shift += sum(o_new[j] for j in keys) - o_old[k]
            if q_new is None:
                delta = charge * (sum(o_new[j] for j in keys) - o_old[k])
            else:
                delta = sum(q_new[j] for j in keys) - q_old[k]
                if f:  # the larger rate: charged for compute moved beside, given back for compute moved away
                    by_factor = (1 - 1 / f) * (sum(o_new[j] for j in keys) - o_old[k])
                    delta = max(delta, by_factor) if by_factor >= 0 else min(delta, by_factor)
            if abs(delta) < 1e-9:
                continue
            weights = [o_new[j] if delta > 0 else lane.compute[j] - o_new[j] for j in keys]
            total = sum(weights)
            if total <= 0:
                continue
            for j, w in zip(keys, weights):
                add = max(delta * w / total, -lane.compute[j])
                lane.work[j] += add
                lane.compute[j] += add
            moved += delta
        if abs(moved) > 1e-6:
            what = "the copying it is moved beside" if q_new is not None else "that share"
            if f and (q_new is not None or charge > 1 - 1 / f):
                why = (f"runs {f:.2f}x as long beside communication (measured); {c.words()}: charged {what} where "
                       "that is more")
            elif f:
                why = f"runs {f:.2f}x as long beside communication (measured)"
            else:
                why = f"is not measured beside communication; {c.words()}: charged {what}"
            notes.append(f"interference: rank {r}'s compute {why}: {moved / len(lane.steps) / 1000:+.3f} ms a step for "
                         f"the compute this change moves {'beside' if shift > 0 else 'away from'} it")
    return notes


def _per_step(lane, values: list[float]) -> list[float]:
    out = [0.0] * len(lane.steps)
    for s, v in zip(_steps(lane), values):
        if s is not None:
            out[s] += v
    return out
