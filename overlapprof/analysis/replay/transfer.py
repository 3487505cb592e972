"""The transfer-time model, fitted on the job's own operations.

Per kind and group size n, over the matched instances (warm-up left out) whose bytes are known,
with ``b`` the bytes each moves on the wire as nccl-tests counts them (bus bytes: the size × the
kind's bus factor for n ranks; send/recv: the message) and ``x`` its measured transfer (µs)::

    x = latency + b / bandwidth

fitted by least squares when the operations have at least :data:`MIN_SIZES` distinct sizes (a
negative latency is refitted through the origin; no positive slope: no fit). Otherwise the
bandwidth is a reference: ``--reference-bandwidth``, else the run's ``--link-rate`` link shared
by its ranks, and the latency the median of ``x − b / bandwidth`` (at least 0); with neither,
the model says so and a bandwidth change scales the whole transfer (latency 0). Each fit keeps
its residuals ``(x − model) / x``.

A bandwidth change by a factor k rewrites each transfer as ``latency + (x − latency) / k``: the
operation keeps its own residual, only the part its bytes take is sped up or slowed down.

**Interference** (CPU runs): where the backend's threads and the ranks' compute share the cores,
a transfer is longer the more compute runs beside it. Per kind and group size, ``transfer = x0 +
slope × compute beside it`` (Σ over the instance's ranks of their compute during its transfer)
is fitted on the instances; where it holds (:func:`interference`), a compute change by F takes
``(1 − F) × slope × compute beside it`` off each transfer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from overlapprof.analysis import intervals as iv
from overlapprof.analysis.crossrank.bandwidth import bus_factor
from overlapprof.analysis.rank.classify import KINDS
from overlapprof.analysis.replay.timeline import NEED, SEND_RECV, Traced
from overlapprof.analysis.stats import median
from overlapprof.report.whatif import TransferFit

MIN_SIZES = 2  # distinct sizes a fit needs


@dataclass
class Model:
    """The fits, and each instance's latency under them (µs; 0 where none applies)."""

    fits: list[TransferFit]
    latency: np.ndarray
    notes: list[str]


def bus_bytes(kind: int, nbytes: float, n: int) -> float:
    """The bytes an operation of ``kind`` on ``n`` ranks moves on the wire (nccl-tests' bus bytes; send/recv: the message)."""
    if kind == SEND_RECV:
        return nbytes
    factor = bus_factor(KINDS[kind], n)
    return float("nan") if factor is None else nbytes * factor


def instance_bytes(tr: Traced) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per instance of ``tr``: its bus bytes (:func:`bus_bytes` of its largest known size; NaN
    where none is known), its kind and its group size."""
    count = len(tr.members)
    bus, kind, size = np.full(count, np.nan), np.zeros(count, dtype=np.int64), np.zeros(count, dtype=np.int64)
    for k, rows in enumerate(tr.members):
        if rows is None or not len(rows):
            continue
        first = int(rows[0])
        kind[k], size[k] = int(tr.kind[first]), int(tr.group_size[first]) or rows.size
        nb = tr.nbytes[rows]
        if not np.isnan(nb).all():
            bus[k] = bus_bytes(int(kind[k]), float(np.nanmax(nb)), int(size[k]))
    return bus, kind, size


def fit(tr: Traced, reference_bytes_per_us: float | None, link_bytes_per_us: float | None, sharing: int) -> Model:
    """The model of ``tr``'s instances. ``reference_bytes_per_us``: ``--reference-bandwidth``;
    ``link_bytes_per_us``: the run's shared link, ``sharing`` the ranks on it."""
    latency = np.zeros(len(tr.members))
    bus, kinds, sizes = instance_bytes(tr)
    groups: dict[tuple[int, int], list[int]] = {}
    for k, key in enumerate(zip(kinds.tolist(), sizes.tolist())):
        groups.setdefault(key, []).append(k)
    fits, notes = [], []
    reference, source = (reference_bytes_per_us, "reference") if reference_bytes_per_us else (
        (link_bytes_per_us / max(sharing, 1), "link") if link_bytes_per_us else (None, "none"))
    for (kind, n), insts in sorted(groups.items()):
        insts = np.array(insts)
        use = insts[~tr.warm[insts] & ~np.isnan(bus[insts]) & (tr.transfer[insts] > 0)]
        name = f"{KINDS[kind]} on {n} ranks"
        if not use.size:
            fits.append(TransferFit(kind=KINDS[kind], group_size=n, operations=int(insts.size), sizes=0,
                                    source="none", note="no operation with known bytes"))
            continue
        b, x = bus[use], tr.transfer[use]
        sizes = int(np.unique(b).size)
        lat = bw = None
        how = "fit"
        if sizes >= MIN_SIZES:
            slope, lat = np.polyfit(b, x, 1)
            if lat < 0:
                slope, lat = float(np.dot(b, x) / np.dot(b, b)), 0.0
            bw = 1.0 / slope if slope > 0 else None
        if bw is None:
            why = f"{sizes} distinct size{'s' if sizes != 1 else ''}" if sizes < MIN_SIZES else "no bandwidth trend"
            if reference is not None:
                bw, how = reference, source
                lat = max(0.0, median((x - b / bw).tolist()))
                notes.append(f"transfer model: {name}: {why}, too few to fit; latency from the "
                             f"{'--reference-bandwidth' if source == 'reference' else 'run link shared by its ranks'}")
            else:
                how, lat = "none", 0.0
                notes.append(f"transfer model: {name}: {why}, too few to fit and no reference bandwidth "
                             "(--reference-bandwidth, or a --link-rate run): a bandwidth change scales its whole transfer")
        model = lat + (b / bw if bw else 0.0)
        resid = (x - model) / x if bw else np.full(x.size, np.nan)
        latency[insts] = min(lat, float(np.min(x)))
        fits.append(TransferFit(
            kind=KINDS[kind], group_size=n, operations=int(use.size), sizes=sizes, source=how,
            latency_us=float(lat), bandwidth_gbps=float(bw / 1e3) if bw else None,
            median_abs_residual=float(np.median(np.abs(resid))) if bw else None,
            max_abs_residual=float(np.max(np.abs(resid))) if bw else None))
    return Model(fits, latency, notes)


