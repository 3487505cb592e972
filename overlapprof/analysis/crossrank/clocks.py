"""Clock domains of the ranks, and offsets that align them.

Each rank's trace is on its host's clock: ``ts`` (µs) plus the trace's ``baseTimeNanoseconds``
when it has one (Kineto writes ``ts`` relative to that base). Ranks of one host share the clock,
so their times compare directly. The host comes from the trace's ``host_name`` (torch >= 2.4);
ranks without one are assumed to be on one host, unless alignment is asked for.

Across hosts, clocks differ by whatever NTP left (often milliseconds, more than a collective
lasts). ``--align-clocks`` estimates one offset per domain from the collectives matched across
domains: the ranks of a synchronising collective (all_reduce, all_gather, reduce_scatter,
all_to_all, barrier) end together, so the offset of domain d relative to domain p is the median,
over the instances they share, of (mean end of p's ranks − mean end of d's ranks). The median
keeps a few mismatched or odd instances from moving it. Domains are chained from the reference
(the domain of the lowest rank) through the pairs that share the most instances; a domain
sharing no instance with the others keeps offset 0 and is reported.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from overlapprof.analysis.stats import median

SYNCHRONISING = frozenset({"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "barrier"})
UNKNOWN_HOST = "one host assumed (no host names)"


def domains_of(hosts: dict[int, str | None], align: bool) -> dict[int, str]:
    """Clock domain name of each rank.

    Without ``align``: the host name, and one shared domain for ranks whose trace names none.
    With ``align``: the host name where known, else each rank its own domain (``rank N``).
    """
    out = {}
    for rank, host in hosts.items():
        if host:
            out[rank] = host
        else:
            out[rank] = f"rank {rank}" if align else UNKNOWN_HOST
    return out


def estimate_offsets(instances, domain_of: dict[int, str]) -> tuple[dict[str, float], dict[str, int], list[str]]:
    """Offsets (µs, to add to a domain's times) from matched instances.

    ``instances``: iterables of ``(kind, ranks, ends)`` with ends on each rank's own clock.
    Returns (offset per domain, instances used per domain, notes).
    """
    diffs: dict[tuple[str, str], list[float]] = defaultdict(list)
    for kind, ranks, ends in instances:
        if kind not in SYNCHRONISING:
            continue
        by_domain: dict[str, list[float]] = defaultdict(list)
        for r, e in zip(ranks, ends):
            by_domain[domain_of[r]].append(e)
        means = {d: float(np.mean(v)) for d, v in by_domain.items()}
        names = sorted(means)
        for i, a in enumerate(names):
            for b in names[i + 1 :]:
                diffs[(a, b)].append(means[a] - means[b])  # offset to add to b to align it with a
    all_domains = sorted(set(domain_of.values()), key=lambda d: min(r for r, x in domain_of.items() if x == d))
    reference = all_domains[0]
    offsets, used, notes = {reference: 0.0}, {reference: 0}, []
    # Prim-like: repeatedly attach the unplaced domain sharing the most instances with a placed one.
    while len(offsets) < len(all_domains):
        best = None
        for (a, b), values in diffs.items():
            for placed, new, sign in ((a, b, 1.0), (b, a, -1.0)):
                if placed in offsets and new not in offsets and (best is None or len(values) > best[3]):
                    best = (placed, new, sign, len(values), values)
        if best is None:
            for d in all_domains:
                if d not in offsets:
                    offsets[d], used[d] = 0.0, 0
                    notes.append(f"clock domain {d} shares no synchronising collective with the others: not aligned")
            break
        placed, new, sign, count, values = best
        offsets[new] = offsets[placed] + sign * median(values)
        used[new] = count
    return offsets, used, notes
