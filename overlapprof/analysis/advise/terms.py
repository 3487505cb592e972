"""Each change in the user's terms: a workload option (``--opt bucket_cap_mb=5``) for a run of
``overlapprof run`` whose workload has it, the DDP/FSDP argument otherwise, or the line of code to
move, named from the trace ("wait for all_reduce #3 after ``layer4``, not right after issuing it").

:func:`prepare` reads what the words need once (the names of the compute each blocking operation
could hide under, the host synchronizations); the other functions only format.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from overlapprof.analysis.advise import names
from overlapprof.analysis.advise.facts import Facts
from overlapprof.analysis.replay.changes import Unmodelled, rewrite
from overlapprof.analysis.replay.timeline import BOUND, ISSUE, NEED


def _ms(us: float) -> str:
    return f"{us / 1000:.3f} ms"


def _code(names_: list[str]) -> str:
    return " and ".join(f"`{n}`" for n in names_) if names_ else "the compute that follows"


def prepare(replayer, facts: Facts) -> dict[str, str]:
    """Words read from the trace: per blocking kind, where its wait can go (``async:KIND``); the
    host synchronizations (``host_sync``); whether the workload has an async variant."""
    said: dict[str, str] = {}
    run = replayer.report.run or {}
    path = (run.get("workload") or {}).get("path")
    try:
        text = Path(path).read_text() if path else ""
    except OSError:
        text = ""
    if re.search(r"""["']async["']\s*:""", text):
        said["async_variant"] = "yes"
    files = {r.rank: r.files for r in replayer.report.ranks}
    shift = getattr(replayer.analyzed.matching, "shift", {}) if replayer.analyzed.matching is not None else {}
    cache: dict[int, list] = {}

    def evs(rank):
        if rank not in cache:
            cache[rank] = names.events(files.get(rank, []))
        return cache[rank]

    for kind in sorted({b.kind for bl in facts.blocking.values() for b in bl}):
        said[f"async:{kind}"] = _where(replayer, facts, kind, evs, shift)
        said[f"async:{kind}@end"] = _where(replayer, facts, kind, evs, shift, at_end=True)
    host_blocked = [(r.exposure.host_blocked_us, r.rank) for r in replayer.report.ranks if r.exposure]
    if host_blocked and max(host_blocked)[0] > 0:
        rank = max(host_blocked)[1]
        rr = replayer.report.rank(rank)
        found: dict[str, float] = {}
        for s in rr.steps:
            for n, us in names.host_syncs(evs(rank), s.start_us, s.start_us + s.step_us).items():
                found[n] = found.get(n, 0.0) + us / max(len(rr.steps), 1)
        if found:
            said["host_sync"] = f"rank {rank}: " + ", ".join(f"`{n}` {_ms(us)} a step"
                                                               for n, us in sorted(found.items(), key=lambda kv: -kv[1]))
    return said


def _where(replayer, facts: Facts, kind: str, evs, shift, at_end: bool = False) -> str:
    """"wait for KIND #k after `x`, before KIND #k+1, not right after issuing it", read from the
    rank with the longest blocking operations of the kind, in its middle step."""
    rank = max(facts.blocking, key=lambda r: sum(b.dur_us for b in facts.blocking[r] if b.kind == kind))
    ops = [b for b in facts.blocking[rank] if b.kind == kind]
    steps = sorted({b.step for b in ops})
    mid = steps[len(steps) // 2]
    op = max((b for b in ops if b.step == mid), key=lambda b: b.dur_us)
    tr = replayer.tr
    try:
        lane = rewrite(tr, [("async", f"{kind}@end" if at_end else kind)], replayer.ctx).traced.lanes[rank]
        at = next(j for j, (k, r) in enumerate(zip(lane.kind, lane.ref)) if k == NEED and r == op.row)
    except (Unmodelled, IndexError, StopIteration):  # the rewrite's own failures: said by the replayer too
        return f"issue {kind} #{op.ordinal} asynchronously and wait for it where its result is first used"
    after = lane.kind[at + 1] if at + 1 < len(lane.kind) else None
    ref = lane.ref[at + 1] if after is not None else None
    before = (f"before {kind} #{op.ordinal + 1}" if after == ISSUE and ref is not None and
              replayer.tr.kind[ref] == replayer.tr.kind[op.row] else "at the step's end")
    if after == BOUND or after is None:
        before = "at the step's end"
    sh = float(shift.get(rank, 0.0)) if hasattr(shift, "get") else 0.0
    lo, hi = float(tr.issue[op.row]) - sh, float(lane.t[at]) - sh
    cs, ce = tr.compute.get(rank, (np.empty(0), np.empty(0)))
    under = names.compute_under(evs(rank), lo, hi, (cs - sh, ce - sh))
    how = "isend/irecv, then .wait() there" if kind == "send_recv" else "async_op=True, then .wait() there"
    every = f", and every blocking {kind} likewise" if at_end else ""
    return (f"wait for {kind} #{op.ordinal} ({_ms(op.dur_us)} on rank {rank}) after {_code(under)} ({before}){every}, "
            f"not right after issuing it ({how})")


def _run(facts: Facts) -> bool:
    return facts.workload is not None


def bucket(facts: Facts, change: str) -> str:
    mb = change.split("=", 1)[1]
    if _run(facts) and "bucket_cap_mb" in facts.options:
        if facts.variant == "sync" and facts.said.get("async_variant"):  # no_sync: the option sizes nothing there
            return f"rerun with --variant async --opt bucket_cap_mb={mb} (the sync variant has no buckets)"
        return f"rerun with --opt bucket_cap_mb={mb} (was {facts.options['bucket_cap_mb']:g})"
    return f"DistributedDataParallel(model, bucket_cap_mb={mb})"


def prefetch(facts: Facts, change: str) -> str:
    more = int(change.split("=", 1)[1])
    if _run(facts) and "prefetch" in facts.options:
        now = int(facts.options["prefetch"]) if facts.variant == "async" else 0
        variant = "--variant async " if facts.variant != "async" else ""
        return f"rerun with {variant}--opt prefetch={now + more} (was {now}: {more} more unit{'s' if more > 1 else ''} ahead)"
    return (f"prefetch {more} more FSDP unit{'s' if more > 1 else ''} ahead: FSDP2 "
            f"`module.set_modules_to_forward_prefetch(the next {more} modules)` (FSDP1: forward_prefetch=True)")


def make_async(facts: Facts, kind: str, change: str) -> str:
    said = facts.said
    words = said.get(f"async:{kind}", f"issue {kind} asynchronously and wait where its result is first used")
    if change.endswith("@end"):
        words = said.get(f"async:{kind}@end",
                         f"issue every blocking {kind} asynchronously and wait for them all at the step's end")
    if _run(facts) and facts.variant == "sync" and said.get("async_variant"):
        words += " (this workload: --variant async)"
    return words


def straggler(facts: Facts, rank: int, late_us: float) -> str:
    act = facts.late_activity
    top = max(act, key=act.get) if act else "other"
    part = late_us * act.get(top, 1.0)
    what = {"other": "outside compute and communication: look at its data loading and host code",
            "compute": "in compute: it computes longer than the others (more work, a slower device, or fewer free "
                       "cores: balance the batches, check its device)",
            "comm": "in other communication: look at what it exchanges besides this"}[top]
    words = f"rank {rank} is late by {_ms(late_us)} a step, {_ms(part)} of it {what}"
    o = facts.options
    if _run(facts) and o.get("slow_rank") == rank and float(o.get("slow_ms") or 0) > 0:
        words += f" (this run: --opt slow_ms={o['slow_ms']:g} on rank {rank}: drop it)"
    return words


def host_sync(facts: Facts) -> str:
    where = facts.said.get("host_sync")
    words = "move the host synchronization out of the communication's window (after its wait), or drop it"
    if where:
        words += f": {where}"
    if _run(facts) and facts.options.get("host_sync"):
        words += " (this run: --opt host_sync=true: drop it)"
    return words


def queued(facts: Facts) -> str:
    kinds = {k: c.get("queued", 0.0) for k, c in facts.kind_cause_us.items()}
    top = max(kinds, key=kinds.get) if kinds else "the operations"
    return (f"{top} operations queue behind one another on one process group: give the independent ones their own "
            "process group (or stream), or issue fewer, larger ones")


__all__ = ["bucket", "host_sync", "make_async", "prefetch", "prepare", "queued", "straggler"]
