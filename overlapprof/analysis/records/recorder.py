"""Reading communication records along with the events: the record rows of a file, as columns.

While :mod:`overlapprof.analysis.rank.scan` reads a file chunk by chunk, a :class:`CommRecorder`
keeps, for the few events communication records refer to, only what they need: the typed
arguments of the *record rows* — GPU activity (any of it may be communication: OVERLAP.md
section 1), ``<backend>:<op>`` annotations, ``record_param_comms`` and ``c10d::*`` ops.
Arguments come a batch of rows at a time (a chunk's kernels, then its other record rows), decoded
by the scan with what it reads of them (:mod:`overlapprof.analysis.rank.chunk_args`), or raw: then
only the fields whose key occurs in the batch's text are decoded (kernels' args rarely hold one).
The fields that have a value in a batch are kept as codes of distinct values
(:class:`~overlapprof.analysis.records.fields.Field`) or float columns, for the *argument rows*
alone: the record rows of batches that held a field. Threads are the scan's thread column,
recoded into the rank's (:meth:`CommRecorder.records`). Its :class:`Records` are what
:func:`overlapprof.analysis.records.table.comm_table` builds a file's table from.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from operator import attrgetter

import msgspec
import numpy as np

from overlapprof.analysis import vocabulary as V
from overlapprof.analysis.records.fields import NUMBER_FIELDS, OWN_FIELDS, STRING_FIELDS, Values
from overlapprof.trace import decode as D
from overlapprof.trace import kineto as K

# Roles of a name (bits): what a row of the right category with that name is.
PARAMS, CALL, ANNOTATION, KERNEL = 1, 2, 4, 8


def _key(name: str) -> bytes:
    """An args key as it stands in a trace's text: quoted."""
    return b'"' + name.encode() + b'"'


def _shared(*names: str) -> bytes:
    """The part of their quoted keys that several keys share: their longest common start or end."""
    keys = [_key(n) for n in names]
    start, end = os.path.commonprefix(keys), os.path.commonprefix([k[::-1] for k in keys])[::-1]
    return max(start, end, key=len)


# What to look for in a batch's text to know which fields it may hold: a key (fields whose keys
# share a part are looked for together), only where a byte of it that kernels' args rarely hold
# occurs in the text (one memchr: a kernel batch's ten keys, each searched for in full, cost three
# times the batch's decoding).
_MARKERS = {
    _key(K.COLLECTIVE_NAME): (b"C", ("collective",)), _key(K.IN_NELEMS): (b"I", ("in_nelems",)),
    _key(K.OUT_NELEMS): (b"O", ("out_nelems",)), _key(K.DTYPE): (b"y", ("dtype",)),
    _key(K.GROUP_SIZE): (b"G", ("group_size",)),
    _shared(K.PG_NAME, K.PG_DESC, K.PG_RANKS): (b"P", ("pg_name", "pg_desc", "pg_ranks")),
    _key(K.SEQ): (b"q", ("seq",)), _key(K.SEQ_LOWER): (b"q", ("seq_lower",)),
    _shared(K.INPUT_DIMS, K.INPUT_TYPE): (b"I", ("input_dims", "input_type")),
    _shared(K.SRC_RANK, K.DST_RANK): (b"R", ("src_rank", "dst_rank")), _key(K.CONCRETE_INPUTS): (b"C", ("concrete_inputs",)),
    _key(K.STREAM): (b"m", ("stream",)), _key(K.DEVICE): (b"v", ("device",)), _key(K.CORRELATION): (b"c", ("correlation",)),
    _key(K.EXTERNAL_ID): (b"E", ("external_id",)),
}
assert {f for _, fields in _MARKERS.values() for f in fields} == {f.name for f in msgspec.structs.fields(D.EventArgs)}
assert all(probe in marker for marker, (probe, _) in _MARKERS.items())
_EMPTY_ARGS = D.EventArgs()
# A field's value when its key is absent (the struct's default: the same object every time).
_ABSENT = {f.name: f.default for f in msgspec.structs.fields(D.EventArgs)}
_IS_GPU = np.isin(np.arange(K.CATEGORIES), K.GPU_CATEGORIES)
# An argument row's fields in a store's bin: its string fields' codes and its numbers (its file
# row stays in memory: the order of the rows is known before the bin is read).
_ARG_ROW = np.dtype([(k, "<i4") for k in STRING_FIELDS] + [(k, "<f8") for k in NUMBER_FIELDS])
_ARG_FILL = {**{k: -1 for k in STRING_FIELDS}, **{k: np.nan for k in NUMBER_FIELDS}}  # absent


