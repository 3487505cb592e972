"""Every exposed microsecond given exactly one cause (OVERLAP.md section 6.3).

For one rank and a set of its operations (all of them; or one kind's, one collective's), the
causes are disjoint sets on the rank's clock, built in precedence order:

- ``late_peer``: the operations' wait parts (:mod:`~overlapprof.analysis.exposure.late`);
- ``host_blocked``: the rank's host synchronizations, and its barriers from their issue to their
  end (the calling thread waits for them; the blocking wait is not a traced call), minus the above;
- ``queued``: for each operation, from its issue to its start, the time its channel (process
  group; GPU: process group and stream) was busy with another operation; minus the above;
- ``no_window``: the spans (from issue to end) of the operations with no compute in their
  window; minus the above.

A domain (the exposed communication of the rank, of a step, of a kind) is measured against them
with :func:`~overlapprof.analysis.intervals.covered`; ``window_short`` is the rest of the
domain, so the five add up to the domain's length. Everything is numpy over the rank's intervals.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from overlapprof.analysis import intervals as iv
from overlapprof.analysis.exposure.late import Labelled, distinct, overlay
from overlapprof.analysis.rank.classify import KINDS
from overlapprof.report import ACTIVITIES, Exposure

BARRIER = KINDS.index("barrier")


@dataclass
class RankOps:
    """One rank's operations (µs, its own clock), in time order. ``wait``: the wait part the
    cross-rank section counts (0: unmatched or warm-up); ``transfer``: its own transfer;
    ``slack``: compute in its window [issue, need); ``slow``: the share of its transfer beyond
    what its bytes need at the reference bandwidth (0: unknown or none); ``channel``: ops of one
    channel run in order."""

    rows: np.ndarray
    kind: np.ndarray
    channel: np.ndarray
    issue: np.ndarray
    start: np.ndarray
    end: np.ndarray
    need: np.ndarray
    wait: np.ndarray
    transfer: np.ndarray
    slack: np.ndarray
    slow: np.ndarray
    step: np.ndarray

    def __len__(self) -> int:
        return self.rows.size


@dataclass
class CauseSets:
    """The disjoint sets of the first four causes (own clock), the late pieces with their
    ``rank * 3 + activity`` labels, and the no-window/window-short parts of transfers beyond
    their bytes' need (``slow``, for the overlay)."""

    late: iv.Intervals
    late_pieces: Labelled
    host: iv.Intervals
    queued: iv.Intervals
    no_window: iv.Intervals
    slow: iv.Intervals


def _queued(ops: RankOps, mask: np.ndarray) -> iv.Intervals:
    """∪ over the operations of ``mask`` of [issue, start) ∩ the spans of their channel's operations."""
    parts_s, parts_e = [], []
    for ch in distinct(ops.channel[mask]):
        mine = mask & (ops.channel == ch) & (ops.start > ops.issue)
        if not mine.any():
            continue
        busy = iv.union(ops.start[ops.channel == ch], ops.end[ops.channel == ch])
        got = iv.intersection(iv.union(ops.issue[mine], ops.start[mine]), busy)
        parts_s.append(got[0])
        parts_e.append(got[1])
    if not parts_s:
        return iv.EMPTY
    return iv.union(np.concatenate(parts_s), np.concatenate(parts_e))


def cause_sets(ops: RankOps, mask: np.ndarray, late_pieces: Labelled, host_sync: iv.Intervals,
               unowned: iv.Intervals = iv.EMPTY) -> CauseSets:
    """The cause sets of the operations ``mask`` (the rank's late pieces are cut to their waits).
    ``unowned``: communication in no operation's span (CPU mode: a ``c10d::*`` call before its
    backend's span opens), counted as no window: the calling thread is inside the call."""
    waits = iv.union(ops.start[mask], ops.start[mask] + ops.wait[mask])
    if mask.all():
        pieces = late_pieces
    else:
        s, e, lab, inside = overlay(late_pieces, (waits[0], waits[1], np.zeros(waits[0].size, np.int64)))
        pieces = (s[inside >= 0], e[inside >= 0], lab[inside >= 0])
    late = iv.union(pieces[0], pieces[1])
    barrier = ops.kind == BARRIER
    host_sync = iv.union(*_cat(host_sync, (ops.issue[barrier], ops.end[barrier])))
    host = iv.difference(host_sync, late)
    taken = iv.union(*_cat(late, host_sync))
    queued = iv.difference(_queued(ops, mask), taken)
    taken = iv.union(*_cat(taken, queued))
    blocking = mask & (ops.slack <= 0)
    no_window = iv.difference(iv.union(*_cat((ops.issue[blocking], ops.end[blocking]), unowned)), taken)
    beyond = mask & (ops.slow > 0)
    tail = ops.end[beyond] - ops.slow[beyond] * ops.transfer[beyond]
    slow = iv.difference(iv.union(np.maximum(tail, ops.start[beyond]), ops.end[beyond]), taken)
    return CauseSets(late, pieces, host, queued, no_window, slow)


