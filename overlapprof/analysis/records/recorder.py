"""Reading communication records along with the events: the record rows of a file, as columns.

While :mod:`overlapprof.analysis.rank.scan` reads a file chunk by chunk, a :class:`CommRecorder`
keeps, for the few events communication records refer to, only what they need: the thread of
runtime calls (a launch's thread), and the thread and typed arguments of the *record rows* —
GPU activity (any of it may be communication: OVERLAP.md section 1), ``<backend>:<op>``
annotations, ``record_param_comms`` and ``c10d::*`` ops. Arguments are decoded a batch of rows
at a time, only the fields whose key occurs in the batch, and kept as codes of distinct values
(:class:`~overlapprof.analysis.records.fields.Field`) or float columns. Its :class:`Records`
are what :func:`overlapprof.analysis.records.table.comm_table` builds a file's table from.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter

import msgspec
import numpy as np

from overlapprof.analysis.columns import distinct_rows
from overlapprof.analysis.rank import classify as C
from overlapprof.analysis.records.fields import NUMBER_FIELDS, OWN_FIELDS, STRING_FIELDS, Values
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
    event's own stream, device, correlation and external id (CommRecord structs)."""

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
        located = np.flatnonzero(named | (codes == C.RUNTIME))
        if located.size:
            self._thread_rows.append(located + row0)
            self._thread_codes.append(self._threads_of(events, located.tolist()))
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
            return np.array([index[(hashable(e.pid), hashable(e.tid))] for e in events], dtype=np.int64)

    def _add_args(self, raws: list) -> None:
        """Columns of the fields of these args: of the fields whose key occurs in their text
        (none, for kernels usually: then nothing is decoded)."""
        n = len(raws)
        text = b"[" + b",".join([r or b"null" for r in raws]) + b"]"
        escaped = b"\\" in text  # a key may be spelled with escapes: take every field
        present = {f for marker, fields in self._markers if escaped or marker in text for f in fields}
        args = [a if a is not None else _EMPTY_ARGS for a in D.event_args(raws, text)] if present else []
        # A field absent from every row of the batch is kept as the batch's length (see records()).
        for name, field in self.values.strings.items():
            self._strings[name].append(field.codes(list(map(attrgetter(name), args))) if name in present else n)
        for name in NUMBER_FIELDS:  # None -> NaN
            self._numbers[name].append(np.array(list(map(attrgetter(name), args)), dtype=np.float64)
                                       if name in present else n)
        for name in OWN_FIELDS if self.own else ():
            self._own[name].append(list(map(attrgetter(name), args)) if name in present else n)

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
            self._strings[name] += [c if isinstance(c, int) else recode[c] for c in part["strings"][name]]
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
        at = np.empty_like(order)  # where each collected row goes in row order
        at[order] = np.arange(order.size)
        own = None
        if self._own is not None:
            own = {k: _column(parts, at, None, object).tolist() for k, parts in self._own.items()}
        return Records(
            rows=rows[order],
            strings={k: _column(v, at, -1, np.int32) for k, v in self._strings.items()},
            numbers={k: _column(v, at, np.nan, np.float64) for k, v in self._numbers.items()},
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


def _column(parts: list, at: np.ndarray, absent, dtype) -> np.ndarray:
    """One field's column in row order from its batches in the order collected (``at``: where
    each collected row goes): a batch's values, or its length where the field was absent."""
    out = np.full(at.size, absent, dtype=dtype)
    start = 0
    for part in parts:
        if isinstance(part, int):
            start += part
            continue
        values = np.fromiter(part, dtype=object, count=len(part)) if dtype is object else part
        out[at[start : start + len(part)]] = values
        start += len(part)
    return out


def hashable(value):
    """The value itself when hashable, else a hashable stand-in (its JSON text)."""
    try:
        hash(value)
        return value
    except TypeError:
        return ("json", msgspec.json.encode(value))
