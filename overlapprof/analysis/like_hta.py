"""``--like-hta``: HolisticTraceAnalysis 0.5.0's ``get_comm_comp_overlap``, reproduced per rank.

overlapprof's own numbers follow OVERLAP.md (the whole trace, every GPU event classified by
category). HTA 0.5.0 computes its ratio differently; this module re-reads a rank's trace the way
HTA's parser does and applies HTA's rules, so that ``--like-hta`` gives HTA's number exactly:

1. **Events**: those with a ``dur`` and a ``cat`` (``cat`` ``Trace`` dropped). ``stream`` and
   ``correlation`` come from ``args`` (-1 when absent; a ``stream`` that is not an integer is -1).
2. **Rounding**: when any ``ts`` of the file is not an integer literal (a nanosecond-resolution
   trace), ``start = ceil(ts)`` and ``end = floor(ts + dur)`` in µs (HTA's
   ``round_down_time_stamps``); else ``end = ts + dur``. Times are then shifted to start at the
   rank's earliest event (HTA shifts by the earliest of all ranks; only float sums can tell).
3. **Window** (HTA's ``_filter_irrelevant_gpu_kernels``), only when the trace has at least two
   distinct ``*ProfilerStep*`` names: a *kernel* is an event with ``stream >= 0`` and
   ``correlation >= 0`` (or named ``Event Sync``/``Context Sync``); every other event is a CPU
   event. The cutoff is the latest start of a CPU event whose name contains ``ProfilerStep``
   (so a ``gpu_user_annotation`` step marker, which has no correlation, counts and usually comes
   last); CPU events starting before the cutoff are kept, and kernels whose ``correlation`` is
   that of a kept CPU event. Fewer than two step names: nothing is filtered.
4. **Classes by name** (HTA's ``get_kernel_type``), over the kept events with ``stream != -1``:
   comm = ``^nccl.*Kernel``; memory = ``^Memcpy|^Memset|^dma``; compute = none of these and not
   matching ``^nccl.*Kernel|.*Memcpy|Memset|.*Sync`` (the rest is "other", uncounted).
5. **Metrics**: each class's intervals merged (HTA's ``merge_kernel_intervals``: sorted by start,
   a new group when a start exceeds every earlier end, group = [min start, max end]);
   ``comm_us`` = Σ merged comm lengths, ``compute_us``/``memory_us`` likewise,
   ``overlapped_us`` = time where a merged comm and a merged compute interval are both open
   (HTA's +1/+2 sweep, running sum = 3), ``overlap_ratio = overlapped_us / comm_us`` (None when
   ``comm_us`` = 0, where HTA gives NaN). HTA reports ``round(100 * ratio, 2)`` percent.

The "two or more step names" test pools the names of all ranks, as HTA's global symbol table does
(:func:`settle`). A difference kept on purpose: a rank of several files (``--repeat`` cycles, which
HTA cannot read) is the concatenation of its files.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from overlapprof.analysis.rank.unions import hold, merged
from overlapprof.errors import InputError
from overlapprof.report import Metrics
from overlapprof.trace.discover import text_head
from overlapprof.trace.kineto import is_array_layout
from overlapprof.trace.reader import LayoutError, TraceReader

COMM_RE = re.compile(r"^nccl.*Kernel")
MEMORY_RE = re.compile(r"(^Memcpy)|(^Memset)|(^dma)")
NOT_COMPUTE_RE = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")
SYNC_NAMES = ("Event Sync", "Context Sync")


class _Args(msgspec.Struct):
    stream: Any = -1
    correlation: Any = -1


class _Event(msgspec.Struct):
    name: Any = None
    cat: Any = None
    ts: Any = msgspec.UNSET
    dur: Any = None
    args: _Args | None = None


_CHUNK_DECODER = msgspec.json.Decoder(list[_Event])


def _int_or(value, default: int = -1) -> int:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        return default


def _kind(name: str) -> int:
    """0 comm, 1 memory, 2 compute, 3 other (HTA's get_kernel_type order)."""
    if COMM_RE.match(name):
        return 0
    if MEMORY_RE.match(name):
        return 1
    if not NOT_COMPUTE_RE.match(name):
        return 2
    return 3


# A kept event as this module keeps it: 34 bytes, held in memory or on disk (past the budget).
_ROW = np.dtype([("ts", "f8"), ("dur", "f8"), ("stream", "i8"), ("corr", "i8"), ("kind", "i1"), ("flags", "i1")],
                align=False)
_STEP, _SYNC = 1, 2  # flags: the name contains ProfilerStep; the name is Event Sync or Context Sync
_WINDOW_ROWS = 1 << 20  # rows of a rank read back at a time


class _Names(dict):
    """name -> (kind, flags), each distinct name classified once."""

    def __missing__(self, name):
        value = self[name] = (_kind(name), (_STEP if "ProfilerStep" in name else 0) | (_SYNC if name in SYNC_NAMES else 0))
        return value


def _chunk_rows(events: list, names: _Names, steps: set) -> tuple[bool, np.ndarray]:
    """A chunk's events as HTA's parser keeps them (rule 1): whether any ``ts`` is not an integer
    literal (pandas then makes the column float64 and HTA rounds: rule 2), and the kept
    events' rows; the step names seen go to ``steps``."""
    rounding = any(not isinstance(e.ts, int) or isinstance(e.ts, bool) for e in events)
    kept = [e for e in events if isinstance(e.dur, (int, float)) and not (isinstance(e.dur, float) and math.isnan(e.dur))
            and e.cat is not None and e.cat != "Trace" and isinstance(e.ts, (int, float))]
    rows = np.empty(len(kept), dtype=_ROW)
    if not kept:
        return rounding, rows
    classes = [names[e.name if isinstance(e.name, str) else ""] for e in kept]
    steps.update(e.name for e, c in zip(kept, classes) if c[1] & _STEP)
    rows["ts"] = np.array([e.ts for e in kept], dtype=np.float64)
    rows["dur"] = np.array([e.dur for e in kept], dtype=np.float64)
    rows["stream"] = np.array([_int_or(e.args.stream) if e.args is not None else -1 for e in kept], dtype=np.int64)
    rows["corr"] = np.array([_int_or(e.args.correlation) if e.args is not None else -1 for e in kept], dtype=np.int64)
    rows["kind"], rows["flags"] = zip(*classes)
    return rounding, rows


class _RankRows:
    """A rank's kept events, file by file, a chunk at a time: in memory, or with ``store`` in a
    bin per trace file there (an :class:`~overlapprof.analysis.engine.store.Store`: in memory up
    to its budget, on disk past it)."""

    def __init__(self, store=None):
        self.store = store
        self.files: list = []  # per trace file: a list of row arrays, or a store's bin
        self.rounding: list[bool] = []

    def read(self, path: str, names: _Names, steps: set) -> None:
        if is_array_layout(text_head(path, 4096) or b""):  # HTA reads only traceEvents
            raise InputError(f"{path}: not a trace HolisticTraceAnalysis can read (the JSON Array Format: "
                             "no traceEvents)")
        for generic in (False, True):
            store = [] if self.store is None else self.store.file(f"hta{len(self.files)}", _ROW)
            rounding = False
            try:
                for chunk in TraceReader(path, _CHUNK_DECODER).chunks(generic=generic):
                    r, rows = _chunk_rows(chunk.events, names, steps)
                    rounding |= r
                    store.append(rows)
                break
            except LayoutError:
                if self.store is not None:
                    store.remove()
        self.files.append(store)
        self.rounding.append(rounding)

    def windows(self):
        """(rows, rounding) a window at a time: a file's rows in order, then the next file's."""
        for store, rounding in zip(self.files, self.rounding):
            for rows in (store if isinstance(store, list) else store.windows(_WINDOW_ROWS)):
                yield rows, rounding


def _times(rows: np.ndarray, rounding: bool, shift: float) -> tuple[np.ndarray, np.ndarray]:
    """(start, end) on HTA's axis (rule 2): rounded on the absolute clock when the file's times
    are not all integers, shifted by the rank's earliest start, then end = start + dur."""
    ts, dur = rows["ts"], rows["dur"]
    if rounding:
        ts, end = np.ceil(ts), np.floor(ts + dur)
        dur = end - ts
    ts = ts - shift
    return ts, ts + dur


def merge(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """HTA's merge_kernel_intervals: sorted by start, a new group when the start exceeds the
    running maximum of earlier ends; each group is [min start, max end]."""
    if start.size == 0:
        return start, end
    order = np.argsort(start, kind="stable")
    s, e = start[order], end[order]
    prev_max = np.maximum.accumulate(e)
    new = np.empty(s.size, dtype=bool)
    new[0] = True
    new[1:] = s[1:] > prev_max[:-1]
    group = np.cumsum(new) - 1
    gs = np.minimum.reduceat(s, np.flatnonzero(new))
    ge = np.full(group[-1] + 1, -np.inf)
    np.maximum.at(ge, group, e)
    return gs, ge


def overlap(comm: tuple[np.ndarray, np.ndarray], comp: tuple[np.ndarray, np.ndarray]) -> float:
    """HTA's sweep: +1/-1 at merged comm starts/ends, +2/-2 at compute's; the time where the
    running sum is 3, summed (ties at one time are order-independent: only the sum after the
    last of them spans time)."""
    times = np.concatenate([comm[0], comm[1], comp[0], comp[1]])
    if times.size == 0:
        return 0.0
    delta = np.concatenate([np.ones(comm[0].size), -np.ones(comm[1].size), np.full(comp[0].size, 2.0),
                            np.full(comp[1].size, -2.0)])
    order = np.argsort(times, kind="stable")
    t, running = times[order], np.cumsum(delta[order])
    span = t[1:] - t[:-1]
    return float(span[running[:-1] == 3].sum())


def _is_kernel(rows: np.ndarray) -> np.ndarray:
    """HTA's kernels (rule 3): a stream and a correlation, or a sync's name."""
    return ((rows["stream"] >= 0) & (rows["corr"] >= 0)) | ((rows["flags"] & _SYNC) != 0)


def _member(values: np.ndarray, sorted_set: np.ndarray) -> np.ndarray:
    """``np.isin(values, sorted_set)`` for a sorted ``sorted_set``, without sorting it again."""
    if sorted_set.size == 0:
        return np.zeros(values.size, dtype=bool)
    at = np.minimum(np.searchsorted(sorted_set, values), sorted_set.size - 1)
    return sorted_set[at] == values


def rank_metrics(files: list[str | Path], window_on: bool | None = None, store=None) -> tuple[Metrics, frozenset[str]]:
    """HTA 0.5.0's get_comm_comp_overlap for one rank (module docstring), as Metrics (µs), and
    the rank's step names (HTA applies its window when all ranks together have two or more:
    :func:`settle`). ``window_on``: force the window on or off (None: this rank's names decide).
    ``store``: where the events' rows (34 bytes each) wait (an
    :class:`~overlapprof.analysis.engine.store.Store`; None: in memory).

    The files are decoded once, a chunk at a time, into rows; the rows are then read three times:
    for the earliest start and the window's cutoff, for the correlations of the CPU events the
    window keeps, and for each class's merged intervals, merged a window of rows at a time (HTA's
    merge of merged groups is the merge of their events: the same groups, the same floats)."""
    rank = _RankRows(store)
    try:
        return _rank_metrics([str(f) for f in files], window_on, rank)
    finally:
        for rows in rank.files:
            if not isinstance(rows, list):
                rows.remove()


def _rank_metrics(files: list[str], window_on: bool | None, rank: _RankRows) -> tuple[Metrics, frozenset[str]]:
    names, steps = _Names(), set()
    for path in files:
        rank.read(path, names, steps)
    first, last_step = np.inf, -np.inf  # on the absolute clock, after rounding
    for rows, rounding in rank.windows():
        if rows.size:
            ts = np.ceil(rows["ts"]) if rounding else rows["ts"]
            first = min(first, float(ts.min()))
            marks = ~_is_kernel(rows) & ((rows["flags"] & _STEP) != 0)
            if marks.any():
                last_step = max(last_step, float(ts[marks].max()))
    shift = 0.0 if first == np.inf else first
    if window_on is None:
        window_on = len(steps) >= 2
    # fl(t - shift) never decreases with t: the latest shifted step start is the latest start,
    # shifted. A rank without steps of its own: -inf, and HTA keeps nothing.
    cutoff = last_step - shift
    launched = np.empty(0, dtype=np.int64)  # the correlations of the CPU events the window keeps, sorted
    if window_on:
        launched = np.unique(np.concatenate([launched] + [
            rows["corr"][~_is_kernel(rows) & (_times(rows, rounding, shift)[0] < cutoff)]
            for rows, rounding in rank.windows()]))
    parts: list[list] = [[], [], []]  # per class (comm, memory, compute): merged groups, pending
    for rows, rounding in rank.windows():
        start, end = _times(rows, rounding, shift)
        keep = rows["stream"] != -1
        if window_on:
            kernel = _is_kernel(rows)
            keep &= (~kernel & (start < cutoff)) | (kernel & _member(rows["corr"], launched))
        for k in range(3):
            mine = keep & (rows["kind"] == k)
            if mine.any():
                parts[k] = hold(parts[k], merge(start[mine], end[mine]), merge)
    empty = (np.empty(0), np.empty(0))
    groups = [merged(p, merge) if p else empty for p in parts]
    comm_us, memory_us, compute_us = (float((e - s).sum()) for s, e in groups)
    overlapped = overlap(groups[0], groups[2])
    return Metrics(
        comm_us=comm_us,
        compute_us=compute_us,
        overlapped_us=overlapped,
        exposed_comm_us=comm_us - overlapped,
        overlap_ratio=overlapped / comm_us if comm_us != 0 else None,
        memory_us=memory_us,
    ), frozenset(steps)


def settle(results, store=None) -> None:
    """HTA decides on its window from the step names of all ranks together: a rank with fewer
    than two of its own is measured again with the window on when the ranks have two or more.
    ``results``: objects with ``files``, ``report`` and ``hta_steps`` (the analyzer's RankResult);
    ``store``: see :func:`rank_metrics`."""
    pooled = frozenset().union(*(r.hta_steps for r in results if r.hta_steps is not None))
    if len(pooled) < 2:
        return
    for r in results:
        if r.hta_steps is not None and len(r.hta_steps) < 2:
            r.report.metrics = rank_metrics(r.files, window_on=True, store=store)[0]


def hta_percent(ratio: float | None) -> float | None:
    """The ratio as HTA reports it: ``round(100 * ratio, 2)`` percent (None for HTA's NaN)."""
    return None if ratio is None else round(100 * ratio, 2)