def _cat(a: iv.Intervals, b: iv.Intervals) -> iv.Intervals:
    return np.concatenate((a[0], b[0])), np.concatenate((a[1], b[1]))


def measure(sets: CauseSets, domain: iv.Segmented, count: int, slow_known: bool) -> list[Exposure]:
    """One Exposure per segment ``0 .. count-1`` of ``domain`` (a segmented union: per step, or
    one segment), its causes measured against ``sets``."""
    seg, starts, ends = domain

    def per_seg(u: iv.Intervals) -> np.ndarray:
        return np.bincount(seg, weights=iv.covered(u, starts, ends), minlength=count)

    total = np.bincount(seg, weights=ends - starts, minlength=count)
    late, host, queued, no_window = (per_seg(u) for u in (sets.late, sets.host, sets.queued, sets.no_window))
    window_short = np.maximum(total - late - host - queued - no_window, 0.0)
    slow = per_seg(sets.slow) if slow_known else None
    by_label = {}
    p_s, p_e, p_lab = sets.late_pieces
    for label in distinct(p_lab):
        mine = p_lab == label
        by_label[label] = per_seg((p_s[mine], p_e[mine]))
    out = []
    for k in range(count):
        by_rank, activity = {}, {}
        for label, values in by_label.items():
            if values[k] > 0:
                by_rank[label // 3] = by_rank.get(label // 3, 0.0) + float(values[k])
                name = ACTIVITIES[label % 3]
                activity[name] = activity.get(name, 0.0) + float(values[k])
        out.append(Exposure(
            late_peer_us=float(late[k]), host_blocked_us=float(host[k]), queued_us=float(queued[k]),
            no_window_us=float(no_window[k]), window_short_us=float(window_short[k]),
            late_peer_by_rank=dict(sorted(by_rank.items())), late_peer_activity=activity,
            slow_transfer_us=None if slow is None else float(min(slow[k], no_window[k] + window_short[k])),
        ))
    return out


def whole(u: iv.Intervals) -> iv.Segmented:
    """A union as a segmented set of one segment."""
    return np.zeros(u[0].size, dtype=np.int64), u[0], u[1]


def pieces_of(sets: CauseSets, domain: iv.Intervals) -> dict[str, iv.Intervals]:
    """The domain's intervals by cause (for a timeline): each cause's set ∩ the domain, and the
    rest as ``window_short``."""
    out, taken = {}, iv.EMPTY
    for name, u in (("late_peer", sets.late), ("host_blocked", sets.host), ("queued", sets.queued),
                    ("no_window", sets.no_window)):
        got = iv.intersection(domain, u)
        if got[0].size:
            out[name] = got
        taken = iv.union(*_cat(taken, got))
    rest = iv.difference(domain, taken)
    if rest[0].size:
        out["window_short"] = rest
    return out


def added(parts: list[Exposure]) -> Exposure | None:
    """The sum of several Exposures (None for none)."""
    if not parts:
        return None
    out = Exposure()
    for p in parts:
        for name in ("late_peer_us", "host_blocked_us", "queued_us", "no_window_us", "window_short_us"):
            setattr(out, name, getattr(out, name) + getattr(p, name))
        for rank, us in p.late_peer_by_rank.items():
            out.late_peer_by_rank[rank] = out.late_peer_by_rank.get(rank, 0.0) + us
        for act, us in p.late_peer_activity.items():
            out.late_peer_activity[act] = out.late_peer_activity.get(act, 0.0) + us
        if p.slow_transfer_us is not None:
            out.slow_transfer_us = (out.slow_transfer_us or 0.0) + p.slow_transfer_us
    out.late_peer_by_rank = dict(sorted(out.late_peer_by_rank.items()))
    return out


__all__ = ["CauseSets", "RankOps", "added", "cause_sets", "measure", "pieces_of", "whole"]
