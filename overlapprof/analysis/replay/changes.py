"""Changes, each a rewrite of the traced steps before they are replayed.

A change is ``name=value``; several joined by commas are one combined change
(``link_rate=4gbit,compute=x0.5``). What each rewrites:

- ``link_rate=RATE`` (a ``--link-rate`` run only) and ``bandwidth=xK``: every transfer becomes
  ``latency + (x − latency) / K`` (:mod:`.transfer`; K = new rate / traced rate); with a link,
  each step is also at least the bytes its instances put on the link at the new rate.
- ``compute=xF``: the compute in every lane's work is multiplied by F (the rest of the work,
  host code and idle, is kept); on CPU runs where the transfers were measured longer with more
  compute beside them, that part of each transfer × F too (:func:`.transfer.interference`).
- ``no_straggler=R``: rank R's extra work removed, down to the other ranks' (:mod:`.straggler`).
- ``async=KIND`` (``async=KIND@end``): every KIND operation with no compute in its window
  becomes asynchronous: its need moves to the issue of the next KIND operation issued after
  some compute (the first use its result can have in a chain of such calls: a ring's next
  send), else (and always with ``@end``) to the end of its step. A pipeline's receives keep
  their waits (the stage computes on what they bring) and are posted where the step's first
  one was (:func:`_post_receives_early`).

- ``bucket_cap_mb=N``: DDP's all_reduce operations regrouped into buckets of N MiB
  (:mod:`.buckets`).

- ``prefetch=N``: each FSDP all_gather issued N all-gathers earlier (:mod:`.prefetch`).

- ``micro_batches=N``: a pipeline's send/recv schedule cut into N micro-batches
  (:mod:`.microbatch`).

- ``no_host_sync`` (``no_host_sync=all``): every barrier taken out of the steps (:mod:`.hostsync`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import numpy as np

from overlapprof.analysis.rank.classify import KINDS
from overlapprof.analysis.replay.buckets import Refused, regroup
from overlapprof.analysis.replay.gradients import gradients
from overlapprof.analysis.replay.hostsync import drop_barriers
from overlapprof.analysis.replay.microbatch import RECV, micro_batches, pipeline
from overlapprof.analysis.replay.percall import shares
from overlapprof.analysis.replay.prefetch import prefetch
from overlapprof.analysis.replay.straggler import no_straggler
from overlapprof.analysis.replay.timeline import BOUND, ISSUE, NEED, SEND_RECV, Traced
from overlapprof.analysis.replay.transfer import Model, held, scaled
from overlapprof.errors import InputError
from overlapprof.units import HELP, bits_per_s

NAMES = ("link_rate", "bandwidth", "compute", "no_straggler", "async", "bucket_cap_mb", "prefetch", "micro_batches",
         "no_host_sync")
BARE = {"no_host_sync": "all"}  # changes that may be named without a value: the value they mean


class Unmodelled(Exception):
    """A change this trace cannot model: the message names the change and what the trace lacks."""


@dataclass
class Context:
    """What the rewrites need besides the traced steps: the fitted model and the run's shared
    link (bytes/µs; None: the run had no ``--link-rate``)."""

    model: Model
    link_bytes_per_us: float | None
    interference: np.ndarray = field(default_factory=lambda: np.zeros(0))  # per instance, µs compute beside cost it
    # rank -> its files' host ops with their shapes, from the analysis's one read (Analyzed.op_shapes):
    # what micro_batches reads of their ops (:mod:`.percall`)
    op_shapes: dict = field(default_factory=dict)
    # rank -> its trace files: bucket_cap_mb reads DDP's gradients from them (:mod:`.gradients`)
    files: dict = field(default_factory=dict)
    # rank -> µs its trace's clock is behind the common clock (the cross-rank matching's shift)
    shift: dict = field(default_factory=dict)
    # over loopback: a bucket's time beyond its bytes' least hindered pace is paid per operation (:mod:`.buckets`)
    per_operation: bool = False
    _per_call: dict | None = None
    _gradients: dict | None = None

    def per_call(self) -> dict:
        """Rank -> step number -> the per-call share of the micro-batches' compute (made once)."""
        if self._per_call is None:
            self._per_call = shares(self.op_shapes)
        return self._per_call

    def gradients(self) -> dict:
        """Rank -> step number -> (when, on the common clock, and elements) of its gradients in the
        order backward made them (made once)."""
        if self._gradients is None:
            self._gradients = {r: {k: [(t + float(self.shift.get(r, 0.0)), n) for t, n in g] for k, g in steps.items()}
                               for r, steps in gradients(self.files).items()}
        return self._gradients


