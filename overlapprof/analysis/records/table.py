"""The table of a rank's communication records (:class:`CommTable`), and how a file's is built.

The metrics need only intervals; matching operations across ranks (which rank waited for which)
needs to know *which* collective each interval was. :func:`comm_table` builds a file's table
from the record rows a :class:`~overlapprof.analysis.records.recorder.CommRecorder` kept: each
communication event's enclosing ``record_param_comms``, ``c10d::*`` op and (GPU mode) comm
annotation on the thread that launched it, found by one sorted search per thread
(:func:`innermost`), and its collective fields merged from them (the event's own first, then the
annotation's, then record_param_comms'). Everything per record is numpy; the rules that read
names and values (peers) run once per distinct combination of them.
:meth:`CommTable.records` makes the report's :class:`~overlapprof.report.CommRecord` structs,
only when a report asks for them (``--comm-ops``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from overlapprof.analysis import vocabulary as V
from overlapprof.analysis.columns import per_distinct
from overlapprof.analysis.intervals import event_ends
from overlapprof.analysis.records.fields import ARROW, MERGED_NUMBERS, MERGED_STRINGS, OWN_FIELDS, P2P_CALLS, Values
from overlapprof.analysis.records.recorder import ANNOTATION, CALL, PARAMS, Records
from overlapprof.report import CommRecord
from overlapprof.trace import kineto as K


@dataclass
class CommTable:
    """A rank's communication records as columns, one row per kernel or annotation, in file
    order (files in order). Codes index ``values``; -1 (codes) and NaN (numbers) are absent.

    ``kind``: index into vocabulary.KINDS of the event's name. ``name``, ``annotation``, ``call``:
    event-name ids. ``thread``: the event's (pid, tid) code. ``launch_ts``, ``call_ts``: NaN
    when absent. ``strings``/``numbers``: the collective fields, merged (see MERGED_*).
    ``peer``: NaN unknown. ``issue_ts``: when the operation was issued (its host call; GPU:
    its launch), ``need_ts``: when the program needed its result (CPU: see
    ``waits.need_times``; NaN: not known, its end). ``own``: the event's stream, device, correlation, external_id
    (lists; only when CommRecord structs were asked for).
    """

    source: str
    values: Values
    kind: np.ndarray
    name: np.ndarray
    thread: np.ndarray
    ts: np.ndarray
    dur: np.ndarray
    step: np.ndarray
    launch_ts: np.ndarray
    annotation: np.ndarray
    call: np.ndarray
    call_ts: np.ndarray
    peer: np.ndarray
    issue_ts: np.ndarray
    need_ts: np.ndarray
    strings: dict[str, np.ndarray]
    numbers: dict[str, np.ndarray]
    own: dict[str, list] | None = None

    def __len__(self) -> int:
        return self.ts.size

    @classmethod
    def concat(cls, parts: list[CommTable]) -> CommTable:
        first = parts[0]
        if len(parts) == 1:
            return first
        arrays = {n: np.concatenate([getattr(p, n) for p in parts]) for n in _ARRAYS}
        own = None if first.own is None else {k: [v for p in parts for v in p.own[k]] for k in first.own}
        return cls(source=first.source, values=first.values, **arrays,
                   strings={k: np.concatenate([p.strings[k] for p in parts]) for k in first.strings},
                   numbers={k: np.concatenate([p.numbers[k] for p in parts]) for k in first.numbers}, own=own)

    def filled(self, out: CommTable | None, at: slice, n: int) -> CommTable:
        """This block's rows written at ``at`` of ``out``, a table of ``n`` rows (None: made
        here, of this block's column types): one table's columns, filled a block at a time,
        not blocks joined at the end (freed blocks would stay in the heap beside the join)."""
        if out is None:
            made = lambda a: np.empty(n, dtype=a.dtype)  # noqa: E731
            out = CommTable(source=self.source, values=self.values, **{k: made(getattr(self, k)) for k in _ARRAYS},
                            strings={k: made(v) for k, v in self.strings.items()},
                            numbers={k: made(v) for k, v in self.numbers.items()},
                            own=None if self.own is None else {k: [] for k in self.own})
        for k in _ARRAYS:
            getattr(out, k)[at] = getattr(self, k)
        for mine, theirs in ((self.strings, out.strings), (self.numbers, out.numbers)):
            for k, v in mine.items():
                theirs[k][at] = v
        if self.own is not None:
            for k, v in self.own.items():
                out.own[k] += v
        return out

    def string(self, name: str) -> list:
        """The values of a string field, by row (None: absent)."""
        f = self.values.strings[name]
        return [f.values[c] if c >= 0 else None for c in self.strings[name].tolist()]

    def records(self) -> list[CommRecord]:
        """One CommRecord per row (what ``--comm-ops`` keeps in the report)."""
        names, threads = self.values.names, self.values.threads.order
        strings = {k: self.string(k) for k in MERGED_STRINGS}
        numbers = {k: [None if v != v else int(v) for v in self.numbers[k].tolist()] for k in MERGED_NUMBERS}
        own = self.own or {k: [None] * len(self) for k in OWN_FIELDS}
        ids = lambda col: [names[i] if i >= 0 else None for i in col.tolist()]  # noqa: E731
        floats = lambda col: [None if v != v else v for v in col.tolist()]  # noqa: E731
        cols = {
            "name": ids(self.name), "annotation": ids(self.annotation), "call": ids(self.call),
            "ts": self.ts.tolist(), "dur": self.dur.tolist(), "launch_ts": floats(self.launch_ts),
            "call_ts": floats(self.call_ts), "step": [None if s < 0 else s for s in self.step.tolist()],
            "peer": [None if v != v else int(v) for v in self.peer.tolist()], **strings, **numbers, **own,
        }
        ids = [tuple(_id_value(v) for v in pair) for pair in threads]  # (pid, tid) per thread code
        thread = self.thread.tolist()
        cols.update(kind=[V.KINDS[k] for k in self.kind.tolist()], pid=[ids[t][0] for t in thread],
                    tid=[ids[t][1] for t in thread])
        keys = list(cols)
        return [CommRecord(source=self.source, **dict(zip(keys, row))) for row in zip(*cols.values())]


_ARRAYS = ("kind", "name", "thread", "ts", "dur", "step", "launch_ts", "annotation", "call", "call_ts", "peer",
           "issue_ts", "need_ts")
# Events whose table rows are made at once (comm_table): the lookups' temporaries are per block,
# not per operation of the rank (about 380 bytes an operation at once, 2026-12-06).
TABLE_BLOCK = 1 << 16


def _id_value(value):
    """A pid/tid as CommRecord types it: int or str (anything else: None)."""
    return value if isinstance(value, (int, str)) and not isinstance(value, bool) else None


def innermost(c_thread, c_start, c_end, q_thread, q_time) -> np.ndarray:
    """For each query (thread, time): the candidate on that thread that encloses the time
    (``start <= t <= end``) most tightly, or -1. A thread's candidates nest (host-side ops)."""
    return Nested(c_thread, c_start, c_end).find(q_thread, q_time)


