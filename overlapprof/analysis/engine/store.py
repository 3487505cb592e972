"""Rows kept in memory up to a budget and on disk past it (issue 36).

A :class:`Store` holds *bins*: records of one numpy dtype appended a batch at a time and read
back whole or a window at a time (:meth:`Store.file`), and sets of bins that rows are routed to
by a bucket number (:meth:`Store.buckets`). Every bin starts in memory; when the bytes held in
memory pass the budget, the largest bin in memory goes to disk (and what is appended to it after
goes there too: segments of the store's one file, :class:`~overlapprof.analysis.spill.SpillLog`),
again until the store is under its budget: a bin
at a time, so what fits is never written, and what does not is written once and read once. The
folder (``$TMPDIR/overlapprof-*``) is made only when a first bin goes to disk (with a budget of
0, when the store opens), and removed when the store closes. With no budget (None) nothing is written.

The measuring code is handed a store (:func:`overlapprof.analysis.rank.bounded.measure`,
:func:`overlapprof.analysis.like_hta.rank_metrics`); the bins have the interface of
:class:`~overlapprof.analysis.spill.SpillFile` and :class:`~overlapprof.analysis.spill.Buckets`.
"""

from __future__ import annotations

import math
import os
import shutil

import numpy as np

from overlapprof.analysis.spill import Buckets, SpillFailed, SpillFile, SpillLog, folder_name, make_folder, spill_error


class Store:
    """Bins of rows, in memory up to ``budget`` bytes (None: no limit; 0: every bin on disk),
    the rest in files; ``label`` names what is stored in the one-line error when the disk
    fails. A context manager: its folder goes at the end, and a failure to make, write or read
    it is :class:`~overlapprof.errors.SpillError`."""

    def __init__(self, budget: int | None, label: str = "the trace"):
        self.budget = math.inf if budget is None else budget
        self.label = label
        self.held = 0  # bytes of the bins in memory
        self.bins: list[Bin] = []
        self.folder: str | None = None
        self.log: SpillLog | None = None  # the one file of the bins on disk, made with the first
        self.spilled = 0  # bins sent to disk (tests read it)

    def __enter__(self) -> Store:
        if self.budget == 0:  # everything goes to disk: the folder at once, as the work starts
            try:
                self.path("")
            except SpillFailed as exc:
                raise spill_error(self.label, exc.error) from None
            except BaseException:  # a SIGTERM here: no __exit__ removes the folder
                self.close()
                raise
        return self

    def __exit__(self, kind, exc, tb) -> None:
        self.close()
        if isinstance(exc, SpillFailed):
            raise spill_error(self.label, exc.error) from None

    def close(self) -> None:
        for b in self.bins:
            b.remove()
        self.bins = []
        if self.log is not None:
            self.log.close()
            self.log = None
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None

    def file(self, name: str, dtype, columns: bool = False, fill: dict | None = None) -> Bin:
        """A new bin of records of ``dtype`` (``name``: what it holds).
        ``columns``: its records are a dict of arrays, one per field of ``dtype`` (see :class:`Bin`);
        ``fill``: the value of each of these fields where a batch of records has none of it."""
        b = Bin(self, f"{len(self.bins)}.{name}", np.dtype(dtype), columns, fill)
        self.bins.append(b)
        if self.budget == 0:
            b.spill()
        return b

    def buckets(self, name: str, dtype, count: int, columns: bool = False) -> Buckets:
        """``count`` new bins that :meth:`Buckets.route` sends records to by bucket number."""
        return Buckets([self.file(f"{name}.{k}", dtype, columns) for k in range(count)])

    def spill_log(self) -> SpillLog:
        """The file the bins on disk write to (made now, if it is not yet)."""
        if self.log is None:
            self.log = SpillLog(self.path("bins"))
        return self.log

    def path(self, name: str) -> str:
        """The path of ``name`` in the store's folder (the folder made now, if it is not yet)."""
        if self.folder is None:
            self.folder = folder_name()  # recorded before it is made: close() removes it whenever a SIGTERM lands
            try:
                make_folder(self.folder)
            except OSError as exc:
                self.folder = None
                raise SpillFailed(os.environ.get("TMPDIR") or "/tmp", exc) from None
        return os.path.join(self.folder, name)

    def _grew(self, nbytes: int) -> None:
        self.held += nbytes
        while self.held > self.budget:
            largest = max((b for b in self.bins if b.file is None), key=lambda b: b.bytes, default=None)
            if largest is None or largest.bytes == 0:
                return
            largest.spill()


