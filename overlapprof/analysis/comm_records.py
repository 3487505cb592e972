"""The records of communication operations, read along with the events into columns.

While :mod:`overlapprof.analysis.events` reads a file chunk by chunk, a :class:`CommRecorder`
keeps, for the few events communication records refer to, only what they need: the thread of
runtime calls (a launch's thread), and the thread and typed arguments of the *record rows* —
GPU activity (any of it may be communication: OVERLAP.md section 1), ``<backend>:<op>``
annotations, ``record_param_comms`` and ``c10d::*`` ops. Arguments are decoded a batch of rows at a time, only the fields whose key
occurs in the batch, and kept as codes of distinct values
(:class:`~overlapprof.analysis.comm_ops.Field`) or float columns.

:func:`comm_table` then builds a file's :class:`~overlapprof.analysis.comm_ops.CommTable`:
each communication event's enclosing ``record_param_comms``, ``c10d::*`` op and (GPU mode) comm
annotation on the thread that launched it, found by one sorted search per thread, and its
collective fields merged from them (the event's own first, then the annotation's, then
record_param_comms'). Everything per operation is numpy; the rules that read names and values
(kinds, peers, sizes) run once per distinct combination of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter

import msgspec
import numpy as np

from overlapprof.analysis import classify as C
from overlapprof.analysis.comm_ops import (
    ARROW,
    MERGED_NUMBERS,
    MERGED_STRINGS,
    NUMBER_FIELDS,
    OWN_FIELDS,
    P2P_CALLS,
    STRING_FIELDS,
    CommTable,
    Values,
)
from overlapprof.trace import decode as D

# Roles of a name (bits): what a row of the right category with that name is.
PARAMS, CALL, ANNOTATION, KERNEL = 1, 2, 4, 8
# What to look for in a batch's text to know which fields it may hold (one search per entry:
# fields whose keys share a part are looked for together).
_MARKERS = {
    b'"Collective name"': ("collective",), b' msg nelems"': ("in_nelems", "out_nelems"), b'"dtype"': ("dtype",),
    b'"Group size"': ("group_size",), b'"Process Group ': ("pg_name", "pg_desc", "pg_ranks"), b'"Seq"': ("seq",),
    b'"seq"': ("seq_lower",), b'"Input ': ("input_dims", "input_type"), b' Rank"': ("src_rank", "dst_rank"),
    b'"Concrete Inputs"': ("concrete_inputs",), b'"stream"': ("stream",), b'"device"': ("device",),
    b'"correlation"': ("correlation",), b'"External id"': ("external_id",),
}
assert {f for fields in _MARKERS.values() for f in fields} == {f.name for f in msgspec.structs.fields(D.EventArgs)}
_EMPTY_ARGS = D.EventArgs()


def _role(name: str, comm_re) -> int:
    return ((PARAMS if name == C.PARAM_COMMS else 0) | (CALL if name.startswith("c10d::") else 0)
            | (ANNOTATION if C.COMM_ANNOTATION.match(name) else 0) | (KERNEL if comm_re.search(name) else 0))


@dataclass
class Records:
    """A file's record rows (row = index among its complete events) and columns of their args;
    ``thread_rows``/``threads``: the record rows and runtime calls, with their thread codes."""

    rows: np.ndarray
    strings: dict[str, np.ndarray]
    numbers: dict[str, np.ndarray]
    own: dict[str, list] | None
    thread_rows: np.ndarray
    threads: np.ndarray

    def thread_of(self, rows: np.ndarray) -> np.ndarray:
        return self.threads[np.searchsorted(self.thread_rows, rows)]


class CommRecorder:
    """Collects a file's record rows chunk by chunk (see the module docstring).

    ``values`` are the rank's (its name index grows as chunks are read); ``own``: also keep the
    event's own stream, device, correlation and external id (CommOp records)."""

    def __init__(self, comm_re, values: Values, own: bool = False):
        self.comm_re, self.values, self.own = comm_re, values, own
        wanted = {*STRING_FIELDS, *NUMBER_FIELDS, *(OWN_FIELDS if own else ())}
        self._markers = [(m, fields) for m, fields in _MARKERS.items() if wanted.intersection(fields)]
        self._rows, self._thread_rows, self._thread_codes = [], [], []
        self._strings = {k: [] for k in STRING_FIELDS}
        self._numbers = {k: [] for k in NUMBER_FIELDS}
        self._own = {k: [] for k in OWN_FIELDS} if own else None

    def add(self, events: list, codes: np.ndarray, name_ids: np.ndarray, row0: int) -> None:
        """One chunk's complete events (``events[k]`` is row ``row0 + k``), their category codes
        and name ids."""
        v = self.values
        if len(v.names) > v.roles.size:
            new = [_role(n, self.comm_re) for n in v.names[v.roles.size :]]
            v.roles = np.concatenate((v.roles, np.array(new, dtype=np.int8)))
        role = v.roles[name_ids]
        named = (((codes == C.CPU_OP) & ((role & (PARAMS | CALL)) != 0))
                 | ((codes == C.ANNOTATION) & ((role & ANNOTATION) != 0))
                 | np.isin(codes, C.GPU_CATEGORIES))  # any GPU activity may be launched by a call (v2)
        located = np.flatnonzero(named | (codes == C.RUNTIME)).tolist()
        if located:
            self._thread_rows.append(np.array(located, dtype=np.int64) + row0)
            self._thread_codes.append(self._threads_of(events, located))
        # Kernels apart: their args rarely hold collective fields, and then need no decoding.
        kernel = codes == C.KERNEL
        for rows in (np.flatnonzero(named & kernel), np.flatnonzero(named & ~kernel)):
            if rows.size:
                self._rows.append(rows + row0)
                self._add_args([events[i].args for i in rows.tolist()])

    def _threads_of(self, events, rows):
        """(pid, tid) int arrays of ``events[rows]`` (the usual case), else their thread codes."""
        try:
            pids, tids = np.array([events[i].pid for i in rows]), np.array([events[i].tid for i in rows])
            if pids.dtype.kind == "i" and tids.dtype.kind == "i":
                return pids, tids
        except (ValueError, TypeError, OverflowError):  # lists and such (odd JSON)
            pass
        events = [events[i] for i in rows]
        index = self.values.threads
        try:
            return np.array([index[(e.pid, e.tid)] for e in events], dtype=np.int64)
        except TypeError:  # an unhashable pid or tid (odd JSON): by its text
            return np.array([index[(_hashable(e.pid), _hashable(e.tid))] for e in events], dtype=np.int64)

    def _add_args(self, raws: list) -> None:
        """Columns of the fields of these args: of the fields whose key occurs in their text
        (none, for kernels usually: then nothing is decoded)."""
        n = len(raws)
        text = b"[" + b",".join([r or b"null" for r in raws]) + b"]"
        escaped = b"\\" in text  # a key may be spelled with escapes: take every field
        present = {f for marker, fields in self._markers if escaped or marker in text for f in fields}
        args = [a if a is not None else _EMPTY_ARGS for a in D.event_args(raws, text)] if present else []
        for name, field in self.values.strings.items():
            column = field.codes(list(map(attrgetter(name), args))) if name in present else np.full(n, -1, np.int32)
            self._strings[name].append(column)
        for name in NUMBER_FIELDS:  # None -> NaN
            column = np.array(list(map(attrgetter(name), args)), dtype=np.float64) if name in present else np.full(n, np.nan)
            self._numbers[name].append(column)
        for name in OWN_FIELDS if self.own else ():
            self._own[name].append(list(map(attrgetter(name), args)) if name in present else [None] * n)

    def export(self) -> dict:
        """What this recorder collected, with its codes' keys (picklable): a worker's share of a
        file, for :meth:`absorb`."""
        return {"rows": self._rows, "thread_rows": self._thread_rows, "thread_codes": self._thread_codes,
                "threads": self.values.threads.order, "strings": self._strings, "numbers": self._numbers,
                "own": self._own, "keys": {k: list(f.items()) for k, f in self.values.strings.items()}}

    def absorb(self, part: dict, row0: int) -> None:
        """Append the next rows of the file (``part``: another recorder's :meth:`export`, its row
        0 being row ``row0`` here), recoding its threads and values into this recorder's as if
        its chunks had been added here: the codes are those reading them here would give."""
        v = self.values
        self._rows += [r + row0 for r in part["rows"]]
        self._thread_rows += [r + row0 for r in part["thread_rows"]]
        if any(not isinstance(t, tuple) for t in part["thread_codes"]):
            recode = np.array([v.threads[key] for key in part["threads"]] + [-1], dtype=np.int64)
            self._thread_codes += [t if isinstance(t, tuple) else recode[t] for t in part["thread_codes"]]
        else:
            self._thread_codes += part["thread_codes"]
        for name, field in v.strings.items():
            keys = part["keys"][name]
            recode = np.full(max((c for _, c in keys), default=-1) + 2, -1, dtype=np.int32)
            for key, code in keys:  # in the order the other recorder met them
                got = field[key]
                if code >= 0:
                    recode[code] = got
            self._strings[name] += [recode[c] for c in part["strings"][name]]
        for name in NUMBER_FIELDS:
            self._numbers[name] += part["numbers"][name]
        if self._own is not None:
            for name in OWN_FIELDS:
                self._own[name] += part["own"][name]
        if len(v.names) > v.roles.size:
            new = [_role(n, self.comm_re) for n in v.names[v.roles.size :]]
            v.roles = np.concatenate((v.roles, np.array(new, dtype=np.int8)))

    def fresh(self) -> CommRecorder:
        """A recorder like this one, empty (to read the file again)."""
        return CommRecorder(self.comm_re, self.values, self.own)

    def records(self) -> Records:
        cat = lambda parts, dtype: np.concatenate(parts) if parts else np.empty(0, dtype)  # noqa: E731
        rows = cat(self._rows, np.int64)
        order = np.argsort(rows, kind="stable")
        own = None
        if self._own is not None:
            own = {k: [v for part in parts for v in part] for k, parts in self._own.items()}
            own = {k: [v[i] for i in order.tolist()] for k, v in own.items()}
        return Records(
            rows=rows[order],
            strings={k: cat(v, np.int32)[order] for k, v in self._strings.items()},
            numbers={k: cat(v, np.float64)[order] for k, v in self._numbers.items()},
            own=own,
            thread_rows=cat(self._thread_rows, np.int64),
            threads=cat([self._codes(t) for t in self._thread_codes], np.int64),
        )

    def _codes(self, threads) -> np.ndarray:
        """Thread codes of a chunk's (pid, tid) int arrays, one lookup per distinct pair."""
        if not isinstance(threads, tuple):
            return threads
        pids, tids = threads
        first, inverse = distinct_rows(pids, tids)
        index = self.values.threads
        codes = np.array([index[pair] for pair in zip(pids[first].tolist(), tids[first].tolist())], dtype=np.int64)
        return codes[inverse]


