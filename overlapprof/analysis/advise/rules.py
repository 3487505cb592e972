"""The rules: from a run's causes of exposure, the candidate changes (each with the values of its
knob to search) and the hints (what the replay cannot model). One rule per cause or knob:

- ``bucket_cap_mb`` (DDP's all_reduce exposed, the buckets issued asynchronously): bucket sizes
  of the ladder from a sixteenth of the step's gradients up to one bucket holding them all (one
  bucket a step: with backward's start from the trace, :mod:`.onebucket`, the sizes below it,
  else a hint);
- ``prefetch`` (FSDP's all_gather exposed): 1 to 3 units more ahead, a deeper one kept only when
  it saves :data:`~overlapprof.report.advice.MIN_SAVING` of the step more (``Candidate.margin``);
- ``async`` (an operation of a kind blocks, ``no_window``): made asynchronous, its wait moved to
  where its result is first needed, or to the step's end; where ``prefetch`` fires, not FSDP's
  all_gather (prefetching is how FSDP overlaps it) and a blocking reduce_scatter is a hint (FSDP
  waits it: no argument of the user's makes it async); where ``bucket_cap_mb`` fires on blocking
  all_reduces (DDP's sync variant), not all_reduce (DDP's buckets over backward are how its
  gradients overlap, and the async variant a rerun makes);
- ``no_straggler`` (``late_peer``): the most waited-for rank's extra work removed, when it is waited
  for at least :data:`STRAGGLER_RATIO` times as long as the next and is late step after step
  (:func:`~overlapprof.analysis.exposure.late.not_steady`: in the median step waited for longer
  than any other rank by at least 3% of the step and the traced steps' own spread, and the last
  to arrive in every traced step or working longer than the others in every one; ranks that take
  turns being late are noise, not a straggler; whatif's ``no_straggler`` says so in a note); in a
  run of ``overlapprof run`` whose slow-rank options do not slow that rank, a hint without a
  number (its extra work is the workload's own: a pipeline's last stage computing the loss);
- ``host_sync`` (``host_blocked``): with barrier operations in the trace, ``no_host_sync`` (every
  barrier removed); without (host synchronizations that are not operations, as
  ``cudaStreamSynchronize``), a hint: the replay does not model them;
- ``queued``: a hint, the replay cannot place operations on a channel the trace does not show;
- ``bandwidth`` (a faster link): a hint with its replayed number, added after the ranking
  (:mod:`.ranking`): hardware, not a setting.

A rule fires when its cause is at least :data:`~overlapprof.report.advice.MIN_SAVING` of the
step; the words of each action are in :mod:`.terms`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from overlapprof.analysis.advise import terms
from overlapprof.analysis.advise.facts import Facts
from overlapprof.analysis.exposure.late import not_steady
from overlapprof.analysis.rank.classify import KINDS
from overlapprof.analysis.replay.timeline import Traced
from overlapprof.report.advice import MIN_SAVING, Hint, Rejected
from overlapprof.report.whatif import TransferFit

MIB = 1 << 20
LADDER = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 25.0, 50.0, 100.0, 200.0)  # bucket sizes tried, MiB
PREFETCH = (1, 2, 3)
STRAGGLER_RATIO = 2.0  # a straggler is waited for at least this many times as long as the next rank


@dataclass
class Candidate:
    """One rule's change: ``values`` the change strings of its knob to search, ``action`` one of
    them in the user's terms, ``cause`` what it removes, ``confidence`` what its model assumes."""

    rule: str
    values: list[str]
    cause: str
    action: Callable[[str], str]
    confidence: list[str] = field(default_factory=list)
    prefer_last: bool = False  # among values as good as each other, the last (the largest bucket)
    # a later value replaces an earlier one only when its step is shorter by at least this share
    # (more prefetching holds more gathered units, a cost the replay does not check)
    margin: float = 0.0


def _ms(us: float) -> str:
    return f"{us / 1000:.3f} ms"


def _transfer_words(fits: list[TransferFit], kind: str) -> str:
    for f in fits:
        if f.kind == kind:
            if f.source == "fit":
                return f"transfer model: {kind} fitted on {f.sizes} sizes"
            if f.source in ("reference", "link"):
                return f"transfer model: {kind} at the {'reference bandwidth' if f.source == 'reference' else 'run link'}"
            return f"transfer model: {kind} none (one size, no reference: the traced time per byte kept)"
    return f"transfer model: no {kind} fit"


def _common(facts: Facts, cpu: bool) -> list[str]:
    return ["interference not modelled (a transfer keeps its traced time beside new compute)"] if cpu else []


