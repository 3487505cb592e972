"""What overlap could buy: the overlap bound of every step (OVERLAP.md section 6.2), and the verdict.

Per rank r and step s (µs): ``C`` its compute, ``X`` the union of its operations' transfer parts
(the cross-rank section's transfer, after the wait; an unmatched operation's whole duration),
``other`` = idle + exposed memory of its partition (what overlapping communication cannot
remove), ``T`` the union of the operations' *unhideable tails*: an operation with ``slack`` µs of
compute in its window can hide at most that much of its transfer, so the last
``max(0, transfer − slack)`` µs before its end cannot overlap anything.

- **first-order** (no operation has a window, as in a trace of blocking calls):
  ``max(C, X) + other``.
- **windows** (some operation has compute in its window): ``max(C + T, X) + other``.

Floors, where what they need is known (the bound is the largest of the form and the floors):
the shared link (``--link-rate`` runs: the bytes all ranks put on it in the step / its rate,
nccl-tests' bus bytes for collectives) and the host cores (ranks sharing ``cores`` cores: Σ over
the host's ranks of the core-time of their compute / cores; core-time = compute wall time ×
min(1, cores / ranks computing at that instant)). A floor adds no ``other``: a rank's idle time
need not leave the link or the cores idle (an async ring of 2 ranks ran at its link floor exactly,
idle time and all). With lock-stepped ranks (collectives matched across them) a step
is as long as its slowest rank's bound: every rank's step gets the maximum. A bound is never
above the step it bounds (the step measured is a schedule that was achieved).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from overlapprof.analysis import intervals as iv
from overlapprof.analysis.crossrank.bandwidth import bus_factor
from overlapprof.analysis.exposure.causes import RankOps
from overlapprof.analysis.exposure.late import distinct
from overlapprof.analysis.rank.classify import KINDS
from overlapprof.analysis.stats import median
from overlapprof.report import FIRST_ORDER, WINDOWS, RankReport, held_fixed

TERMS = ("compute", "windows", "transfer", "link", "cores")  # what can make a bound (the binding term)


@dataclass
class Resources:
    """What the floors need: the shared link's rate (bytes/µs) and which ranks share how many
    cores (host name -> (cores, ranks)); None/empty when not known."""

    link_bytes_per_us: float | None
    hosts: dict[str, tuple[int, list[int]]]


def _per_step(report: RankReport, ops: RankOps, starts: np.ndarray, ends: np.ndarray) -> list[float]:
    """|∪ [starts, ends)| of the operations of each of the report's steps."""
    numbers = np.array([s.step for s in report.steps], dtype=np.int64)
    order = np.argsort(numbers, kind="stable")
    step = np.asarray(ops.step).astype(np.int64)
    at = np.searchsorted(numbers[order], step, side="right") - 1  # the last step of that number
    keep = at >= 0
    keep[keep] = numbers[order[at[keep]]] == step[keep]
    seg = np.full(step.size, -1, dtype=np.int64)
    seg[keep] = order[at[keep]]
    lengths, _ = iv.lengths_by(iv.union_by(seg[keep], starts[keep], ends[keep]), len(report.steps))
    return lengths


def _other(step) -> float:
    p = step.partition
    if p is None:
        return max(0.0, step.step_us - step.compute_us - step.exposed_comm_us)
    return p.idle_us + p.exposed_memory_us


def _link_floor(matching, rate: float | None) -> tuple[dict[int, float], bool]:
    """Step number -> µs the step's bytes need on the shared link, and whether every
    operation's size was known."""
    if rate is None or matching is None:
        return {}, True
    ops, m = matching.ops, matching.matched
    first = m.rows[m.bounds]
    out: dict[int, float] = {}
    complete = True
    for kind, nbytes, n, step in zip(ops.kind[first].tolist(), ops.nbytes[first].tolist(), m.sizes.tolist(),
                                     ops.step[first].tolist()):
        name = KINDS[kind]
        if name == "barrier":
            continue  # a few bytes: nothing for the link
        factor = 1.0 if name == "send_recv" else bus_factor(name, n)
        if nbytes != nbytes or factor is None:
            complete = False
            continue
        on_link = nbytes if name == "send_recv" else n * factor * nbytes
        out[step] = out.get(step, 0.0) + on_link / rate
    return out, complete


