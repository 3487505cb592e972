"""The communication records of a rank measured a bucket at a time
(:mod:`overlapprof.analysis.rank.bounded`), from its one read of each file.

While a file is read, its :class:`~overlapprof.analysis.records.recorder.CommRecorder` keeps
the args of the rows that hold a field (argument rows) and
:class:`~overlapprof.analysis.rank.spilled.SpilledRows` the calls and ``a:b`` annotations the
records read (``recs``). Which GPU events are communication is known only once their time
bucket is classified: :class:`CommEvents` keeps those of each bucket (a row per operation), the
others are dropped with their bucket. Then the record rows are the calls, the annotations and
the communication events, in file order, and the table is built from them as
:func:`~overlapprof.analysis.rank.events.extract` builds it from a whole file.
"""

from __future__ import annotations

import copy

import numpy as np

from overlapprof.analysis import heap
from overlapprof.analysis.rank.events import extract
from overlapprof.analysis.rank.scan import SCAN_COLUMNS, Scan
from overlapprof.analysis.rank.spilled import SpilledFile
from overlapprof.analysis.rank.waits import lookup
from overlapprof.analysis.records.table import CommTable, StoredTable, comm_table

_COMM_ROW = np.dtype([("row", "<i8"), ("ts", "<f8"), ("dur", "<f8"), ("codes", "i1"), ("name_ids", "<i4"),
                      ("thread", "<i4"), ("kind", "i1"), ("launch_ts", "<f8"), ("launch_thread", "<i4"),
                      ("corr", "<f8")])


class CommEvents:
    """A file's communication GPU events, a classified time bucket at a time, in a bin of the
    rank's store (past its budget, on disk: a row per operation)."""

    def __init__(self, store):
        self.bin = store.file("comm", _COMM_ROW)

    def add(self, joined: np.ndarray, kinds: np.ndarray) -> None:
        """The communication events of a bucket: their joined rows
        (:func:`~overlapprof.analysis.rank.spilled.joined_by_time`'s columns) and kind codes."""
        out = np.empty(kinds.size, dtype=_COMM_ROW)
        for k in _COMM_ROW.names:
            out[k] = kinds if k == "kind" else joined[k]
        self.bin.append(out)

    def result(self) -> np.ndarray:
        """The events in file order (the bin is emptied)."""
        rows = self.bin.read()
        self.bin.remove()
        row = rows["row"]
        if np.all(row[1:] > row[:-1]):  # one bucket, or buckets in file order: no gather of every record
            return rows
        return rows[np.argsort(row, kind="stable")]


def gpu_table(f: SpilledFile, comm: np.ndarray, values, needs: dict, store=None) -> CommTable | StoredTable:
    """GPU mode: the file's table from its communication events ``comm`` (:meth:`CommEvents.result`)
    and the need times measured from its CUDA sync events (``needs``:
    :meth:`~overlapprof.analysis.rank.waits.NeedTimes.result`). ``store``: the table is made
    into it (a :class:`~overlapprof.analysis.records.table.StoredTable`, read back by the caller
    once the record rows are let go of), for a rank past its store's budget."""
    heap.release(f.rows.size)  # the classified buckets' pages, before the per-operation arrays
    recs = f.rows.recs.read()
    f.rows.recs.remove()
    n_recs = recs["row"].size
    rows = np.concatenate((recs["row"], comm["row"]))
    order = np.argsort(rows, kind="stable")
    cols = {k: np.concatenate((recs[k], comm[k]))[order] for k in ("ts", "dur", "codes", "name_ids", "thread")}
    rec = f.recorder.records(cols["thread"], f.threads, rows[order])
    rec.rows = np.arange(rows.size, dtype=np.int32 if rows.size < 2**31 else np.int64)  # (per record row)
    where = np.empty_like(order)
    where[order] = np.arange(order.size)
    launched = ~np.isnan(comm["launch_ts"])
    host_thread = rec.thread_codes[np.where(launched, comm["launch_thread"], comm["thread"])]
    rec.gather(cols["ts"], cols["dur"], cols["codes"], cols["name_ids"], every=True)
    anchor = np.where(launched, comm["launch_ts"], comm["ts"])
    at = where[n_recs:].copy()
    del cols, rows, order, where, recs  # (per operation: not held while the table is built)
    kinds, launch_ts, need_ts = comm["kind"].copy(), comm["launch_ts"].copy(), lookup(needs, comm["corr"], comm["ts"])
    del comm  # (the caller holds none: its rows, 54 bytes an operation, are not held while the table is built)
    table = comm_table(rec, values, gpu=True, rows=at, kinds=kinds, launch_ts=launch_ts, host_thread=host_thread,
                       anchor=anchor, issue_ts=anchor, need_ts=need_ts, store=store)
    rec.args.remove()  # the argument rows' bin (see CommRecorder's store)
    return table


def cpu_table(f: SpilledFile, comm_re, comm_ann, names: list[str], values, activity, ends, keep=None) -> CommTable:
    """CPU mode: the file's table from its calls and annotations, classified as in memory
    (``activity``: the host activity of its compute CPU ops; ``ends``: see
    :func:`~overlapprof.analysis.rank.events.ends_at_peer`). ``keep``: a list that gets what
    :func:`cpu_table_again` builds the table from again, with other ends (a row per operation, in memory)."""
    recs = f.rows.recs.read()
    rec = f.recorder.records(recs["thread"], f.threads, recs["row"])
    rec.rows = np.arange(recs["row"].size)
    if keep is not None:
        held = copy.copy(rec)
        held.args = None if rec.args is None else _HeldArgs(rec.args.read())
        keep.append((f.path, copy.deepcopy(recs), copy.deepcopy(held), activity))
    scan = Scan.of_columns(f.path, {k: recs[k] for k in SCAN_COLUMNS}, None, rec)
    table = extract(scan, False, comm_re, comm_ann, names, values, activity, ends)[2]
    if rec.args is not None:
        rec.args.remove()
    return table


def cpu_table_again(kept: tuple, comm_re, comm_ann, names: list[str], values, ends) -> CommTable:
    """:func:`cpu_table` again from what it kept (``keep``), with the sends' ``ends``."""
    path, recs, rec, activity = kept
    scan = Scan.of_columns(path, {k: recs[k] for k in SCAN_COLUMNS}, None, rec)
    return extract(scan, False, comm_re, comm_ann, names, values, activity, ends)[2]


class _HeldArgs:
    """A bin's argument columns read into memory (what :meth:`Records.arg_columns` reads)."""

    def __init__(self, columns: dict):
        self.columns = columns

    def span(self, lo: int, hi: int) -> dict:
        return {k: v[lo:hi] for k, v in self.columns.items()}