def candidates(facts: Facts, tr: Traced, fits: list[TransferFit], cpu: bool,
               one_bucket: Callable[[], str | None] = lambda: None) -> tuple[list[Candidate], list[Hint], list[Rejected]]:
    """The candidates, hints and candidates left out before any replay of a run (see the module
    docstring); ``one_bucket``: how the replayer places smaller buckets where DDP traced one a step
    (its assumption, in words; None: it cannot place them)."""
    out: list[Candidate] = []
    hints: list[Hint] = []
    rejected: list[Rejected] = []
    floor = MIN_SAVING * facts.step_us
    ar = facts.kind_cause_us.get("all_reduce", {})
    ar_blocking = any(b.kind == "all_reduce" for bl in facts.blocking.values() for b in bl)
    if "all_reduce" in facts.kinds and sum(ar.values()) >= floor and (
            "bucket_cap_mb" in facts.options or not ar_blocking):
        values, one, total = _bucket_values(facts, tr)
        spread = []
        if one and (placed := one_bucket()) is not None:
            # a size that holds every gradient is the traced bucket again: the run as it is, not a change
            values, one = [v for v in _bucket_values(facts, tr, single=False)[0]
                           if float(v.split("=")[1]) < total], False
            spread = [placed]
        if one and "bucket_cap_mb" in facts.options:  # without the option or autograd names: not DDP's bucket
            hints.append(Hint(
                rule="bucket_cap_mb", change=f"bucket_cap_mb={_nice(total / 4)}",
                action=terms.bucket(facts, f"bucket_cap_mb={_nice(total / 4)}"),
                why=f"one all_reduce a step: a single bucket holds all {total:.3g} MiB of gradients, reduced when "
                    f"backward ends (all_reduce exposed {_ms(sum(ar.values()))} a step); smaller buckets would start "
                    "during backward, but the trace names no autograd function to place backward by, so the replay "
                    "cannot place them"))
        elif values:
            out.append(Candidate(
                "bucket_cap_mb", values,
                f"all_reduce exposed {_ms(sum(ar.values()))} a step (window_short {_ms(ar.get('window_short', 0))}: "
                f"the last bucket reduced after backward ends; no_window {_ms(ar.get('no_window', 0))})",
                lambda v: terms.bucket(facts, v),
                [_transfer_words(fits, "all_reduce"),
                 *(spread or ["gradients taken as produced evenly between the traced buckets"]), *_common(facts, cpu)],
                prefer_last=True))
    ag = facts.kind_cause_us.get("all_gather", {})
    if "all_gather" in facts.kinds and sum(ag.values()) >= floor:
        out.append(Candidate(
            "prefetch", [f"prefetch={n}" for n in PREFETCH],
            f"all_gather exposed {_ms(sum(ag.values()))} a step (no_window {_ms(ag.get('no_window', 0))}, "
            f"window_short {_ms(ag.get('window_short', 0))}, queued {_ms(ag.get('queued', 0))})",
            lambda v: terms.prefetch(facts, v),
            ["the memory of more gathered units is not checked", *_common(facts, cpu)], margin=MIN_SAVING))
    fsdp = any(c.rule == "prefetch" for c in out)
    # DDP's gradients reduced blocking (a run with the bucket option): buckets over backward are how
    # they overlap, and what a rerun "made async" runs (the sync variant's async one buckets them)
    ddp = ar_blocking and any(c.rule == "bucket_cap_mb" for c in out)
    for kind in KINDS:
        if kind in ("barrier", "other") or (fsdp and kind == "all_gather") or (ddp and kind == "all_reduce"):
            # FSDP issues its all-gathers itself: prefetching is how they overlap (an FSDP run's async
            # variant is prefetch=1 from its sync one), not an async_op the user's code passes; DDP's
            # gradients are read right after their all_reduce (the optimizer), so moving its wait
            # later predicts a program no rerun makes
            continue
        blocked = facts.kind_cause_us.get(kind, {}).get("no_window", 0.0)
        if blocked >= floor and fsdp and kind == "reduce_scatter" and any(
                b.kind == kind for bl in facts.blocking.values() for b in bl):
            hints.append(Hint(
                rule="async", change=f"async={kind}", action=terms.make_async(facts, kind, f"async={kind}"),
                why=f"{kind} blocking: no_window {_ms(blocked)} a step, but FSDP issues and waits its reduce-scatters "
                    "itself: no argument of the user's code makes them asynchronous"))
        elif blocked >= floor and any(b.kind == kind for bl in facts.blocking.values() for b in bl):
            out.append(Candidate(
                "async", [f"async={kind}", f"async={kind}@end"],
                f"{kind} blocking: no_window {_ms(blocked)} a step (nothing computes beside it)",
                lambda v, kind=kind: terms.make_async(facts, kind, v),
                ["its result taken as first needed at the next such operation after some compute, else the "
                 "step's end (the trace does not say which tensor the program reads next)", *_common(facts, cpu)]))
    late = sorted(facts.late_us.items(), key=lambda kv: -kv[1])
    for rank, us in late[:1]:  # one straggler: the most waited-for rank, at least twice the next one,
        # and late step after step (late.not_steady)
        clear = len(late) < 2 or us >= STRAGGLER_RATIO * late[1][1]
        noise = not_steady(facts.late_net_us.get(rank, []), facts.step_us, facts.spread_us,
                           facts.extra_us.get(rank))
        if us >= floor and clear and noise is not None and rank in tr.lanes and len(tr.lanes) > 1:
            rejected.append(Rejected(
                rule="no_straggler", change=f"no_straggler={rank}",
                why=f"the others wait {_ms(us)} a step for rank {rank} on average, but not step after step ({noise}): "
                    "ranks late by turns, not a straggler"))
        elif us >= floor and clear and rank in tr.lanes and len(tr.lanes) > 1 and not _planted_elsewhere(facts, rank):
            out.append(Candidate(
                "no_straggler", [f"no_straggler={rank}"], f"late_peer: the others wait {_ms(us)} a step for rank {rank}",
                lambda v, rank=rank, us=us: terms.straggler(facts, rank, us),
                ["the rank's extra work brought down to the other ranks' median; what made it late is not modelled"]))
        elif us >= floor and clear and rank in tr.lanes and len(tr.lanes) > 1:
            hints.append(Hint(
                rule="no_straggler", change=f"no_straggler={rank}", action=terms.straggler(facts, rank, us),
                why=f"late_peer: the others wait {_ms(us)} a step for rank {rank}, but it is not this run's slow rank "
                    f"(slow_rank={facts.options.get('slow_rank')}, slow_ms={facts.options.get('slow_ms')}): its extra "
                    "work is the workload's own (a pipeline stage's share of the model, say), which no option of a "
                    "rerun removes: balance the ranks' work in the code"))
    if facts.cause_us.get("host_blocked", 0.0) >= floor and (tr.kind == KINDS.index("barrier")).any():
        out.append(Candidate(
            "host_sync", ["no_host_sync"], f"host_blocked {_ms(facts.cause_us['host_blocked'])} a step: a barrier holds "
                                           "the host while communication is in flight",
            lambda v: terms.host_sync(facts),
            ["each barrier removed, its rank going straight on; the operations in flight across it take the "
             "transfer model's time for their bytes", *_common(facts, cpu)]))
    elif facts.cause_us.get("host_blocked", 0.0) >= floor:
        hints.append(Hint(rule="host_sync", action=terms.host_sync(facts),
                          why=f"host_blocked {_ms(facts.cause_us['host_blocked'])} a step: the replay does not model "
                              "host synchronizations (moving one changes what the host launches when)"))
    if facts.cause_us.get("queued", 0.0) >= floor:
        hints.append(Hint(rule="queued", action=terms.queued(facts),
                          why=f"queued {_ms(facts.cause_us['queued'])} a step: another process group or stream is not "
                              "in the trace's operations, so the replay cannot place the operations on it"))
    return out, hints, rejected