class Bin:
    """Records of one dtype, appended in order: in memory (a list of arrays) until the store
    sends it to disk (:meth:`spill`). A bin of ``columns`` takes and gives its records as a
    dict of arrays, a field each (:func:`~overlapprof.analysis.spill.take` indexes them): in
    memory they stay columns, so a bin that is never written costs no structured rows; on disk
    they are the dtype's rows.

    A field of ``fill`` may be missing from a batch of columns (given as the batch's length, an
    int): in memory it costs nothing, on disk it is written as its fill value, and a field that
    no batch held is read back as an empty column whatever the budget."""

    def __init__(self, store: Store, name: str, dtype: np.dtype, columns: bool = False, fill: dict | None = None):
        self.store, self.name, self.dtype, self.columns = store, name, dtype, columns
        self.fill = fill or {}
        self.held_fields: set = set()  # the fields of fill that some batch held
        self.parts: list = []
        self.bytes = self.rows = 0
        self.file: SpillFile | None = None

    def append(self, records) -> None:
        if self.columns:
            records = {k: v if isinstance(v := records[k], int) and k in self.fill else _own(np.asarray(v, dtype=self.dtype[k]))
                       for k in self.dtype.names}
            arrays = [v for v in records.values() if not isinstance(v, int)]
            size = arrays[0].size if arrays else records[self.dtype.names[0]]
            nbytes = sum(v.nbytes for v in arrays)
            self.held_fields.update(k for k in self.fill if not isinstance(records[k], int))
        else:
            size = records.size
        if size == 0:
            return
        self.rows += size
        if self.file is not None:
            self.file.append(self._rows(records))
            return
        if not self.columns:
            records = _own(np.asarray(records, dtype=self.dtype))
            nbytes = records.nbytes
        self.parts.append(records)
        self.bytes += nbytes
        self.store._grew(nbytes)

    def _rows(self, records) -> np.ndarray:
        if not self.columns:
            return records
        rows = np.empty(_size(records[self.dtype.names[0]]), dtype=self.dtype)
        for k in self.dtype.names:
            rows[k] = self.fill[k] if isinstance(records[k], int) else records[k]
        return rows

    def spill(self) -> None:
        """Send the records to a file, and what comes after."""
        self.file = SpillFile(self.store.spill_log(), self.dtype)
        for part in self.parts:
            self.file.append(self._rows(part))
        self.store.held -= self.bytes
        self.store.spilled += 1
        self.parts, self.bytes = [], 0

    def read(self):
        """Every record (the bin stays)."""
        if self.file is not None:
            return self._columns(self.file.read())
        if self.columns and self.parts:  # joined a field at a time, each batch's let go of as it is
            joined = {}
            for k in self.dtype.names:
                column = [p.pop(k) for p in self.parts]
                if k in self.fill and k not in self.held_fields:
                    joined[k] = np.empty(0, dtype=self.dtype[k])
                elif len(column) == 1 and not isinstance(column[0], int):
                    joined[k] = column[0]
                else:
                    joined[k] = np.concatenate([np.full(v, self.fill[k], dtype=self.dtype[k]) if isinstance(v, int) else v
                                                for v in column])
            self.parts = [joined]
        elif len(self.parts) > 1:
            self.parts = [np.concatenate(self.parts)]
        if self.parts:
            return self.parts[0]
        return self._columns(np.empty(0, dtype=self.dtype))

    def _columns(self, rows: np.ndarray):
        """Rows read back as a bin of columns gives them (a field of ``fill`` no batch held: empty)."""
        if not self.columns:
            return rows
        return {k: rows[k] if k not in self.fill or k in self.held_fields else np.empty(0, dtype=self.dtype[k])
                for k in self.dtype.names}

    def windows(self, rows: int):
        """The records, at most ``rows`` at a time, in order (a bin of rows)."""
        assert not self.columns
        if self.file is not None:
            yield from self.file.windows(rows)
            return
        whole = self.read()
        for at in range(0, whole.size, rows):
            yield whole[at : at + rows]

    def span(self, lo: int, hi: int):
        """Records ``lo`` to ``hi`` (not included), in order (the bin stays)."""
        if self.file is not None:
            return self._columns(self.file.span(lo, hi))
        whole = self.read()
        return {k: v[lo:hi] for k, v in whole.items()} if self.columns else whole[lo:hi]

    def remove(self) -> None:
        if self.file is not None:
            self.file.remove()
            self.file = None
        self.store.held -= self.bytes
        self.parts, self.bytes = [], 0


def _size(column) -> int:
    return column if isinstance(column, int) else column.size


def _own(a: np.ndarray) -> np.ndarray:
    """``a``, or a copy of it when it is a view (which would hold its whole base)."""
    return a if a.base is None else a.copy()
