"""The traced steps as the replay reads them (:class:`Traced`): each rank's *lane* of keys, and the
operations with what the replay keeps of them.

A rank's lane is the thread that issues its communication and waits for it (CPU: the issuing
thread; GPU: its host launches and the ends of the operations it waits for), read as an ordered
list of keys on the run's common clock:

- ``BOUND``: a ProfilerStep's start or end;
- ``ISSUE i``: operation *i* issued (``a_i``, OVERLAP.md 6.1);
- ``NEED i``: its result needed (``n_i``): the lane waits there until the operation ends.

After each key the lane does ``work`` µs (``compute`` of it in its compute union, less the time
its threads spent inside their communication calls: :func:`_outside_calls`) before the next key:
the measured gap, less the time the lane sat blocked in a need. A need is placed after the last
other key before the operation's end (a key inside ``[n_i, e_i)`` means the lane was not
blocked there, whatever ``n_i`` said), so the blocked time is exactly ``[n_i, e_i)`` less what
another need already blocked. Replaying these keys with the measured operation ends gives every
key its measured time back, so the traced steps are reproduced.

Per operation the replay keeps: its instance (matched across ranks; -1 none), its own
``lead`` (start − the later of its issue and, on a collective channel whose operations ran in
order, its predecessor's end: ``prev``; where it started only as an earlier operation still
running at its issue ended, that one's: it waited for the backend's worker thread, gloo's two
a group, and starts when that one ends in the replay too), its ``tail`` (end − the instance's
latest start − the instance's transfer; unmatched: end − start − its duration, 0; where the
row's data had moved before its lane came to wait for it, 0, and ``seen``, the µs from that need
to its end: see :func:`_seen`), and per instance the measured transfer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from overlapprof.analysis import intervals as iv
from overlapprof.analysis.rank.classify import KINDS

BOUND, ISSUE, NEED = 0, 1, 2  # key types, also their order at one instant
SEND_RECV = KINDS.index("send_recv")


@dataclass
class Lane:
    """One rank's keys in order: ``t`` (measured µs, common clock), ``kind`` (BOUND/ISSUE/NEED),
    ``ref`` (operation row, or for BOUND ``2 * step index`` (+1 for its end)), ``work`` and
    ``compute`` after each key. ``steps``: the step numbers of the rank's report, in order."""

    rank: int
    t: list[float]
    kind: list[int]
    ref: list[int]
    work: list[float]
    compute: list[float]
    steps: list[int]
    measured_steps: list[float]

    def step_work(self) -> list[float]:
        """Σ work per step (its keys between the step's start and end)."""
        return self.per_step(self.work)

    def per_step(self, values) -> list[float]:
        """Σ ``values`` (one per key of the lane) per step: the keys between the step's start and end."""
        return [sum((values[j] for j in keys), 0.0) for keys in step_pieces(self)]


def work_positions(lane) -> list[float]:
    """The lane's cumulative work at each key (reset at each step's start)."""
    out, acc = [], 0.0
    for kind, ref, w in zip(lane.kind, lane.ref, lane.work):
        if kind == BOUND and ref % 2 == 0:
            acc = 0.0
        out.append(acc)
        acc += w
    return out


def position(lane, step: int, at: float) -> float | None:
    """The lane's work position (µs of work since step ``step`` began) at time ``at`` (its clock);
    None outside the step."""
    pos = work_positions(lane)
    start = next(j for j, (k, r) in enumerate(zip(lane.kind, lane.ref)) if k == BOUND and r == 2 * step)
    if at < lane.t[start]:
        return None
    for j in range(start, len(lane.t)):
        if lane.kind[j] == BOUND and lane.ref[j] == 2 * step + 1:
            return None
        nxt = lane.t[j + 1] if j + 1 < len(lane.t) else float("inf")
        if lane.t[j] <= at < nxt:
            return pos[j] + min(at - lane.t[j], lane.work[j])
    return None


def step_pieces(lane) -> list[list[int]]:
    """Per step, the indexes of its keys (from its start to before its end)."""
    out, cur = [[] for _ in lane.steps], None
    for j, (kind, ref) in enumerate(zip(lane.kind, lane.ref)):
        if kind == BOUND:
            cur = ref // 2 if ref % 2 == 0 else None
        if cur is not None:
            out[cur].append(j)
    return out


