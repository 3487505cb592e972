"""Interference the trace cannot measure: what advise stands behind for it.

The replay charges the compute a change moves beside communication at the slowdown the trace
measures (:mod:`overlapprof.analysis.replay.slowdown`). A rank whose trace has no compute
beside communication (a sync variant, a wait right after each issue) measures none. On a CPU
host where each rank's compute thread and its backend's thread outnumber the cores, the replay
charges the moved compute the *cores' share* of the transfers, measured from the trace against
run.json's ``--link-rate`` link (:mod:`overlapprof.analysis.replay.cores`: over a paced link most
of a transfer is the link holding the bytes back, which no core works for), or over loopback the
copying of their bytes (:mod:`overlapprof.analysis.replay.copying`: a transfer's least hindered
time less its hops' latency).

Per rank of a CPU run without a measured slowdown (no compute class with a factor and time
under communication), from run.json's nodes (``cpu_cores``, the ranks on the node):

- ``ranks + backend threads > cores`` (2 × the ranks on the node) and the cores' share of its
  transfers not measured (no transfer whose bytes are known): what overlap costs there is
  assumed to be **at least what it buys**, and the change is a **hint** (the uncharged replay's
  saving, and why), not an item. Charging the moved compute in full was tried and is not
  enough: it still left a saving of 2.4 ms on a run of ``allreduce-wait-early`` whose rerun was
  7.3 ms slower (the transfers slow down too, and the replay keeps their traced time);
- the same host, the share measured above
  :data:`~overlapprof.analysis.replay.cores.MAX_SHARE` (the link paces little of each transfer:
  the pipeline's 64 KiB sends pass in the 1 Gbit/s link's burst; over loopback, transfers
  mostly copying: DDP's 1 MiB buckets): a **hint** too, with the charged saving;
- the same host, the share at most that (the link paces most of each transfer; over loopback,
  transfers mostly latency and waiting: the all_reduce workload's 64 KiB, a share of 3-8%): the
  change is **charged**: listed as the charged replay predicts it, like a measured one, its item
  saying the share it was charged (the advice benchmark's idle ``ring-sync`` trace over 1
  Gbit/s: a share of 2%, 5.28 ms a step predicted saved by its async variant, 5.30 ms realized);
- otherwise (cores enough for both, or the host's cores not recorded, as for a user's own
  traces): the change is *demoted*: nothing charged, listed only when it saves at least
  :data:`DEMOTED_MARGIN` times the minimum saving, and its item says what was not measured.

Changes that move no compute beside communication (or only on ranks that measured it) are left
as the replay predicts them.
"""

from __future__ import annotations

from dataclasses import dataclass

from overlapprof.analysis.replay.cores import MAX_SHARE, Crowded, host_cores, measured

DEMOTED_MARGIN = 2.0  # a demoted change must save this many times the minimum saving
HINT, CHARGED, DEMOTED = "hint", "charged", "demoted"


@dataclass
class Assumption:
    """What is stood behind for one rank whose slowdown is not measured: ``kind`` one of
    :data:`HINT` (a change adding overlap there is a hint), :data:`CHARGED` (listed as the charged
    replay predicts it) or :data:`DEMOTED` (listed only for twice the minimum saving), and the
    words that say it."""

    kind: str
    words: str

    @property
    def hint(self) -> bool:
        return self.kind == HINT


def assumptions(report, crowded: dict[int, Crowded]) -> dict[int, Assumption]:
    """Per CPU rank without a measured slowdown, what is stood behind (the module docstring);
    ``crowded``: :func:`overlapprof.analysis.replay.cores.shares` of the run."""
    done = measured(report)
    hosts = host_cores(report)
    out = {}
    for rank in [r.rank for r in report.ranks if r.mode == "cpu" and r.rank not in done]:
        c = crowded.get(rank)
        if c is None:
            host = (f"{hosts[rank][0]} cores for {hosts[rank][1]} ranks and their backend threads "
                    f"({2 * hosts[rank][1]})" if rank in hosts else "the host's cores not recorded")
            out[rank] = Assumption(DEMOTED, "interference not measured (no compute ran beside communication in this "
                                            f"trace); {host}: not charged, so listed only for a saving of at least "
                                            f"{DEMOTED_MARGIN:g}x the minimum")
        elif c.share is None:
            out[rank] = Assumption(HINT, f"{c.words()}, and this trace has no compute beside communication to measure "
                                         "what overlap costs there: assumed to cost what it buys")
        elif c.share > MAX_SHARE:
            out[rank] = Assumption(HINT, f"{c.words()}, and this trace has no compute beside communication to measure "
                                         "what overlap costs there: charging the moved compute that share is not "
                                         "enough where the transfers slow down too")
        else:
            out[rank] = Assumption(CHARGED, f"interference not measured (no compute ran beside communication in this "
                                            f"trace); {c.words()}: the compute moved beside them charged that share")
    return out