def _role(name: str, comm_re) -> int:
    return ((PARAMS if name == V.PARAM_COMMS else 0) | (CALL if name.startswith("c10d::") else 0)
            | (ANNOTATION if V.COMM_ANNOTATION.match(name) else 0) | (KERNEL if comm_re.search(name) else 0))


@dataclass
class Records:
    """A file's record rows (row = index among its complete events, sorted) and the columns of
    their args. The columns have one value per *argument row*: ``args_at`` gives, for each
    record row (by its index in ``rows``), its place in them (-1: no field was decoded for it);
    a field no argument row holds is an empty column. ``row_thread`` (the scan's thread code of
    every row) and ``thread_codes`` (those codes -> the rank's, ``Values.threads``) give the
    thread of any row of a category the scan locates (:meth:`thread_of`).

    :meth:`gather` then keeps the record rows' own columns (``ts``, ``dur``, ``code``,
    ``name``, ``thread``: by record index), so that the table is built without the file's."""

    rows: np.ndarray
    args_at: np.ndarray
    strings: dict[str, np.ndarray]
    numbers: dict[str, np.ndarray]
    own: dict[str, list] | None
    row_thread: np.ndarray | None
    thread_codes: np.ndarray
    ts: np.ndarray | None = None
    dur: np.ndarray | None = None
    code: np.ndarray | None = None
    name: np.ndarray | None = None
    thread: np.ndarray | None = None
    args: object = None  # the argument rows' columns in a store's bin instead (see arg_columns)

    def thread_of(self, rows: np.ndarray) -> np.ndarray:
        """The rank's thread code of each row (before :meth:`gather`)."""
        return self.thread_codes[self.row_thread[rows]]

    def drop(self, rows: np.ndarray) -> None:
        """Forget these rows (before :meth:`gather`; any that are not record rows are ignored):
        GPU activity the classification found not to be communication, which no table row and no
        enclosing call needs. Their argument values stay, unreferenced."""
        if rows.size == 0 or self.rows.size == 0:
            return
        rows = np.sort(rows)
        at = np.minimum(np.searchsorted(rows, self.rows), rows.size - 1)
        keep = rows[at] != self.rows
        self.rows, self.args_at = self.rows[keep], self.args_at[keep]

    def gather(self, ts: np.ndarray, dur: np.ndarray, codes: np.ndarray, name_ids: np.ndarray,
               every: bool = False) -> None:
        """Keep the record rows' values of the file's columns, and let go of the file's threads.
        ``every``: the columns are the record rows' already (``rows`` is every row): kept, not copied."""
        if every:
            self.ts, self.dur, self.code, self.name = ts, dur, codes, name_ids
        else:
            self.ts, self.dur, self.code, self.name = ts[self.rows], dur[self.rows], codes[self.rows], name_ids[self.rows]
        self.thread, self.row_thread = self.thread_of(self.rows), None

    def arg_columns(self, idx: list[np.ndarray]) -> tuple[list[np.ndarray], dict, dict]:
        """The string and number columns that the argument rows ``idx`` (arrays of them, -1:
        none) read, and ``idx`` as indices into those. Kept in a store's bin (``args``), they
        are read from it only from the first to the last of ``idx``'s rows: a block of records
        needs the argument rows near it in the file, not the whole file's."""
        if self.args is None:
            return idx, self.strings, self.numbers
        used = [i[i >= 0] for i in idx]
        used = [u for u in used if u.size]
        lo = min(int(u.min()) for u in used) if used else 0
        hi = max(int(u.max()) for u in used) + 1 if used else 0
        cols = self.args.span(lo, hi)
        return ([np.where(i >= 0, i - lo, -1) for i in idx], {k: cols[k] for k in STRING_FIELDS},
                {k: cols[k] for k in NUMBER_FIELDS})

    def args_of(self, idx: np.ndarray) -> np.ndarray:
        """The argument row of each record index ``idx`` (-1 stays -1)."""
        return np.where(idx >= 0, self.args_at[np.maximum(idx, 0)], -1) if self.args_at.size else np.full(idx.size, -1)


