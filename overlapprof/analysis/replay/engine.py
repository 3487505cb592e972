"""The replay: every rank's lane walked key by key, the operations resolved across ranks.

Rules (times µs on the common clock; primes are replayed values):

- a lane's time advances by each key's ``work``; at ``ISSUE i`` the operation is issued
  (``a'_i``); at ``NEED i`` the lane waits until ``e'_i`` (the blocked time is exposed
  communication, given a cause below);
- an operation starts at ``s'_i = max(a'_i, e'_prev) + lead_i`` (``prev``: its predecessor on a
  collective channel whose operations ran in order; none: ``a'_i``);
- a matched instance moves its data once all its ranks have started: each rank's operation
  ends at ``max(s'_i, max_r s'_r + transfer' + tail_i)`` (a collective ends when its last rank's
  transfer ends); an unmatched operation at ``s'_i + dur'_i``; an operation whose end the trace
  saw only when its lane came to wait (``seen``) is waited for until the later of that and the
  replayed need + its ``seen`` µs.

Causes of each blocked µs, in OVERLAP.md's precedence: ``late_peer`` (before the instance's
latest start, named after that rank), ``queued`` (before its start, behind its channel),
``no_window`` (no compute on the lane between its issue and its need) or ``window_short``.

A cycle (a lane waiting on an instance whose other rank waits on this lane, which a bad match
can make) is broken at the earliest such instance, its missing ranks started at their measured
lead over their lane's time, and counted in ``forced``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from overlapprof.analysis.replay.timeline import ISSUE, NEED, Traced
from overlapprof.errors import InputError

PARTS = ("compute", "other", "late_peer", "queued", "no_window", "window_short")


@dataclass
class RankSteps:
    """One rank's replayed steps: durations and, per step, µs of each of :data:`PARTS`;
    ``late_by_rank``: per step, late rank -> µs."""

    step_us: list[float]
    parts: dict[str, list[float]]
    late_by_rank: list[dict[int, float]]


@dataclass
class Replayed:
    ranks: dict[int, RankSteps]
    issue: np.ndarray
    start: np.ndarray
    end: np.ndarray
    forced: int = 0
    notes: list[str] = field(default_factory=list)
    key_t: dict[int, np.ndarray] = field(default_factory=dict)  # rank -> per key, when the work after it began


class _Ops:
    """The operations' replayed times and how one resolving leads to the next."""

    def __init__(self, tr: Traced):
        n = tr.rank.size
        self.tr = tr
        self.a, self.s, self.e = np.full(n, math.nan), np.full(n, math.nan), np.full(n, math.nan)
        self.started = [0] * len(tr.members)
        self.latest = [-math.inf] * len(tr.members)
        self.last_rank = [-1] * len(tr.members)
        self.after: dict[int, list[int]] = {}
        for row, p in enumerate(tr.prev.tolist()):
            if p >= 0:
                self.after.setdefault(p, []).append(row)
        self.prev, self.lead, self.inst = tr.prev.tolist(), tr.lead.tolist(), tr.inst.tolist()

    def issue(self, row: int, at: float) -> None:
        self.a[row] = at
        self._try_start(row)

    def _try_start(self, row: int) -> None:
        if not math.isnan(self.s[row]) or math.isnan(self.a[row]):
            return
        p = self.prev[row]
        if p >= 0 and math.isnan(self.e[p]):
            return
        self.s[row] = max(self.a[row], self.e[p] if p >= 0 else -math.inf) + self.lead[row]
        self.started_now(row)

    def started_now(self, row: int) -> None:
        k = self.inst[row]
        if k < 0:
            self._ended(row, self.s[row] + self.tr.dur[row])
            return
        self.started[k] += 1
        if self.s[row] > self.latest[k]:
            self.latest[k], self.last_rank[k] = self.s[row], int(self.tr.rank[row])
        if self.started[k] == len(self.tr.members[k]):
            done = self.latest[k] + self.tr.transfer[k]
            for m in self.tr.members[k].tolist():
                self._ended(m, max(self.s[m], done + self.tr.tail[m]))

    def _ended(self, row: int, at: float) -> None:
        self.e[row] = at
        for nxt in self.after.get(row, ()):
            self._try_start(nxt)


