"""A loopback transfer's time split into the cores' copying and the rest, from the trace.

Over loopback (no ``--link-rate`` link) gloo moves a transfer's bytes through the kernel on the
host's cores: the send copies them in, the receive out, a collective's reduction reads them.
That is the cores' work: compute beside it on the same cores loses the time it takes. The rest
of the transfer is latency (the peer's wake-up, the protocol's round trips) and waiting (for a
late peer, for a core): no core works for it, and compute beside it is hidden for free.

Per kind and group size, the copying takes ``w = c / rate`` µs of an instance, ``c`` the bytes
a rank's cores copy (the message once for send/recv; a collective's bus bytes sent and as many
received: twice) and ``rate`` (bytes a µs):

- the trace's transfer model where it has a bandwidth of its own (a fit on two or more sizes,
  or ``--reference-bandwidth``): the fit's slope is the time a byte takes, its intercept the
  latency: ``w = bus bytes / bandwidth``;
- else, from the least hindered transfers of the kind (the 10th percentile ``u`` of its
  transfers, warm-up left out, as :func:`~.transfer.unhindered` takes it): ``u`` less the
  latency of its hops (``h`` each: a ring all_reduce on ``n`` ranks ``2(n − 1)``, other
  collectives ``n − 1``, a send/recv 1) is what its bytes took, at most ``R``:
  ``rate = c / max(u − latency, c / R)``.

``h`` and ``R`` come from the trace where it can show them (:func:`loopback_hop`): a kind fitted
on two or more sizes has a latency of its own (the fit's intercept) and a copy rate (its slope,
as above), so ``h`` is the fits' latency a hop (their median, each fit's latency over its hops)
and ``R`` the fastest of their copy rates. A trace whose kinds each have one size (the all_reduce
workload's 64 KiB, a pipeline's activations) cannot tell a kind's latency from its copying: ``h``
is then :data:`HOP_US` and ``R`` :data:`MAX_RATE`, measured on the project's test VM, and the
notes say they were assumed (a user's machine differs).

So a 64 KiB all_reduce whose fastest instances take 160 µs is mostly latency (about 40 µs of
copying), a 1.5 MiB one that takes 2 ms mostly copying. ``share`` (the cores' share of a rank's
transfers, :func:`share`) is ``Σ min(w_k, x_k) / Σ x_k`` over the instances it takes part in.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from overlapprof.analysis.rank.classify import KINDS
from overlapprof.analysis.replay.timeline import SEND_RECV, Traced
from overlapprof.analysis.replay.transfer import UNHINDERED_PERCENTILE, instance_bytes
from overlapprof.analysis.stats import median

# The fallbacks, for a trace that cannot show them (no kind fitted on two or more sizes):
# µs of latency a hop of a gloo transfer over loopback takes: the idle 2-core test VM's pinned
# 64 KiB all_reduce on 2 ranks (2 hops) took 155-163 µs at its 10th percentile (2026-12-07), of
# which its bytes' copying is about 40 µs
HOP_US = 60.0
MAX_RATE = 8000.0  # bytes/µs: a memory copy on that VM; no loopback transfer copies faster


@dataclass
class Hop:
    """A hop's latency (``us``) and the fastest copy (``rate``, bytes/µs) that a kind of one size
    is measured with (the module docstring), and where each comes from: ``assumed`` names what
    the trace could not show (``latency``, ``rate``: the fallback constants were used)."""

    us: float
    rate: float
    words: str
    assumed: tuple[str, ...] = ()


def _copy_factor(kind: int) -> int:
    """The bytes a rank's cores copy per bus byte: a send/recv's message once, a collective's
    bus bytes sent and as many received."""
    return 1 if kind == SEND_RECV else 2


def loopback_hop(model=None) -> Hop:
    """The :class:`Hop` of a trace's transfer ``model``: from its own fits (two or more sizes of
    a kind; a fit whose intercept fell below zero says nothing of the latency), else the
    fallbacks :data:`HOP_US` and :data:`MAX_RATE`."""
    fits = [f for f in (model.fits if model else []) if f.source == "fit" and f.bandwidth_gbps]
    lat = [f.latency_us / hops(KINDS.index(f.kind), f.group_size) for f in fits if f.latency_us and f.latency_us > 0]
    rates = [f.bandwidth_gbps * 1e3 * _copy_factor(KINDS.index(f.kind)) for f in fits]
    us = median(lat) if lat else HOP_US
    rate = max(rates) if rates else MAX_RATE
    named = ", ".join(f"{f.kind} on {f.group_size} ranks ({f.sizes} sizes)" for f in fits)
    assumed = tuple(w for w, got in (("latency", lat), ("rate", rates)) if not got)
    if not assumed:
        words = (f"a hop's latency {us:.0f} us and a copy at most {rate / 1e3:.2f} GB/s, from the trace's fits of "
                 f"{named}")
    elif len(assumed) == 2:
        words = (f"a hop's latency {us:.0f} us and a copy at most {rate / 1e3:.0f} GB/s assumed (measured on "
                 "overlapprof's test VM): no kind of this trace has two or more sizes to fit them on, and a kind "
                 "of one size cannot tell its latency from its copying")
    else:
        words = (f"a copy at most {rate / 1e3:.2f} GB/s from the trace's fits of {named}; a hop's latency "
                 f"{us:.0f} us assumed (measured on overlapprof's test VM): their intercepts fell below zero")
    return Hop(us, rate, words, assumed)


def _copied(tr: Traced) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per instance: the bytes a rank's cores copy (NaN: not known), its bus bytes, kind and group size."""
    bus, kinds, sizes = instance_bytes(tr)
    return bus * np.where(kinds == SEND_RECV, 1, 2), bus, kinds, sizes


