"""A CPU rank measured again with its async sends' new ends (OVERLAP.md section 1: a send matched
to a receive its thread waited for ends at the receive's end; see
:mod:`overlapprof.analysis.crossrank.transfer_ends`), from what its one read kept: nothing reads
its files again.

The ends change only the send spans' communication intervals. So :class:`Remeasure` keeps, from
:func:`~overlapprof.analysis.rank.bounded.measure`, what the communication is classified from
(each file's rows kept in memory: the steps, calls and annotations) and what the records are
tabled from (:func:`~overlapprof.analysis.rank.bucket_records.cpu_table`'s ``keep``), a row per
operation; the first measurement's U(compute) and U(memory) (whole and per step) and each step's
end by them; and the interference's top-level compute spans (moved to a store of the
analyzing process as the rank's result arrives there: :meth:`Remeasure.keep_in`). :meth:`Remeasure.again` classifies
the communication with the ends exactly as the first measurement did, makes its unions, takes
the rest of the :class:`~overlapprof.analysis.rank.unions.RankUnions` from the first, and measures
the records and the interference again: the same floats a second read gave.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from overlapprof.analysis.interference import InterferenceBuilder
from overlapprof.analysis.rank.bucket_records import cpu_table_again
from overlapprof.analysis.rank.events import Steps, extract, filtered, place_in_steps
from overlapprof.analysis.rank.scan import Scan
from overlapprof.analysis.rank.unions import COMM, UnionsBuilder
from overlapprof.analysis.records.table import CommTable


@dataclass
class Remeasure:
    """What :meth:`again` measures a CPU rank from. ``rank``: the first measurement (a
    :class:`~overlapprof.analysis.rank.bounded.BoundedRank`); ``few``: per file, its path and the
    columns of its rows kept in memory; ``tables``: per file, what its records' table is built
    from (none without records); ``steps``: the steps before the filters (the records'); ``cutoff``:
    ``--drop-last-step``'s (:func:`~overlapprof.analysis.rank.events.last_step_dropped`);
    ``other_end``: each step's end, max(its own, the ends of its compute and memory events);
    ``spans``: the interference's spans (:meth:`InterferenceBuilder.replayable`; :meth:`keep_in` a store)."""

    rank: object
    few: list[tuple[str, dict]]
    tables: list[tuple]
    steps: Steps
    cutoff: float | None
    other_end: np.ndarray
    spans: InterferenceBuilder
    comm_re: object
    comm_ann: object
    names: list[str]
    values: object

    def keep_in(self, store) -> None:
        """The spans into ``store`` (the analyzing process's: in memory up to its budget, on disk
        past it), where they wait for the ends."""
        spans = InterferenceBuilder(self.spans.steps, nest=False, store=store)
        for rec in self.spans.held:
            spans.buckets.route(np.zeros(rec.size, dtype=np.int64), rec)
        self.spans = spans

    def again(self, ends: tuple[np.ndarray, np.ndarray]):
        """The rank measured with ``ends`` (:attr:`~overlapprof.analysis.crossrank.transfer_ends.PartnerEnds.ends`'s):
        the first measurement with its unions, table and interference made again."""
        build = UnionsBuilder(self.rank.unions.steps)
        for path, columns in self.few:
            sets = extract(Scan.of_columns(path, dict(columns)), False, self.comm_re, self.comm_ann, self.names, None,
                           ends=ends)[0]
            build.add(filtered(sets[0], False, self.cutoff), COMM)
        new, old = build.result(), self.rank.unions
        unions = replace(old, last_end=np.maximum(new.last_end, self.other_end),
                         whole=(new.whole[COMM], *old.whole[1:]), by_step=(new.by_step[COMM], *old.by_step[1:]),
                         kinds=new.kinds, operations=new.operations, counts=(new.counts[0], *old.counts[1:]),
                         spans=(new.spans[0], *old.spans[1:]))
        table = None
        if self.tables:
            table = CommTable.concat([cpu_table_again(k, self.comm_re, self.comm_ann, self.names, self.values, ends)
                                      for k in self.tables])
            place_in_steps(table, self.steps)
        measured = self.spans.result(unions.comm, self.names)
        return replace(self.rank, unions=unions, table=table, interference=measured)
