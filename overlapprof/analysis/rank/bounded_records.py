"""The communication records of a rank measured with its events on disk (past the memory
budget, ``--memory-budget``; with the cross-rank section or ``--comm-ops``): each file read
again, keeping only the rows records need, then classified and tabled as in memory.

The first pass (:mod:`overlapprof.analysis.rank.bounded`) finds each file's communication GPU
events. On the second read, their correlations keep those events and the runtime calls that
launched them; with every communication call, every ``a:b`` annotation (what a record's fields
come from) and every kernel named as communication, that is a scan of a size per operation,
not per event. :func:`~overlapprof.analysis.rank.events.extract` classifies it (the same events
come out as communication: their launches and every call are there) and builds the rank's
:class:`~overlapprof.analysis.records.table.CommTable` as from the whole file: the other GPU
activity is no record's (:meth:`~overlapprof.analysis.records.recorder.Records.drop`).
"""

from __future__ import annotations

from functools import partial

import numpy as np

from overlapprof.analysis.rank import classify as C
from overlapprof.analysis.rank.events import Steps, extract, place_in_steps
from overlapprof.analysis.rank.read import read_file
from overlapprof.analysis.rank.chunk_args import IS_CORRELATED
from overlapprof.analysis.rank.scan import IS_GPU, SCAN_COLUMNS, launch_rows, Scan
from overlapprof.analysis.rank.waits import lookup
from overlapprof.analysis.records.fields import Values
from overlapprof.analysis.records.recorder import CommRecorder
from overlapprof.analysis.records.table import CommTable

_CALL, _ANNOTATION, _KERNEL = 1, 2, 4  # roles of a name: what a row of the right category may be


class KeepRecordRows:
    """Which rows of a chunk the second read keeps (``scan.read_chunks``' ``keep``): the
    communication calls, ``a:b`` annotations, kernels named as communication, and the GPU events
    and runtime calls of the correlations ``corr``."""

    def __init__(self, comm_re, corr: np.ndarray):
        self.comm_re, self.corr = comm_re, np.sort(corr)
        self.names, self.roles = None, np.zeros(0, dtype=np.int8)

    def _role(self, name: str) -> int:
        return ((_CALL if C.is_comm_call(name) else 0) | (_ANNOTATION if C.COMM_ANNOTATION.match(name) else 0)
                | (_KERNEL if self.comm_re.search(name) else 0))

    def __call__(self, codes, name_ids, names: list[str], linked, corr) -> np.ndarray:
        if names is not self.names:  # another reader's names (a part of a parallel read)
            self.names, self.roles = names, np.zeros(0, dtype=np.int8)
        if len(names) > self.roles.size:
            new = [self._role(n) for n in names[self.roles.size :]]
            self.roles = np.concatenate((self.roles, np.array(new, dtype=np.int8)))
        role = self.roles[name_ids]
        keep = (((codes == C.CPU_OP) & ((role & _CALL) != 0)) | ((codes == C.ANNOTATION) & ((role & _ANNOTATION) != 0))
                | (IS_GPU[codes] & ((role & _KERNEL) != 0)))
        if self.corr.size and linked.size:
            at = np.minimum(np.searchsorted(self.corr, corr), self.corr.size - 1)
            keep[linked[self.corr[at] == corr]] = True  # NaN matches nothing
        return keep


def comm_table(files: list[str], gpu: bool, comm_re, comm_ann, own: bool, comm_corr: list[np.ndarray] | None,
               steps: Steps, parallel=None, activity: list | None = None, ends=None,
               needs: list[dict] | None = None) -> CommTable:
    """The rank's CommTable, its files read again (see the module docstring). ``comm_corr``:
    per file, the correlations of its communication GPU events (None: CPU mode); ``own``: keep
    the events' own fields (``--comm-ops``); ``steps``: the rank's, before any filter;
    ``parallel``: reads a large file (see :func:`~overlapprof.analysis.rank.read.read_file`); ``activity``: CPU mode, per file, the host
    activity of its compute cpu_ops (what the second read leaves out); ``ends``: see
    :func:`~overlapprof.analysis.rank.events.ends_at_peer`; ``needs``: GPU mode, per file, the
    need times the first pass measured from the CUDA sync events
    (:meth:`~overlapprof.analysis.rank.waits.NeedTimes.result`: this read keeps no sync row)."""
    values = Values()
    names = values.index
    tables = []
    for k, path in enumerate(files):
        keep = KeepRecordRows(comm_re, comm_corr[k] if comm_corr is not None else np.empty(0))
        arrays, _, _, threads, recorder = read_file(path, names, CommRecorder(comm_re, values, own), parallel,
                                                    keep=keep)
        if arrays is None:  # no row kept
            arrays = {k: np.empty(0, dtype) for k, dtype in {**SCAN_COLUMNS, "corr": np.float64}.items()}
        corr = arrays.pop("corr")
        launch = launch_rows(arrays["codes"], corr)
        waited = None
        if needs is not None:
            row_corr = np.full(arrays["ts"].size, np.nan)
            row_corr[IS_CORRELATED[arrays["codes"]]] = corr
            waited = partial(_waited, needs[k], row_corr, arrays["ts"])
        records = recorder.records(arrays["thread"], list(threads))
        scan = Scan.of_columns(path, arrays, launch, records)
        tables.append(extract(scan, gpu, comm_re, comm_ann, names.order, values,
                              activity[k] if activity is not None else None, ends, waited)[2])
    table = CommTable.concat(tables)
    place_in_steps(table, steps)
    return table


def _waited(needs: dict, corr: np.ndarray, ts: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The need times of the communication GPU events ``rows`` (see :func:`comm_table`'s ``needs``)."""
    return lookup(needs, corr[rows], ts[rows])
