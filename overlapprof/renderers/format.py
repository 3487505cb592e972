"""How every renderer writes a number: one rule per kind of value, and the plain-text table layout.

The analyzer computes every number; renderers only format them, through these functions, so a
value reads the same in the text tables, the CSV-free views and the HTML page:

- a missing value (None: no communication, no steps, unknown): ``PLACEHOLDER`` (``-``)
- time: µs in, milliseconds out with 3 decimals (``ms(1234.5)`` = ``1.234``; the unit is in the
  column or row name); a difference with its sign (``+1.234``)
- ratio: a fraction in, a percentage with 2 decimals out (``percent(0.1495)`` = ``14.95%``)
- factor: ``1.23x``; with its bootstrap interval ``1.23x [1.10-1.35]``
- bytes: decimal units (1 kB = 1000 B, as nccl-tests and GB/s use): ``1.05 MB``
- bandwidth: GB/s, 3 significant digits below 1, else 2 decimals
- a workload's own metric (``ctx.metric``): 6 significant digits, its unit in its name
"""

from __future__ import annotations

PLACEHOLDER = "-"
_LATE_SHOWN = 3  # late ranks named in a cell

# How the cross-rank section splits time (overlapprof.report.crossrank), said the same way by
# the table, the chart and the page.
TRANSFER_RULE = "transfer = the shortest duration across ranks, or of a send/recv pair the receiver's end − the later start"
WAIT_RULE = "wait = duration − transfer"
RANK_SUMS = ("unions within the rank's communication (operations in flight at once count once): wait + transfer "
             "<= comm, the rest in no matched operation (warm-up, unmatched); wait share = wait / comm; exposed wait: "
             "the wait under no compute, its share of exposed comm")


def to_ms(us: float) -> float:
    """Microseconds as a number of milliseconds (a plot's axis unit)."""
    return us / 1000.0


def ms(us: float | None, signed: bool = False) -> str:
    """Microseconds as milliseconds, 3 decimals (``signed``: with its sign, for a difference)."""
    return PLACEHOLDER if us is None else f"{us / 1000:+.3f}" if signed else f"{us / 1000:.3f}"


def percent(ratio: float | None, signed: bool = False) -> str:
    """A fraction as a percentage, 2 decimals (``signed``: with its sign, for a change)."""
    return PLACEHOLDER if ratio is None else f"{100 * ratio:+.2f}%" if signed else f"{100 * ratio:.2f}%"


def factor(value: float | None, interval: tuple[float, float] | None = None) -> str:
    """A factor (speedup, slowdown): ``1.23x``, with its interval when given: ``1.23x [1.10-1.35]``."""
    if value is None:
        return PLACEHOLDER
    return f"{value:.2f}x" if interval is None else f"{value:.2f}x [{interval[0]:.2f}-{interval[1]:.2f}]"


def portion(fraction: float | None, interval: tuple[float, float] | None = None) -> str:
    """A share as a whole percentage, with its interval when given: ``97% [88-104%]``."""
    if fraction is None:
        return PLACEHOLDER
    text = f"{100 * fraction:.0f}%"
    return text if interval is None else f"{text} [{100 * interval[0]:.0f}-{100 * interval[1]:.0f}%]"


def saved_ms(us: float | None, fraction: float | None) -> str:
    """A saving in ms with its share of the baseline: ``+1.234 (+12.34%)``."""
    if us is None:
        return PLACEHOLDER
    return ms(us, signed=True) + (f" ({percent(fraction, signed=True)})" if fraction is not None else "")


def human_bytes(n: int | None) -> str:
    """Bytes in decimal units (1 kB = 1000 B); ``unknown`` when None."""
    if n is None:
        return "unknown"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


def gbps(value: float | None) -> str:
    """A bandwidth in GB/s."""
    return PLACEHOLDER if value is None else f"{value:.3g}" if value < 1 else f"{value:.2f}"


def metric(value: float | None) -> str:
    """A workload's own metric (``ctx.metric``), in the unit its name says: 6 significant digits."""
    return PLACEHOLDER if value is None else f"{value:.6g}"


def count(value: int | None) -> str:
    """A count (``-`` when unknown or 0 means unknown, e.g. a group size)."""
    return str(value) if value else PLACEHOLDER


def times(n: int) -> str:
    """How many times: ``once``, ``3 times``."""
    return "once" if n == 1 else f"{n} times"


def rank_list(ranks: list[int]) -> str:
    """Ranks as ``0-7`` when consecutive (more than two), else ``0, 2, 5``."""
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return ", ".join(map(str, ranks))


def late_ranks(exposure) -> str:
    """The ranks waited for (roots), most first: ``3 (119.7 ms compute)``."""
    if exposure is None or not exposure.late_peer_by_rank:
        return PLACEHOLDER
    ranked = sorted(exposure.late_peer_by_rank.items(), key=lambda kv: -kv[1])
    text = ", ".join(f"{r} ({ms(us)})" for r, us in ranked[:_LATE_SHOWN])
    return text + (f", +{len(ranked) - _LATE_SHOWN}" if len(ranked) > _LATE_SHOWN else "")


def late_activity(exposure) -> str:
    """What the late ranks were doing, as shares: ``comm 82%, compute 15%, other 3%``."""
    if exposure is None or not exposure.late_peer_activity or exposure.late_peer_us <= 0:
        return PLACEHOLDER
    ranked = sorted(exposure.late_peer_activity.items(), key=lambda kv: -kv[1])
    return ", ".join(f"{a} {100 * us / exposure.late_peer_us:.0f}%" for a, us in ranked)


def text_table(header: list[str], rows: list[list[str]]) -> str:
    """Plain aligned text columns: the first left-aligned, the others right-aligned, a rule of
    dashes under the header; no colour, no box drawing, so it pipes, diffs and pastes cleanly."""
    widths = [max(len(str(r[c])) for r in [header, *rows]) for c in range(len(header))]

    def line(cells):
        return "  ".join(
            str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(cells, widths))
        ).rstrip()

    return "\n".join([line(header), line(["-" * w for w in widths]), *(line(r) for r in rows)])
