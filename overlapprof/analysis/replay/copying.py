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
  latency of its hops (:data:`HOP_US` each: a ring all_reduce on ``n`` ranks ``2(n − 1)``, other
  collectives ``n − 1``, a send/recv 1) is what its bytes took, at most :data:`MAX_RATE`:
  ``rate = c / max(u − latency, c / MAX_RATE)``.

So a 64 KiB all_reduce whose fastest instances take 160 µs is mostly latency (about 40 µs of
copying), a 1.5 MiB one that takes 2 ms mostly copying. ``share`` (the cores' share of a rank's
transfers, :func:`share`) is ``Σ min(w_k, x_k) / Σ x_k`` over the instances it takes part in.
"""

from __future__ import annotations

import numpy as np

from overlapprof.analysis.rank.classify import KINDS
from overlapprof.analysis.replay.timeline import SEND_RECV, Traced
from overlapprof.analysis.replay.transfer import UNHINDERED_PERCENTILE, instance_bytes

# µs of latency a hop of a gloo transfer over loopback takes: the idle 2-core test VM's pinned
# 64 KiB all_reduce on 2 ranks (2 hops) took 155-163 µs at its 10th percentile (2026-12-07), of
# which its bytes' copying is about 40 µs
HOP_US = 60.0
MAX_RATE = 8000.0  # bytes/µs: a memory copy on that VM; no loopback transfer copies faster


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
    live = ~tr.warm[:copied.size] & (np.nan_to_num(copied) > 0) & (tr.transfer[:copied.size] > 0)
    out = {}
    for kind, n in set(zip(kinds[live].tolist(), sizes[live].tolist())):
        ks = np.flatnonzero(live & (kinds == kind) & (sizes == n))
        if (KINDS[kind], n) in own:  # bus bytes at the fitted bandwidth; the rate is of the bytes copied
            out[(kind, n)] = own[(KINDS[kind], n)] * float(np.median(copied[ks] / bus[ks]))
            continue
        u = float(np.percentile(tr.transfer[ks], UNHINDERED_PERCENTILE))
        c = float(np.median(copied[ks]))
        out[(kind, n)] = c / max(u - HOP_US * hops(kind, n), c / MAX_RATE)
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
    kinds it has no fit or reference for: :data:`HOP_US` a hop, at most the kind's shortest
    transfer (a rewrite that makes more operations, smaller buckets or micro-batches, pays it
    for each, as the run does); its notes."""
    _, _, kinds, sizes = _copied(tr)
    notes = []
    for f in model.fits:
        if f.source != "none":
            continue
        kind = KINDS.index(f.kind)
        ks = np.flatnonzero((kinds == kind) & (sizes == f.group_size))
        live = ks[~tr.warm[ks] & (tr.transfer[ks] > 0)]
        if not live.size:
            continue
        lat = min(HOP_US * hops(kind, f.group_size), float(np.min(tr.transfer[live])))
        model.latency[ks] = lat
        f.latency_us = lat
        notes.append(f"transfer model: {f.kind} on {f.group_size} ranks over loopback: latency {lat:.0f} us "
                     f"({HOP_US:.0f} us a hop, at most its shortest transfer): each operation a change adds pays it")
    return notes
