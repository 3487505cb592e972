"""Interference the trace cannot measure: what advise assumes for it, from the host.

The replay charges the compute a change moves beside communication at the slowdown the trace
measures (:mod:`overlapprof.analysis.replay.slowdown`). A rank whose trace has no compute
beside communication (a sync variant, a wait right after each issue) measures none, and the
replay then charges nothing: the textbook change (make it async) is predicted to hide the
transfer for free. On a CPU host where each rank's compute thread and its backend's thread
outnumber the cores, it does not: the transfer is the cores' work too (gloo copies and reduces
on them), so what the compute gains beside it, the transfer loses.

Per rank of a CPU run without a measured slowdown (no compute class with a factor and time
under communication), from run.json's nodes (``cpu_cores``, the ranks on the node):

- ``ranks + backend threads > cores`` (2 × the ranks on the node): what overlap costs there is
  assumed to be **at least what it buys** (the cores run both at once, each at part speed), so
  the replay's saving, which takes the new overlap as free, is not stood behind: the change is a
  hint, with that saving and why, not an item. Charging the moved compute in full (the replay's
  slowdown with an unbounded factor) was tried first and is not enough: it still left a saving
  of 2.4 ms on a run of ``allreduce-wait-early`` whose rerun was 7.3 ms slower (the transfers
  slow down too, and the replay keeps their traced time). A ``--link-rate`` link does not change
  this: on the advice benchmark's loaded runs the pipeline's async variant, over its 1 Gbit/s
  link, was 13 ms slower where the replay gave 6.4 ms less (the ring's, over the same link, did
  gain: that is the price of not standing behind a number nobody measured);
- otherwise (cores enough for both, or the host's cores not recorded, as for a user's own
  traces): the change is *demoted*: listed only when it saves at least :data:`DEMOTED_MARGIN`
  times the minimum saving, and its item says what was not measured.

Changes that move no compute beside communication (or only on ranks that measured it) are left
as the replay predicts them.
"""

from __future__ import annotations

from dataclasses import dataclass

from overlapprof.analysis.exposure import resources

DEMOTED_MARGIN = 2.0  # a demoted change must save this many times the minimum saving


@dataclass
class Assumption:
    """What is assumed for one rank whose slowdown is not measured: ``hint`` (overlap assumed to
    cost what it buys: a change adding overlap there is a hint) or not (the change demoted), and
    the words that say it."""

    hint: bool
    words: str


def measured(report) -> set[int]:
    """The ranks whose trace measures its compute beside communication: a class with a factor
    and time under communication (a factor at or below 1 is measured too: no slowdown)."""
    return {r.rank for r in report.ranks if r.interference is not None and any(
        c.factor and c.overlapped_us > 0 for c in r.interference.classes)}


def assumptions(report) -> dict[int, Assumption]:
    """Per CPU rank without a measured slowdown, what is assumed (the module docstring)."""
    done = measured(report)
    unmeasured = [r.rank for r in report.ranks if r.mode == "cpu" and r.rank not in done]
    if not unmeasured:
        return {}
    res, _, _ = resources(report.run, None)
    link = " (over the run's link: the backend's threads still send, receive and reduce on them)" \
        if res.link_bytes_per_us is not None else " (loopback)"
    host_of = {rank: (cores, len(ranks)) for cores, ranks in res.hosts.values() for rank in ranks}
    out = {}
    for rank in unmeasured:
        if rank not in host_of:
            out[rank] = Assumption(False, "interference not measured (no compute ran beside communication in this "
                                          "trace) and the host's cores not recorded: not charged, so listed only "
                                          f"for a saving of at least {DEMOTED_MARGIN:g}x the minimum")
            continue
        cores, n = host_of[rank]
        busy = 2 * n
        if busy > cores:
            out[rank] = Assumption(True, f"{n} ranks and their backend threads ({busy}) share {cores} cores{link}, "
                                         "and this trace has no compute beside communication to measure what overlap "
                                         "costs there: assumed to cost what it buys")
        else:
            out[rank] = Assumption(False, f"interference not measured (no compute ran beside communication in this "
                                          f"trace); {cores} cores for {n} ranks and their backend threads ({busy}): "
                                          f"not charged, so listed only for a saving of at least {DEMOTED_MARGIN:g}x "
                                          "the minimum")
    return out
