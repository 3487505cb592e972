"""The cross-rank section of a Report (``Report.crossrank``; ``"comms"`` in the JSON): which rank
waited for which, and how fast the links were.

Plain typed data (msgspec Structs, no numpy), computed by :mod:`overlapprof.analysis.crossrank`
and read by the renderers. Times are microseconds; bandwidths GB/s with GB = 1e9 bytes.

Definitions (one *instance* is one collective call, or one send/recv pair, matched across the
ranks that recorded it; ``d_r`` is rank r's duration of its operation in the instance):

- ``transfer_us`` = min over the instance's ranks of ``d_r``: the time the data moved, once the
  last rank had arrived (every rank ends together, so the last to arrive waited least).
- ``wait_us`` of rank r = ``d_r − transfer_us`` (equivalently the latest arrival − r's arrival).
- A send/recv pair whose ranks share a clock is measured at the receiver instead (a send may end
  as soon as its data is buffered, with the data still on its way: gloo over TCP, any eager
  protocol): ``transfer_us`` = the receiver's end − the later start; r's wait = the later start
  − r's start when r's operation ends after the later start, else 0 (it did not wait for its
  partner); r's own transfer (what its sums add) = ``d_r`` − its wait, at most ``transfer_us``;
  ``last_rank`` = the later start (ties: the shorter operation).
- ``skew_us`` = latest start − earliest start of the instance (needs comparable clocks).
- ``last_rank``: the rank with the shortest duration (it did not wait: the others waited for it);
  ties go to the latest start.
- per rank, over its matched non-warm-up operations, as lengths of unions within the rank's
  U(comm) (OVERLAP.md), so that operations in flight at once count once: ``wait_us`` =
  |U(waits) ∩ U(comm)|, each wait being the interval ``[ts, ts + wait)`` at the start of the
  rank's operation (a rank waits first, then transfers); ``transfer_us`` = |U(operations) ∩
  U(comm)| − ``wait_us``. So ``wait_us + transfer_us <= comm_us`` (= |U(comm)|); the rest is
  communication in no matched operation (warm-up, unmatched). ``wait_share`` = ``wait_us /
  comm_us``. ``exposed_wait_us`` = |U(waits) ∩ (U(comm) \\ U(compute))|, the waiting no compute
  hides, and ``exposed_wait_share`` = ``exposed_wait_us / exposed_comm_us``. (Reports saved by
  earlier versions, which have no ``comm_us``, summed ``wait_us``/``transfer_us`` over operations,
  which could exceed the rank's communication, and their ``wait_share`` is what
  ``exposed_wait_share`` is now; they load as saved.)
- ``caused_wait_us`` of rank r = Σ over instances where r is ``last_rank`` of the other ranks'
  waits (a sum over the waiting ranks). ``stragglers`` are the ranks ordered by it;
  ``straggler`` is the one named, only when the evidence holds
  (``overlapprof.analysis.crossrank.waits``): from the instances of
  groups whose every rank has a trace, it caused at least half of all their waiting and twice
  what any other rank did, and most of the waiting in more than half of the steps with waiting;
  ``straggler_evidence`` says the numbers (None in reports saved before the rule).
- Bandwidth (nccl-tests' definitions, see :mod:`overlapprof.analysis.crossrank.bandwidth`):
  ``algbw_gbps`` = bytes / transfer, ``busbw_gbps`` = algbw × ``bus_factor`` of the kind.
- Warm-up: a rank's first communication operation whose transfer time is at least
  ``warmup_factor`` × the median transfer of its kind on that rank (NCCL builds communicators
  inside the first call; its first recv blocks). Warm-up instances are listed in ``warmups`` and
  left out of every sum, median and straggler count above.
"""

from __future__ import annotations

import msgspec

from overlapprof.report.exposure import Exposure
from overlapprof.report.metrics import by_rank