def _core_times(unions: dict[int, iv.Intervals], cores: int) -> dict[int, iv.Segmented]:
    """Each rank's compute union cut by how many of these ranks compute at once, as (level k,
    starts, ends): core-time of an instant with k ranks computing = min(1, cores / k)."""
    ranks = list(unions)
    starts = np.concatenate([unions[r][0] for r in ranks] + [np.empty(0)])
    ends = np.concatenate([unions[r][1] for r in ranks] + [np.empty(0)])
    pos = np.concatenate((starts, ends))
    delta = np.concatenate((np.ones(starts.size, np.int64), -np.ones(ends.size, np.int64)))
    order = np.argsort(pos, kind="stable")
    pos, level = pos[order], np.cumsum(delta[order])
    lo, hi, lv = pos[:-1], pos[1:], level[:-1]
    out = {}
    for r in ranks:
        parts = []
        for k in distinct(lv[lv > 0]):
            at = (lv == k) & (hi > lo)
            got = iv.intersection(unions[r], iv.union(lo[at], hi[at]))
            parts.append((np.full(got[0].size, k, np.int64), got[0], got[1]))
        out[r] = tuple(np.concatenate([p[j] for p in parts]) for j in range(3)) if parts else iv.EMPTY_BY
    return out


def _host_floor(reports: dict[int, RankReport], compute: dict[int, iv.Intervals], shift: dict[int, float],
                res: Resources) -> dict[int, dict[int, float]]:
    """Rank -> step number -> µs its host's cores need for the host's ranks' compute in that step."""
    out: dict[int, dict[int, float]] = {}
    for cores, ranks in res.hosts.values():
        ranks = [r for r in ranks if r in reports and r in compute]
        if not ranks or cores <= 0:
            continue
        common = {r: (compute[r][0] + shift.get(r, 0.0), compute[r][1] + shift.get(r, 0.0)) for r in ranks}
        cut = _core_times(common, cores)
        need: dict[int, float] = {}
        for r in ranks:
            level, starts, ends = cut[r]
            weight = np.minimum(1.0, cores / np.maximum(level, 1))
            for s in reports[r].steps:
                lo = s.start_us + shift.get(r, 0.0)
                got = np.clip(np.minimum(ends, lo + s.step_us) - np.maximum(starts, lo), 0.0, None)
                need[s.step] = need.get(s.step, 0.0) + float(np.sum(got * weight)) / cores
        for r in ranks:
            out[r] = need
    return out


def overlap_bounds(reports: dict[int, RankReport], ops: dict[int, RankOps], compute: dict[int, iv.Intervals],
                   matching, res: Resources, windows_known: bool) -> list[str]:
    """Set every step's ``overlap_bound_us`` and each rank's median, speedup, form and verdict;
    the notes say which form and floors were used and what was missing. ``windows_known``:
    whether the traces say where each operation's result was needed (CPU: the issuing thread's
    activity; GPU: CUDA event-sync records)."""
    windows = windows_known and any(bool((o.slack > 0).any()) for o in ops.values())
    form = WINDOWS if windows else FIRST_ORDER
    link, complete = _link_floor(matching, res.link_bytes_per_us)
    shift = matching.shift if matching is not None else {}
    host = _host_floor(reports, compute, shift, res)
    lock = matching is not None and len(reports) > 1 and matching.matched.sizes.size > 0
    per_rank: dict[int, dict[int, dict[str, float]]] = {}
    for r, report in reports.items():
        o = ops.get(r)
        if o is None or not report.steps:
            continue
        after_wait = o.start + o.wait
        x = _per_step(report, o, after_wait, after_wait + o.transfer)
        tails = _per_step(report, o, o.end - np.maximum(o.transfer - o.slack, 0.0), o.end)
        rows = {}
        for k, s in enumerate(report.steps):
            other = _other(s)
            terms = {"compute": s.compute_us + other, "transfer": x[k] + other}
            if windows:
                terms["windows"] = s.compute_us + tails[k] + other
            if s.step in link:
                terms["link"] = link[s.step]
            if r in host and s.step in host[r]:
                terms["cores"] = host[r][s.step]
            rows[s.step] = dict(terms, other=other, rank=r)
        per_rank[r] = rows
    if lock:  # a step lasts as long as its slowest rank's bound
        by_step: dict[int, dict[str, float]] = {}
        for rows in per_rank.values():
            for step, terms in rows.items():
                if step not in by_step or _value(terms) > _value(by_step[step]):
                    by_step[step] = terms
        per_rank = {r: {step: by_step[step] for step in rows} for r, rows in per_rank.items()}
    words = _form_words(form, lock, bool(link), bool(host), res)
    for r, rows in per_rank.items():
        report = reports[r]
        for s in report.steps:  # a model above what was measured is not tight: the step itself bounds it
            s.overlap_bound_us = min(_value(rows[s.step]), s.step_us)
        report.overlap_bound_us = median([s.overlap_bound_us for s in report.steps])
        report.overlap_bound_speedup = (report.median_step_us / report.overlap_bound_us
                                        if report.median_step_us and report.overlap_bound_us else None)
        report.overlap_bound_form = words
        report.verdict = verdict(report, _typical(rows.values()))
    notes = [f"overlap bound: {words}"]
    if not windows:
        why = ("no CUDA event-sync record in the GPU traces names the communication event a stream waited on "
               "(torch 2.11 with CUDA 13 leaves wait_on_cuda_event_record_corr_id at -1), to say where an "
               "operation's result was needed" if not windows_known else
               "no operation had compute in its window (every call blocked, as in a sync variant)")
        notes.append(f"overlap bound: {why}: the first-order form max(compute, transfer) + other, as if every "
                     "transfer could hide under any compute of its step")
    if res.link_bytes_per_us is None:
        notes.append("overlap bound: no shared link known (a --link-rate run records one): the link's bytes are "
                     "not a floor")
    elif not complete:
        notes.append("overlap bound: some operations' sizes are unknown: the link floor counts only the others")
    if not res.hosts:
        notes.append("overlap bound: the host's cores are not known (run.json of a CPU run records them): "
                     "ranks time-sharing cores are not a floor")
    if not lock:
        notes.append("overlap bound: ranks not matched to each other (one rank, or no matched collective): each "
                     "rank's bound is its own")
    return notes


