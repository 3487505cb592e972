"""``micro_batches=N``: a pipeline's step replayed with its batch cut into N micro-batches, not M.

What the trace must hold, per rank and step: its send/recv operations fall into groups by
direction and peer, in pairs (sends to q, receives from q) whose issues are phase-separated (every
issue of one group before every issue of the other: the activations go one way, then their
gradients come back, GPipe's fill and drain), each group holding the same M ≥ 2 operations, and
the i-th send of a pair matched with the i-th receive on its peer. A ring (a send and a receive
per hop, alternating) or a trace without send/recv is refused.

The rewrite, per rank and step, on the lane's *work positions* (the work done since the step
began, as :mod:`.buckets` reads them):

- a group's keys of one type (issues, or needs) sit at positions ``P_0 .. P_(M−1)``. A send's
  key closes its micro-batch's piece of the group's stretch of work (the work before it made the
  data: a forward, then its send), which starts at ``P_0 − (P_(M−1) − P_0) / (M − 1)``; a
  receive's key opens it (the work after it needs the data), the stretch ending as far after
  ``P_(M−1)``. A stretch never reaches past the keys around the group (a backward's receives
  start after the forward's last send). The N new keys cut the same stretch into N pieces: at
  the piecewise-linear interpolation of the positions at ``(j + 1) / N`` (sends) or ``j / N``
  (receives), j = 0 .. N−1. A need is never before its own issue;
- the step's compute is kept as it was traced, position by position (the batch is the same, cut
  finer or coarser), except the share of the micro-batches' compute its ops without the rows
  took (:mod:`.percall`: the weights' gradient accumulation, autograd's nodes; from the ops'
  recorded shapes, per rank and step): that share, like the rest of the work inside the
  micro-batches' stretch (host code: a micro-batch's Python, dispatch), is paid per
  micro-batch: × N/M. (Measured, loaded: the small pipeline of the tests, 8 → 4 micro-batches,
  +16.1% error without the host work's, +2.1% with it; 4 → 8, −21.1% and +0.5%.) So is the
  compute beyond M pieces of each pass at its least hindered (:func:`_stalled`: stalls, met once
  a micro-batch). How an op with the rows runs at another row count (a matmul's speed at small
  sizes) is not scaled;
- new operation j copies traced operation ``ceil((j + 1) M / N) − 1`` (its lead, tail, peer,
  instance's partner), with ``M / N`` of its bytes: send j of one rank is matched with receive j
  of its peer, as the workload sends and receives in the same order. Of its transfer ``x`` only
  what the bytes took moves with them: at most ``u``, the 10th percentile of the transfers of its
  size seen to end (:func:`_bytes_part`); the rest, ``x − u`` (or the transfer model's latency
  where larger), is the hand-over's own (a blocked rank's wake-up on shared cores, gloo's
  handshake), paid per micro-batch whatever its bytes. The new transfer is ``rest + (x − rest)
  × M / N``. (Measured: the sync pipeline's hand-overs of 128 KiB took 0.09-12 ms in one step
  under load; scaled whole, 8 → 16 micro-batches predicted 37 ms a step of blocked hand-overs on
  rank 0 where its run blocked 85, now 102.) Where the traced instance's end was seen at a
  rank's wait (an async receive posted early and waited late: gloo ends its span at the
  ``wait()``), ``x`` is when the program looked, not what the data took: ``x`` is then ``u`` at
  most, and the new row ends no earlier than its replayed need + the µs the traced one took
  after its need (:func:`_seen_at_wait`; the async pipeline traced with 16 micro-batches
  predicted 8 at +108%, loaded, with the wait-bound transfers × 2, and −1.6% without).

With N = M the traced steps come back unchanged. The replay then resolves the new operations
across ranks, so the pipeline's fill and drain (stage 1 waits for stage 0's first micro-batch,
stage 0 for stage 1's first gradient) follow from the schedule, as in the trace.
"""

from __future__ import annotations

import math

import numpy as np

from overlapprof.analysis.replay.buckets import Refused
from overlapprof.analysis.replay.timeline import BOUND, ISSUE, NEED, SEND_RECV, Traced

SEND, RECV = 1, 2


