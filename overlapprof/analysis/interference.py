"""Interference from one trace: how much slower each compute class of compute runs while
communication runs beside it (OVERLAP.md section 6.4; the report's
:class:`~overlapprof.report.Interference`).

On CPUs gloo's threads take cores from the compute; on GPUs NCCL's kernels take SMs and memory
bandwidth. The same operation (its name) then takes longer inside a communication interval than
outside one, and a trace that holds both measures it: per class, the mean duration of its spans
wholly inside U(comm) over that of its spans wholly outside is the class's ``factor``, and every
span overlapped by communication paid ``o × (1 − 1/factor)`` extra (``o``: its time under
U(comm)). Spans are the top-level compute events of a thread (CPU mode: an op enclosed by another
op of its thread is part of that op's time, and counting both would count its slowdown twice);
every kernel in GPU mode.

:class:`InterferenceBuilder` takes the rank's compute events (filtered as the metrics' are) a
batch at a time, in memory or, past the memory budget, in time buckets on disk, and measures them
against the rank's whole U(comm) once it is known. Every sum is of integer nanoseconds, so the
result does not depend on how the events were batched: a rank measured on disk gets the report a
rank read in memory gets. :func:`class_factors` gives the factors for a replay.
"""

from __future__ import annotations


import numpy as np

from overlapprof.analysis.intervals import Intervals
from overlapprof.analysis.rank.events import EventSet, Steps
from overlapprof.analysis.spill import cut_points
from overlapprof.report.interference import Interference, ComputeClass

# Spans a class needs on each side (inside and outside communication) before its factor is
# given: below this a mean of a few noisy durations says little.
MIN_SAMPLES = 5
_NS = 1000.0  # µs -> ns: the sums are integers
_SPAN_ROW = np.dtype([("start", "<f8"), ("end", "<f8"), ("anchor", "<f8"), ("key", "<i4"), ("thread", "<i4")])
_BUCKETS = 32  # time buckets of the spans on disk (one in memory at a time; each file open holds a 64 KiB buffer)


def covered_length(u: Intervals, start: np.ndarray, end: np.ndarray, cum: np.ndarray | None = None) -> np.ndarray:
    """|[start, end) ∩ u| for each interval (µs; ``u`` sorted and disjoint), by the cumulative
    covered length at both ends. ``cum``: :func:`cumulative` of ``u``, when the caller made it
    once for many calls."""
    starts, ends = u
    if starts.size == 0 or start.size == 0:
        return np.zeros(start.size)
    cum = cumulative(u) if cum is None else cum

    def upto(t):
        j = np.searchsorted(starts, t, "right") - 1
        k = np.maximum(j, 0)
        inside = np.clip(t - starts[k], 0.0, ends[k] - starts[k])
        return np.where(j >= 0, cum[k] + inside, 0.0)

    return np.maximum(upto(end) - upto(start), 0.0)


def cumulative(u: Intervals) -> np.ndarray:
    """The covered length of ``u`` before each of its intervals, and in all (:func:`covered_length`)."""
    return np.concatenate(([0.0], np.cumsum(u[1] - u[0])))


def top_level(rec: np.ndarray, reach: dict) -> np.ndarray:
    """Whether each span of ``rec`` (a bucket of :data:`_SPAN_ROW`, in arrival order) is not
    enclosed by an earlier-starting (or equal-starting, longer) span of its thread. ``reach``:
    thread -> the latest end of its spans in earlier buckets, updated."""
    out = np.ones(rec.size, dtype=bool)
    if rec.size == 0:
        return out
    order = np.lexsort((-rec["end"], rec["start"], rec["thread"]))  # stable: full ties keep arrival order
    thread, start, end = rec["thread"][order], rec["start"][order], rec["end"][order]
    bounds = np.flatnonzero(np.diff(thread)) + 1
    for a, b in zip(np.concatenate(([0], bounds)).tolist(), np.concatenate((bounds, [thread.size])).tolist()):
        t = int(thread[a])
        before = np.maximum.accumulate(np.concatenate(([reach.get(t, -np.inf)], end[a:b])))
        out[order[a:b]] = ~(start[a:b] < before[:-1])
        reach[t] = float(before[-1])
    return out


