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

The cores' share of a rank's transfers is ``Σ min(x_k − pacing_k, w_k) / Σ x_k`` over the
instances it takes part in (warm-up left out), ``w_k`` the copying of its bytes as over loopback
(:mod:`.copying`): of what the link does not hold back, the copies through the kernel are the
cores' work, the rest (gloo's protocol, a hop's latency) is not. A pipeline's 64 KiB activation
passes inside the burst unpaced, in 50-65 µs of which its copying is about 8: its share is that
copying (12%), not the whole transfer (100%, what ``x_k − pacing_k`` alone gave).
**Over loopback** (no link) the share is the copying of each transfer's bytes on the cores
(:mod:`.copying`: its bytes at the rate the trace's least hindered transfers of its kind show,
less their latency), and that copying is what moved compute is charged (below). Without a
transfer whose bytes are known it is not measured (None).

**The charge** (:func:`~.slowdown.slow`): compute moved beside communication on a rank with a
link-measured share is charged ``share × (O' − O)``, as a measured factor ``f`` charges
``(1 − 1/f) × (O' − O)``: of each µs of moved compute, the part the cores owed the transfer
is not hidden. Over loopback it is charged the copying it is moved beside: ``Q' − Q``, with
``Q`` the compute that an operation's copying (not its whole transfer) covers, counted as ``O``
is, on the rewritten operations too (a smaller bucket copies fewer bytes). A loopback rank with
both a factor and a share (its trace has some compute beside communication) is charged the larger,
and given back the larger for compute a change moves away (over a link the factor, as before: a
paced transfer's share is not copying):
the factor is measured on the little overlap the trace has, which may lie beside a transfer's
waiting rather than its copying. A rank whose share is not measured is not charged (the note
says so), and advise does not stand behind a change there, nor where the share is above
:data:`MAX_SHARE` (:mod:`overlapprof.analysis.advise.assumed`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from overlapprof.analysis.exposure import resources
from overlapprof.analysis.replay import copying
from overlapprof.analysis.replay.timeline import SEND_RECV, Traced
from overlapprof.analysis.replay.transfer import instance_bytes

MAX_SHARE = 0.5  # above this share the transfer is mostly the cores' work: advise does not list the change


@dataclass
class Crowded:
    """A CPU rank on a crowded host: ``cores`` and ``ranks`` on its node, ``share`` (the cores'
    share of its transfers, 0-1; None: not measured, no transfer's bytes known)."""

    rank: int
    cores: int
    ranks: int
    share: float | None
    rates: dict | None = None  # over loopback: :func:`.copying.rates` of the trace
    hop: copying.Hop | None = None  # over loopback: the hop's latency and copy ceiling those rates used

    def words(self) -> str:
        busy = 2 * self.ranks
        head = f"{self.ranks} ranks and their backend threads ({busy}) share {self.cores} cores"
        if self.share is None:
            return f"{head} over loopback: the transfers are the cores' work, for a share of their time not measured"
        if self.rates is not None:
            assumed = ""
            if self.hop is not None and self.hop.assumed:
                what = {"latency": f"a hop's latency ({self.hop.us:.0f} us)",
                        "rate": f"the copy ceiling ({self.hop.rate / 1e3:.0f} GB/s)"}
                assumed = f"; {' and '.join(what[w] for w in self.hop.assumed)} assumed, the test VM's"
            return (f"{head} over loopback; {100 * self.share:.0f}% of its transfers' time is the cores' work (copying "
                    f"their bytes; the rest latency and waiting, measured from its transfers{assumed})")
        return (f"{head}; {100 * self.share:.0f}% of its transfers' time is the cores' work (copying their bytes; "
                "the rest the link's pacing, measured against its rate, and latency)")


def host_cores(report) -> dict[int, tuple[int, int]]:
    """Rank -> (cores, ranks on its node) for the CPU ranks of a run whose nodes record their cores."""
    res, _, _ = resources(report.run, None)
    return {rank: (cores, len(ranks)) for cores, ranks in res.hosts.values() for rank in ranks}


def crowded_hosts(report) -> dict[int, tuple[int, int]]:
    """:func:`host_cores` of the ranks whose node's ranks and backend threads (2 each) outnumber its cores."""
    return {rank: (cores, n) for rank, (cores, n) in host_cores(report).items() if 2 * n > cores}


def loopback(report) -> bool:
    """Whether run.json puts every rank of this CPU run on one host with no ``--link-rate`` link:
    gloo's transfers go over loopback."""
    res, _, _ = resources(report.run, None)
    ranks = {r.rank for r in report.ranks}
    return (res.link_bytes_per_us is None and len(res.hosts) == 1 and bool(ranks)
            and ranks <= set(next(iter(res.hosts.values()))[1]) and all(r.mode == "cpu" for r in report.ranks))


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


def shares(report, tr: Traced, model=None) -> dict[int, Crowded]:
    """Per CPU rank on a crowded host (:func:`crowded_hosts`): its :class:`Crowded`, with the
    cores' share of its transfers (the module docstring): measured against the run's link (the
    ranks whose trace measures no slowdown), or over loopback from the transfers' bytes (every
    rank; ``model``: the trace's transfer model)."""
    hosts = crowded_hosts(report)
    ranks = [r.rank for r in report.ranks if r.mode == "cpu" and r.rank in hosts]
    if not ranks or not len(tr.members):
        return {r: Crowded(r, *hosts[r], share=None) for r in ranks}
    res, _, _ = resources(report.run, None)
    rate = res.link_bytes_per_us
    if rate:  # over a link only where the trace measures no slowdown, as before
        done = measured(report)
        ranks = [r for r in ranks if r not in done]
        burst = float(((report.run or {}).get("link") or {}).get("burst_bytes") or 0.0)
        pacing = link_time(tr, rate, burst)
        # what the link does not pace is at most the copying of the bytes (a message inside the
        # burst passes unpaced: its time is then mostly latency, which no core works for)
        copied = copying.copy_time(tr, copying.rates(tr, model))[:pacing.size]
        busy = np.where(np.isnan(pacing), np.nan, np.fmin(tr.transfer[:pacing.size] - pacing, copied))
        by = None
    else:
        by = copying.rates(tr, model)
        busy = copying.copy_time(tr, by)
    hop = copying.loopback_hop(model) if by is not None else None
    return {r: Crowded(r, *hosts[r], share=copying.share(tr, r, busy), rates=by, hop=hop) for r in ranks}