class CommRecorder:
    """Collects a file's record rows chunk by chunk (see the module docstring).

    ``values`` are the rank's (its name index grows as chunks are read); ``own``: also keep the
    event's own stream, device, correlation and external id (CommRecord structs).
    ``record_rows``: keep which rows are record rows (else only the argument rows: a rank measured
    a bucket at a time knows its record rows once classified, and hands them to :meth:`records`;
    a row per GPU event kept here would be memory per event). ``store``: the argument rows'
    string codes and numbers wait in a bin of this :class:`~overlapprof.analysis.engine.store.Store`
    (past its budget, on disk) instead of in memory: about 100 bytes an operation while the
    rank's store fills."""

    def __init__(self, comm_re, values: Values, own: bool = False, record_rows: bool = True, store=None):
        self.comm_re, self.values, self.own, self.record_rows = comm_re, values, own, record_rows
        self.store = store
        self._bin = store.file("args", _ARG_ROW, columns=True, fill=_ARG_FILL) if store is not None else None
        wanted = {*STRING_FIELDS, *NUMBER_FIELDS, *(OWN_FIELDS if own else ())}
        self._markers = [(m, probe, fields) for m, (probe, fields) in _MARKERS.items() if wanted.intersection(fields)]
        self._wanted = [f.name for f in msgspec.structs.fields(D.EventArgs) if f.name in wanted]
        self._rows, self._arg_rows = [], []  # record rows, and the argument rows, a batch each
        self._strings = {k: [] for k in STRING_FIELDS}
        self._numbers = {k: [] for k in NUMBER_FIELDS}
        self._own = {k: [] for k in OWN_FIELDS} if own else None

    def batches(self, codes: np.ndarray, name_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The record rows of a chunk's complete events (their category codes and name ids), in
        two batches: the kernels (their args rarely hold a field: looked for in their text before
        any decoding, :meth:`add_raw`) and the rest."""
        role = self._roles()[name_ids]
        named = (((codes == K.CPU_OP) & ((role & (PARAMS | CALL)) != 0))
                 | ((codes == K.ANNOTATION) & ((role & ANNOTATION) != 0))
                 | _IS_GPU[codes])  # any GPU activity may be launched by a call (v2)
        kernel = codes == K.KERNEL
        return np.flatnonzero(named & kernel), np.flatnonzero(named & ~kernel)

    def add(self, events: list, codes: np.ndarray, name_ids: np.ndarray, row0: int) -> None:
        """One chunk's complete events (``events[k]`` is row ``row0 + k``), their category codes
        and name ids."""
        for rows in self.batches(codes, name_ids):
            if rows.size:
                raws = [events[i].args or b"null" for i in rows.tolist()]
                self.add_raw(rows + row0, raws, b",".join(raws))

    def add_raw(self, rows: np.ndarray, raws: list, text: bytes) -> None:
        """A batch of record rows (file rows) and their raw args (absent: ``null``), ``text``
        those joined by commas: the fields whose key occurs in the text are decoded and kept;
        when there is none (for kernels usually), nothing is."""
        if self.record_rows:
            self._rows.append(rows)
        escaped = b"\\" in text  # a key may be spelled with escapes: take every field
        present = {f for marker, probe, fields in self._markers if escaped or (probe in text and marker in text)
                   for f in fields}
        if present:
            args = [a if a is not None else _EMPTY_ARGS for a in D.event_args(raws, b"[" + text + b"]")]
            self._keep(rows, lambda name: list(map(attrgetter(name), args)), present)

    def add_decoded(self, rows: np.ndarray, args: list) -> None:
        """A batch of record rows (file rows) and their args, decoded (EventArgs, or a struct with
        its fields; None: none): the fields that have a value in a row are kept."""
        if self.record_rows:
            self._rows.append(rows)
        if not args:
            return
        args = [a if a is not None else _EMPTY_ARGS for a in args]
        n, present, values = len(args), set(), {}
        for name in self._wanted:
            values[name] = column = list(map(attrgetter(name), args))
            absent = _ABSENT[name]
            if column[0] is not absent or column.count(absent) < n:  # all absent: identity, fast
                present.add(name)
        if present:
            self._keep(rows, values.__getitem__, present)

    def _keep(self, rows: np.ndarray, column, present: set) -> None:
        """Keep the columns of the ``present`` fields of a batch (``column(name)``: the field's
        values, by row); the other fields are kept as the batch's length (see :meth:`records`)."""
        n = rows.size
        strings = {name: field.codes(column(name)) if name in present else n for name, field in self.values.strings.items()}
        numbers = {name: np.array(column(name), dtype=np.float64) if name in present else n  # None -> NaN
                   for name in NUMBER_FIELDS}
        self._batch(rows, strings, numbers)
        for name in OWN_FIELDS if self.own else ():
            self._own[name].append(column(name) if name in present else n)

    def _batch(self, rows: np.ndarray, strings: dict, numbers: dict) -> None:
        """Keep a batch of argument rows: each field's codes or numbers, or the batch's length
        where the batch held none of it (in the store's bin too: see ``_ARG_FILL``)."""
        self._arg_rows.append(rows)
        if self._bin is None:
            for name, part in strings.items():
                self._strings[name].append(part)
            for name, part in numbers.items():
                self._numbers[name].append(part)
            return
        self._bin.append({**strings, **numbers})

    def export(self) -> dict:
        """What this recorder collected, with its codes' keys (picklable): a worker's share of a
        file, for :meth:`absorb`."""
        return {"rows": self._rows, "arg_rows": self._arg_rows, "strings": self._strings, "numbers": self._numbers,
                "own": self._own, "keys": {k: list(f.items()) for k, f in self.values.strings.items()}}

    def absorb(self, part: dict, row0: int) -> None:
        """Append the next rows of the file (``part``: another recorder's :meth:`export`, its row
        0 being row ``row0`` here), recoding its threads and values into this recorder's as if
        its chunks had been added here: the codes are those reading them here would give."""
        v = self.values
        self._rows += [r + row0 for r in part["rows"]]
        recodes = {}
        for name, field in v.strings.items():
            keys = part["keys"][name]
            recode = recodes[name] = np.full(max((c for _, c in keys), default=-1) + 2, -1, dtype=np.int32)
            for key, code in keys:  # in the order the other recorder met them
                got = field[key]
                if code >= 0:
                    recode[code] = got
        for k, rows in enumerate(part["arg_rows"]):
            strings = {name: c if isinstance(c, int) else recodes[name][c]
                       for name, c in ((name, part["strings"][name][k]) for name in v.strings)}
            self._batch(rows + row0, strings, {name: part["numbers"][name][k] for name in NUMBER_FIELDS})
        if self._own is not None:
            for name in OWN_FIELDS:
                self._own[name] += part["own"][name]
        self._roles()

    def _roles(self) -> np.ndarray:
        """The roles of the rank's names (``values.roles``), those of new names added."""
        v = self.values
        if len(v.names) > v.roles.size:
            new = [_role(n, self.comm_re) for n in v.names[v.roles.size :]]
            v.roles = np.concatenate((v.roles, np.array(new, dtype=np.int8)))
        return v.roles

    def fresh(self) -> CommRecorder:
        """A recorder like this one, empty (to read the file again)."""
        if self._bin is not None:
            self._bin.remove()
        return CommRecorder(self.comm_re, self.values, self.own, self.record_rows, self.store)

    def records(self, thread: np.ndarray, threads, rows: np.ndarray | None = None) -> Records:
        """The file's Records; ``thread``: the scan's thread code of each row, ``threads``: the
        scan's keys of those codes, in code order ((pid, tid) pairs). ``rows``: the record rows
        (sorted file rows) when this recorder did not keep them (``record_rows``); the argument
        rows not among them are left unreferenced. The batches are let go of as they are joined."""
        cat = lambda parts: np.concatenate(parts) if parts else np.empty(0, np.int64)  # noqa: E731
        arg_rows = cat(self._arg_rows)
        if rows is None:
            rows = cat(self._rows)
            rows.sort(kind="stable")
        self._rows = self._arg_rows = None
        order = np.argsort(arg_rows, kind="stable")
        at = np.empty_like(order)  # where each collected argument row goes in row order
        at[order] = np.arange(order.size)
        args_at = np.full(rows.size, -1, dtype=_index_type(max(rows.size, order.size)))
        place = np.minimum(np.searchsorted(rows, arg_rows[order]), max(rows.size - 1, 0))
        hit = rows[place] == arg_rows[order] if rows.size else np.zeros(order.size, dtype=bool)
        stored, self._bin = self._bin, None
        if stored is not None:  # the argument rows stay in the bin, in the order collected
            args_at[place[hit]] = order[hit]
            at = np.arange(order.size)
        else:
            args_at[place[hit]] = np.arange(order.size)[hit]
        del arg_rows, order
        own = None
        if self._own is not None:
            own = {k: _column(self._own.pop(k), at, None, object).tolist() for k in list(self._own)}
        strings = {k: _column(self._strings.pop(k), at, -1, np.int32) for k in list(self._strings)}
        numbers = {k: _column(self._numbers.pop(k), at, np.nan, np.float64) for k in list(self._numbers)}
        index = self.values.threads
        return Records(
            rows=rows, args_at=args_at, strings=strings, numbers=numbers, own=own, row_thread=thread, args=stored,
            thread_codes=np.array([index[key] for key in threads] + [-1], dtype=np.int32),
        )


def _index_type(n: int):
    """The integer type of indices into ``n`` rows: 4 bytes where they fit (per record row)."""
    return np.int32 if n < 2**31 else np.int64


def _column(parts: list, at: np.ndarray, absent, dtype) -> np.ndarray:
    """One field's column in row order from its batches in the order collected (``at``: where
    each collected row goes): a batch's values, or its length where the field was absent
    (absent from every batch: an empty column)."""
    if all(isinstance(part, int) for part in parts) and dtype is not object:
        return np.empty(0, dtype=dtype)
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