def _grouped(codes: np.ndarray, values: np.ndarray) -> dict[int, int]:
    """Σ values per code (int64), as a dict."""
    if codes.size == 0:
        return {}
    order = np.argsort(codes, kind="stable")
    codes, values = codes[order], values[order]
    first = np.concatenate(([0], np.flatnonzero(np.diff(codes)) + 1))
    return dict(zip(codes[first].tolist(), np.add.reduceat(values, first).tolist()))


def _add(into: dict, more: dict) -> None:
    for k, v in more.items():
        into[k] = into.get(k, 0) + v


class InterferenceBuilder:
    """Compute events in (:meth:`add`, filtered as the metrics' are), an
    :class:`~overlapprof.report.Interference` and the per-step slowed time out (:meth:`result`).

    ``steps``: the rank's steps (after the filters); ``nest``: take the top-level spans of each
    thread (CPU mode); ``store``: keep the spans in time buckets (cut at ``edges``, µs) of this
    :class:`~overlapprof.analysis.engine.store.Store` (in memory up to its budget, on disk past
    it), not in a list in memory. ``keep``: :meth:`result` keeps the spans it measured
    (``kept``; :meth:`replayable`), to be measured against another U(comm) without the events."""

    def __init__(self, steps: Steps, nest: bool, store=None, edges: np.ndarray | None = None, keep: bool = False):
        self.steps, self.nest = steps, nest
        self.edges = np.empty(0) if edges is None else np.asarray(edges, dtype=np.float64)
        self.held: list[np.ndarray] = []
        self.kept: list[np.ndarray] | None = [] if keep else None
        self.buckets = None if store is None else store.buckets("spans", _SPAN_ROW, self.edges.size + 1)

    @staticmethod
    def bucket_edges(sample_values: np.ndarray) -> np.ndarray:
        """The cut points of :data:`_BUCKETS` time buckets of about equal size, from a sample of times."""
        return cut_points(sample_values, _BUCKETS)

    def add(self, s: EventSet) -> None:
        if len(s) == 0:
            return
        rec = np.empty(len(s), dtype=_SPAN_ROW)
        rec["start"], rec["end"], rec["anchor"], rec["key"], rec["thread"] = s.start, s.end, s.anchor, s.key, s.thread
        if self.buckets is None:
            self.held.append(rec)
        else:
            self.buckets.route(np.searchsorted(self.edges, rec["start"], "right"), rec)

    def _batches(self):
        if self.buckets is None:
            if self.held:
                yield np.concatenate(self.held)
            self.held = []
            return
        for f in self.buckets:  # in time order
            rec = f.read()
            f.remove()
            yield rec

    def result(self, comm: Intervals, names: list[str]) -> tuple[Interference, list[float]]:
        """The rank's interference against its whole U(comm) ``comm`` (``names``: what the keys
        code), and the slowed time of each step (in ``steps`` order; µs)."""
        sums = {name: {} for name in ("n_in", "ns_in", "n_out", "ns_out", "ns_over")}
        step_over: dict[int, int] = {}  # step index * 2**31 + key -> Σ overlap ns
        reach: dict = {}
        cum = cumulative(comm)  # once: each batch is measured against the same U(comm)
        for rec in self._batches():
            if self.nest:
                rec = rec[top_level(rec, reach)]
            if self.kept is not None:
                self.kept.append(rec)
            dur = np.rint((rec["end"] - rec["start"]) * _NS).astype(np.int64)
            over = covered_length(comm, rec["start"], rec["end"], cum)
            over = np.minimum(np.rint(over * _NS).astype(np.int64), dur)
            key = rec["key"].astype(np.int64)
            inside = (dur > 0) & (over >= dur - 1)  # covered to the nanosecond (float sums round)
            outside = (dur > 0) & (over == 0)
            _add(sums["n_in"], _grouped(key[inside], np.ones(int(inside.sum()), dtype=np.int64)))
            _add(sums["ns_in"], _grouped(key[inside], dur[inside]))
            _add(sums["n_out"], _grouped(key[outside], np.ones(int(outside.sum()), dtype=np.int64)))
            _add(sums["ns_out"], _grouped(key[outside], dur[outside]))
            touched = over > 0
            _add(sums["ns_over"], _grouped(key[touched], over[touched]))
            step = self.steps.index_of(rec["anchor"][touched])
            mine = step >= 0
            _add(step_over, _grouped(step[mine] * (1 << 31) + key[touched][mine], over[touched][mine]))
        return self._measured(sums, step_over, names)

    def replayable(self) -> InterferenceBuilder:
        """After :meth:`result` with ``keep``: a builder (in memory, no store) holding the spans it
        measured, whose :meth:`result` measures them against another U(comm) (the sums are of
        integer nanoseconds: the same whichever batches the spans come in)."""
        spans = InterferenceBuilder(self.steps, nest=False)
        spans.held = [np.concatenate(self.kept)] if self.kept else []
        return spans

    def _measured(self, sums: dict, step_over: dict, names: list[str]):
        factor, classes = {}, []
        for key in sorted(set(sums["n_in"]) | set(sums["ns_over"])):
            n_in, n_out = sums["n_in"].get(key, 0), sums["n_out"].get(key, 0)
            mean_in = sums["ns_in"].get(key, 0) / n_in / _NS if n_in else None
            mean_out = sums["ns_out"].get(key, 0) / n_out / _NS if n_out else None
            f = mean_in / mean_out if n_in >= MIN_SAMPLES and n_out >= MIN_SAMPLES and mean_out else None
            over_us = sums["ns_over"].get(key, 0) / _NS
            if f is not None:
                factor[key] = f
            classes.append(ComputeClass(name=names[key], inside=n_in, outside=n_out, inside_mean_us=mean_in,
                                          outside_mean_us=mean_out, factor=f, overlapped_us=over_us,
                                          slowed_us=None if f is None else over_us * (1 - 1 / f)))
        classes.sort(key=lambda c: (-c.overlapped_us, c.name))
        count = self.steps.start.size
        slowed = [0.0] * count
        for code, ns in sorted(step_over.items()):
            step, key = divmod(code, 1 << 31)
            if key in factor:
                slowed[step] += ns / _NS * (1 - 1 / factor[key])
        total = sum(c.slowed_us for c in classes if c.slowed_us is not None)
        missing = sum(c.overlapped_us for c in classes if c.factor is None)
        return (Interference(slowed_us=total, net_overlap_gain_us=0.0, unmeasured_us=missing, min_samples=MIN_SAMPLES,
                             classes=classes), slowed)

    def remove(self) -> None:
        if self.buckets is not None:
            self.buckets.remove()


def attach(report, interference: Interference, slowed: list[float]) -> None:
    """Put a rank's interference in its RankReport: the rank's and each step's ``slowed_us`` and
    ``net_overlap_gain_us`` (``slowed``: per step, in the report's step order)."""
    interference.net_overlap_gain_us = report.metrics.overlapped_us - interference.slowed_us
    report.interference = interference
    for step, extra in zip(report.steps, slowed):
        step.slowed_us = extra
        step.net_overlap_gain_us = step.overlapped_us - extra


def class_factors(report) -> dict[int, dict[str, float]]:
    """Per rank of a Report, each measured compute class's slowdown factor by name (a replay
    stretches a span overlapped by communication by it); ranks without interference map to {}."""
    return {r.rank: (r.interference.factors() if r.interference is not None else {}) for r in report.ranks}