def _steps(lane) -> list[tuple[int, int]]:
    """Per step index, the key indexes of its start and end BOUND."""
    out = [[-1, -1] for _ in lane.steps]
    for j, (kind, ref) in enumerate(zip(lane.kind, lane.ref)):
        if kind == BOUND:
            out[ref // 2][ref % 2] = j
    return [tuple(x) for x in out]


def _groups(tr: Traced, lane, s: int, e: int) -> dict[tuple[int, int], list[int]]:
    """(direction, peer) -> the send/recv rows issued in keys [s, e), in order."""
    out: dict[tuple[int, int], list[int]] = {}
    for kind, ref in zip(lane.kind[s:e], lane.ref[s:e]):
        if kind == ISSUE and tr.kind[ref] == SEND_RECV:
            out.setdefault((int(tr.direction[ref]), int(tr.peer[ref])), []).append(ref)
    return out


def _check(tr: Traced, rank: int, number: int, groups) -> int:
    """The traced micro-batches M of one rank's step; Refused unless a pipeline's."""
    where = f"rank {rank}, step {number}"
    if any(d not in (SEND, RECV) or q < 0 for d, q in groups):
        raise Refused(f"{where}: send/recv operations whose direction or peer the trace does not say")
    counts = {len(rows) for rows in groups.values()}
    if len(counts) != 1 or min(counts) < 2:
        raise Refused(f"{where}: its send/recv groups (by direction and peer) hold {sorted(counts)} operations, not "
                      "the same number of at least 2 micro-batches each")
    for (d, q), rows in groups.items():
        other = groups.get((SEND + RECV - d, q))
        if other is None:
            raise Refused(f"{where}: it {'sends to' if d == SEND else 'receives from'} rank {q} but never "
                          f"{'receives from' if d == SEND else 'sends to'} it (not a pipeline's forward and backward)")
        a, b = (rows, other) if tr.issue[rows[0]] <= tr.issue[other[0]] else (other, rows)
        if tr.issue[a[-1]] > tr.issue[b[0]]:
            raise Refused(f"{where}: its sends to and receives from rank {q} alternate (a ring's hops, not a "
                          "pipeline's forward then backward)")
    return counts.pop()


def _index(tr: Traced, plan) -> None:
    """Refused unless the i-th operation of each group is matched with the i-th of its peer's."""
    at = {}
    for (rank, k), groups in plan.items():
        for g, rows in groups.items():
            for i, row in enumerate(rows):
                at[row] = (rank, g, i)
    for row, (rank, (d, q), i) in at.items():
        inst = int(tr.inst[row])
        if inst < 0:
            raise Refused(f"rank {rank}'s send/recv operations are not all matched across ranks")
        partners = [int(m) for m in tr.members[inst] if int(m) != row]
        if len(partners) != 1 or at.get(partners[0], (None, None, None))[1:] != ((SEND + RECV - d, rank), i):
            raise Refused(f"rank {rank}'s send/recv operations are not matched in order with rank {q}'s (the i-th "
                          "send with the i-th receive)")


def _positions(lane, s: int, e: int) -> tuple[np.ndarray, np.ndarray]:
    """Work and compute done since the step began, at each key s .. e."""
    w = np.concatenate(([0.0], np.cumsum(lane.work[s:e])))
    c = np.concatenate(([0.0], np.cumsum(lane.compute[s:e])))
    return w, c


def _spread(p: np.ndarray, m: int, n: int, floor: float, ceiling: float, opens: bool) -> np.ndarray:
    """The N new positions of M traced ones (see the module docstring). ``opens``: each key
    starts its micro-batch's stretch of work (a receive: the work after it needs its data), else
    closes it (a send: the work before it made its data); the stretch lies in [floor, ceiling],
    the keys before the first and after the last (a backward's receives start after the
    forward's last send)."""
    spacing = (p[-1] - p[0]) / (m - 1)
    if opens:
        knots, values = np.arange(m + 1) / m, np.concatenate((p, [min(ceiling, p[-1] + spacing)]))
        return np.interp(np.arange(n) / n, knots, values)
    knots, values = np.arange(m + 1) / m, np.concatenate(([max(floor, p[0] - spacing)], p))
    return np.interp(np.arange(1, n + 1) / n, knots, values)


def pipeline(tr: Traced) -> bool:
    """Whether every step that issues send/recv operations is a pipeline's (:func:`_check`: per
    peer, the sends and the receives in two runs, a forward then a backward; not a ring's hops)."""
    seen = False
    for rank, lane in tr.lanes.items():
        for k, (s, e) in enumerate(_steps(lane)):
            groups = _groups(tr, lane, s, e)
            if groups:
                try:
                    _check(tr, rank, lane.steps[k], groups)
                except Refused:
                    return False
                seen = True
    return seen


def micro_batches(tr: Traced, n: int, latency: np.ndarray, per_call: dict | None = None) -> tuple[int, list]:
    """Rewrite ``tr`` in place for ``n`` micro-batches a step; the traced M (the largest, when
    steps differ). ``per_call``: rank -> step number -> the share of the micro-batches' compute
    paid per micro-batch (:mod:`.percall`; none: the compute kept). Also returns the stalled
    shares of the rewritten (rank, step)s' micro-batch compute (:func:`_stalled`). Refused when
    the trace is not a pipeline's."""
    pipe = (tr.kind == SEND_RECV)
    if not pipe.any():
        raise Refused("the trace has no send/recv between pipeline stages")
    plan: dict[tuple[int, int], dict] = {}
    for rank, lane in tr.lanes.items():
        for k, (s, e) in enumerate(_steps(lane)):
            groups = _groups(tr, lane, s, e)
            if groups:
                _check(tr, rank, lane.steps[k], groups)
                plan[(rank, k)] = groups
    if not plan:
        raise Refused("no step issues send/recv operations")
    _index(tr, plan)
    least = _least_pieces(tr, plan)
    waited = _seen_at_wait(tr)
    bytes_part = _bytes_part(tr, waited)
    new_rows: list[dict] = []
    new_inst: dict[tuple, int] = {}
    transfers: list[float] = []
    stalls: list[float] = []
    traced_m = 0
    for rank, lane in tr.lanes.items():
        ranges = _steps(lane)
        keys = list(zip(lane.t, lane.kind, lane.ref, lane.work, lane.compute))
        out: list[tuple] = []
        done = 0
        for k, (s, e) in enumerate(ranges):
            groups = plan.get((rank, k))
            if groups is None:
                continue
            m = len(next(iter(groups.values())))
            traced_m = max(traced_m, m)
            out += keys[done:s]
            share = (per_call or {}).get(rank, {}).get(lane.steps[k], 0.0)
            out += _rewrite_step(tr, lane, s, e, groups, m, n, rank, new_rows, new_inst, transfers, latency, waited,
                                 bytes_part, share, least.get(rank), stalls)
            done = e + 1
        out += keys[done:]
        lane.t, lane.kind, lane.ref = [x[0] for x in out], [x[1] for x in out], [x[2] for x in out]
        lane.work, lane.compute = [x[3] for x in out], [x[4] for x in out]
    _append(tr, new_rows, transfers)
    return traced_m, stalls


def _rewrite_step(tr, lane, s, e, groups, m, n, rank, new_rows, new_inst, transfers, latency, waited,
                  bytes_part, share, least, stalls) -> list[tuple]:
    pos, cum = _positions(lane, s, e)
    total = pos[-1]
    where = {}  # (row, kind) -> key index in [s, e]
    for j in range(s, e + 1):
        if lane.kind[j] in (ISSUE, NEED):
            where[(lane.ref[j], lane.kind[j])] = j
    moving = {row for rows in groups.values() for row in rows}
    stretch = (math.inf, -math.inf)  # the positions of the micro-batches' work
    placed = [(0.0, s, 0, BOUND, lane.ref[s]), (total, e, 0, BOUND, lane.ref[e])]
    for j in range(s + 1, e):
        if lane.ref[j] not in moving or lane.kind[j] == BOUND:
            placed.append((pos[j - s], j, 0, lane.kind[j], lane.ref[j]))
    for (d, q), rows in groups.items():
        if any((row, NEED) not in where for row in rows):
            raise Refused(f"rank {rank}: a send/recv of step {lane.steps[lane.ref[s] // 2]} is waited for in "
                          "another step")
        at = {kind: _spread(np.array([pos[where[(row, kind)] - s] for row in rows]), m, n,
                            pos[where[(rows[0], kind)] - s - 1], pos[where[(rows[-1], kind)] - s + 1], d == RECV)
              for kind in (ISSUE, NEED)}
        at[NEED] = np.maximum(at[NEED], at[ISSUE])
        issues = np.array([pos[where[(row, ISSUE)] - s] for row in rows])
        spacing = (issues[-1] - issues[0]) / (m - 1)
        stretch = (min(stretch[0], issues[0] - (0.0 if d == RECV else spacing)),
                   max(stretch[1], issues[-1] + (spacing if d == RECV else 0.0)))
        for j in range(n):
            t = min(m - 1, max(0, math.ceil((j + 1) * m / n) - 1))
            template = rows[t]
            key = (int(tr.step[template]), frozenset({(rank, d, q), (q, SEND + RECV - d, rank)}), j)
            if key not in new_inst:
                inst = int(tr.inst[template])
                x = float(tr.transfer[inst])
                moved = min(x, bytes_part.get(inst, x))  # what its bytes took; the rest is the hand-over's own
                if inst in waited:  # an end seen at a wait: the data's own time, no more
                    x = moved
                lat = max(min(float(latency[inst]) if inst < latency.size else 0.0, x), x - moved)
                new_inst[key] = len(tr.members) + len(transfers)
                transfers.append(lat + (x - lat) * m / n)
            row = tr.rank.size + len(new_rows)
            seen = waited.get(int(tr.inst[template]), {}).get(template)
            new_rows.append(dict(template=template, inst=new_inst[key], scale=m / n, seen=seen))
            for kind in (ISSUE, NEED):
                placed.append((float(at[kind][j]), where[(template, kind)], j, kind, row))
    if least is not None and stretch[1] > stretch[0]:
        inside = float(np.interp(stretch[1], pos, cum) - np.interp(stretch[0], pos, cum))
        stalled = _stalled(inside, m, least)
        stalls.append(stalled)
        share = stalled + (1 - stalled) * share
    placed.sort(key=lambda x: (x[0], x[1], x[2]))  # the start BOUND first, the end last (positions 0, total)
    keys = []
    for a, b in zip(placed, placed[1:] + [None]):
        if b is None:
            work, compute = lane.work[e], lane.compute[e]
        else:
            hi = min(max(b[0], a[0]), total)
            work = hi - a[0]
            compute = min(work, float(np.interp(hi, pos, cum) - np.interp(a[0], pos, cum)))
            inside = max(0.0, min(hi, stretch[1]) - max(a[0], stretch[0]))
            if work > 0:  # the host work and the per-call compute of a micro-batch: N of them, not M
                more = (n / m - 1) * inside / work
                work += (work - compute + share * compute) * more
                compute += share * compute * more
        keys.append((lane.t[s] + a[0], a[3], a[4], max(work, 0.0), max(compute, 0.0)))
    return keys


def _piece_keys(lane, s: int, e: int, rows: list[int], d: int) -> list[int]:
    """The key indexes in [s, e] that bound the group's micro-batch pieces: a send's issue (the
    forward before it made its data), a receive's need (the compute after it uses its data; an
    async receive is posted early, so its issue bounds nothing)."""
    kind = ISSUE if d == SEND else NEED
    at = {lane.ref[j]: j for j in range(s, e + 1) if lane.kind[j] == kind}
    return [at[row] for row in rows if row in at]


def _least_pieces(tr: Traced, plan) -> dict[int, dict[tuple[int, int], float]]:
    """Rank -> (direction, peer) -> the compute of the group's least hindered micro-batch piece
    (the 10th percentile over the trace's steps of the compute between consecutive keys of
    :func:`_piece_keys`), for ranks whose steps talk to one peer (a 2-stage pipeline: the sends'
    pieces are one pass, the receives' the other; a middle stage's forward is both a receive's
    piece and a send's). Every piece of a group does the same work on as many rows, so what one
    takes beyond the least hindered is not its rows' work: a stall of the rank's core (a
    blocked peer's hand-over, the other threads on a pinned core), met once a micro-batch."""
    pieces: dict[int, dict[tuple[int, int], list[float]]] = {}
    one_peer = {r for r, _ in plan} - {r for (r, _), groups in plan.items() if len({q for _, q in groups}) != 1}
    for (rank, k), groups in plan.items():
        if rank not in one_peer:
            continue
        lane = tr.lanes[rank]
        s, e = _steps(lane)[k]
        cum = np.concatenate(([0.0], np.cumsum(lane.compute[s:e])))
        for g, rows in groups.items():
            at = [cum[j - s] for j in _piece_keys(lane, s, e, rows, g[0])]
            pieces.setdefault(rank, {}).setdefault(g, []).extend(np.diff(at).tolist())
    return {rank: {g: float(np.percentile(v, 10)) for g, v in by.items() if v} for rank, by in pieces.items()
            if all(by.values())}


def _stalled(inside: float, m: int, least: dict) -> float:
    """The share of the compute inside the micro-batches' stretch beyond M pieces of each group
    at its least hindered (:func:`_least_pieces`): paid per micro-batch, as the stalls that made
    it are met once a micro-batch."""
    if inside <= 0:
        return 0.0
    return max(0.0, inside - m * sum(least.values())) / inside


def _seen_at_wait(tr: Traced) -> dict[int, dict[int, float]]:
    """The send/recv instances whose measured transfer ended where a rank's lane waited for it:
    an asynchronous operation's span ends at its ``wait()`` (gloo on CPU), so from the latest
    start to that end is when the program looked, not what the data took (async pipelines: a
    stage that lags posts its receives early and waits for micro-batch i long after it came).
    Such an instance is one whose member row was needed after the instance's latest start and
    ended within half its transfer of that need. Instance -> {row: µs from its need to its
    end}. Its new operations transfer what its bytes can have taken (:func:`_bytes_part`) and
    end at the later of that and their replayed need + those µs (``seen``), so their end
    follows the rewritten schedule instead of a fixed µs after their issue (:mod:`.engine`)."""
    need: dict[int, float] = {}
    for lane in tr.lanes.values():
        for t, kind, ref in zip(lane.t, lane.kind, lane.ref):
            if kind == NEED:
                need[ref] = t
    out: dict[int, dict[int, float]] = {}
    for k, rows in enumerate(tr.members):
        if tr.kind[rows[0]] != SEND_RECV:
            continue
        latest = float(np.max(tr.start[rows]))
        x = float(tr.transfer[k])
        at = {int(r): float(tr.end[r]) - need[int(r)] for r in rows.tolist()
              if int(r) in need and need[int(r)] > latest and 0 <= tr.end[r] - need[int(r)] < x / 2}
        if at:
            out[k] = at
    return out


def _bytes_part(tr: Traced, waited) -> dict[int, float]:
    """Per send/recv instance, the most of its transfer its bytes can have taken: the 10th
    percentile of the transfers of its size that were seen to end (not at a wait; warm-up left
    out where others are left; of any size where none of its own), else 0. One step's
    hand-overs of one size move the same bytes yet take from tens of µs to ms (the blocked
    rank's wake-up on shared cores, the handshake): what one takes beyond the least hindered
    ones is not its bytes, and a micro-batch's hand-over pays it whatever its rows."""
    insts = [k for k, rows in enumerate(tr.members) if tr.kind[rows[0]] == SEND_RECV]
    size = {k: float(np.nanmax(tr.nbytes[tr.members[k]])) if not np.isnan(tr.nbytes[tr.members[k]]).all() else -1.0
            for k in insts}
    clean = [k for k in insts if k not in waited and not tr.warm[k]] or [k for k in insts if k not in waited]
    every = float(np.percentile(tr.transfer[clean], 10)) if clean else 0.0
    pace = {b: float(np.percentile([tr.transfer[k] for k in clean if size[k] == b], 10))
            for b in {size[k] for k in clean}}
    return {k: pace.get(size[k], every) for k in insts}


def _append(tr: Traced, rows: list[dict], transfers: list[float]) -> None:
    if not rows:
        return
    t = np.array([r["template"] for r in rows])
    scale = np.array([r["scale"] for r in rows])
    tr.members += [None] * len(transfers)
    tr.transfer = np.append(tr.transfer, transfers)
    tr.warm = np.append(tr.warm, np.zeros(len(transfers), dtype=bool))
    base = tr.rank.size
    for name in ("rank", "kind", "group_size", "step", "lead", "tail", "end", "direction", "peer"):
        setattr(tr, name, np.append(getattr(tr, name), getattr(tr, name)[t]))
    seen = np.pad(tr.seen, (0, base - tr.seen.size))[t]
    tr.seen = np.append(np.pad(tr.seen, (0, base - tr.seen.size)),
                        [r["seen"] if r["seen"] is not None else v for r, v in zip(rows, seen)])
    for name in ("issue", "start"):
        setattr(tr, name, np.append(getattr(tr, name), np.full(t.size, np.nan)))
    tr.dur = np.append(tr.dur, tr.dur[t] * scale)
    tr.nbytes = np.append(tr.nbytes, tr.nbytes[t] * scale)
    tr.inst = np.append(tr.inst, [r["inst"] for r in rows]).astype(np.int64)
    tr.prev = np.append(tr.prev, np.full(t.size, -1)).astype(np.int64)
    for k in range(len(tr.members)):
        if tr.members[k] is None:
            tr.members[k] = np.flatnonzero(tr.inst[base:] == k) + base
