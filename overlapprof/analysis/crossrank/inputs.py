"""Each rank's share of the cross-rank analysis (:class:`CrossRankInput`), built where the rank was read.

A worker that reads a rank keeps what matching needs (its logical operations and exposed
communication) and what the rank's trace says of its host, clock base and process groups;
:func:`overlapprof.analysis.crossrank.section.build_crossrank` takes them all once the ranks are
settled.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec
import numpy as np

from overlapprof.analysis import intervals as iv
from overlapprof.analysis.columns import distinct_rows
from overlapprof.analysis.records.operations import DEFAULT_GROUP, CommOperations, rank_operations
from overlapprof.analysis.records.table import CommTable
from overlapprof.trace.decode import TraceFile
from overlapprof.trace.kineto import GROUP_SIZE, PG_RANKS, base_us


@dataclass
class CrossRankInput:
    """One rank's share of the cross-rank analysis (built by the analyzer from a worker's result).

    ``base_us``: the trace's ``baseTimeNanoseconds`` / 1000 (``ts + base_us`` is its host clock).
    ``pg_ranks``: process group name -> member ranks (``distributedInfo.pg_config``).
    ``ops``: the rank's logical operations (:func:`~overlapprof.analysis.records.operations.rank_operations`);
    ``op_groups``: what they say of their groups, name -> (size, ranks, source); ``unnamed``:
    whether some carry no group name. ``comm``: U(comm), and ``exposed``: U(comm) \\ U(compute) of
    the rank (OVERLAP.md), on its own ``ts`` clock. Built in the worker that read the rank (small:
    numpy columns).
    """

    rank: int
    ops: CommOperations | None = None
    host: str | None = None
    base_us: float = 0.0
    world_size: int | None = None
    pg_ranks: dict[str, list[int]] = field(default_factory=dict)
    op_groups: dict[str, tuple] = field(default_factory=dict)
    unnamed: bool = False
    comm: iv.Intervals = iv.EMPTY
    exposed: iv.Intervals = iv.EMPTY
    comm_us: float = 0.0
    exposed_comm_us: float = 0.0

    def attach(self, table: CommTable, comm: iv.Intervals, exposed: iv.Intervals, exposed_comm_us: float) -> None:
        """Add the rank's operations (as logical-operation columns) and its communication, all and exposed."""
        self.ops = rank_operations(table)
        self.comm, self.exposed, self.exposed_comm_us = comm, exposed, exposed_comm_us
        self.comm_us = iv.length(comm)
        if not len(table):
            return
        pg, ranks = table.strings["pg_name"], table.strings["pg_ranks"]
        self.unnamed = bool((pg < 0).any())
        size = np.nan_to_num(table.numbers["group_size"], nan=0.0).astype(np.int64)
        # What the operations say of their groups: the first that lists the ranks, else the first
        # with a size (in order, so only the first operation of each distinct combination counts).
        first, _ = distinct_rows(pg, ranks, size)
        strings = table.values.strings
        for code, ranks_code, group_size in zip(pg[first].tolist(), ranks[first].tolist(), size[first].tolist()):
            name = (strings["pg_name"].values[code] if code >= 0 else None) or DEFAULT_GROUP
            members = strings["pg_ranks"].values[ranks_code] if ranks_code >= 0 else None
            if members and self.op_groups.get(name, (0, None))[1] is None:
                self.op_groups[name] = (len(members), members, PG_RANKS)
            elif group_size and name not in self.op_groups:
                self.op_groups[name] = (group_size, None, GROUP_SIZE)


class _ProcessGroup(msgspec.Struct):
    pg_name: str | int
    ranks: list[int]


_PG_CONFIG = msgspec.json.Decoder(list[_ProcessGroup])


def crossrank_input(traces: list[TraceFile], base_ns: int | None) -> CrossRankInput:
    """A rank's host, clock base and process groups from its decoded trace files (the operations
    and exposed intervals are filled in later). Odd values are ignored, never fatal."""
    host, pg_ranks = None, {}
    for t in traces:
        if host is None and t.host_name:
            try:
                host = msgspec.json.decode(t.host_name, type=str) or None
            except (msgspec.DecodeError, msgspec.ValidationError):
                pass
        if t.distributedInfo is not None and t.distributedInfo.pg_config:
            try:
                groups = _PG_CONFIG.decode(t.distributedInfo.pg_config)
            except (msgspec.DecodeError, msgspec.ValidationError):
                groups = []
            pg_ranks.update({str(g.pg_name): g.ranks for g in groups})
    return CrossRankInput(rank=-1, host=host, base_us=base_us(base_ns), pg_ranks=pg_ranks)
