"""What the rules read from a run: its causes of exposure per step (overall and per kind of
communication), its late ranks, its blocking operations, and who ran it (a run of
``overlapprof run``, with its workload's options, or a user's own job).

Every time is µs a step: the mean over the run's (rank, step) pairs (means, unlike medians, add
up: the causes sum to the exposed communication a step).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from statistics import median

from overlapprof.analysis.exposure.late import extra_work, late_steps
from overlapprof.analysis.rank.classify import KINDS
from overlapprof.analysis.replay.timeline import BOUND, ISSUE, NEED, Traced
from overlapprof.report import CAUSES, Report


@dataclass
class Blocking:
    """A blocking operation (no compute between its issue and its need) of one rank: its row,
    kind, ordinal among its step's operations of that kind (1-based), step index, and duration."""

    row: int
    kind: str
    ordinal: int
    step: int
    dur_us: float


@dataclass
class Facts:
    pairs: int  # (rank, step) pairs
    step_us: float  # the traced step, median over the pairs
    exposed_us: float
    cause_us: dict[str, float]  # cause -> µs a step
    kind_cause_us: dict[str, dict[str, float]]  # kind -> cause -> µs a step
    late_us: dict[int, float]  # late rank -> µs a step the others waited for it (the most-waiting rank's)
    late_activity: dict[str, float]  # compute/comm/other -> share of the late ranks' time
    # late rank -> per step of (µs waited for it − µs waited for the most-waited other rank): a
    # straggler is late step after step (late.not_steady); ranks that take turns (noise) are not
    late_net_us: dict[int, list[float]] = field(default_factory=dict)  # per step number, ascending
    spread_us: float = 0.0  # the traced steps' median deviation from the median step
    extra_us: dict[int, list[float]] = field(default_factory=dict)  # rank -> per step, its work − the others' median
    blocking: dict[int, list[Blocking]] = field(default_factory=dict)  # rank -> its blocking operations
    kinds: set[str] = field(default_factory=set)  # kinds of operation in the trace
    workload: str | None = None  # an `overlapprof run` directory's workload; None: a user's own job
    variant: str | None = None
    options: dict = field(default_factory=dict)  # the workload's options, defaults applied
    said: dict[str, str] = field(default_factory=dict)  # words read from the trace (terms.prepare)

    def share(self, us: float) -> float:
        return us / self.step_us if self.step_us > 0 else 0.0


def read(report: Report, tr: Traced, step_us: float) -> Facts:
    """The Facts of ``report`` and its Traced ``tr``; ``step_us`` the traced step."""
    steps = [s for r in report.ranks for s in r.steps]
    n = max(len(steps), 1)
    cause = {c: sum(getattr(s.exposure, f"{c}_us") for s in steps if s.exposure) / n for c in CAUSES}
    kinds: dict[str, dict[str, float]] = {}
    for r in report.ranks:
        for k in r.kinds:
            if k.exposure is None:
                continue
            row = kinds.setdefault(k.kind, {c: 0.0 for c in CAUSES})
            for c in CAUSES:
                row[c] += getattr(k.exposure, f"{c}_us") / n
    late, late_net = late_steps(report.ranks)
    traced = [v for lane in tr.lanes.values() for v in lane.measured_steps]
    activity: dict[str, float] = {}
    for r in report.ranks:
        if r.exposure:
            for a, us in r.exposure.late_peer_activity.items():
                activity[a] = activity.get(a, 0.0) + us
    total = sum(activity.values())
    run = report.run or {}
    options = dict(run.get("options") or {})
    # `overlapprof run` records every option with its default, the common ones (overlapprof.workload's
    # COMMON_OPTIONS: slow_rank, slow_ms) too; overlapprof.profile records the user's own options only
    launched = "slow_rank" in options and "slow_ms" in options
    return Facts(pairs=len(steps), step_us=step_us, exposed_us=sum(cause.values()), cause_us=cause,
                 kind_cause_us=kinds, late_us=late, late_net_us=late_net,
                 spread_us=median([abs(v - step_us) for v in traced]) if traced else 0.0,
                 extra_us=extra_work({r: dict(zip(lane.steps, lane.step_work())) for r, lane in tr.lanes.items()}),
                 late_activity={a: us / total for a, us in activity.items()} if total > 0 else {},
                 blocking={r: _blocking(tr, lane) for r, lane in tr.lanes.items()},
                 kinds={KINDS[int(k)] for k in set(tr.kind.tolist())},
                 workload=((run.get("workload") or {}).get("name") or None) if launched else None,
                 variant=run.get("variant") or None, options=options)


def _blocking(tr: Traced, lane) -> list[Blocking]:
    out, issued, cum, step = [], {}, 0.0, None
    ordinal: dict[str, int] = {}
    for kind, ref, c in zip(lane.kind, lane.ref, lane.compute):
        if kind == BOUND:
            step = ref // 2 if ref % 2 == 0 else None
            ordinal = {}
        elif kind == ISSUE:
            name = KINDS[int(tr.kind[ref])]
            ordinal[name] = ordinal.get(name, 0) + 1
            issued[ref] = (cum, ordinal[name], step)
        elif kind == NEED and ref in issued and step is not None:
            at, k, s = issued[ref]
            if cum - at <= 0:
                out.append(Blocking(row=ref, kind=KINDS[int(tr.kind[ref])], ordinal=k, step=s,
                                    dur_us=float(tr.end[ref] - tr.start[ref])))
        cum += c
    return out
