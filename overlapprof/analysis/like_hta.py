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

from overlapprof.errors import InputError
from overlapprof.report import Metrics
from overlapprof.trace.decode import read_bytes
from overlapprof.trace.kineto import without_bom

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


class _Trace(msgspec.Struct):
    traceEvents: list[_Event] = []


_DECODER = msgspec.json.Decoder(_Trace)


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


def _columns(path: str | Path):
    """One file's events as HTA's parser keeps them: names, start, duration, stream, correlation."""
    try:
        events = _DECODER.decode(without_bom(read_bytes(path))).traceEvents
    except msgspec.MsgspecError as exc:  # the JSON Array Format too: HTA reads only traceEvents
        raise InputError(f"{path}: not a trace HolisticTraceAnalysis can read ({exc})") from None
    # pandas makes the ts column float64 (and HTA rounds) when any ts is a float or missing
    rounding = any(not isinstance(e.ts, int) or isinstance(e.ts, bool) for e in events)
    kept = [e for e in events if isinstance(e.dur, (int, float)) and not (isinstance(e.dur, float) and math.isnan(e.dur))
            and e.cat is not None and e.cat != "Trace" and isinstance(e.ts, (int, float))]
    names = [e.name if isinstance(e.name, str) else "" for e in kept]
    ts = np.array([e.ts for e in kept], dtype=np.float64)
    dur = np.array([e.dur for e in kept], dtype=np.float64)
    if rounding:  # on the absolute clock, as HTA does before it shifts times to start at 0
        ts, end = np.ceil(ts), np.floor(ts + dur)
        dur = end - ts
    stream = np.array([_int_or(e.args.stream) if e.args is not None else -1 for e in kept], dtype=np.int64)
    corr = np.array([_int_or(e.args.correlation) if e.args is not None else -1 for e in kept], dtype=np.int64)
    return names, ts, dur, stream, corr


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


def window(names: list[str], ts: np.ndarray, stream: np.ndarray, corr: np.ndarray,
           on: bool | None = None) -> np.ndarray:
    """The events HTA keeps (step 3 of the module docstring), as a mask. ``on``: whether the
    window applies (None: when these events have two or more step names)."""
    is_step = np.array(["ProfilerStep" in n for n in names], dtype=bool)
    if on is None:
        on = len({n for n, s in zip(names, is_step) if s}) >= 2
    if not on:
        return np.ones(ts.size, dtype=bool)
    kernel = ((stream >= 0) & (corr >= 0)) | np.isin(np.array(names, dtype=object), SYNC_NAMES)
    cpu = ~kernel
    steps = cpu & is_step
    if not steps.any():  # a rank without steps of its own: HTA keeps nothing
        return np.zeros(ts.size, dtype=bool)
    kept_cpu = cpu & (ts < ts[steps].max())
    return kept_cpu | (kernel & np.isin(corr, corr[kept_cpu]))


def step_names(names: list[str]) -> frozenset[str]:
    return frozenset(n for n in names if "ProfilerStep" in n)


def rank_metrics(files: list[str | Path], window_on: bool | None = None) -> tuple[Metrics, frozenset[str]]:
    """HTA 0.5.0's get_comm_comp_overlap for one rank (module docstring), as Metrics (µs), and
    the rank's step names (HTA applies its window when all ranks together have two or more:
    :func:`settle`). ``window_on``: force the window on or off (None: this rank's names decide)."""
    cols = [_columns(f) for f in files]
    names = [n for c in cols for n in c[0]]
    ts, dur, stream, corr = (np.concatenate([c[k] for c in cols]) for k in range(1, 5))
    # HTA shifts every ts by the earliest one, then takes end = ts + dur: the same float sums
    ts = ts - (ts.min() if ts.size else 0.0)
    end = ts + dur
    keep = window(names, ts, stream, corr, window_on) & (stream != -1)
    idx = np.flatnonzero(keep)
    kinds = np.array([_kind(names[i]) for i in idx], dtype=np.int8)
    merged = [merge(ts[idx[kinds == k]], end[idx[kinds == k]]) for k in range(3)]
    comm_us, memory_us, compute_us = (float((e - s).sum()) for s, e in merged)
    overlapped = overlap(merged[0], merged[2])
    return Metrics(
        comm_us=comm_us,
        compute_us=compute_us,
        overlapped_us=overlapped,
        exposed_comm_us=comm_us - overlapped,
        overlap_ratio=overlapped / comm_us if comm_us != 0 else None,
        memory_us=memory_us,
    ), step_names(names)


def settle(results) -> None:
    """HTA decides on its window from the step names of all ranks together: a rank with fewer
    than two of its own is measured again with the window on when the ranks have two or more.
    ``results``: objects with ``files``, ``report`` and ``hta_steps`` (the analyzer's RankResult)."""
    pooled = frozenset().union(*(r.hta_steps for r in results if r.hta_steps is not None))
    if len(pooled) < 2:
        return
    for r in results:
        if r.hta_steps is not None and len(r.hta_steps) < 2:
            r.report.metrics = rank_metrics(r.files, window_on=True)[0]


def hta_percent(ratio: float | None) -> float | None:
    """The ratio as HTA reports it: ``round(100 * ratio, 2)`` percent (None for HTA's NaN)."""
    return None if ratio is None else round(100 * ratio, 2)