MIN_INSTANCES = 8  # instances an interference fit needs
MIN_R = 0.5  # and the correlation it must show


def beside(tr: Traced, most: bool = False) -> np.ndarray:
    """Per instance, the compute that ran beside its transfer: Σ over its ranks of their compute
    in [its latest start, + its transfer) (µs; the ranks of one host share its cores); ``most``:
    the most one of its ranks did there instead."""
    out = np.zeros(len(tr.members))
    for k, rows in enumerate(tr.members):
        lo = float(np.max(tr.start[rows]))
        hi = lo + float(tr.transfer[k])
        each = [float(iv.covered(tr.compute[r], np.array([lo]), np.array([hi]))[0])
                for r in set(tr.rank[rows].tolist()) if r in tr.compute]
        out[k] = (max(each) if most else sum(each)) if each else 0.0
    return out


def held(tr: Traced) -> np.ndarray:
    """Per instance, whether compute held its transfer back: a rank that computed beside it
    stopped and waited for it (its need lies before the transfer's end), so more compute would
    have held it longer. One that ended while every rank computing beside it still computed was
    slowed beside that compute, and more of it beside does not make it slower."""
    need = {ref: t for lane in tr.lanes.values() for t, kind, ref in zip(lane.t, lane.kind, lane.ref)
            if kind == NEED}
    out = np.zeros(len(tr.members), dtype=bool)
    for k, rows in enumerate(tr.members):
        lo = float(np.max(tr.start[rows]))
        hi = lo + float(tr.transfer[k])
        for row in rows.tolist():
            r = int(tr.rank[row])
            if r in tr.compute and need.get(row, hi) < hi and \
                    iv.covered(tr.compute[r], np.array([lo]), np.array([hi]))[0] > 0:
                out[k] = True
    return out


def _fits(tr: Traced, c: np.ndarray):
    """(kind, group size, its instances, slope, x0, r, instances fitted) of each kind and group
    size whose transfers grow with the compute ``c`` beside them (see :func:`interference`)."""
    groups: dict[tuple[int, int], list[int]] = {}
    for k, rows in enumerate(tr.members):
        groups.setdefault((int(tr.kind[rows[0]]), rows.size), []).append(k)
    for (kind, n), insts in sorted(groups.items()):
        use = np.array([k for k in insts if not tr.warm[k]])
        if use.size < MIN_INSTANCES or np.ptp(c[use]) <= 0 or np.ptp(tr.transfer[use]) <= 0:
            continue
        r = float(np.corrcoef(c[use], tr.transfer[use])[0, 1])
        slope, x0 = np.polyfit(c[use], tr.transfer[use], 1)
        if slope > 0 and r >= MIN_R:
            yield kind, n, insts, float(slope), float(x0), r, use.size


