"""A rank's classified intervals reduced to their unions: what every metric of the rank is a function of.

:class:`RankUnions` holds U(comm), U(compute) and U(memory) of the whole rank and of each step
(the events that belong to the step, by launch, else by start), U(comm of kind k) of the whole
rank, and the counts, spans and step ends the report needs.
:mod:`~overlapprof.analysis.rank.metrics` computes every metric from it, once.

It is built by :class:`UnionsBuilder` from classified event sets, a batch at a time: the whole
rank in one batch when it is read in memory, a time bucket at a time when it is measured with its
events on disk (past the memory budget, :mod:`~overlapprof.analysis.rank.bounded`).
A union of the batches' unions is the union of all their intervals, run for run with the same
float ends (a run's ends are event boundaries), so the metrics are the same floats whichever way
the rank was read. What is held is the runs of the unions, not the events: on an
operation-dense trace about a run per operation and set.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from overlapprof.analysis import intervals as iv
from overlapprof.analysis.rank.classify import KINDS
from overlapprof.analysis.rank.events import EventSet, RankEvents, Steps

COMM, COMPUTE, MEMORY = 0, 1, 2  # the classes, in RankEvents' order
# Intervals made into per-step unions, and runs measured per step, at once: the segmented
# functions' temporaries take about 100 bytes per interval, so steps go in groups of about this
# many. 2026-12-05 (generated 400 MB, --no-comms, one worker, load 4): 2**16 against 2**19, peak
# 120 MB against 173 MB with the events on disk, 158 MB against 181 MB in memory, the same time.
STEP_GROUP_INTERVALS = 1 << 16
# Pending unions of one key merged into one past this many (bounds what a rank measured on disk holds).
_MERGE_PARTS = 16


@dataclass
class RankUnions:
    """The unions of a rank's classified intervals (µs, the rank's clock), after the filters.

    ``whole``: U(comm), U(compute), U(memory) of the whole rank; ``by_step``: the same per step,
    segmented (segment = index in ``steps``); ``kinds``: kind code (index into
    ``classify.KINDS``) -> U(comm of the kind), whole rank, for each kind with comm events;
    ``operations``: kind code -> its operations (``EventSet.operation``); ``counts``: events of
    each class; ``spans``: each class's earliest start and latest end (None: no events);
    ``last_end``: each step's end, max(the step's own end, the ends of its events)."""

    steps: Steps
    last_end: np.ndarray
    whole: tuple[iv.Intervals, iv.Intervals, iv.Intervals]
    by_step: tuple[iv.Segmented, iv.Segmented, iv.Segmented]
    kinds: dict[int, iv.Intervals]
    operations: dict[int, int]
    counts: tuple[int, int, int]
    spans: tuple[tuple[float, float] | None, ...]

    @property
    def comm(self) -> iv.Intervals:
        return self.whole[COMM]

    @property
    def compute(self) -> iv.Intervals:
        return self.whole[COMPUTE]

    @property
    def memory(self) -> iv.Intervals:
        return self.whole[MEMORY]

    @cached_property
    def exposed(self) -> iv.Intervals:
        """U(comm) − U(compute) of the whole rank: the exposed communication the cross-rank
        section and the causes share out (made once)."""
        return iv.difference(self.comm, self.compute)

    def step(self, cls: int, k: int) -> iv.Intervals:
        """U(class) of the events of step ``k``."""
        seg, starts, ends = self.by_step[cls]
        a, b = np.searchsorted(seg, (k, k + 1))
        return starts[a:b], ends[a:b]


def rank_unions(ev: RankEvents) -> RankUnions:
    """The unions of a rank read in memory (its classified events, filters applied)."""
    build = UnionsBuilder(ev.steps)
    for cls, s in enumerate((ev.comm, ev.compute, ev.memory)):
        build.add(s, cls)
    return build.result()


def _union_by(seg: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> iv.Segmented:
    """:func:`~overlapprof.analysis.intervals.union_by`, a group of about
    :data:`STEP_GROUP_INTERVALS` intervals' segments at a time (a segment's union does not
    depend on the others)."""
    if seg.size <= STEP_GROUP_INTERVALS:
        return iv.union_by(seg, starts, ends)
    order = np.argsort(seg, kind="stable")
    seg, starts, ends = seg[order], starts[order], ends[order]
    parts, lo = [], 0
    while lo < seg.size:
        hi = min(seg.size, lo + STEP_GROUP_INTERVALS)
        hi = int(np.searchsorted(seg, seg[hi - 1], "right"))  # a segment is never split
        parts.append(iv.union_by(seg[lo:hi], starts[lo:hi], ends[lo:hi]))
        lo = hi
    return iv.concat_by(*parts)


class UnionsBuilder:
    """Classified event sets in, :class:`RankUnions` out (see the module docstring).

    ``steps``: the rank's steps (after the filters). What it holds stays small over many
    batches: a whole-rank union is made at the end from the steps' unions and the union of the
    events outside every step, and the unions per kind are held only once a second kind of
    communication is seen (with one kind, its union is U(comm)): about half the memory of
    holding each whole union on an operation-dense trace, at the cost of one more union at the end."""

    def __init__(self, steps: Steps):
        self.steps = steps
        self.last_end = steps.end.astype(np.float64, copy=True)
        self.counts = [0, 0, 0]
        self.spans: list[list[float] | None] = [None, None, None]
        self.kind_events = np.zeros(len(KINDS), dtype=np.int64)
        self.operations = np.zeros(len(KINDS), dtype=np.int64)
        self._whole: dict[object, list[iv.Intervals]] = {}  # of the events outside every step
        self._by_step: dict[int, list[iv.Segmented]] = {}

    def add(self, s: EventSet, cls: int) -> None:
        """One batch of events of class ``cls`` (:data:`COMM`, :data:`COMPUTE`, :data:`MEMORY`)."""
        if len(s) == 0:
            return
        self.counts[cls] += len(s)
        lo, hi = float(s.start.min()), float(s.end.max())
        span = self.spans[cls]
        self.spans[cls] = [lo, hi] if span is None else [min(span[0], lo), max(span[1], hi)]
        seg = self.steps.index_of(s.anchor)
        inside = np.flatnonzero(seg >= 0)
        held = np.flatnonzero(seg < 0)
        whole = iv.union(s.start[held], s.end[held])
        if cls == COMM:
            self._add_kinds(s)
        seg = seg[inside].astype(np.int32)  # a step index: 4 bytes a run held, not 8
        np.maximum.at(self.last_end, seg, s.end[inside])
        self._put(self._whole, cls, whole, iv.union)
        self._put(self._by_step, cls, _union_by(seg, s.start[inside], s.end[inside]), _union_by)

    def _add_kinds(self, s: EventSet) -> None:
        """The batch's comm events by kind."""
        self.kind_events += np.bincount(s.kind, minlength=len(KINDS))
        self.operations += np.bincount(s.kind[s.operation], minlength=len(KINDS))
        seen = np.flatnonzero(self.kind_events).tolist()
        if len(seen) == 1:
            return  # one kind so far: its union is U(comm)
        before = np.flatnonzero(self.kind_events - np.bincount(s.kind, minlength=len(KINDS))).tolist()
        if len(before) == 1 and ("kind", before[0]) not in self._whole:
            # a second kind arrives: the first one's union so far is U(comm) so far (this batch apart)
            self._whole[("kind", before[0])] = [self._whole_of(COMM)]
        codes = np.flatnonzero(np.bincount(s.kind)).tolist()
        for code in codes:
            mine = s.kind == code
            self._put(self._whole, ("kind", code), iv.union(s.start[mine], s.end[mine]), iv.union)

    def _whole_of(self, cls: int) -> iv.Intervals:
        """U(class) of the batches added so far, from its steps' and its outside parts."""
        steps = merged(self._by_step.get(cls, [iv.EMPTY_BY]), _union_by)
        outside = merged(self._whole.get(cls, [iv.EMPTY]), iv.union)
        return iv.union(np.concatenate((steps[1], outside[0])), np.concatenate((steps[2], outside[1])))

    @staticmethod
    def _put(table: dict, key, u: tuple, union) -> None:
        table[key] = hold(table.get(key, []), u, union)

    def result(self) -> RankUnions:
        self._by_step = {key: [merged(parts, _union_by)] for key, parts in self._by_step.items()}
        whole = {c: self._whole_of(c) for c in (COMM, COMPUTE, MEMORY)}
        by_step = {key: parts[0] for key, parts in self._by_step.items()}
        present = np.flatnonzero(self.kind_events).tolist()
        kinds = {code: merged(self._whole[("kind", code)], iv.union) for code in present
                 if ("kind", code) in self._whole}
        if len(present) == 1 and not kinds:
            kinds = {present[0]: whole[COMM]}
        return RankUnions(
            steps=self.steps, last_end=self.last_end,
            whole=tuple(whole.get(c, iv.EMPTY) for c in (COMM, COMPUTE, MEMORY)),
            by_step=tuple(by_step.get(c, iv.EMPTY_BY) for c in (COMM, COMPUTE, MEMORY)),
            kinds=kinds, operations={code: int(self.operations[code]) for code in present},
            counts=tuple(self.counts), spans=tuple(None if s is None else tuple(s) for s in self.spans))


def hold(parts: list[tuple], part: tuple, union) -> list[tuple]:
    """``parts`` (pending sets of arrays) with ``part`` added, made one by ``union`` past
    :data:`_MERGE_PARTS` of them: what a rank measured on disk holds stays about one set."""
    parts.append(part)
    return [merged(parts, union)] if len(parts) > _MERGE_PARTS else parts


def merged(parts: list[tuple], union) -> tuple:
    """One union of several (the first, when there is one: no work)."""
    if len(parts) == 1:
        return parts[0]
    return union(*(np.concatenate([p[k] for p in parts]) for k in range(len(parts[0]))))