@dataclass
class Rewritten:
    traced: Traced
    link_bytes_per_us: float | None  # the link the steps are floored by (None: no floor)
    notes: list[str]
    compute_factor: float = 1.0  # the lanes' compute scaled by this (compute=xF, every one of the change)


def parse(text: str) -> list[tuple[str, str]]:
    """``name=value[,name=value...]`` -> pairs; InputError on a malformed or unknown one."""
    out = []
    for part in [p.strip() for p in str(text).split(",") if p.strip()]:
        name, eq, value = part.partition("=")
        name = name.strip().lower()
        if not eq and name in BARE:
            eq, value = "=", BARE[name]
        if not eq or not value.strip():
            raise InputError(f"--set {part}: a change is NAME=VALUE (one of {', '.join(NAMES)})")
        if name not in NAMES:
            raise InputError(f"--set {part}: no change named {name!r} (one of {', '.join(NAMES)})")
        out.append((name, value.strip()))
    if not out:
        raise InputError(f"--set {text!r}: no change given (NAME=VALUE, one of {', '.join(NAMES)})")
    return out


def factor(name: str, value: str) -> float:
    """``x2``, ``2x`` or ``2`` -> 2.0; InputError unless a positive number."""
    text = value.lower().removeprefix("x").removesuffix("x")
    try:
        f = float(text)
    except ValueError:
        f = -1.0
    if not f > 0 or f == float("inf"):
        raise InputError(f"--set {name}={value}: a factor is a positive number, as x2 or x0.5")
    return f


def rewrite(tr: Traced, changes: list[tuple[str, str]], ctx: Context) -> Rewritten:
    """A rewritten copy of ``tr`` for ``changes``; Unmodelled when one cannot be modelled."""
    tr = copy.deepcopy(tr)
    link = ctx.link_bytes_per_us
    notes: list[str] = []
    scale = 1.0
    for name, value in changes:
        if name == "link_rate":
            bits = bits_per_s(value)
            if bits is None:
                raise InputError(f"--set link_rate={value}: not a rate ({HELP})")
            if ctx.link_bytes_per_us is None:
                raise Unmodelled(f"link_rate={value}: the traced run had no --link-rate link to change "
                                 "(say how much faster the transfers get with bandwidth=xK)")
            new = bits / 8 / 1e6
            scaled(tr, ctx.model, new / ctx.link_bytes_per_us)
            link = new
        elif name == "bandwidth":
            k = factor(name, value)
            scaled(tr, ctx.model, k)
            if link is not None:
                link *= k
        elif name == "compute":
            f = factor(name, value)
            scale *= f
            cost = ctx.interference[:tr.transfer.size]  # instances a rewrite before made (micro-batches): none fitted
            if f > 1:  # more compute lengthens only the transfers it held back
                cost = cost * held(tr)[:cost.size]
            tr.transfer = tr.transfer - (1 - f) * np.pad(cost, (0, tr.transfer.size - cost.size))
            for lane in tr.lanes.values():
                lane.work = [w - (1 - f) * c for w, c in zip(lane.work, lane.compute)]
                lane.compute = [f * c for c in lane.compute]
        elif name == "no_straggler":
            try:
                notes += no_straggler(tr, value)
            except Refused as exc:
                raise Unmodelled(f"no_straggler={value}: {exc}") from None
        elif name == "async":
            notes += _make_async(tr, value)
        elif name == "prefetch":
            notes += _prefetch(tr, value)
        elif name == "bucket_cap_mb":
            cap = _size_mb(value)
            try:
                made, unpaired = regroup(tr, cap, ctx.model.latency, ctx.per_operation,
                                         ctx.interference if ctx.link_bytes_per_us else None, ctx.gradients(),
                                         _link_per_byte(ctx))
            except Refused as exc:
                raise Unmodelled(f"bucket_cap_mb={value}: {exc}") from None
            notes.append(f"bucket_cap_mb={value}: {made} bucket{'s' if made != 1 else ''} in all replace the traced "
                         "all_reduce operations")
            if unpaired:
                notes.append(f"bucket_cap_mb={value}: {unpaired} step{'s' if unpaired != 1 else ''} left as traced: "
                             "the cross-rank matching did not pair their all_reduce operations one per rank")
        elif name == "no_host_sync":
            notes += _no_host_sync(tr, value, ctx)
        else:  # micro_batches
            notes += _micro_batches(tr, value, ctx)
    return Rewritten(tr, link, notes, scale)