@dataclass
class Traced:
    """All ranks' lanes and the operations' columns (rows of the cross-rank matching's
    operations; times on the common clock). ``prev``: the row an operation queued behind on its
    collective channel (-1: none); ``transfer``: per instance, the measured transfer (µs)."""

    lanes: dict[int, Lane]
    rank: np.ndarray
    kind: np.ndarray
    issue: np.ndarray
    start: np.ndarray
    end: np.ndarray
    dur: np.ndarray
    nbytes: np.ndarray
    group_size: np.ndarray
    step: np.ndarray
    inst: np.ndarray
    lead: np.ndarray
    tail: np.ndarray
    prev: np.ndarray
    transfer: np.ndarray
    members: list[np.ndarray]
    warm: np.ndarray
    mode: str
    notes: list[str] = field(default_factory=list)
    compute: dict = field(default_factory=dict)  # rank -> its compute union on the common clock
    direction: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))  # 0 none, 1 send, 2 recv
    peer: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))  # send/recv's other rank, -1 unknown
    # per row, µs from its need to its end where it ended only when its lane came to wait for it
    # (its data moved before; 0: not so, and any row past its size)
    seen: np.ndarray = field(default_factory=lambda: np.zeros(0))


def _channels(ops, rows: np.ndarray, mode: str) -> np.ndarray:
    if mode == "gpu":
        return ops.group[rows] * (1 << 32) + ops.thread[rows]
    return ops.group[rows].astype(np.int64)


def _empty(reports, inputs) -> Traced:
    """No communication operation: lanes of steps alone."""
    z, zi = np.empty(0), np.empty(0, dtype=np.int64)
    lanes = {r: _lane(r, reports[r], _outside_calls(inputs[r], 0.0), 0.0, zi, z, z, z) for r in sorted(reports)
             if r in inputs and reports[r].steps}
    return Traced(lanes, zi, zi, z, z, z, z, z, zi, zi, zi, z, z, zi, z, [], np.empty(0, dtype=bool), "cpu")


def traced(reports, inputs, matching) -> Traced:
    """The Traced of a run: ``reports`` rank -> RankReport (with steps), ``inputs`` rank ->
    ExposureInput (its compute union), ``matching`` the cross-rank Matching (None: no operation).

    An operation's result is taken as needed at the end of the last compute that started before
    it ended (the lane computed that far beside it; a blocking call: its issue), on CPU ranks no
    later than the end of its issuing thread's last activity before it ended (the analysis's need:
    the backend's own copies on its worker thread are compute, not the lane computing), and on
    GPUs where CUDA event-sync records say, where they say. GPU ranks are replayed on the device's
    clock: an operation is issued where its kernels start (the host's launch runs ahead)."""
    if matching is None:
        return _empty(reports, inputs)
    ops, x = matching.ops, matching.measured
    shift = matching.row_shift
    gpu = np.isin(ops.rank, [r for r, e in inputs.items() if e.mode == "gpu"])
    issue_raw = np.where(gpu, ops.ts, np.minimum(ops.issue, ops.ts))
    need_raw = np.where(gpu, ops.need, np.nan)
    for r, e in inputs.items():
        rows = np.flatnonzero((ops.rank == r) & np.isnan(need_raw))
        cs, ce = e.compute
        at = np.searchsorted(cs, ops.end[rows], side="left") - 1
        need_raw[rows] = np.fmin(np.where(at >= 0, ce[np.maximum(at, 0)], -np.inf), ops.need[rows])
    need_raw = np.clip(np.where(np.isnan(need_raw), ops.end, need_raw), issue_raw, ops.end)
    start, end = ops.ts + shift, ops.end + shift
    issue, need = issue_raw + shift, need_raw + shift
    n = len(ops)
    inst = x.inst_of.copy()
    members = matching.matched.instances()
    latest = np.array([start[m].max() for m in members]) if members else np.empty(0)
    transfer = np.asarray(x.transfer, dtype=float).copy()
    tail = np.zeros(n)
    matched = inst >= 0
    tail[matched] = end[matched] - latest[inst[matched]] - transfer[inst[matched]]
    prev = np.full(n, -1, dtype=np.int64)
    lead = start - issue
    modes = {r: inputs[r].mode for r in inputs}
    mode = "gpu" if "gpu" in modes.values() else "cpu"
    for r in sorted(reports):
        rows = np.flatnonzero(ops.rank == r)
        rows = rows[np.argsort(issue[rows], kind="stable")]
        coll = rows[ops.kind[rows] != SEND_RECV]
        ch = _channels(ops, coll, modes.get(r, "cpu"))
        last: dict[int, int] = {}
        running: dict[int, list[int]] = {}  # per channel, its earlier rows not ended by the latest issue
        for row, c in zip(coll.tolist(), ch.tolist()):
            p = last.get(c)
            live = running[c] = [q for q in running.get(c, []) if end[q] > issue[row]]
            if p is not None and start[row] >= end[p]:  # it ran after its predecessor: in order
                prev[row] = p
                lead[row] = start[row] - max(issue[row], end[p])
            else:  # it waited for a worker thread (gloo: two a group): started as an earlier one ended
                held = [q for q in live if end[q] <= start[row]]
                if held:
                    q = max(held, key=lambda x: end[x])
                    prev[row] = q
                    lead[row] = start[row] - end[q]
            live.append(row)
            last[c] = row
    lanes, compute = {}, {}
    for r in sorted(inputs):
        sh = matching.shift.get(r, 0.0)
        compute[r] = (inputs[r].compute[0] + sh, inputs[r].compute[1] + sh)
        if r in reports and reports[r].steps:
            rows = np.flatnonzero(ops.rank == r)
            lanes[r] = _lane(r, reports[r], _outside_calls(inputs[r], sh), sh, rows, issue, need, end)
    seen = _seen(lanes, inst, tail, end, latest, transfer, prev)
    return Traced(compute=compute, lanes=lanes, rank=ops.rank.copy(), kind=ops.kind.astype(np.int64), issue=issue, start=start,
                  end=end, dur=ops.dur.copy(), nbytes=ops.nbytes.copy(), group_size=ops.group_size.copy(),
                  step=ops.step.copy(), inst=inst, lead=lead, tail=tail, prev=prev, transfer=transfer,
                  members=members, warm=np.asarray(x.warm, dtype=bool), mode=mode,
                  direction=ops.direction.astype(np.int64), peer=ops.peer.astype(np.int64), seen=seen)


