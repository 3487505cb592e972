"""A CPU host's cores shared by its ranks: a change that makes more of them compute at once slows
each, as the cores divide between them.

With ``n`` of a host's ranks computing at an instant and ``c`` cores, each gets ``min(1, c / n)``
of a core (processor sharing, as the overlap bound's host-cores floor counts core-time:
OVERLAP.md section 6.2). The unchanged replay (the trace's own schedule) gives each (rank, step)
the share its compute had, ``s``: its compute's core-time over its wall time. A rewritten replay
gives ``s'``; that step's compute becomes ``compute × s / s'``, the core-time it took in the trace
at the share it now gets, and is replayed again until the shares settle (:data:`ROUNDS` replays
at most, each scaled from the rewritten compute, not from the last round). With nothing changed
``s' = s`` and the traced steps come back; a host with at least as many cores as ranks, or whose
cores are not known (no run.json), is never scaled. Each key's compute is placed at the start of
the work after it (the lane's keys say how much compute, not where in the work). Only compute
counts: a lane's host code between calls may be a blocking call's own wait (counting all of it
predicted the README's ring 6-7% slower than its run; compute alone, within 3%); the
backends' threads are charged apart (:mod:`.cores`).

Measured (2026-12-07, the README's command 1, 4 ranks on 2 cores over a 2 Gbit/s link): its sync
trace made asynchronous was predicted at 33.6 ms a step (``@end``) and 36.2 (first use) without
this, 38.3 and 39.6 with it; the async run took 39.4 ms, computing 1.29x what the sync run did.
"""

from __future__ import annotations

import numpy as np

from overlapprof.analysis.replay.engine import Replayed, replay
from overlapprof.analysis.replay.timeline import Traced, step_pieces

SHARED = "cores shared:"  # how its note begins (advise lists it among what an item assumed)
ROUNDS = 6  # replays at most, for the shares to settle
SETTLED = 0.002  # a round that moves no (rank, step) factor by more than this share ends them


class CoreSharing:
    """The shares of the trace ``tr`` (its unchanged replay), for the hosts whose ranks outnumber
    their cores (``hosts``: host -> (cores, ranks), as
    :class:`~overlapprof.analysis.exposure.bounds.Resources` holds them)."""

    def __init__(self, tr: Traced, hosts: dict[str, tuple[int, list[int]]]):
        self.hosts = [(cores, [r for r in ranks if r in tr.lanes]) for cores, ranks in hosts.values()]
        self.hosts = [(cores, ranks) for cores, ranks in self.hosts if len(ranks) > cores]
        self.traced = _shares(tr, replay(tr), self.hosts) if self.hosts else {}

    def __call__(self, new: Traced) -> tuple[Replayed, list[str]]:
        """``new`` (``tr`` rewritten) replayed with each (rank, step)'s compute scaled to the share
        of the cores it gets there (in place: ``new``'s lanes keep the last round's); the note
        that says by how much."""
        out = replay(new)
        if not self.traced:
            return out, []
        work = {r: (list(new.lanes[r].work), list(new.lanes[r].compute)) for _, ranks in self.hosts for r in ranks}
        factor: dict[tuple[int, int], float] = {}
        for _ in range(ROUNDS):
            now = _shares(new, out, self.hosts)
            f = {key: s / now[key] if now.get(key) else factor.get(key, 1.0) for key, s in self.traced.items()}
            moved = max((abs(v / factor.get(key, 1.0) - 1) for key, v in f.items()), default=0.0)
            if moved <= SETTLED:
                break
            factor = f
            for r, (w, c) in work.items():
                _scale(new.lanes[r], w, c, {k: v for (rank, k), v in factor.items() if rank == r})
            out = replay(new)
        before = sum(sum(c) for _, c in work.values())
        after = sum(sum(new.lanes[r].compute) for r in work)
        if not before or abs(after / before - 1) < 1e-3:
            return out, []
        return out, [f"{SHARED} {len(work)} ranks on {', '.join(str(c) for c, _ in self.hosts)} cores compute at "
                     "once more or less than in the trace, and the cores divide between them: their compute "
                     f"{100 * (after / before - 1):+.1f}% (processor sharing, from the trace's own shares)"]


def _scale(lane, work: list[float], compute: list[float], factor: dict[int, float]) -> None:
    """The lane's keys of step k get ``compute`` × ``factor[k]``, their ``work`` the difference."""
    for j, k in enumerate(_step_index(lane).tolist()):
        f = factor.get(k, 1.0) if k >= 0 else 1.0
        lane.work[j], lane.compute[j] = work[j] + (f - 1) * compute[j], compute[j] * f


def _shares(tr: Traced, out: Replayed, hosts) -> dict[tuple[int, int], float]:
    """(rank, step index) -> the share of a core its compute had in ``out``: core-time / wall time."""
    res = {}
    for cores, ranks in hosts:
        spans = {r: _spans(tr.lanes[r], out.key_t[r]) for r in ranks if r in out.key_t}
        if not spans:
            continue
        lo = np.concatenate([s[0] for s in spans.values()])
        hi = np.concatenate([s[1] for s in spans.values()])
        edges = np.unique(np.concatenate([lo, hi]))
        if edges.size < 2:
            continue
        # lanes computing on each elementary segment, and the cumulative core-time a lane gets there
        n = np.zeros(edges.size, dtype=np.int64)
        np.add.at(n, np.searchsorted(edges, lo), 1)
        np.add.at(n, np.searchsorted(edges, hi), -1)
        n = np.cumsum(n)[:-1]
        share = np.minimum(1.0, cores / np.maximum(n, 1))
        got = np.concatenate([[0.0], np.cumsum(share * np.diff(edges))])
        for r, (a, b, step) in spans.items():
            core = np.interp(b, edges, got) - np.interp(a, edges, got)
            wall = b - a
            for k in np.unique(step[step >= 0]).tolist():
                m = step == k
                total = float(wall[m].sum())
                if total > 0:
                    res[(r, k)] = float(core[m].sum()) / total
    return res


def _spans(lane, key_t: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The lane's computing spans ``[key_t, key_t + compute)`` (compute > 0) and each one's step
    index (-1 between steps)."""
    c = np.asarray(lane.compute, dtype=float)
    t = np.asarray(key_t, dtype=float)
    ok = (c > 0) & ~np.isnan(t)
    return t[ok], t[ok] + c[ok], _step_index(lane)[ok]


def _step_index(lane) -> np.ndarray:
    """Per key of the lane, the index of the step it is in (-1 between steps)."""
    out = np.full(len(lane.kind), -1, dtype=np.int64)
    for k, keys in enumerate(step_pieces(lane)):
        out[keys] = k
    return out