def _link_per_byte(ctx: Context) -> float | None:
    """µs a bus byte of an all_reduce over the run's paced link, a rank's share of it (the transfer
    fit's bandwidth where it came from the link); None without one."""
    if not ctx.link_bytes_per_us:
        return None
    fit = next((f for f in ctx.model.fits if f.kind == "all_reduce" and f.source == "link" and f.bandwidth_gbps), None)
    return 1 / (fit.bandwidth_gbps * 1e3) if fit is not None else None


def _size_mb(value: str) -> float:
    try:
        mb = float(value)
    except ValueError:
        mb = -1.0
    if not 0 < mb < float("inf"):
        raise InputError(f"--set bucket_cap_mb={value}: a size in MiB, a positive number (as DDP's bucket_cap_mb)")
    return mb


def _count(name: str, value: str, what: str) -> int:
    """``value`` as a whole number of at least 1, else bad input naming ``what`` it counts."""
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise InputError(f"--set {name}={value}: {what}, a whole number of at least 1")
    return n


def _prefetch(tr: Traced, value: str) -> list[str]:
    depth = _count("prefetch", value, "how many units earlier")
    if not (tr.kind == KINDS.index("all_gather")).any():
        raise Unmodelled(f"prefetch={value}: the trace has no all_gather operations (FSDP's unit all-gathers) to "
                         "issue earlier")
    moved = prefetch(tr, depth)
    if not moved:
        raise Unmodelled(f"prefetch={value}: no step (or its forward or backward pass) has more than {depth} "
                         "all_gather operations to issue earlier")
    return [f"prefetch={value}: {moved} all_gather operations issued {depth} earlier (the memory that takes is "
            "not checked)"]


def _no_host_sync(tr: Traced, value: str, ctx: Context) -> list[str]:
    if value.lower() != "all":
        raise InputError(f"--set no_host_sync={value}: the only value is 'all' (every barrier), or name it alone")
    removed, cut = drop_barriers(tr, ctx.model)
    if not removed:
        raise Unmodelled("no_host_sync: the trace has no barrier operation to remove (a host synchronization that is "
                         "not an operation, as cudaStreamSynchronize or aten::item, is part of the host's work: the "
                         "replay cannot tell what the host would do without it)")
    steps = max([len(lane.steps) for lane in tr.lanes.values()] + [1])
    notes = [f"no_host_sync: {removed} barrier operations removed, each rank going straight on to what followed them"]
    if cut > 0:
        notes.append(f"no_host_sync: the operations in flight across a barrier take the transfer model's time for "
                     f"their bytes, {cut / steps / 1000:.3f} ms of transfer a step less than measured (the barrier held "
                     "their lanes, and their measured end with them)")
    return notes


def _make_async(tr: Traced, value: str) -> list[str]:
    kind_name, _, where = value.partition("@")
    kind_name = kind_name.strip().lower()
    if kind_name not in KINDS:
        raise InputError(f"--set async={value}: no kind {kind_name!r} (one of {', '.join(KINDS)})")
    if where not in ("", "end"):
        raise InputError(f"--set async={value}: after @ only 'end' (wait at the step's end)")
    code = KINDS.index(kind_name)
    if not (tr.kind == code).any():
        raise Unmodelled(f"async={value}: the trace has no {kind_name} operation")
    moved = 0
    inputs = code == SEND_RECV and pipeline(tr)
    for lane in tr.lanes.values():
        moved += _move_needs(tr, lane, code, at_end=where == "end", keep_receives=inputs)
        if inputs:
            _post_receives_early(tr, lane)
    if not moved:
        raise Unmodelled(f"async={value}: every {kind_name} operation already has compute in its window "
                         "(it is asynchronous already)")
    return [f"async={value}: {moved} blocking {kind_name} operations made asynchronous"]


def _move_needs(tr: Traced, lane, code: int, at_end: bool, keep_receives: bool = False) -> int:
    issued, moved = {}, 0
    cum = 0.0
    blocking = []
    for j, (kind, ref) in enumerate(zip(lane.kind, lane.ref)):
        if kind == ISSUE:
            issued[ref] = cum
        elif kind == NEED and tr.kind[ref] == code and ref in issued and cum - issued[ref] <= 0 \
                and not (keep_receives and tr.direction[ref] == RECV):
            blocking.append(ref)
        cum += lane.compute[j]
    for row in blocking:
        q = next(j for j, (k, r) in enumerate(zip(lane.kind, lane.ref)) if k == NEED and r == row)
        if q > 0:
            lane.work[q - 1] += lane.work[q]
            lane.compute[q - 1] += lane.compute[q]
        for name in ("t", "kind", "ref", "work", "compute"):
            del getattr(lane, name)[q]
        target = _first_use(tr, lane, row, code, at_end)
        for name, v in (("t", lane.t[min(target, len(lane.t) - 1)]), ("kind", NEED), ("ref", row), ("work", 0.0), ("compute", 0.0)):
            getattr(lane, name).insert(target, v)
        moved += 1
    return moved


