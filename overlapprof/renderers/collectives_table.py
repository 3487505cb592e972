"""``--by collective``: the comms section of a Report as plain-text tables (and CSV rows).

One row per process group × kind × message size (medians over its matched instances), then one
row per rank (wait vs transfer, who waited for whom), the stragglers, warm-up operations,
unmatched operations and how matching and clocks were done. Definitions are those of
:mod:`overlapprof.analysis.comms`; times in ms, bandwidths in GB/s (GB = 1e9 bytes).
"""

from __future__ import annotations

from overlapprof.renderers.table import format_table
from overlapprof.report import Report

_NONE = "-"


def _ms(us: float | None) -> str:
    return _NONE if us is None else f"{us / 1000:.3f}"


def _pct(ratio: float | None) -> str:
    return _NONE if ratio is None else f"{100 * ratio:.1f}%"


def _gbps(value: float | None) -> str:
    return _NONE if value is None else f"{value:.3g}" if value < 1 else f"{value:.2f}"


def human_bytes(n: int | None) -> str:
    """Decimal units (1 kB = 1000 B), as nccl-tests and GB/s use; ``unknown`` when None."""
    if n is None:
        return "unknown"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


BANDWIDTH_HEAD = ["kind", "n", "bytes", "count", "transfer ms", "wait ms", "skew ms", "algbw GB/s", "busbw GB/s",
                  "method", "transfer time"]
RANK_HEAD = ["rank", "ops", "matched", "wait ms", "transfer ms", "exposed wait ms", "wait share", "arrived last",
             "caused wait ms", "unmatched"]


def bandwidth_rows(report: Report) -> list[list[str]]:
    c = report.comms
    return [
        [b.kind, str(b.group_size or _NONE), human_bytes(b.bytes), str(b.count), _ms(b.median_transfer_us),
         _ms(b.median_wait_us), _ms(b.median_skew_us), _gbps(b.algbw_gbps), _gbps(b.busbw_gbps), b.method, b.transfer]
        for b in c.bandwidth
    ]


def rank_rows(report: Report) -> list[list[str]]:
    return [
        [str(r.rank), str(r.ops), str(r.matched_ops), _ms(r.wait_us), _ms(r.transfer_us), _ms(r.exposed_wait_us),
         _pct(r.wait_share), str(r.last_arrivals), _ms(r.caused_wait_us), str(r.unmatched_ops)]
        for r in report.comms.ranks
    ]


def rank_cells(report: Report, rank: int) -> list[str]:
    """wait ms, transfer ms and wait share of a rank, for the per-rank summary table."""
    c = report.comms
    try:
        r = c.rank(rank) if c is not None else None
    except KeyError:
        r = None
    if r is None or not r.matched_ops:
        return [_NONE, _NONE, _NONE]
    return [_ms(r.wait_us), _ms(r.transfer_us), _pct(r.wait_share)]


RANK_CELLS_HEAD = ["wait ms", "transfer ms", "wait share"]


def _ranks(ranks: list[int]) -> str:
    return f"{ranks[0]}-{ranks[-1]}" if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)) else ", ".join(map(str, ranks))


def _times(n: int) -> str:
    return "once" if n == 1 else f"{n} times"


def straggler_line(report: Report) -> str | None:
    """One line naming the rank the others waited for most, for the summary."""
    c = report.comms
    if c is None or not c.stragglers:
        return None
    s = c.stragglers[0]
    return (f"straggler: rank {s.rank} (others waited {_ms(s.caused_wait_us)} ms for it, {_pct(s.share)} of all "
            f"waiting; arrived last {_times(s.last_arrivals)}) · `--by collective` for details")


def detail_lines(report: Report) -> list[str]:
    """Stragglers, warm-up, unmatched operations, groups, matching, clocks and notes."""
    c = report.comms
    lines = []
    for s in c.stragglers:
        lines.append(f"straggler: rank {s.rank} caused {_ms(s.caused_wait_us)} ms of others' waiting "
                     f"({_pct(s.share)}), arrived last {_times(s.last_arrivals)}")
    if not c.stragglers and any(r.matched_ops for r in c.ranks):
        lines.append("straggler: none (no rank made another wait)")
    for w in c.warmups:
        lines.append(f"warm-up: rank {w.rank}'s first {w.kind} took {_ms(w.transfer_us)} ms, {w.factor:.0f}x the "
                     f"median {_ms(w.median_us)} ms (communicator set-up): left out of the numbers above")
    for u in c.unmatched:
        lines.append(f"unmatched: rank {u.rank}: {u.count} {u.kind} ({_ms(u.us)} ms): {u.reason}")
    for g in c.groups:
        size = f"{len(g.ranks_present)} of {g.size}" if g.size else f"{len(g.ranks_present)} of an unknown number of"
        state = "complete" if g.complete else "incomplete: waits for absent ranks are unknown"
        lines.append(f"group {g.name}: {size} ranks have traces ({state}; size from {g.size_source})")
    methods = ", ".join(f"{m.kind} {m.method} ({m.instances} matched, {m.unmatched_ops} unmatched)" for m in c.matching)
    lines.append(f"matching: {methods}")
    if c.clocks == "aligned":
        offsets = ", ".join(f"{d.name} {d.offset_us / 1000:+.3f} ms ({d.instances} collectives)" for d in c.domains)
        lines.append(f"clocks: aligned on matched collectives' ends: {offsets}")
    else:
        lines.append(f"clocks: {c.clocks}: " + "; ".join(f"{d.name}: ranks {_ranks(d.ranks)}" for d in c.domains))
    lines.extend(f"note: {n}" for n in c.notes)
    return lines


def render(report: Report) -> str:
    """The --by collective text: bandwidth table, per-rank table, then the details."""
    if report.comms is None:
        off = not report.options.comms
        return "(cross-rank analysis off: --no-comms)\n" if off else "(no communication operations to match)\n"
    parts = [
        "collectives: medians per kind and size (transfer = shortest duration across ranks; wait = duration − transfer)",
        format_table(BANDWIDTH_HEAD, bandwidth_rows(report)) if report.comms.bandwidth else "(none)",
        "",
        "ranks: wait vs transfer (sums over matched instances; wait share = exposed wait / exposed comm)",
        format_table(RANK_HEAD, rank_rows(report)),
        "",
        *detail_lines(report),
    ]
    return "\n".join(parts) + "\n"


def csv_rows(report: Report) -> tuple[list[str], list[list]]:
    """Raw numbers (µs, bytes, GB/s) of the bandwidth rows for CSV; empty cells for unknowns."""
    head = ["kind", "group_size", "bytes", "count", "median_transfer_us", "median_wait_us", "median_skew_us",
            "algbw_gbps", "busbw_gbps", "bus_factor", "method", "transfer"]
    if report.comms is None:
        return head, []
    return head, [["" if (v := getattr(b, h)) is None else v for h in head] for b in report.comms.bandwidth]