def replay(tr: Traced) -> Replayed:
    """Replay ``tr`` (see the module docstring)."""
    ops = _Ops(tr)
    lanes = tr.lanes
    for row in np.flatnonzero(~np.isin(tr.rank, list(lanes))).tolist():  # ranks not replayed: as measured
        ops.issue(row, float(tr.issue[row]))
    cur = {r: 0 for r in lanes}
    tau = {r: (lane.t[0] if lane.t else 0.0) for r, lane in lanes.items()}
    cum = {r: 0.0 for r in lanes}
    issued_cum: dict[int, float] = {}
    step_of = {r: None for r in lanes}
    bounds = {r: [math.nan] * (2 * len(lane.steps)) for r, lane in lanes.items()}
    parts = {r: {p: [0.0] * len(lane.steps) for p in PARTS} for r, lane in lanes.items()}
    late_by = {r: [{} for _ in lane.steps] for r, lane in lanes.items()}
    key_t = {r: np.full(len(lane.t), math.nan) for r, lane in lanes.items()}
    forced = 0
    while True:
        moved = False
        for r, lane in lanes.items():
            j, t = cur[r], tau[r]
            n = len(lane.t)
            while j < n:
                kind, ref = lane.kind[j], lane.ref[j]
                if kind == NEED:
                    end = ops.e[ref]
                    if math.isnan(end):
                        break
                    if ref < tr.seen.size:  # an end seen only when the lane came to wait
                        end = max(end, t + tr.seen[ref])
                    if end > t and step_of[r] is not None:
                        _blocked(ops, ref, t, end, cum[r] - issued_cum.get(ref, cum[r]), parts[r], late_by[r],
                                 step_of[r])
                    t = max(t, end)
                elif kind == ISSUE:
                    issued_cum[ref] = cum[r]
                    ops.issue(ref, t)
                else:
                    bounds[r][ref] = t
                    step_of[r] = ref // 2 if ref % 2 == 0 else None
                k = step_of[r]
                if k is not None:
                    parts[r]["compute"][k] += lane.compute[j]
                    parts[r]["other"][k] += lane.work[j] - lane.compute[j]
                cum[r] += lane.compute[j]
                key_t[r][j] = t
                t += lane.work[j]
                j += 1
            moved |= j != cur[r]
            cur[r], tau[r] = j, t
        if all(cur[r] == len(lane.t) for r, lane in lanes.items()):
            break
        if not moved:
            _force(ops, tr, lanes, cur, tau)
            forced += 1
    ranks = {}
    for r, lane in lanes.items():
        b = bounds[r]
        ranks[r] = RankSteps(step_us=[b[2 * k + 1] - b[2 * k] for k in range(len(lane.steps))], parts=parts[r],
                             late_by_rank=late_by[r])
    notes = [f"replay: {forced} waits across ranks formed a cycle (operations matched out of order?) and were "
             "broken at their measured times"] if forced else []
    return Replayed(ranks, ops.a, ops.s, ops.e, forced, notes, key_t)


def _blocked(ops: _Ops, row: int, lo: float, hi: float, slack: float, parts, late_by, k: int) -> None:
    inst = ops.inst[row]
    if inst >= 0 and ops.latest[inst] > ops.s[row] and ops.last_rank[inst] != ops.tr.rank[row]:
        late = max(0.0, min(hi, ops.latest[inst]) - lo)
        if late > 0:
            parts["late_peer"][k] += late
            who = ops.last_rank[inst]
            late_by[k][who] = late_by[k].get(who, 0.0) + late
            lo += late
    queued_until = ops.s[row] - ops.lead[row]  # when its channel let it go
    if ops.prev[row] >= 0 and queued_until > ops.a[row] and lo < queued_until:
        q = min(hi, queued_until) - lo
        parts["queued"][k] += q
        lo += q
    if hi > lo:
        parts["no_window" if slack <= 0 else "window_short"][k] += hi - lo


def _force(ops: _Ops, tr: Traced, lanes, cur, tau) -> None:
    """Break a cycle: the blocked need whose instance ends first (measured) gets its missing
    ranks started at their measured lead over where their lanes are."""
    waiting = [lane.ref[cur[r]] for r, lane in lanes.items() if cur[r] < len(lane.t) and lane.kind[cur[r]] == NEED]
    pending = [row for row in waiting if ops.inst[row] >= 0]
    if not pending:
        raise InputError("replay: every rank waits on an operation no rank can start (operations matched out of "
                         "order across ranks?)")
    row = min(pending, key=lambda x: tr.end[x])
    for m in tr.members[ops.inst[row]].tolist():
        if math.isnan(ops.s[m]):
            r = int(tr.rank[m])
            lane = lanes.get(r)
            delay = tau[r] - lane.t[cur[r]] if lane is not None and cur[r] < len(lane.t) else 0.0
            ops.a[m] = tr.issue[m] + delay
            ops.s[m] = tr.start[m] + delay
            ops.started_now(m)
