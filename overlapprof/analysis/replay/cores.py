"""What compute moved beside a transfer costs where the trace has none beside it, on a crowded CPU host.

A rank's slowdown beside communication is measured where its trace has compute beside it
(:mod:`.slowdown`). A trace with none (a sync variant, a wait right after each issue) measures
nothing, and on a CPU host whose ranks and their backend threads (2 × the ranks on the node)
outnumber the cores, new overlap is not free there: gloo sends, receives, copies and reduces on
the same cores as the compute. But not all of a transfer's time is the cores' work: over a
``--link-rate`` link most of it can be the link's pacing (the kernel's token bucket holds the
bytes back; no core works meanwhile). Only the cores' share competes with compute moved beside it.

**The cores' share**, measured from the trace and run.json's link: per instance ``k`` (warm-up
left out, bytes known, transfer ``x_k`` from its latest start), the link's time in its interval
is the bytes of every instance on the link during it, each spread evenly over its own transfer,
at the link's rate (one medium shared by all ranks: two sends at once take twice as long)::

    pacing_k = Σ_j b_j × |[lo_j, lo_j + x_j) ∩ [lo_k, lo_k + x_k)| / x_j / rate,   capped at x_k

with ``b_j`` the bytes instance ``j`` puts on the link: a message's size for send/recv, and for
a collective on ``n`` ranks each rank's bus bytes
(:func:`~overlapprof.analysis.replay.transfer.bus_bytes`: what nccl-tests counts each rank to
send), ``n`` times.

and the cores' share of a rank's transfers is ``Σ (x_k − pacing_k) / Σ x_k`` over the instances it
takes part in: what is not the link's pacing (the copies through the kernel, gloo's protocol, and
the time a thread waits for a core) is taken as the cores' work. Without a link (loopback) the
whole transfer is the cores' work: the share is 1.

**The charge** (:func:`~.slowdown.slow`): compute moved beside communication on such a rank runs
``1 + share`` times as long for the part beside the transfer, as a measured factor ``f`` charges
``1 − 1/f`` of it: for each µs of moved compute, the share of the transfer the cores had to do
is not hidden. A share of 1 (loopback) charges the moved compute in full; that is still not
enough there (the transfers slow down too, and the replay keeps their traced time), which is why
advise does not stand behind such a change (:mod:`overlapprof.analysis.advise.assumed`,
:data:`MAX_SHARE`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from overlapprof.analysis.exposure import resources
from overlapprof.analysis.replay.timeline import SEND_RECV, Traced
from overlapprof.analysis.replay.transfer import bus_bytes

MAX_SHARE = 0.5  # above this share the transfer is mostly the cores' work: advise does not list the change


@dataclass
class Crowded:
    """A rank on a crowded CPU host whose trace measures no slowdown: ``cores`` and ``ranks`` on
    its node, ``share`` (the cores' share of its transfers, 0-1; 1 without a link) and ``link``
    (the run has a ``--link-rate`` link the share was measured against)."""

    rank: int
    cores: int
    ranks: int
    share: float
    link: bool

    def words(self) -> str:
        busy = 2 * self.ranks
        head = f"{self.ranks} ranks and their backend threads ({busy}) share {self.cores} cores"
        if not self.link:
            return f"{head} over loopback: the transfers are the cores' work"
        return (f"{head}; {100 * self.share:.0f}% of its transfers' time is the cores' work (the rest the link's "
                "pacing, measured against its rate)")


def host_cores(report) -> dict[int, tuple[int, int]]:
    """Rank -> (cores, ranks on its node) for the CPU ranks of a run whose nodes record their cores."""
    res, _, _ = resources(report.run, None)
    return {rank: (cores, len(ranks)) for cores, ranks in res.hosts.values() for rank in ranks}


def crowded_hosts(report) -> dict[int, tuple[int, int]]:
    """:func:`host_cores` of the ranks whose node's ranks and backend threads (2 each) outnumber its cores."""
    return {rank: (cores, n) for rank, (cores, n) in host_cores(report).items() if 2 * n > cores}


def link_time(tr: Traced, link_bytes_per_us: float) -> np.ndarray:
    """Per instance, the link's time in its transfer (µs; the module docstring's ``pacing_k``);
    NaN where its bytes are not known, or it is warm-up."""
    count = len(tr.members)
    out = np.full(count, np.nan)
    lo, x, b = np.zeros(count), np.zeros(count), np.full(count, np.nan)
    for k, rows in enumerate(tr.members):
        first = int(rows[0])
        nb = tr.nbytes[rows]
        n = int(tr.group_size[first]) or rows.size
        lo[k] = float(np.max(tr.start[rows]))
        x[k] = float(tr.transfer[k])
        if not np.isnan(nb).all():
            kind = int(tr.kind[first])
            b[k] = bus_bytes(kind, float(np.nanmax(nb)), n) * (1 if kind == SEND_RECV else n)
    known = ~np.isnan(b) & (x > 0)
    density = np.where(known, np.nan_to_num(b) / np.where(x > 0, x, 1.0), 0.0)  # bytes/µs each put on the link
    hi = lo + x
    for k in np.flatnonzero(known & ~tr.warm[:count]):
        cover = np.clip(np.minimum(hi, hi[k]) - np.maximum(lo, lo[k]), 0.0, None)
        out[k] = min(float(np.dot(density, cover)) / link_bytes_per_us, x[k])
    return out


def shares(report, tr: Traced) -> dict[int, Crowded]:
    """Per CPU rank on a crowded host (:func:`crowded_hosts`) whose trace measures no slowdown
    beside communication (no compute class with a factor and time under it): its
    :class:`Crowded`, with the cores' share of its transfers (the module docstring)."""
    hosts = crowded_hosts(report)
    measured = {r.rank for r in report.ranks if r.interference is not None and any(
        c.factor and c.overlapped_us > 0 for c in r.interference.classes)}
    ranks = [r.rank for r in report.ranks if r.mode == "cpu" and r.rank in hosts and r.rank not in measured]
    if not ranks:
        return {}
    res, _, _ = resources(report.run, None)
    rate = res.link_bytes_per_us
    pacing = link_time(tr, rate) if rate and len(tr.members) else None
    out = {}
    for r in ranks:
        share = 1.0
        if pacing is not None:
            ks = [k for k, rows in enumerate(tr.members) if r in tr.rank[rows] and not np.isnan(pacing[k])]
            total = float(sum(tr.transfer[k] for k in ks))
            if total > 0:
                share = float(sum(tr.transfer[k] - pacing[k] for k in ks)) / total
        out[r] = Crowded(r, *hosts[r], share=min(max(share, 0.0), 1.0), link=rate is not None)
    return out