def _hashable(value):
    try:
        hash(value)
        return value
    except TypeError:
        return ("json", msgspec.json.encode(value))


# -- the table of a file ----------------------------------------------------------------------------


def innermost(c_thread, c_start, c_end, q_thread, q_time) -> np.ndarray:
    """For each query (thread, time): the candidate on that thread that encloses the time
    (``start <= t <= end``) most tightly, or -1. A thread's candidates nest (host-side ops)."""
    out = np.full(q_time.size, -1, dtype=np.int64)
    if c_start.size == 0 or q_time.size == 0:
        return out
    order = np.lexsort((c_start, c_thread))  # stable: equal starts keep their order
    threads, starts, ends = c_thread[order], c_start[order], c_end[order]
    lo, hi = np.searchsorted(threads, q_thread, "left"), np.searchsorted(threads, q_thread, "right")
    for thread in np.flatnonzero(np.bincount(q_thread[hi > lo])).tolist():  # (np.unique imports numpy.ma)
        queries = np.flatnonzero(q_thread == thread)
        a, b = int(lo[queries[0]]), int(hi[queries[0]])
        t = q_time[queries]
        j = a + np.searchsorted(starts[a:b], t, "right") - 1
        found = (j >= a) & (ends[np.maximum(j, a)] >= t)
        out[queries[found]] = order[j[found]]
        late = np.flatnonzero((j >= a) & ~found)  # the last op started before t ended before it
        if late.size:
            parent = _parents(starts[a:b], ends[a:b])
            for q, k in zip(queries[late].tolist(), (j[late] - a).tolist()):
                tq = q_time[q]
                while k >= 0 and ends[a + k] < tq:
                    k = parent[k]
                out[q] = order[a + k] if k >= 0 else -1
    return out


