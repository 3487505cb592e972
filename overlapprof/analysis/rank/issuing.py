"""What a communication event was issued for, and which rows lie inside communication calls.

Per rank, names are looked at once per distinct name (:func:`name_property`); a GPU event's
communication kind is that of the collective its launch was issued for (OVERLAP.md section 3:
:func:`issuing_kind`), and in CPU mode a backend's span is part of the ``c10d::*`` call that
issued it (:func:`operations`), so that a kind's count is of operations, not spans.
:func:`~overlapprof.analysis.rank.events.extract` reads them.
"""

from __future__ import annotations

import functools

import numpy as np

from overlapprof.analysis.intervals import union
from overlapprof.analysis.rank import classify as C
from overlapprof.analysis.rank.classify import KIND_CODE
from overlapprof.analysis.rank.scan import Scan
from overlapprof.analysis.records.table import innermost


def name_property(names: list[str], func, dtype, ids: np.ndarray) -> np.ndarray:
    """``func(name)`` for the events of name ``ids``, computed once per distinct name (a trace
    has far fewer names than events)."""
    return np.array([func(n) for n in names], dtype=dtype)[ids]


class NameTables:
    """Per-name tables of one rank's names (``names``: its name index's list, which only grows):
    ``func(name)`` for every name, each computed once however many batches ask for it. A rank
    measured a time bucket at a time classifies each bucket with the same names: on the 2 GB
    generated trace, 40 buckets and 6,000 names (a ``ProfilerStep#N`` each), a few hundred ms of
    the same regular expressions again per bucket. ``func`` is the key: a module-level function
    or one :func:`kind_code` made."""

    def __init__(self, names: list[str]):
        self.names = names
        self._tables: dict = {}

    def table(self, func, dtype) -> np.ndarray:
        """``func(name)`` of every name, by id."""
        got = self._tables.get(func)
        if got is None or got.size < len(self.names):
            done = 0 if got is None else got.size
            new = np.array([func(n) for n in self.names[done:]], dtype=dtype)
            got = self._tables[func] = new if got is None else np.concatenate((got, new))
        return got

    def of(self, func, dtype, ids: np.ndarray) -> np.ndarray:
        """``func(name)`` for the events of name ``ids``."""
        return self.table(func, dtype)[ids]


@functools.lru_cache(maxsize=1 << 16)
def _named_kind(test, name: str) -> int:
    """The kind code of ``name`` when ``test`` (a compiled pattern's search or match) finds it,
    else -1; kept per (pattern, name): a rank measured a time bucket at a time asks for the same
    names in every bucket, and the families' pattern is slow on long kernel names."""
    return KIND_CODE[C.comm_kind(name)] if test(name) else -1


@functools.lru_cache(maxsize=64)
def kind_code(pattern_test):
    """``name -> kind code or -1`` (:func:`_named_kind`) for a pattern's test; the same function
    for the same test (a :class:`NameTables` key)."""
    return functools.partial(_named_kind, pattern_test)


def own_kind_code(name: str) -> int:
    """The kind code of a name (:func:`~overlapprof.analysis.rank.classify.comm_kind`)."""
    return KIND_CODE[C.comm_kind(name)]


def call_kind_code(name: str) -> int:
    """The kind code of a ``c10d::*`` call's name, from what follows ``c10d::``."""
    return KIND_CODE[C.comm_kind(name[6:])]


def _by_thread(calls: np.ndarray, scan: Scan, q_thread: np.ndarray):
    """Per thread that has both: (the queries on it, the call rows on it)."""
    if calls.size == 0 or q_thread.size == 0:
        return
    c_thread = scan.thread[calls]
    for thread in np.flatnonzero(np.bincount(c_thread[c_thread >= 0])).tolist():
        queries = np.flatnonzero(q_thread == thread)
        if queries.size:
            yield queries, calls[c_thread == thread]


def inside_calls(calls: np.ndarray, scan: Scan, q_thread: np.ndarray, q_time: np.ndarray) -> np.ndarray:
    """Whether each query (thread, time) lies in [call.ts, call.ts + dur) of one of the call
    rows ``calls`` on that thread: per thread, the union of its calls and one sorted search."""
    out = np.zeros(q_time.size, dtype=bool)
    for queries, mine in _by_thread(calls, scan, q_thread):
        starts, ends = union(scan.ts[mine], scan.end(mine))
        if starts.size == 0:  # only calls of no duration on this thread: nothing lies inside them
            continue
        t = q_time[queries]
        j = np.searchsorted(starts, t, "right") - 1
        out[queries] = (j >= 0) & (t < ends[np.maximum(j, 0)])
    return out


def encloses_calls(calls: np.ndarray, scan: Scan, q_thread: np.ndarray, q_start: np.ndarray,
                   q_end: np.ndarray) -> np.ndarray:
    """Whether each query span (thread, start, end) has one of the call rows ``calls`` start inside
    it on its thread: an op that opened before a communication call and closed after it (an
    autograd node whose hook issues and waits an all-gather) is the call's caller, and its end
    is no sign that the thread worked beside the operation."""
    out = np.zeros(q_start.size, dtype=bool)
    for queries, mine in _by_thread(calls, scan, q_thread):
        starts = np.sort(scan.ts[mine])
        out[queries] = (np.searchsorted(starts, q_end[queries], "left")
                        > np.searchsorted(starts, q_start[queries], "right"))
    return out