def _post_receives_early(tr: Traced, lane) -> None:
    """A pipeline made asynchronous posts its receives ahead (``irecv``), each still waited for
    before the compute that uses it: every receive of a step is issued where the step's first
    receive was, in their traced order, so its data moves as soon as the peer's send is issued
    instead of once the stage has finished computing the micro-batch before it. The work after
    a moved issue (none for a blocking call) goes to the key before it."""
    out, first = [], None  # first: where in ``out`` this step's receives are posted
    for key in zip(lane.t, lane.kind, lane.ref, lane.work, lane.compute):
        t, kind, ref, work, compute = key
        if kind == BOUND:
            first = None
        elif kind == ISSUE and tr.kind[ref] == SEND_RECV and tr.direction[ref] == RECV:
            if first is None:
                first = len(out) + 1
            elif out:
                out[-1][3] += work
                out[-1][4] += compute
                out.insert(first, [out[first - 1][0], ISSUE, ref, 0.0, 0.0])
                first += 1
                continue
        out.append(list(key))
    for i, name in enumerate(("t", "kind", "ref", "work", "compute")):
        setattr(lane, name, [k[i] for k in out])


def _first_use(tr: Traced, lane, row: int, code: int, at_end: bool) -> int:
    """Where ``row``'s result is first needed: the next ``code`` issue after some compute, else
    (or with ``at_end``) its step's end, else the lane's end."""
    j = next(j for j, (k, r) in enumerate(zip(lane.kind, lane.ref)) if k == ISSUE and r == row)
    computed = 0.0
    for i in range(j + 1, len(lane.kind)):
        kind, ref = lane.kind[i], lane.ref[i]
        if kind == BOUND and ref % 2 == 1:
            return i
        if not at_end and kind == ISSUE and tr.kind[ref] == code and computed > 0:
            return i
        computed += lane.compute[i]
    return len(lane.kind)


def _micro_batches(tr: Traced, value: str, ctx: Context) -> list[str]:
    n = _count("micro_batches", value, "how many micro-batches a step")
    try:
        m, stalls = micro_batches(tr, n, ctx.model.latency, ctx.per_call())
    except Refused as exc:
        raise Unmodelled(f"micro_batches={value}: {exc}") from None
    head = (f"micro_batches={value}: the traced {m} micro-batches a step cut into {n} (each hand-over's bytes x "
            f"{m}/{n}, what it took beyond them and the host work paid per micro-batch; "
            + (f"the compute beyond each pass's least hindered micro-batch, {_span(stalls)} of the micro-batches' "
               "compute by rank and step, paid per micro-batch as a stall met once a micro-batch; " if stalls else ""))
    found = [v for steps in ctx.per_call().values() for v in steps.values()]
    if not found:
        return [head + ("the rest of " if stalls else "") + "the step's compute kept: the trace's shapes do not say "
                "which ops carry a micro-batch's rows (none recorded, or the rows also size another dimension of the "
                "hand-over))"]
    return [head + f"of the rest, the share their ops without the rows took ({_span(found)} by rank and step) "
            "paid per micro-batch, the rest kept: "
            "how an op with the rows runs at another row count, a matmul's speed at small sizes, is not in one "
            "trace)"]


def _span(shares: list[float]) -> str:
    low, high = f"{100 * min(shares):.0f}%", f"{100 * max(shares):.0f}%"
    return low if low == high else low[:-1] + "-" + high


def link_floor(tr: Traced, rate: float) -> dict[int, float]:
    """Step number -> µs its matched instances' bytes need on a shared link of ``rate`` bytes/µs
    (send/recv: the message once; a collective: n × bus factor × its size), as the overlap
    bound's link floor counts them."""
    from overlapprof.analysis.crossrank.bandwidth import bus_factor

    out: dict[int, float] = {}
    for rows in tr.members:
        first = int(rows[0])
        nbytes, kind, step = float(np.nanmax(tr.nbytes[rows])) if not np.isnan(tr.nbytes[rows]).all() else None, \
            KINDS[int(tr.kind[first])], int(tr.step[first])
        if nbytes is None or kind == "barrier" or step < 0:
            continue
        n = int(tr.group_size[first]) or rows.size
        f = 1.0 if kind == "send_recv" else bus_factor(kind, n)
        if f is None:
            continue
        out[step] = out.get(step, 0.0) + (nbytes if kind == "send_recv" else n * f * nbytes) / rate
    return out
