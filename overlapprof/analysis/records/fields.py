"""The fields of communication records: which trace args are kept, and how their values are coded.

A communication record is one communication kernel (GPU mode) or ``<backend>:<op>`` annotation
(CPU mode) with what the trace says about it: the kernel's stream and correlation id, and the
arguments of the ``record_param_comms`` op that encloses its launch (NCCL's process-group name,
ranks, sequence number, message sizes, dtype). Strings and JSON values are kept as small int
codes into lists of distinct values (:class:`Field`, one per field; :class:`Values`, shared by
a rank's files); numbers as float64 columns (NaN: absent). The table of records is
:mod:`overlapprof.analysis.records.table`; what the report keeps of one is
:class:`overlapprof.report.CommRecord`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import msgspec
import numpy as np

from overlapprof.analysis.columns import Index


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
            return np.array([self[raw] for raw in raws], dtype=np.int32)
        except TypeError:
            return np.array([self[key] for key in map(self.key, raws)], dtype=np.int32)


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
# The event's own args, kept only for CommRecord structs (--comm-ops).
OWN_FIELDS = ("stream", "device", "correlation", "external_id")
# The collective fields of an operation: from the event, else its annotation, else its
# record_param_comms (CommRecord.seq is "Seq", else "seq", of the first of them that has one).
MERGED_STRINGS = ("collective", "pg_name", "pg_desc", "pg_ranks", "dtype", "input_dims", "input_type")
MERGED_NUMBERS = ("group_size", "seq", "in_nelems", "out_nelems")


@dataclass
class Values:
    """The distinct values of one rank's communication records, shared by its trace files:
    each string field's values, the event names (``index``: name -> id) and their roles (bits of
    :mod:`overlapprof.analysis.records.recorder`), and the threads ((pid, tid) -> code)."""

    index: Index = field(default_factory=Index)
    strings: dict[str, Field] = field(default_factory=lambda: {n: make() for n, make in STRING_FIELDS.items()})
    roles: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int8))
    threads: Index = field(default_factory=Index)

    @property
    def names(self) -> list[str]:
        return self.index.order