def _value(terms: dict[str, float]) -> float:
    return max(v for k, v in terms.items() if k in TERMS)


def _typical(steps) -> dict[str, float]:
    """The terms of a rank's median step by bound (what its verdict reads)."""
    ordered = sorted(steps, key=_value)
    return ordered[(len(ordered) - 1) // 2] if ordered else {}


def _form_words(form: str, lock: bool, link: bool, host: bool, res: Resources) -> str:
    parts = [form]
    if lock:
        parts.append("lock-stepped ranks")
    if link:
        parts.append(f"link floor {res.link_bytes_per_us * 8e6 / 1e9:g} Gbit/s shared")
    if host:
        parts.append("host-cores floor " + ", ".join(f"{len(r)} ranks on {c} cores" for c, r in res.hosts.values()))
    return ", ".join(parts)


REMEDY = {
    "late_peer": "balance the ranks' work or issue earlier on the late rank",
    "host_blocked": "remove the host synchronization or move it after the window",
    "queued": "separate the channel (another stream or process group), reorder or re-bucket",
    "no_window": "make the call asynchronous and move independent compute into its window",
    "window_short": "more independent compute per window, fewer bytes, or issue earlier",
}
NEAR = 0.05  # terms within 5% of the bound count as binding it


def binding(terms: dict[str, float]) -> str:
    """What sets a step's bound: ``host`` (its idle and exposed memory are most of it),
    ``communication`` (the transfer or the link, within :data:`NEAR` of the bound),
    ``windows`` (transfers that cannot hide under the compute in their windows) or ``compute``
    (compute, or the host cores)."""
    bound = _value(terms)
    if bound <= 0:
        return "compute"
    if terms.get("other", 0.0) >= 0.5 * bound:
        return "host"
    if max(terms.get("transfer", 0.0), terms.get("link", 0.0)) >= (1 - NEAR) * bound:
        return "communication"
    if "windows" in terms and terms["windows"] - terms["compute"] >= NEAR * bound and terms["windows"] >= (1 - NEAR) * bound:
        return "windows"
    return "compute"


LATE_SHARE = 0.5  # late_peer holds at least half of a rank's exposed communication...
LATE_STEP = 0.1  # ...and a tenth of its median step: the late rank is the lever, named first


def _ms(us: float) -> str:
    return f"{us / 1000:.3f}"


def _step_mean(report: RankReport, pick) -> float | None:
    """The mean over the rank's steps of ``pick(step exposure)`` (µs); None without steps."""
    parts = [pick(s.exposure) for s in report.steps if s.exposure is not None]
    return sum(parts) / len(parts) if parts else None


def late_first(report: RankReport, step: float) -> str | None:
    """The verdict's first clause when a late rank holds most of this rank's exposure
    (:data:`LATE_SHARE` of it, and :data:`LATE_STEP` of the step): who was late, by how much a
    step and what the late ranks were doing; None otherwise."""
    e = report.exposure
    if e is None or e.total_us() <= 0 or e.late_peer_us < LATE_SHARE * e.total_us() or not e.late_peer_by_rank:
        return None
    late = _step_mean(report, lambda x: x.late_peer_us)
    if late is None or late < LATE_STEP * step:
        return None
    rank = max(e.late_peer_by_rank, key=e.late_peer_by_rank.get)
    who = f"rank {rank}"
    if len(e.late_peer_by_rank) > 1:
        who = f"mostly {who} ({_ms(_step_mean(report, lambda x: x.late_peer_by_rank.get(rank, 0.0)))} ms a step)"
    doing = ", ".join(f"{a} {100 * us / e.late_peer_us:.0f}%" for a, us in
                      sorted(e.late_peer_activity.items(), key=lambda kv: -kv[1]) if us > 0)
    return (f"late-peer-limited: {100 * e.late_peer_us / e.total_us():.0f}% of its exposed communication, "
            f"{_ms(late)} ms a step, waits for a late rank: {who}, doing {doing or 'nothing recorded'}: "
            f"{REMEDY['late_peer']}")


def verdict(report: RankReport, terms: dict[str, float]) -> str | None:
    """One line a user can act on. First, when a late rank holds most of the exposure
    (:func:`late_first`), that; then where the step stands against its overlap bound: at its bound
    (communication-, compute- or host-bound, or limited by its windows) or overlap-limited, with
    the largest cause of exposure named (unless the late rank was). The bound holds the run's
    windows (or transfers) and compute fixed (:func:`overlapprof.report.held_fixed`), and the line
    says so: a change of bucketing, order or compute can buy more."""
    step, bound = report.median_step_us, report.overlap_bound_us
    if not step or bound is None or not terms:
        return None
    late = late_first(report, step)
    held = held_fixed(report.overlap_bound_form)
    ms = _ms
    at = (f"({ms(bound)} ms bound vs {ms(step)} ms; overlap can buy at most {step / bound:.2f}x within {held}: "
          "a change of bucketing, order or compute can buy more)")
    exposure = report.exposure
    largest = exposure.largest() if exposure is not None else None
    cause = ""
    if largest is not None and late is None:
        name, us = largest
        share = us / exposure.total_us()
        who = ""
        if name == "late_peer" and exposure.late_peer_by_rank:
            who = f", mostly rank {max(exposure.late_peer_by_rank, key=exposure.late_peer_by_rank.get)}"
        cause = f"largest cause of exposure: {name} ({100 * share:.0f}%{who}): {REMEDY[name]}"
    line = _standing(report, terms, step, bound, at, held, cause, late is not None)
    return f"{late}; behind it, {line}" if late else line


def _standing(report: RankReport, terms: dict[str, float], step: float, bound: float, at: str, held: str, cause: str,
              named: bool) -> str:
    """Where the step stands against its bound (``named``: a cause was named before it)."""
    ms = _ms
    kind = binding(terms)
    then = f"; {cause}" if cause else ""
    if step - bound > 0.1 * step and (cause or named):
        return (f"overlap-limited: {ms(step - bound)} ms a step above its overlap bound ({step / bound:.2f}x possible "
                f"within {held}){then}")
    where = f" on rank {terms['rank']}" if terms.get("rank", report.rank) != report.rank else ""
    if kind == "host":
        return (f"host-bound: {ms(terms['other'])} ms a step{where} is neither compute nor communication (host "
                f"code, launch gaps, data loading, a straggler's sleep) {at}")
    if kind == "communication":
        what = "the link's bytes set" if terms.get("link", 0.0) >= terms.get("transfer", 0.0) else "the transfers set"
        return f"communication-bound: {what} the step {at}: move fewer bytes or use a faster link"
    if kind == "windows" and (cause or named):
        return (f"overlap-limited by its windows: transfers that cannot hide under the compute in their windows "
                f"set the step {at}{then}")
    what = "the host cores' compute sets" if terms.get("cores", 0.0) >= terms["compute"] else "compute sets"
    return f"compute-bound: {what} the step {at}: speed up compute"