def issuing_kind(scan: Scan, tables: NameTables, calls: np.ndarray, q_thread, q_time, fallback) -> np.ndarray:
    """The kind code of the collective each query was issued for (OVERLAP.md section 3): the
    ``Collective name`` of the innermost enclosing record_param_comms on its thread, else the
    name of the innermost enclosing ``c10d::*`` call, else ``fallback`` (its own name's kind).
    ``tables``: of the rank's names."""
    out = fallback.astype(np.int8).copy()
    if calls.size == 0 or q_time.size == 0:
        return out
    names = tables.names
    params = calls[scan.name_ids[calls] == names.index(C.PARAM_COMMS)] if C.PARAM_COMMS in names else calls[:0]
    c10d = calls[tables.of(C.is_comm_wrapper, bool, scan.name_ids[calls])]
    kind = np.full(q_time.size, -1, dtype=np.int8)
    for rows, codes in ((c10d, None), (params, scan.collective)):  # later sources win
        if rows.size == 0:
            continue
        # Half-open [ts, ts + dur): innermost() takes closed ends, so end at the float just below.
        found = innermost(scan.thread[rows], scan.ts[rows], np.nextafter(scan.end(rows), -np.inf), q_thread, q_time)
        ok = found >= 0
        if codes is None:
            value = tables.of(call_kind_code, np.int8, scan.name_ids[rows])
        else:
            value = codes[rows]
        got = np.where(ok, value[np.maximum(found, 0)], -1)
        kind = np.where(got >= 0, got, kind)
    return np.where(kind >= 0, kind, out).astype(np.int8)


# What a backend may run a collective as: gloo runs a reduce-scatter of one tensor
# (``c10d::_reduce_scatter_base_``, FSDP2's) as an all-reduce on its worker thread, and records it as
# ``gloo:all_reduce``. Span kind -> the kinds of the calls it may be part of (its own first).
RUN_AS = {KIND_CODE["all_reduce"]: (KIND_CODE["all_reduce"], KIND_CODE["reduce_scatter"])}


def operations(scan: Scan, comm_rows: np.ndarray, kinds: np.ndarray, calls: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """CPU mode: whether each comm row is an operation of its own, so that a rank's count of a
    kind is the number of operations issued, not of spans recorded for them; and the call each
    comm row is part of (a row of the scan, -1: none), whose start is when it was issued.
    ``kinds`` (of the comm rows) is updated in place: a span that is part of a call takes its kind.

    Each ``c10d::*`` call ``calls`` is one operation. A ``<backend>:<op>`` span that starts
    inside one on its thread is part of it (gloo's send/recv: ``c10d::recv_`` then
    ``gloo:recv`` on the calling thread). A span on another thread (gloo runs a collective on a
    worker thread) is part of the earliest call not yet taken that started no later than it and
    that its backend may run as the span's kind (:data:`RUN_AS`: gloo's work queue is first in,
    first out), the spans taken in the order they start; or else an operation of its own.
    """
    is_span = scan.codes[comm_rows] == C.ANNOTATION
    out = ~is_span
    holder_row = np.full(comm_rows.size, -1, dtype=np.int64)
    spans = np.flatnonzero(is_span)
    if spans.size == 0 or calls.size == 0:
        out[spans] = True
        return out, holder_row
    ends = np.nextafter(scan.end(calls), -np.inf)  # innermost() takes closed ends
    rows = comm_rows[spans]
    holder = innermost(scan.thread[calls], scan.ts[calls], ends, scan.thread[rows], scan.ts[rows])
    holder_row[spans[holder >= 0]] = calls[holder[holder >= 0]]
    taken = np.zeros(calls.size, dtype=bool)
    taken[holder[holder >= 0]] = True
    order = np.argsort(comm_rows, kind="stable")  # calls are comm rows: their kinds by row
    call_kind = kinds[order[np.searchsorted(comm_rows[order], calls)]]
    loose = spans[holder < 0]
    loose = loose[np.argsort(scan.ts[comm_rows[loose]], kind="stable")]
    free = {}  # call kind -> (its free calls by start, their starts, how many are taken)
    for kind in np.flatnonzero(np.bincount(call_kind[~taken])).tolist() if (~taken).any() else []:
        mine = calls[(call_kind == kind) & ~taken]
        mine = mine[np.argsort(scan.ts[mine], kind="stable")]
        free[kind] = [mine.tolist(), scan.ts[mine].tolist(), 0]
    for q, t in zip(loose.tolist(), scan.ts[comm_rows[loose]].tolist()):
        heads = [(f[1][f[2]], k) for k in RUN_AS.get(int(kinds[q]), (int(kinds[q]),))
                 if (f := free.get(k)) is not None and f[2] < len(f[0]) and f[1][f[2]] <= t]
        if not heads:
            out[q] = True
            continue
        _, k = min(heads)  # the earliest issued (first in, first out)
        holder_row[q] = free[k][0][free[k][2]]  # part of that call
        free[k][2] += 1
        kinds[q] = k
    return out, holder_row


def call_union(comm, names: list[str]):
    """CPU mode: the union of the ``c10d::*`` calls among a rank's communication events ``comm``
    (an EventSet; ``key``: ids into ``names``): the time its threads spent inside their
    communication calls (issuing, copying, or blocked waiting), which the cpu_op that encloses
    a call (an autograd node whose hook issues one) covers as compute."""
    if comm.start.size == 0:
        return union(comm.start, comm.end)
    wrapper = name_property(names, C.is_comm_wrapper, bool, comm.key)
    return union(comm.start[wrapper], comm.end[wrapper])