def interference(tr: Traced, mode_cpu: bool) -> tuple[np.ndarray, list[str]]:
    """Per instance, the µs of its transfer the compute beside it cost (0: none found): per kind
    and group size, ``transfer = x0 + slope × compute beside it`` fitted on the instances (CPU
    runs: the ranks' compute and the backend's threads share the cores), kept when the slope is
    positive, the correlation at least :data:`MIN_R` and there are :data:`MIN_INSTANCES`."""
    cost = np.zeros(len(tr.members))
    notes: list[str] = []
    if not mode_cpu or not tr.members:
        return cost, notes
    c, most = beside(tr), beside(tr, most=True)
    for kind, n, insts, slope, x0, r, used in _fits(tr, c):
        # the ranks compute side by side: a transfer waits at most as long as one of them computed beside it
        cost[insts] = np.minimum(np.minimum(slope * c[insts], most[insts]), tr.transfer[insts])
        notes.append(f"interference: {KINDS[kind]} on {n} ranks: transfer = {x0:.0f} us + {slope:.3f} x the compute "
                     f"beside it (r = {r:.2f}, {used} instances): a compute change changes that part too")
    return cost, notes


def slopes(tr: Traced) -> tuple[np.ndarray, np.ndarray]:
    """Per instance, the slope of :func:`interference`'s fit for its kind and group size (0: none;
    GPU runs: none) and the compute beside it as traced."""
    out = np.zeros(len(tr.members))
    if tr.mode != "cpu" or not tr.members:
        return out, out.copy()
    c = beside(tr)
    for _, _, insts, slope, *_ in _fits(tr, c):
        out[insts] = slope
    return out, c


UNHINDERED_PERCENTILE = 10  # of a kind's transfers: the least hindered show what the transfer takes alone


def unhindered(tr: Traced, insts: np.ndarray, scale: dict[tuple[int, int], float] | None = None) -> np.ndarray:
    """Per instance of ``insts``, its transfer with nothing slowing it but the compute beside it:
    ``min(x, u + c)``, ``u`` the 10th percentile of the transfers of its kind, group size and
    bytes (warm-up left out where others are left), ``c`` the most compute one of its ranks did
    beside it, each rank's × ``scale[(rank, step)]`` (a rewrite that changed that step's
    compute; default 1). On CPU runs a transfer is stretched by what shares the cores with it:
    the compute beside it (kept: the cores stay shared) and the peers' backend threads, which
    spin while they wait for a late rank (taken away with the late rank, the transfer then goes
    on at the pace of the least hindered ones once the compute beside it is done)."""
    scale = scale or {}
    out = tr.transfer[insts].astype(float)
    if not insts.size:
        return out
    keys: dict[tuple, list[int]] = {}
    for k, rows in enumerate(tr.members):
        nb = tr.nbytes[rows]
        size = float(np.nanmax(nb)) if not np.isnan(nb).all() else -1.0
        keys.setdefault((int(tr.kind[rows[0]]), rows.size, size), []).append(k)
    key_of = {k: key for key, ks in keys.items() for k in ks}
    floor = {}
    for key, ks in keys.items():
        ks = np.array(ks)
        live = ks[~tr.warm[ks]] if (~tr.warm[ks]).any() else ks
        floor[key] = float(np.percentile(tr.transfer[live], UNHINDERED_PERCENTILE))
    for i, k in enumerate(insts.tolist()):
        rows = tr.members[k]
        lo = float(np.max(tr.start[rows]))
        hi = lo + float(tr.transfer[k])
        step = int(tr.step[rows[0]])
        c = max((scale.get((r, step), 1.0) * float(iv.covered(tr.compute[r], np.array([lo]), np.array([hi]))[0])
                 for r in set(tr.rank[rows].tolist()) if r in tr.compute), default=0.0)
        out[i] = min(out[i], floor[key_of[k]] + c)
    return out


def scaled(tr: Traced, model: Model, factor: float) -> None:
    """Rewrite ``tr``'s transfers for a bandwidth ``factor`` times the traced one, in place:
    instances ``latency + (x − latency) / factor``, a rank's negative tail (it ended before the
    instance's last rank) by the same ratio as its transfer; unmatched operations likewise with no latency.
    Instances a rewrite before it made (buckets, micro-batches) have no fitted latency: scaled whole."""
    fitted = model.latency[:tr.transfer.size]
    before = tr.transfer
    lat = np.minimum(np.pad(fitted, (0, tr.transfer.size - fitted.size)), before)
    tr.transfer = lat + (before - lat) / factor
    # a rank that ends before the instance's last rank (a negative tail: a send whose bytes the
    # link still held when it returned) ends the same share of the transfer earlier
    ratio = np.divide(tr.transfer, before, out=np.ones_like(before), where=before > 0)
    early = np.flatnonzero((tr.inst >= 0) & (tr.tail < 0))  # none where no operation was matched (one rank)
    tr.tail = tr.tail.copy()
    tr.tail[early] *= ratio[tr.inst[early]]
    unmatched = tr.inst < 0
    tr.dur = np.where(unmatched, tr.dur / factor, tr.dur)