def hops(kind: int, n: int) -> int:
    if kind == SEND_RECV:
        return 1
    return (2 if KINDS[kind] == "all_reduce" else 1) * max(n - 1, 1)


def rates(tr: Traced, model=None) -> dict[tuple[int, int], float]:
    """(kind, group size) -> the bytes a µs the cores copy for it (the module docstring);
    ``model``: the trace's :class:`~overlapprof.analysis.replay.transfer.Model`."""
    copied, bus, kinds, sizes = _copied(tr)
    own = {(f.kind, f.group_size): f.bandwidth_gbps * 1e3 for f in (model.fits if model else [])
           if f.source in ("fit", "reference") and f.bandwidth_gbps}
    hop = loopback_hop(model)
    live = ~tr.warm[:copied.size] & (np.nan_to_num(copied) > 0) & (tr.transfer[:copied.size] > 0)
    out = {}
    for kind, n in set(zip(kinds[live].tolist(), sizes[live].tolist())):
        ks = np.flatnonzero(live & (kinds == kind) & (sizes == n))
        if (KINDS[kind], n) in own:  # bus bytes at the fitted bandwidth; the rate is of the bytes copied
            out[(kind, n)] = own[(KINDS[kind], n)] * float(np.median(copied[ks] / bus[ks]))
            continue
        u = float(np.percentile(tr.transfer[ks], UNHINDERED_PERCENTILE))
        c = float(np.median(copied[ks]))
        out[(kind, n)] = c / max(u - hop.us * hops(kind, n), c / hop.rate)
    return out


def copy_time(tr: Traced, by: dict[tuple[int, int], float]) -> np.ndarray:
    """Per instance of ``tr`` (traced or rewritten), the µs of copying its bytes at the rates
    ``by`` (:func:`rates` of the traced run); NaN where its bytes or its kind's rate are not
    known."""
    copied, _, kinds, sizes = _copied(tr)
    rate = np.array([by.get(key, np.nan) for key in zip(kinds.tolist(), sizes.tolist())], dtype=float)
    return copied / rate if rate.size else copied


def share(tr: Traced, rank: int, busy: np.ndarray) -> float | None:
    """``Σ min(busy_k, x_k) / Σ x_k`` over the traced instances (warm-up left out) that ``rank``
    takes part in and whose ``busy`` (µs of the cores' work) is known; None: none."""
    ks = [k for k, rows in enumerate(tr.members)
          if not tr.warm[k] and rank in tr.rank[rows] and not np.isnan(busy[k]) and tr.transfer[k] > 0]
    total = float(sum(tr.transfer[k] for k in ks))
    if total <= 0:
        return None
    return min(max(float(sum(min(busy[k], tr.transfer[k]) for k in ks)) / total, 0.0), 1.0)


def loopback_latency(tr: Traced, model) -> list[str]:
    """Give ``model`` (the transfer model of a CPU run over loopback, in place) a latency for the
    kinds it has no fit or reference for: a hop's latency (:func:`loopback_hop`) a hop, at most
    the kind's shortest transfer (a rewrite that makes more operations, smaller buckets or
    micro-batches, pays it for each, as the run does); its notes, the first saying where the
    hop's latency and the copy rate came from (the trace's fits, or assumed)."""
    _, _, kinds, sizes = _copied(tr)
    hop = loopback_hop(model)
    notes = []
    for f in model.fits:
        if f.source != "none":
            continue
        kind = KINDS.index(f.kind)
        ks = np.flatnonzero((kinds == kind) & (sizes == f.group_size))
        live = ks[~tr.warm[ks] & (tr.transfer[ks] > 0)]
        if not live.size:
            continue
        lat = min(hop.us * hops(kind, f.group_size), float(np.min(tr.transfer[live])))
        model.latency[ks] = lat
        f.latency_us = lat
        notes.append(f"transfer model: {f.kind} on {f.group_size} ranks over loopback: latency {lat:.0f} us "
                     f"({hop.us:.0f} us a hop, at most its shortest transfer): each operation a change adds pays it")
    return [f"loopback: {hop.words}"] + notes if notes else notes
