"""What compute moved beside a transfer costs where the trace has none beside it, on a crowded CPU host.

A rank's slowdown beside communication is measured where its trace has compute beside it
(:mod:`.slowdown`). A trace with none (a sync variant, a wait right after each issue) measures
nothing, and on a CPU host whose ranks and their backend threads (2 × the ranks on the node)
outnumber the cores, new overlap is not free there: gloo sends, receives, copies and reduces on
the same cores as the compute. But not all of a transfer's time is the cores' work: over a
``--link-rate`` link most of it can be the link's pacing (the kernel's token bucket holds the
bytes back; no core works meanwhile). Only the cores' share competes with compute moved beside it.

**The cores' share**, measured from the trace and run.json's link (its rate and its token
bucket's burst): the link's time in each transfer is replayed through the link's token bucket.
Instances are taken in the order of their latest start ``lo_k`` (warm-up too: it spends tokens),
each putting ``b_k`` bytes on the link (a message's size for send/recv; for a collective on ``n``
ranks, each rank's bus bytes ``n`` times: one medium shared by all ranks, :func:`link_bytes`). The bucket refills at the rate up to the burst while
the link is free; an instance that finds enough tokens passes unpaced (the default burst, 128
KiB, lets a pipeline's 64 KiB activation through at once), one that does not waits for the
tokens it lacks, after any instance queued before it::

    pacing_k = (the link free for it − lo_k) + max(0, b_k − tokens) / rate,   capped at x_k

The cores' share of a rank's transfers is ``Σ (x_k − pacing_k) / Σ x_k`` over the instances it
takes part in (warm-up left out): what the link does not hold back (the copies through the
kernel, gloo's protocol, the time a thread waits for a core) is taken as the cores' work.
Without a link (loopback), or without a transfer whose bytes are known, it is not measured
(None): the transfers are all the cores' work, but how much of their traced time that work
takes (and how much is waiting for a peer or a core) the trace does not say.

**The charge** (:func:`~.slowdown.slow`): compute moved beside communication on a rank with a
measured share is charged ``share × (O' − O)``, as a measured factor ``f`` charges
``(1 − 1/f) × (O' − O)``: of each µs of moved compute, the part the cores owed the transfer
is not hidden. A rank whose share is not measured is not charged (the note says so), and advise
does not stand behind a change there, nor where the share is above :data:`MAX_SHARE`
(:mod:`overlapprof.analysis.advise.assumed`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from overlapprof.analysis.exposure import resources
from overlapprof.analysis.replay.timeline import SEND_RECV, Traced
from overlapprof.analysis.replay.transfer import instance_bytes

MAX_SHARE = 0.5  # above this share the transfer is mostly the cores' work: advise does not list the change


@dataclass
class Crowded:
    """A rank on a crowded CPU host whose trace measures no slowdown: ``cores`` and ``ranks`` on
    its node, ``share`` (the cores' share of its transfers, 0-1; None: not measured, loopback)."""

    rank: int
    cores: int
    ranks: int
    share: float | None

    def words(self) -> str:
        busy = 2 * self.ranks
        head = f"{self.ranks} ranks and their backend threads ({busy}) share {self.cores} cores"
        if self.share is None:
            return f"{head} over loopback: the transfers are the cores' work, for a share of their time not measured"
        return (f"{head}; {100 * self.share:.0f}% of its transfers' time is the cores' work (the rest the link's "
                "pacing, measured against its rate)")


def host_cores(report) -> dict[int, tuple[int, int]]:
    """Rank -> (cores, ranks on its node) for the CPU ranks of a run whose nodes record their cores."""
    res, _, _ = resources(report.run, None)
    return {rank: (cores, len(ranks)) for cores, ranks in res.hosts.values() for rank in ranks}


def crowded_hosts(report) -> dict[int, tuple[int, int]]:
    """:func:`host_cores` of the ranks whose node's ranks and backend threads (2 each) outnumber its cores."""
    return {rank: (cores, n) for rank, (cores, n) in host_cores(report).items() if 2 * n > cores}


def link_bytes(tr: Traced) -> np.ndarray:
    """Per instance, the bytes it puts on a link every rank shares (NaN: not known): a message's
    size for send/recv; for a collective on ``n`` ranks, each rank's bus bytes ``n`` times."""
    bus, kinds, sizes = instance_bytes(tr)
    return bus * np.where(kinds == SEND_RECV, 1, sizes)


def measured(report) -> set[int]:
    """The ranks whose trace measures its compute beside communication: a class with a factor
    and time under communication (a factor at or below 1 is measured too: no slowdown)."""
    return {r.rank for r in report.ranks if r.interference is not None and any(
        c.factor and c.overlapped_us > 0 for c in r.interference.classes)}


def link_time(tr: Traced, link_bytes_per_us: float, burst_bytes: float) -> np.ndarray:
    """Per instance, the link's time in its transfer (µs; the module docstring's ``pacing_k``);
    NaN where its bytes are not known, or it is warm-up."""
    count = len(tr.members)
    out = np.full(count, np.nan)
    lo = np.array([float(np.max(tr.start[rows])) for rows in tr.members])
    b = link_bytes(tr)
    tokens, free = float(burst_bytes), -np.inf  # the bucket, and when the link is free to send
    for k in np.argsort(lo, kind="stable"):
        if np.isnan(b[k]):
            continue
        if lo[k] > free:
            tokens = min(float(burst_bytes), tokens + (lo[k] - free) * link_bytes_per_us if free > -np.inf
                         else float(burst_bytes))
            free = lo[k]
        lack = b[k] - tokens
        tokens = max(-lack, 0.0)
        free += max(lack, 0.0) / link_bytes_per_us
        if not tr.warm[k] and tr.transfer[k] > 0:
            out[k] = min(free - lo[k], float(tr.transfer[k]))
    return out


def shares(report, tr: Traced) -> dict[int, Crowded]:
    """Per CPU rank on a crowded host (:func:`crowded_hosts`) whose trace measures no slowdown
    beside communication (no compute class with a factor and time under it): its
    :class:`Crowded`, with the cores' share of its transfers (the module docstring)."""
    hosts = crowded_hosts(report)
    done = measured(report)
    ranks = [r.rank for r in report.ranks if r.mode == "cpu" and r.rank in hosts and r.rank not in done]
    if not ranks:
        return {}
    res, _, _ = resources(report.run, None)
    rate = res.link_bytes_per_us
    burst = float(((report.run or {}).get("link") or {}).get("burst_bytes") or 0.0)
    pacing = link_time(tr, rate, burst) if rate and len(tr.members) else None
    out = {}
    for r in ranks:
        share = None
        if pacing is not None:
            ks = [k for k, rows in enumerate(tr.members) if r in tr.rank[rows] and not np.isnan(pacing[k])]
            total = float(sum(tr.transfer[k] for k in ks))
            if total > 0:
                share = min(max(float(sum(tr.transfer[k] - pacing[k] for k in ks)) / total, 0.0), 1.0)
        out[r] = Crowded(r, *hosts[r], share=share)
    return out
