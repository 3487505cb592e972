"""The communication operations of a rank: :class:`CommTable` (columns) and :class:`CommOp` (records).

The metrics need only intervals; matching operations across ranks (which rank waited for which)
needs to know *which* collective each interval was. One operation is one communication kernel
(GPU mode) or one ``<backend>:<op>`` annotation (CPU mode), with what the trace says about it:
the kernel's stream and correlation id, and the arguments of the ``record_param_comms`` op that
encloses its launch (NCCL's process-group name, ranks, sequence number, message sizes, dtype).

The analyzer keeps them as columns (:class:`CommTable`, built by
:mod:`overlapprof.analysis.comm_records`): numbers in numpy arrays, strings and other values as
small int codes into lists of distinct values. :meth:`CommTable.ops` makes the
:class:`CommOp` records only when a report asks for them (``--comm-ops``).

Field values are copied from the trace; a field the trace does not have is None (and left out of
the JSON). Times are the trace's microseconds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np

from overlapprof.analysis.classify import KINDS


class CommOp(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A communication kernel or annotation, and its collective's parameters.

    - ``kind``: all_reduce, all_gather, reduce_scatter, broadcast, reduce, all_to_all, send_recv,
      barrier or other (from ``name``).
    - ``source``: ``"kernel"`` (GPU mode) or ``"annotation"`` (CPU mode).
    - ``ts``, ``dur``: start and duration, µs, as in the trace.
    - ``step``: N of the ``ProfilerStep#N`` the operation belongs to (OVERLAP.md section 3).
    - ``pid``, ``tid``: the trace's process/thread of the event (device and stream for kernels).
    - ``stream``, ``device``, ``correlation``, ``external_id``: the event's args.
    - ``launch_ts``: start of the runtime call that launched the kernel (GPU mode), µs.
    - ``collective``, ``pg_name``, ``pg_desc``, ``pg_ranks``, ``group_size``, ``seq``,
      ``in_nelems``, ``out_nelems``, ``dtype``: from ``record_param_comms`` (or the event itself).
    - ``input_dims``, ``input_type``: the shapes and dtypes the profiler recorded (record_shapes).
    - ``annotation``: GPU mode, the ``<backend>:<op>`` annotation enclosing the kernel's launch
      (``nccl:all_to_all``, ``nccl:send 0->1``): the collective a generic kernel belongs to.
    - ``call``: the ``c10d::*`` op enclosing the launch (GPU) or the annotation (CPU).
    - ``call_ts``: GPU mode, start of the host-side call that launched the kernel (its
      record_param_comms, annotation or c10d op): kernels sharing it are one operation.
    - ``peer``: point-to-point ops, the other end's rank: the global ``Src Rank``/``Dst Rank`` of
      record_param_comms, else the group rank of the annotation (``0->1``) or of the c10d op's
      arguments (``c10d::send(tensors, group, dst, tag)``, with ``record_shapes``), mapped to a
      global rank through ``pg_ranks`` when the trace lists them.
    """

    kind: str
    name: str
    source: str
    ts: float
    dur: float
    step: int | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    stream: int | str | None = None
    device: int | str | None = None
    correlation: int | None = None
    external_id: int | None = None
    launch_ts: float | None = None
    collective: str | None = None
    pg_name: str | None = None
    pg_desc: str | None = None
    pg_ranks: list[int] | None = None
    group_size: int | None = None
    seq: int | None = None
    in_nelems: int | None = None
    out_nelems: int | None = None
    dtype: str | None = None
    input_dims: Any = None
    input_type: Any = None
    annotation: str | None = None
    call: str | None = None
    call_ts: float | None = None
    peer: int | None = None


# -- distinct values ------------------------------------------------------------------------------

class Field(dict):
    """One field's distinct values: ``codes(raw values)`` -> int32 codes (-1: absent, or None
    after ``prep``: unusable) and ``values[code]``, prepared once per distinct raw value by ``prep``. ``key``
    makes a raw value hashable; with ``canonical``, raw values equal after ``prep`` share a code
    (``pg_name`` 0 and "0"; values must then be hashable, lists as tuples)."""

    def __init__(self, prep=None, key=None, canonical: bool = False):
        super().__init__()
        self.prep, self.key = prep, key
        self.values: list = []
        self._canonical: dict | None = {} if canonical else None

    def __missing__(self, raw):
        value = raw if raw is None or self.prep is None else self.prep(raw)
        if value is None:  # absent, or a value the field cannot use
            code = -1
        elif self._canonical is None:
            code = len(self.values)
            self.values.append(value)
        else:
            canon = tuple(value) if isinstance(value, list) else value
            code = self._canonical.get(canon)
            if code is None:
                code = self._canonical[canon] = len(self.values)
                self.values.append(value)
        self[raw] = code
        return code

    def codes(self, raws: list) -> np.ndarray:
        try:  # as they are, when hashable
            return np.array(list(map(self.__getitem__, raws)), dtype=np.int32)
        except TypeError:
            return np.array(list(map(self.__getitem__, map(self.key, raws))), dtype=np.int32)


_ANY = msgspec.json.Decoder()
_RANKS = msgspec.json.Decoder(list[int])
_RANK = msgspec.json.Decoder(int | str)
_LIST = msgspec.json.Decoder(list)
ARROW = re.compile(r"(\d+)\s*(->|<-)\s*(\d+)")
P2P_CALLS = ("c10d::send", "c10d::recv_")


def _decoded(decoder, raw):
    """``decoder.decode(raw)``, None when it does not decode (values are informative)."""
    try:
        return decoder.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


