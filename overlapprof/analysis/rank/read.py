"""A trace file read into a :class:`~overlapprof.analysis.rank.scan.Scan`: by several processes
when it is large and the caller hands a parallel reader (``parallel``, an
:class:`overlapprof.analysis.engine.parallel.Reader`), else, or when they give up, by this one
(:mod:`overlapprof.analysis.rank.scan`)."""

from __future__ import annotations

import numpy as np

from overlapprof.analysis.columns import Index
from overlapprof.analysis.rank import classify as C
from overlapprof.analysis.rank import scan as S
from overlapprof.analysis.records.recorder import CommRecorder
from overlapprof.errors import TraceError
from overlapprof.trace import nsys


def read_file(path, names: Index, recorder: CommRecorder | None, parallel=None, sink=None):
    """:func:`~overlapprof.analysis.rank.scan.read_serially`'s result, the file read by
    ``parallel(path, names, recorder, sink)`` when it is given (several processes when the
    file is large: :class:`~overlapprof.analysis.engine.parallel.Reader`, which checked every
    time: no problem to raise; None when it did not read it), else, or when they give up, by
    this one."""
    if parallel is not None:
        got = parallel(path, names, recorder, sink)
        if got is not None:
            arrays, unclassified, header, threads = got
            return arrays, unclassified, header, threads, recorder
        if recorder is not None:
            recorder = recorder.fresh()  # it may hold the parts read before the workers gave up
    return S.read_serially(path, names, recorder, sink)


def read_scan(path, names: Index, recorder: CommRecorder | None = None, parallel=None,
              notes: list | None = None, step_range: str | None = None, rank_map: dict | None = None) -> S.Scan:
    """Read a file's events chunk by chunk (:mod:`overlapprof.trace.reader`) into a scan; a
    large file by ``parallel`` (see :func:`read_file`). An Nsight Systems export (or one rank of it) is
    read by :mod:`overlapprof.analysis.rank.nsys_scan` (its notes appended to ``notes``;
    ``step_range``: the NVTX range that is a step, ``rank_map``: pid -> rank)."""
    if nsys.is_sqlite(path):
        from overlapprof.analysis.rank import nsys_scan

        scan, said = nsys_scan.read(path, names, recorder, step_range, rank_map)
        if notes is not None:
            notes += said
        return scan
    arrays, unclassified, header, threads, recorder = read_file(path, names, recorder, parallel)
    if arrays is None:
        raise TraceError(path, "no complete ('X') events: nothing to measure")
    negative = int(np.count_nonzero(arrays["dur"] < 0))
    events = arrays["ts"].size
    kept = S.drop_unread_rows(arrays, names.order)
    corr = arrays.pop("corr")  # correlated rows are all kept in GPU mode: corr is unchanged
    launch = S.launch_rows(arrays["codes"], corr)
    sync_record = S.launch_rows(arrays["codes"], corr, of=(C.SYNC,)) if (arrays["codes"] == C.SYNC).any() else None
    records = recorder.records(arrays["thread"], list(threads)) if recorder is not None else None
    if records is not None and kept is not None:
        records.rows = np.searchsorted(np.flatnonzero(kept), records.rows)  # every record row is a kept row
    scan = S.Scan(str(path), **arrays, launch=launch, negative=negative, events=events, header=header,
                  unclassified=unclassified, records=records)
    if sync_record is not None:
        scan.sync_record = sync_record
    return scan