class Nested:
    """Candidates of :func:`innermost`, sorted once by (thread, start), for queries that come a
    block at a time (:func:`comm_table`)."""

    def __init__(self, c_thread, c_start, c_end):
        self.order = np.lexsort((c_start, c_thread)) if c_start.size else np.empty(0, np.int64)  # stable
        self.threads, self.starts, self.ends = c_thread[self.order], c_start[self.order], c_end[self.order]
        self._parents: dict[int, list[int]] = {}  # a thread's first candidate -> its candidates' parents

    def find(self, q_thread, q_time) -> np.ndarray:
        """The innermost enclosing candidate of each query (an index into the candidates), or -1."""
        out = np.full(q_time.size, -1, dtype=np.int64)
        if self.starts.size == 0 or q_time.size == 0:
            return out
        order, threads, starts, ends = self.order, self.threads, self.starts, self.ends
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
                if a not in self._parents:
                    self._parents[a] = _parents(starts[a:b], ends[a:b])
                parent = self._parents[a]
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


class StoredTable:
    """A :class:`CommTable` made a block at a time into a bin of a rank's store (past its
    budget, on disk) and read back whole by :meth:`result` once what it was made from is let
    go of: the table and the record rows it is made from are not held at once (together about
    300 bytes an operation on the generated traces, 2026-12-07)."""

    def __init__(self, store):
        self.store, self.bin = store, None
        self.source = self.values = self.own = None
        self.strings: list[str] = []
        self.numbers: list[str] = []

    def add(self, part: CommTable) -> None:
        cols = {k: getattr(part, k) for k in _ARRAYS}
        cols.update({f"s/{k}": v for k, v in part.strings.items()})
        cols.update({f"n/{k}": v for k, v in part.numbers.items()})
        if self.bin is None:
            self.bin = self.store.file("table", [(k, v.dtype) for k, v in cols.items()], columns=True)
            self.source, self.values = part.source, part.values
            self.strings, self.numbers = list(part.strings), list(part.numbers)
            self.own = None if part.own is None else {k: [] for k in part.own}
        self.bin.append(cols)
        if self.own is not None:
            for k, v in part.own.items():
                self.own[k] += v

    def result(self) -> CommTable:
        """The table (the bin is removed; from disk its columns are fields of one array of rows)."""
        cols = self.bin.read()
        self.bin.remove()
        return CommTable(source=self.source, values=self.values, **{k: cols[k] for k in _ARRAYS},
                         strings={k: cols[f"s/{k}"] for k in self.strings},
                         numbers={k: cols[f"n/{k}"] for k in self.numbers}, own=self.own)