class CollectiveInstance(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One matched collective (or send/recv pair). Lists are parallel to ``ranks``.

    ``starts_us`` are on the common clock (after ``--align-clocks`` offsets), relative to
    ``CrossRank.time_origin_us``. ``key``: the sequence number (method seq) or the order index.
    ``bytes``: the message size nccl-tests would report (None: unknown); ``group_size``: n of
    the group (from the trace), which the bus bandwidth factor uses.
    """

    kind: str
    group: str
    method: str
    key: int
    ranks: list[int]
    starts_us: list[float]
    durations_us: list[float]
    transfer_us: float
    last_rank: int
    skew_us: float | None = None
    bytes: int | None = None
    group_size: int | None = None
    step: int | None = None
    warmup: bool = False

    def waits_us(self) -> list[float]:
        """Each rank's wait: its duration − transfer_us."""
        return [d - self.transfer_us for d in self.durations_us]


class RankWaits(msgspec.Struct, kw_only=True):
    """Per rank (see the module docstring for the formulas). ``ops`` counts logical operations
    (kernels of one host call merged); ``unmatched_us`` is their summed duration."""

    rank: int
    host: str | None
    clock_offset_us: float
    ops: int
    matched_ops: int
    unmatched_ops: int
    unmatched_us: float
    wait_us: float
    transfer_us: float
    exposed_wait_us: float
    exposed_comm_us: float
    wait_share: float | None
    last_arrivals: int
    caused_wait_us: float
    warmup_ops: int = 0
    warmup_us: float = 0.0
    comm_us: float | None = None  # |U(comm)| of the rank (None in reports saved before it was kept)
    exposed_wait_share: float | None = None


class Straggler(msgspec.Struct, kw_only=True):
    """A rank others waited for: ``caused_wait_us`` (and its share of all wait), ``last_arrivals``."""

    rank: int
    caused_wait_us: float
    share: float
    last_arrivals: int


class ProcessGroup(msgspec.Struct, kw_only=True):
    """A process group: ``size`` ranks (from the trace), ``ranks_present`` with a trace here.
    ``complete`` is False when some of its ranks have no trace: their waits are unknown, and a
    rank present may have waited for an absent one."""

    name: str
    size: int | None
    ranks_present: list[int]
    complete: bool
    size_source: str


class KindMatch(msgspec.Struct, kw_only=True):
    """How one kind of operation of one group was matched: ``method`` is one of

    - ``seq``: process group + sequence number recorded by the trace;
    - ``order``: the i-th operation of the kind in the process group on each rank;
    - ``overlap``: order of occurrence, re-synchronised on a shared clock: the operations that
      overlap in time (ranks missing an operation are skipped, not shifted);
    - ``pair-order``: send/recv, the i-th send from rank s to rank d with the i-th recv on d from s;
    - ``none``: one rank only, nothing to match.

    ``instances`` with at least two ranks, ``unmatched_ops`` left alone (reasons in
    ``CrossRank.unmatched``)."""

    group: str
    kind: str
    method: str
    instances: int
    unmatched_ops: int
    note: str | None = None


class Unmatched(msgspec.Struct, kw_only=True):
    """Operations of ``rank`` and ``kind`` that no other rank's operation matched, and why."""

    rank: int
    kind: str
    count: int
    us: float
    reason: str


class WarmupOp(msgspec.Struct, kw_only=True):
    """A rank's first operation flagged as warm-up: its transfer time vs the kind's median."""

    rank: int
    kind: str
    transfer_us: float
    median_us: float
    factor: float


class BandwidthRow(msgspec.Struct, kw_only=True):
    """One kind × message size × group size: medians over its non-warm-up instances.

    ``transfer`` is ``"matched"`` (transfer = shortest duration across ranks) or ``"own duration
    (upper bound)"`` (no partner trace: the rank's own duration, which includes any wait, so
    algbw/busbw are lower bounds). ``bytes`` None: the trace has no sizes (bandwidth unknown).
    """

    kind: str
    group_size: int | None
    bytes: int | None
    count: int
    median_transfer_us: float
    median_wait_us: float | None
    median_skew_us: float | None
    algbw_gbps: float | None
    busbw_gbps: float | None
    bus_factor: float | None
    method: str
    transfer: str
    exposure: Exposure | None = None  # its operations' exposed time by cause, summed over ranks


class ClockDomain(msgspec.Struct, kw_only=True):
    """Ranks sharing a clock (one host). ``offset_us`` was added to their timestamps to align
    them with the reference domain (0 for it, and without ``--align-clocks``); ``instances`` is
    how many matched instances the estimate used (median of end differences)."""

    name: str
    ranks: list[int]
    offset_us: float = 0.0
    instances: int = 0


class CrossRank(msgspec.Struct, kw_only=True):
    """Across ranks: matching, waiting vs transferring, stragglers, bandwidth, warm-up.

    ``clocks``: ``"shared"`` (one clock domain), ``"aligned"`` (``--align-clocks``) or
    ``"unaligned"`` (several hosts, not aligned: skew and overlap matching are off).
    """

    clocks: str
    time_origin_us: float
    domains: list[ClockDomain]
    groups: list[ProcessGroup]
    matching: list[KindMatch]
    ranks: list[RankWaits]
    stragglers: list[Straggler]
    bandwidth: list[BandwidthRow]
    instances: list[CollectiveInstance]
    unmatched: list[Unmatched] = []
    warmups: list[WarmupOp] = []
    warmup_factor: float = 10.0
    notes: list[str] = []
    straggler: int | None = None  # the rank named straggler: only when the evidence holds (module docstring)
    straggler_evidence: str | None = None  # the numbers judged, in words; None: saved before the rule

    def rank(self, rank: int) -> RankWaits:
        """The RankWaits of ``rank`` (KeyError if absent)."""
        return by_rank(self.ranks, rank)
