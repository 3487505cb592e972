"""The host's ops with their recorded input shapes (``record_shapes``), kept from the rank's one
read when asked (``AnalyzeOptions.op_shapes``): what the what-if's per-call share of a
pipeline's micro-batches reads (:mod:`overlapprof.analysis.replay.percall`), so no file is read a
second time for it.

Kept, per file, as it is read a chunk at a time (:class:`OpShapes`, beside the rank's
:class:`~overlapprof.analysis.rank.spilled.SpilledRows`): every ``cpu_op``, the ``ProfilerStep#N``
spans and gloo's ``gloo:send``/``gloo:recv`` spans (a hand-over's shape when its ``c10d::``
call records none), each with its time, thread and name, and the ints of its ``Input Dims``: the
shapes of its tensors, flattened, and how many of them the first tensor has (a hand-over's rows
are its first dimension, and must size no other dimension of it). Only the args of those rows
are decoded, and only when asked: the read otherwise decodes no compute op's args.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec
import numpy as np

from overlapprof.analysis.columns import GrowingColumns, Index
from overlapprof.analysis.rank import classify as C
from overlapprof.trace.decode import ShapeArgs

HAND_OVER_SPANS = ("gloo:send", "gloo:recv")
STEP = "ProfilerStep#"
_ARGS = msgspec.json.Decoder(list[ShapeArgs | None])
_ROW = {"ts": np.float64, "dur": np.float64, "thread": np.int32, "name_ids": np.int32, "dims_at": np.int64,
        "dims": np.int32, "first": np.int32}


def shapes(dims) -> list[list[int]]:
    """The tensor shapes (lists of ints) anywhere in a recorded ``Input Dims``."""
    if not isinstance(dims, list):
        return []
    if dims and all(isinstance(d, int) and not isinstance(d, bool) for d in dims):
        return [dims]
    return [s for d in dims for s in shapes(d)]


@dataclass
class OpRows:
    """One file's kept rows (see the module docstring): ``names[name_ids]`` their names, ``thread``
    the file's thread codes, ``flat[dims_at[k]:dims_at[k] + dims[k]]`` the ints of row k's shapes,
    of which the first ``first[k]`` are its first tensor's."""

    ts: np.ndarray
    dur: np.ndarray
    thread: np.ndarray
    name_ids: np.ndarray
    dims_at: np.ndarray
    dims: np.ndarray
    first: np.ndarray
    flat: np.ndarray
    names: list[str]

    def ints(self, k: int) -> np.ndarray:
        at = int(self.dims_at[k])
        return self.flat[at:at + int(self.dims[k])]


class OpShapes:
    """Collects a file's :class:`OpRows` a chunk at a time (:meth:`add`), in file order."""

    def __init__(self, names: Index):
        self.names = names
        self.kept = np.zeros(0, dtype=bool)  # by name id: a step or a hand-over span
        self.rows = GrowingColumns(_ROW, 1 << 12)
        self.flat: list[np.ndarray] = []
        self.size = 0  # ints in flat

    def add(self, events: list, columns: dict) -> None:
        """A chunk's complete ``events`` and their scan ``columns`` (codes, name ids, threads, times)."""
        order = self.names.order
        if len(order) > self.kept.size:
            new = [n.startswith(STEP) or n in HAND_OVER_SPANS for n in order[self.kept.size:]]
            self.kept = np.concatenate((self.kept, np.array(new, dtype=bool)))
        codes, name_ids = columns["codes"], columns["name_ids"]
        keep = np.flatnonzero((codes == C.CPU_OP) | (self.kept[name_ids] & (codes == C.ANNOTATION)))
        if not keep.size:
            return
        raws = [events[k].args or b"null" for k in keep.tolist()]
        try:
            args = _ARGS.decode(b"[" + b",".join(raws) + b"]")
        except msgspec.MsgspecError:  # an odd args: each on its own, a bad one as no shapes
            args = [_one(r) for r in raws]
        dims, first = np.zeros(keep.size, np.int32), np.zeros(keep.size, np.int32)
        ints: list[int] = []  # the chunk's, one array at the end
        for i, a in enumerate(args):
            found = shapes(a.input_dims) if a is not None else []
            if found:
                before = len(ints)
                for s in found:
                    ints += s
                dims[i], first[i] = len(ints) - before, len(found[0])
        at = self.size + np.concatenate(([0], np.cumsum(dims[:-1], dtype=np.int64)))
        if ints:
            self.flat.append(np.array(ints, dtype=np.int64))
            self.size += len(ints)
        self.rows.append(ts=columns["ts"][keep], dur=columns["dur"][keep], thread=columns["thread"][keep],
                         name_ids=name_ids[keep], dims_at=at, dims=dims, first=first)

    def result(self) -> OpRows:
        """The rows kept, their names renumbered among themselves (they travel to the parent)."""
        a = self.rows.arrays()
        used, name_ids = np.unique(a["name_ids"], return_inverse=True)
        flat = np.concatenate(self.flat) if self.flat else np.zeros(0, np.int64)
        return OpRows(a["ts"].copy(), a["dur"].copy(), a["thread"].copy(), name_ids.astype(np.int32),
                      a["dims_at"].copy(), a["dims"].copy(), a["first"].copy(), flat,
                      [self.names.order[k] for k in used.tolist()])


def _one(raw: bytes):
    try:
        return _ARGS.decode(b"[" + raw + b"]")[0]
    except msgspec.MsgspecError:
        return None