def comm_table(rec: Records, values: Values, *, gpu: bool, rows: np.ndarray, kinds: np.ndarray,
               launch_ts: np.ndarray, host_thread: np.ndarray, anchor: np.ndarray, issue_ts: np.ndarray | None = None,
               need_ts: np.ndarray | None = None, store=None) -> CommTable | StoredTable:
    """The CommTable of one file's communication events ``rows`` (record rows; ``rec``
    gathered, see :meth:`Records.gather`). Per event: ``kinds``, its vocabulary.KINDS code;
    ``launch_ts``, the start of its launching runtime call (NaN: none); ``host_thread`` and
    ``anchor``, the thread and time where it was issued (its launch's, else its own). ``step``
    is left -1 (the caller knows the steps). ``issue_ts`` (default: the launch, else the start)
    and ``need_ts`` (default NaN: unknown): see :class:`CommTable`. ``store``: a table of more
    than one block goes into it, a :class:`StoredTable` (the caller reads it back)."""
    n = rows.size
    rec_role = values.roles[rec.name]

    def enclosing(category, role):
        cand = np.flatnonzero((rec.code == category) & ((rec_role & role) != 0))
        ts = rec.ts[cand]
        return cand, Nested(rec.thread[cand], ts, event_ends(ts, rec.dur[cand]))

    near = [enclosing(K.CPU_OP, PARAMS), enclosing(K.CPU_OP, CALL)] + ([enclosing(K.ANNOTATION, ANNOTATION)] if gpu else [])
    out = None
    stored = StoredTable(store) if store is not None and n > TABLE_BLOCK else None
    for lo in range(0, max(n, 1), TABLE_BLOCK):  # (one empty block when there is no event)
        at = slice(lo, lo + TABLE_BLOCK)
        part = _block(rec, values, near, gpu, rows[at], host_thread[at], anchor[at], launch_ts[at])
        part.kind = kinds[at].astype(np.int8)
        if issue_ts is not None:
            part.issue_ts = issue_ts[at]
        if need_ts is not None:
            part.need_ts = need_ts[at]
        if n <= TABLE_BLOCK:
            return part
        if stored is not None:
            stored.add(part)
        else:
            out = part.filled(out, at, n)
    return stored if stored is not None else out