def _planted_elsewhere(facts: Facts, rank: int) -> bool:
    """An `overlapprof run` run whose late rank is not the one its slow-rank options slow (none
    slowed, or another): what makes it late is the workload's own code, not a setting a rerun
    changes. A user's own job (no workload) is never: its slow rank is theirs to fix."""
    if facts.workload is None:
        return False
    return facts.options.get("slow_rank") != rank or not (facts.options.get("slow_ms") or 0) > 0


def _nice(mb: float) -> str:
    """The ladder's size nearest ``mb`` (at most it)."""
    return f"{max([v for v in LADDER if v <= mb] or [LADDER[0]]):g}"


def _bucket_values(facts: Facts, tr: Traced, single: bool = True) -> tuple[list[str], bool, float]:
    """Bucket sizes from the ladder around the traced all_reduces' bytes a step: at least a
    sixteenth of them, at most one size above them all (one bucket), the traced cap left out;
    whether there is one all_reduce a (rank, step) (a single bucket: nothing to regroup from);
    the bytes a step in MiB."""
    rows = np.flatnonzero(tr.kind == KINDS.index("all_reduce"))
    sizes = tr.nbytes[rows]
    if not rows.size or np.isnan(sizes).all():
        return [], False, 0.0
    keys = [(int(tr.rank[r]), int(tr.step[r])) for r in rows.tolist()]
    steps = max(1, len(set(keys)))
    total = float(np.nansum(sizes)) / steps / MIB
    if single and len(keys) == steps:
        return [], True, total
    current = facts.options.get("bucket_cap_mb")
    out = []
    for v in LADDER:
        if v < total / 16:
            continue
        if current is not None and abs(float(current) - v) < 1e-9:
            continue
        out.append(f"bucket_cap_mb={v:g}")
        if v >= total:
            break
    return out, False, total