def _outside_calls(e, shift: float):
    """A rank's compute union less the time its threads spent inside their own communication
    calls (CPU mode: :attr:`ExposureInput.calls`), on the common clock: what its lane computes.
    The op that encloses a call (an autograd node whose hook issues a reduce-scatter, or waits
    an all-gather) is compute in the analysis, but its time inside the call is issuing,
    copying or waiting, which a faster or slower device does not scale."""
    cs, ce = e.compute
    if e.calls[0].size:
        cs, ce = iv.difference((cs, ce), e.calls)
    return cs + shift, ce + shift


def _seen(lanes, inst, tail, end, latest, transfer, prev) -> np.ndarray:
    """Rows whose data had moved (the instance's latest start + transfer) by the time their lane
    came to wait for them, and that still ended after: their end is where the lane saw them
    done (CPU: gloo completes an async send when the host waits), not a part of the transfer.
    Their tail is set to 0 in place and the µs from the need to the end returned: the replay
    ends them at the later of their transfer's end and their replayed need + those µs, so a
    change that moves the need moves the end with it. A row another waits for on its channel
    keeps its tail (its end is when the next one started)."""
    seen = np.zeros(tail.size)
    chained = set(prev[prev >= 0].tolist())
    for lane in lanes.values():
        for at, kind, row in zip(lane.t, lane.kind, lane.ref):
            if kind != NEED or tail[row] <= 0 or row in chained or inst[row] < 0:
                continue
            if at >= latest[inst[row]] + transfer[inst[row]]:
                seen[row] = end[row] - at
                tail[row] = 0.0
    return seen


def _lane(rank: int, report, compute, shift: float, rows, issue, need, end) -> Lane:
    keys: list[tuple[float, int, int]] = []
    for k, s in enumerate(report.steps):
        keys.append((s.start_us + shift, BOUND, 2 * k))
        keys.append((s.start_us + s.step_us + shift, BOUND, 2 * k + 1))
    keys += [(float(issue[r]), ISSUE, int(r)) for r in rows]
    keys.sort()
    others = np.array([k[0] for k in keys])
    needs = []
    for r in rows.tolist():
        at = float(need[r])
        before = int(np.searchsorted(others, end[r], side="left")) - 1  # the last other key before the end
        if before >= 0 and others[before] > at:
            at = float(others[before])
        needs.append((at, NEED, r))
    keys = sorted(keys + needs)
    t = np.array([k[0] for k in keys])
    blocked = np.empty(t.size)
    reach = -np.inf
    for j, (at, kind, ref) in enumerate(keys):
        if kind == NEED:
            reach = max(reach, float(end[ref]))
        blocked[j] = max(at, reach)
    nxt = np.append(t[1:], t[-1])
    lo = np.minimum(blocked, nxt)
    work = np.maximum(nxt - lo, 0.0)
    compute = iv.covered(compute, lo, nxt) if t.size else np.empty(0)
    return Lane(rank=rank, t=t.tolist(), kind=[k[1] for k in keys], ref=[k[2] for k in keys], work=work.tolist(),
                compute=np.minimum(compute, work).tolist(), steps=[s.step for s in report.steps],
                measured_steps=[s.step_us for s in report.steps])