def _block(rec: Records, values: Values, near: list, gpu: bool, rows: np.ndarray,
           host_thread: np.ndarray, anchor: np.ndarray, launch_ts: np.ndarray) -> CommTable:
    """The table of a block of :func:`comm_table`'s events (``near``: the candidates of the
    enclosing params, call and (GPU) annotation, with their :class:`Nested`). ``kind`` is left
    for the caller."""
    n = rows.size
    own_rec = np.searchsorted(rec.rows, rows)
    found = [_take(cand, nested.find(host_thread, anchor), -1) for cand, nested in near]
    params, call = found[0], found[1]
    annotation = found[2] if gpu else np.full(n, -1, dtype=np.int64)
    del found
    own_args = rec.args_of(own_rec)
    arg_sources, arg_strings, arg_numbers = rec.arg_columns(
        [own_args, rec.args_of(annotation), rec.args_of(params), rec.args_of(call)])
    call_args = arg_sources.pop()
    seq, lower = arg_numbers["seq"], arg_numbers["seq_lower"]  # Seq's, else Seq Lower's
    seq = lower if seq.size == 0 else seq if lower.size == 0 else np.where(np.isnan(seq), lower, seq)
    strings = {k: _merge(arg_strings[k], arg_sources, -1) for k in MERGED_STRINGS}
    numbers = {k: _merge(seq if k == "seq" else arg_numbers[k], arg_sources, np.nan) for k in MERGED_NUMBERS}
    names = _take(rec.name, annotation, -1), _take(rec.name, call, -1)
    host = np.where(params >= 0, params, np.where(annotation >= 0, annotation, call))
    call_ts = _take(rec.ts, host, np.nan) if gpu else np.full(n, np.nan)
    peer = _peers(rec, values, arg_strings, arg_sources[2], call_args, annotation if gpu else own_rec, call,
                  strings["pg_ranks"])
    own = None
    if rec.own is not None:
        own = {k: [v[i] if i >= 0 else None for i in own_args.tolist()] for k, v in rec.own.items()}
    ts = rec.ts[own_rec]
    return CommTable(
        source="kernel" if gpu else "annotation", values=values, kind=np.empty(0, np.int8),
        name=rec.name[own_rec].astype(np.int32), thread=rec.thread[own_rec], ts=ts,
        dur=rec.dur[own_rec], step=np.full(n, -1, dtype=np.int64), launch_ts=launch_ts,
        annotation=names[0].astype(np.int32), call=names[1].astype(np.int32), call_ts=call_ts, peer=peer,
        issue_ts=np.where(np.isnan(launch_ts), ts, launch_ts), need_ts=np.full(n, np.nan),
        strings=strings, numbers=numbers, own=own,
    )


def _peers(rec: Records, values: Values, arg_strings: dict, params_args, call_args, near, call, ranks) -> np.ndarray:
    """CommRecord.peer of each record (NaN: unknown): record_param_comms' global Dst Rank, else
    its Src Rank, else the group rank of ``near`` (annotation ``0->1``) or of the c10d
    send/recv's arguments, mapped to a global rank through the merged Process Group Ranks
    (``arg_strings``, ``params_args``, ``call_args``: :meth:`Records.arg_columns`')."""
    f = values.strings
    rec_names = rec.name

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
        peer, _take(arg_strings["dst_rank"], params_args, -1), _take(arg_strings["src_rank"], params_args, -1),
        _take(rec_names, near, -1), _take(rec_names, call, -1), _take(arg_strings["concrete_inputs"], call_args, -1),
        ranks,
    )
    return np.array([np.nan if p is None else p for p in found] + [np.nan], dtype=np.float64)[inverse]