def _parents(starts: np.ndarray, ends: np.ndarray) -> list[int]:
    """Each op's enclosing op among the earlier ones (ops sorted by start), or -1."""
    parent, open_ = [], []
    ends_ = ends.tolist()
    for j, s in enumerate(starts.tolist()):
        while open_ and ends_[open_[-1]] < s:
            open_.pop()
        parent.append(open_[-1] if open_ else -1)
        open_.append(j)
    return parent


def _take(column: np.ndarray, idx: np.ndarray, absent):
    """``column[idx]``, ``absent`` where idx is -1."""
    if column.size == 0:
        return np.full(idx.size, absent, dtype=column.dtype)
    return np.where(idx >= 0, column[np.maximum(idx, 0)], absent)


def _merge(column: np.ndarray, sources: list[np.ndarray], absent) -> np.ndarray:
    """The value of the first source (record index, -1 none) that has one (codes: >= 0, numbers: not NaN)."""
    out = np.full(sources[0].size, absent, dtype=column.dtype)
    for idx in reversed(sources):
        if not idx.size or idx.max() < 0:
            continue
        value = _take(column, idx, absent)
        has = ~np.isnan(value) if column.dtype.kind == "f" else value >= 0
        out = np.where(has, value, out)
    return out


def distinct_rows(*columns) -> tuple[np.ndarray, np.ndarray]:
    """(first, inverse): the first row of each distinct row of the int columns (in order of
    first appearance) and each row's index into ``first``. One int64 key per row (mixed radix
    of each column's dense codes), so a single 1-d unique."""
    n = len(columns[0])
    key, span = np.zeros(n, dtype=np.int64), 1
    for column in columns:
        column = np.asarray(column, dtype=np.int64)
        if n == 0 or (low := column.min()) == (high := column.max()):
            continue
        if high - low < n:
            dense, size = column - low, int(high - low) + 1
        else:
            distinct, dense = np.unique(column, return_inverse=True)
            size = distinct.size
        if span * size >= 1 << 62:
            key = np.unique(key, return_inverse=True)[1].astype(np.int64)
            span = int(key.max()) + 1
        key, span = key * size + dense, span * size
    if span == 1:  # every row alike
        return np.zeros(min(n, 1), dtype=np.int64), np.zeros(n, dtype=np.int64)
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    rank = np.empty(first.size, dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(first.size)
    return np.sort(first), rank[inverse.reshape(-1)]


def per_distinct(func, *columns) -> tuple[list, np.ndarray]:
    """``func(*values)`` once per distinct row of the int columns: (the results, each row's
    index into them)."""
    if len(columns[0]) == 0:
        return [], np.empty(0, dtype=np.int64)
    first, inverse = distinct_rows(*columns)
    return [func(*row) for row in zip(*(np.asarray(c)[first].tolist() for c in columns))], inverse


def comm_table(rec: Records, values: Values, *, gpu: bool, rows: np.ndarray, kinds: np.ndarray, ts: np.ndarray,
               end: np.ndarray, dur: np.ndarray, codes: np.ndarray, name_ids: np.ndarray, launch_row: np.ndarray,
               anchor: np.ndarray) -> CommTable:
    """The CommTable of one file's communication events ``rows`` (kinds: their classify.KINDS
    codes); ``step`` is left -1 (the caller knows the steps)."""
    n = rows.size
    own_rec = np.searchsorted(rec.rows, rows)
    lr = launch_row[rows] if gpu else np.full(n, -1, dtype=np.int64)
    thread, t = rec.thread_of(np.where(lr >= 0, lr, rows)), anchor[rows]  # where it was launched
    rec_code, rec_role = codes[rec.rows], values.roles[name_ids[rec.rows]]

    def enclosing(category, role):
        cand = np.flatnonzero((rec_code == category) & ((rec_role & role) != 0))
        r = rec.rows[cand]
        return _take(cand, innermost(rec.thread_of(r), ts[r], end[r], thread, t), -1)

    params, call = enclosing(C.CPU_OP, PARAMS), enclosing(C.CPU_OP, CALL)
    annotation = enclosing(C.ANNOTATION, ANNOTATION) if gpu else np.full(n, -1, dtype=np.int64)
    sources = [own_rec, annotation, params]
    seq = np.where(np.isnan(rec.numbers["seq"]), rec.numbers["seq_lower"], rec.numbers["seq"])
    strings = {k: _merge(rec.strings[k], sources, -1) for k in MERGED_STRINGS}
    numbers = {k: _merge(seq if k == "seq" else rec.numbers[k], sources, np.nan) for k in MERGED_NUMBERS}
    names = _take(name_ids[rec.rows], sources[1], -1), _take(name_ids[rec.rows], call, -1)
    host = np.where(params >= 0, params, np.where(annotation >= 0, annotation, call))
    call_ts = _take(ts[rec.rows], host, np.nan) if gpu else np.full(n, np.nan)
    peer = _peers(rec, values, params, annotation if gpu else own_rec, call, strings["pg_ranks"], name_ids)
    return CommTable(
        source="kernel" if gpu else "annotation", values=values, kind=kinds.astype(np.int8),
        name=name_ids[rows].astype(np.int32), thread=rec.thread_of(rows), ts=ts[rows], dur=dur[rows],
        step=np.full(n, -1, dtype=np.int64), launch_ts=_take(ts, lr, np.nan), annotation=names[0].astype(np.int32),
        call=names[1].astype(np.int32), call_ts=call_ts, peer=peer, strings=strings, numbers=numbers,
        own=None if rec.own is None else {k: [v[i] for i in own_rec.tolist()] for k, v in rec.own.items()},
    )


def _peers(rec: Records, values: Values, params, near, call, ranks, name_ids) -> np.ndarray:
    """CommOp.peer of each operation (NaN: unknown): record_param_comms' global Dst Rank, else
    its Src Rank, else the group rank of ``near`` (annotation ``0->1``) or of the c10d
    send/recv's arguments, mapped to a global rank through the merged Process Group Ranks."""
    f = values.strings
    rec_names = name_ids[rec.rows]

    def peer(dst, src, near_name, call_name, inputs, ranks_code):
        for code, field in ((dst, "dst_rank"), (src, "src_rank")):
            if code >= 0:
                return f[field].values[code]
        local = None
        if near_name >= 0 and (m := ARROW.search(values.names[near_name])):
            local = int(m.group(3))
        elif call_name >= 0 and values.names[call_name] in P2P_CALLS and inputs >= 0:
            local = f["concrete_inputs"].values[inputs]
        group = f["pg_ranks"].values[ranks_code] if ranks_code >= 0 else None
        if local is not None and group:
            return group[local] if local < len(group) else None
        return local

    found, inverse = per_distinct(
        peer, _take(rec.strings["dst_rank"], params, -1), _take(rec.strings["src_rank"], params, -1),
        _take(rec_names, near, -1), _take(rec_names, call, -1), _take(rec.strings["concrete_inputs"], call, -1), ranks,
    )
    return np.array([np.nan if p is None else p for p in found] + [np.nan], dtype=np.float64)[inverse]