def _ranks_list(raw):
    """Process Group Ranks: a list, or NCCL's string ``"[0, 1]"`` (unreadable: unusable)."""
    return list(raw) if isinstance(raw, tuple) else _decoded(_RANKS, raw)


def _any_json(raw: bytes):
    return _decoded(_ANY, raw)


def _digits(value) -> int | None:
    """A string of digits as an int (record_param_comms and c10d write ranks as strings)."""
    return int(value) if isinstance(value, str) and value.isdigit() else None


def _rank_arg(raw: bytes) -> int | None:
    """A rank argument: an int, or a string of digits."""
    value = _decoded(_RANK, raw)
    return value if isinstance(value, int) else _digits(value)


def _inputs_peer(raw: bytes) -> int | None:
    """c10d::send/recv_'s peer from its Concrete Inputs (tensors, group, peer, tag), as strings."""
    inputs = _decoded(_LIST, raw)
    return _digits(inputs[2]) if inputs and len(inputs) > 2 else None


def _raw_bytes(raw):
    return bytes(raw) if raw else None


def _tuple_list(value):
    return tuple(value) if value.__class__ is list else value


# EventArgs field -> how its values are kept. Strings and JSON values become codes into a Field;
# numbers become float64 columns (NaN: absent).
STRING_FIELDS = {
    "collective": lambda: Field(),
    "pg_name": lambda: Field(prep=str, canonical=True),
    "pg_desc": lambda: Field(),
    "pg_ranks": lambda: Field(prep=_ranks_list, key=_tuple_list, canonical=True),
    "dtype": lambda: Field(),
    "input_dims": lambda: Field(prep=_any_json, key=_raw_bytes),
    "input_type": lambda: Field(prep=_any_json, key=_raw_bytes),
    "src_rank": lambda: Field(prep=_rank_arg, key=_raw_bytes),
    "dst_rank": lambda: Field(prep=_rank_arg, key=_raw_bytes),
    "concrete_inputs": lambda: Field(prep=_inputs_peer, key=_raw_bytes),
}
NUMBER_FIELDS = ("group_size", "seq", "seq_lower", "in_nelems", "out_nelems")
# The event's own args, kept only for CommOp records (--comm-ops).
OWN_FIELDS = ("stream", "device", "correlation", "external_id")
# The collective fields of an operation: from the event, else its annotation, else its
# record_param_comms (CommOp.seq is "Seq", else "seq", of the first of them that has one).
MERGED_STRINGS = ("collective", "pg_name", "pg_desc", "pg_ranks", "dtype", "input_dims", "input_type")
MERGED_NUMBERS = ("group_size", "seq", "in_nelems", "out_nelems")


class Index(dict):
    """Key -> small int id, in order of first appearance; ``order[id]`` is the key."""

    def __init__(self):
        super().__init__()
        self.order: list = []

    def __missing__(self, key):
        value = self[key] = len(self.order)
        self.order.append(key)
        return value


@dataclass
class Values:
    """The distinct values of one rank's communication records, shared by its trace files:
    each string field's values, the event names (``index``: name -> id) and their roles (bits of
    :mod:`overlapprof.analysis.comm_records`), and the threads ((pid, tid) -> code)."""

    index: Index = field(default_factory=Index)
    strings: dict[str, Field] = field(default_factory=lambda: {n: make() for n, make in STRING_FIELDS.items()})
    roles: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int8))
    threads: Index = field(default_factory=Index)

    @property
    def names(self) -> list[str]:
        return self.index.order


# -- the table ------------------------------------------------------------------------------------


@dataclass
class CommTable:
    """A rank's communication operations as columns, one row per kernel or annotation, in file
    order (files in order). Codes index ``values``; -1 (codes) and NaN (numbers) are absent.

    ``kind``: index into classify.KINDS of the event's name. ``name``, ``annotation``, ``call``:
    event-name ids. ``thread``: the event's (pid, tid) code. ``launch_ts``, ``call_ts``: NaN
    when absent. ``strings``/``numbers``: the collective fields, merged (see MERGED_*).
    ``peer``: NaN unknown. ``own``: the event's stream, device, correlation, external_id
    (lists; only when CommOp records were asked for).
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
        arrays = {n: np.concatenate([getattr(p, n) for p in parts])
                  for n in ("kind", "name", "thread", "ts", "dur", "step", "launch_ts", "annotation", "call",
                            "call_ts", "peer")}
        own = None if first.own is None else {k: [v for p in parts for v in p.own[k]] for k in first.own}
        return cls(source=first.source, values=first.values, **arrays,
                   strings={k: np.concatenate([p.strings[k] for p in parts]) for k in first.strings},
                   numbers={k: np.concatenate([p.numbers[k] for p in parts]) for k in first.numbers}, own=own)

    def string(self, name: str) -> list:
        """The values of a string field, by row (None: absent)."""
        f = self.values.strings[name]
        return [f.values[c] if c >= 0 else None for c in self.strings[name].tolist()]

    def ops(self) -> list[CommOp]:
        """One CommOp per row (what ``--comm-ops`` keeps in the report)."""
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
        out = []
        for i, (kind, thread) in enumerate(zip(self.kind.tolist(), self.thread.tolist())):
            pid, tid = (_id_value(v) for v in threads[thread])
            out.append(CommOp(kind=KINDS[kind], source=self.source, pid=pid, tid=tid,
                              **{k: v[i] for k, v in cols.items()}))
        return out


def _id_value(value):
    """A pid/tid as CommOp types it: int or str (anything else: None)."""
    return value if isinstance(value, (int, str)) and not isinstance(value, bool) else None
