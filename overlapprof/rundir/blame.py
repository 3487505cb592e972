"""Which rank a failed run is blamed on, and the run's status, from its rank and node records.

No torch here. The records are ``run_record.RankRecord`` and ``run_record.NodeRecord``
(anything with their attributes). A rank's ``error_kind`` (see ``run_record.RankRecord``) says whether its failure
was its own (an exception, a timeout, a death by exit code or signal) or a consequence (a peer's
death, being stopped by the launcher, Ctrl-C).

A hang needs more than the kinds: when rank 1 sleeps forever in its compute, rank 0 waits in
``all_reduce``, and whichever watchdog fires first ends the run (the other rank is then stopped
by the launcher). Every rank that timed out or was stopped records where it was (``location``),
for how long it had made no progress (``stalled_s``) and whether that place is a wait on its
peers (``waiting_on_peers``: a ``torch.distributed`` call). A rank that stalled in its own code
is the cause; the ranks waiting in communication are its consequences.
"""

# A rank's own failure, not a consequence of another's or of the launcher stopping it.
OWN_FAILURES = ("exception", "timeout", "stalled", "exit")
_STALL_MIN_S = 1.0  # a stopped rank this long without progress, outside communication, stalled


def stalled_in_own_code(rank):
    """Did a failed rank stop making progress in its own code (not waiting on its peers in a
    torch.distributed call) for at least a second before the watchdog or the launcher ended it?"""
    return (rank.error_kind in ("timeout", "terminated") and rank.waiting_on_peers is False
            and (rank.stalled_s or 0) >= _STALL_MIN_S)


# Where a rank is in its loop, for ordering: set-up, then warm-up steps, then ProfilerSteps.
_LOOP_ORDER = {"setup": 0, "warmup": 1}


def _progress(where) -> tuple[int, int]:
    """How far a rank got (smaller: further behind): its step kind's place, then its step."""
    if where is None or where.step is None:
        return (0, -1)
    return (_LOOP_ORDER.get(where.step_kind, 2), where.step)


def root_cause(ranks):
    """The failure that started it, of ``ranks`` ({rank: RankRecord}), as
    ``(rank, error, error_kind, consequences)``, or None when no rank failed.

    Preference, then the earliest: a rank's own error (exception), or a rank that stalled in its
    own code (dated by the start of its stall); then a death of its own (exit code, signal: its
    "ended" is when the launcher noticed, later than the peers' errors it caused); then a
    timeout while waiting on peers (a deadlock: all wait), the rank furthest behind first (a
    rank blocked in a recv at step 7 holds up one waiting at step 9, not the other way round),
    then the earliest; then the rest. ``consequences`` are the other failed ranks."""
    failed = [(int(rank), info) for rank, info in ranks.items() if info.status == "failed"]
    if not failed:
        return None

    def preference(item):
        rank, info = item
        stalled = stalled_in_own_code(info)
        order = 0 if stalled or info.error_kind == "exception" else {
            "exit": 1, "timeout": 2}.get(info.error_kind, 3)
        ended = info.ended if info.ended is not None else float("inf")
        behind = _progress(info.where) if order == 2 else (0, 0)
        return order, behind, ended - (info.stalled_s or 0) if stalled else ended, rank

    rank, info = min(failed, key=preference)
    kind, error = info.error_kind, info.error
    if stalled_in_own_code(info):
        kind = "stalled"
        error = (f"made no progress for {info.stalled_s:.0f} s in its own code, "
                 f"{info.location}{where_text(info.where)}")
    return rank, error, kind, sorted(r for r, _ in failed if r != rank)


def run_status(ranks, nodes, failure, missing_ranks):
    """"interrupted" (Ctrl-C, unless a rank failed of its own first), "failed", "running" (a
    rank or node has not ended), "incomplete" (ranks missing here, or a rank's loop ended before
    its profiler schedule was recorded) or "ok". ``ranks`` and
    ``nodes`` are records; ``failure`` a ``run_record.Failure`` or None."""
    states = {r.status for r in ranks} | {n.status for n in nodes}
    interrupted = "interrupted" in states or any(
        (n.error or "").startswith("interrupted") for n in nodes)
    if interrupted and (failure is None or failure.error_kind not in OWN_FAILURES):
        return "interrupted"
    if failure is not None or "failed" in states:
        return "failed"
    if states & {"starting", "running", "claimed"}:
        return "running"
    return "incomplete" if missing_ranks or "incomplete" in states else "ok"


def where_text(where):
    """", in phase 'compute' of ProfilerStep#0 (unprofiled)" from a ``run_record.Where`` (or
    None)."""
    if where is None or where.step is None:
        return f", in phase '{where.phase}'" if where is not None and where.phase else ""
    step = (f"warmup step {where.step}" if where.step_kind == "warmup"
            else f"ProfilerStep#{where.step} ({where.step_kind})")
    return f", in phase '{where.phase}' of {step}" if where.phase else f", in {step}"


def status_note(run):
    """A one-line note for the readers of a run (analyze, compare, report) whose run.json says
    it did not end well; "" for a run that is ok (or running, or from elsewhere)."""
    which = f"run {run.name}" if run.name else "the run"
    cut = "; the step it stopped in counts as long as it ran (--drop-last-step leaves each rank's last step out)"
    if run.status == "interrupted":
        return f"run.json: {which} was interrupted (Ctrl-C): its traces end where it stopped{cut}"
    if run.status == "failed":
        why = f" (rank {run.failure.rank}: {run.failure.error})" if run.failure else ""
        return f"run.json: {which} failed{why}: its traces end where it stopped{cut}"
    if run.status == "incomplete" and (why := incomplete_rank(run)):
        return f"run.json: {which} is incomplete: rank {why[0]}: {why[1]}"
    return ""


def incomplete_rank(run):
    """(rank, why) of the first rank whose loop ended before its profiler schedule was recorded
    (status "incomplete"), or None."""
    for rank, info in sorted(run.ranks.items(), key=lambda kv: int(kv[0]) if str(kv[0]).isdigit() else 0):
        if info.status == "incomplete":
            return int(rank), info.error or "its loop ended before the profiler schedule was recorded"
    return None
