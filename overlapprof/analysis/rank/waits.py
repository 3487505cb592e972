"""Need times: when the program needed each communication's result.

GPU mode (:func:`waited_for` over a whole file; :class:`NeedTimes` a batch of GPU events at a
time): from the ``Stream Wait Event`` rows of ``enable_cuda_sync_events``, for a rank whose GPU
events are classified a time bucket at a time (:mod:`overlapprof.analysis.rank.bounded`). CPU
mode (:func:`need_times`): the end of the host activity of the issuing thread before the
operation ends, on the activity itself or on its per-thread runs (:func:`thread_reach`). A wait on stream
W at time t waits on a ``cudaEventRecord`` call, which covers the communication launched last at
or before that call from its thread; that result was needed when the first GPU event launched on
W after t could otherwise run: the later of

- the earliest launch on W after t (a minimum over every GPU event on W), and
- the latest end of the events launched on W at or before t (a maximum),

so each batch of GPU events updates a minimum and a maximum per wait, and the result is the
whole file's, float for float. The waits (a few per operation) and the communication events'
launches (one per operation) are held in memory; the GPU events are not.
"""

from __future__ import annotations

import numpy as np

from overlapprof.analysis.rank import classify as C
from overlapprof.analysis.rank.scan import Scan


class NeedTimes:
    """One file's waits (:meth:`add_waits`), then its GPU events and communication events a batch at
    a time (:meth:`add_gpu`, :meth:`add_comm`), then each communication event's need time
    (:meth:`result`)."""

    def __init__(self):
        self._waits: list[tuple] = []
        self._comm: list[tuple] = []
        self.stream = self.ts = self.rec_thread = self.rec_ts = None
        self.first_after = self.reach_before = None

    def add_waits(self, stream: np.ndarray, ts: np.ndarray, rec_thread: np.ndarray, rec_ts: np.ndarray) -> None:
        """``Stream Wait Event`` rows (their stream's thread code and time) with the thread and
        time of the ``cudaEventRecord`` call they wait on; all of them before any :meth:`add_gpu`."""
        if ts.size:
            self._waits.append((stream, ts, rec_thread, rec_ts))

    def _ready(self) -> None:
        if self.ts is None:
            parts = self._waits or [(np.empty(0, np.int32), np.empty(0), np.empty(0, np.int32), np.empty(0))]
            self.stream, self.ts, self.rec_thread, self.rec_ts = (np.concatenate(p) for p in zip(*parts))
            self._waits = []
            # the streams that wait, once (np.unique and np.intersect1d import numpy.ma: 20 ms a run)
            self.waiting = sorted(set(self.stream.tolist()))
            self.first_after = np.full(self.ts.size, np.inf)
            self.reach_before = np.full(self.ts.size, -np.inf)

    def add_gpu(self, stream: np.ndarray, launch: np.ndarray, end: np.ndarray) -> None:
        """GPU events whose launch was found: their stream's thread code, launch time and end."""
        self._ready()
        if self.ts.size == 0 or launch.size == 0:
            return
        for s in self.waiting:
            on_w = stream == s
            if not on_w.any():
                continue
            q = np.flatnonzero(self.stream == s)
            order = np.argsort(launch[on_w], kind="stable")
            starts, reach = launch[on_w][order], np.maximum.accumulate(end[on_w][order])
            idx = np.searchsorted(starts, self.ts[q], "right")
            after = idx < starts.size
            self.first_after[q[after]] = np.minimum(self.first_after[q[after]], starts[idx[after]])
            before = idx > 0
            self.reach_before[q[before]] = np.maximum(self.reach_before[q[before]], reach[idx[before] - 1])

    def add_comm(self, corr: np.ndarray, ts: np.ndarray, launch_thread: np.ndarray, launch_ts: np.ndarray) -> None:
        """Communication events: their correlation and start (what :meth:`result` keys them by),
        and their launch's thread code and time (NaN: not found). Without a wait (a trace
        without CUDA sync events: most) none is needed, and none is kept."""
        self._ready()
        if ts.size and self.ts.size:
            self._comm.append((corr, ts, launch_thread, launch_ts))

    def result(self) -> dict[tuple[float, float], float]:
        """(correlation, start) of each communication event that a wait needed -> the time it
        was needed. Of communication events launched at the same time on the same thread, the
        wait takes the last by (correlation, start) where the whole file takes the last in file
        order: the same unless two share a launch."""
        self._ready()
        if self.ts.size == 0 or not self._comm:
            return {}
        corr, ts, thread, launch = (np.concatenate(p) for p in zip(*self._comm))
        found = ~np.isnan(launch)
        corr, ts, thread, launch = corr[found], ts[found], thread[found], launch[found]
        order = np.lexsort((ts, corr, launch, thread))
        corr, ts, thread, launch = corr[order], ts[order], thread[order], launch[order]
        k = np.full(self.ts.size, -1, dtype=np.int64)
        for t in sorted(set(self.rec_thread.tolist())):  # (np.unique imports numpy.ma)
            q = np.flatnonzero(self.rec_thread == t)
            lo, hi = np.searchsorted(thread, t, "left"), np.searchsorted(thread, t, "right")
            got = lo + np.searchsorted(launch[lo:hi], self.rec_ts[q], "right") - 1
            k[q] = np.where(got >= lo, got, -1)
        ready = np.where(np.isfinite(self.first_after), np.maximum(self.first_after, self.reach_before), np.nan)
        ok = (k >= 0) & ~np.isnan(ready)
        need = np.full(corr.size, np.nan)
        np.fmin.at(need, k[ok], ready[ok])
        got = np.flatnonzero(~np.isnan(need))
        return dict(zip(zip(corr[got].tolist(), ts[got].tolist()), need[got].tolist()))


def lookup(needs: dict, corr: np.ndarray, ts: np.ndarray) -> np.ndarray:
    """The need times of events given by correlation and start (NaN: not needed by a wait)."""
    if not needs:  # no CUDA sync events (most traces): no lookup per event
        return np.full(corr.size, np.nan)
    return np.array([needs.get(key, np.nan) for key in zip(corr.tolist(), ts.tolist())], dtype=np.float64)


def waited_for(scan: Scan, names: list[str], gpu_rows: np.ndarray, launch: np.ndarray, comm: np.ndarray,
                comm_launch: np.ndarray) -> np.ndarray:
    """GPU mode: when the program needed each communication event's result (``comm``: GPU rows,
    ``comm_launch``: their launching runtime rows, -1 none; NaN: not known), from the CUDA sync
    events of ``enable_cuda_sync_events``. A "Stream Wait Event" on stream W waits on a
    ``cudaEventRecord`` call: the event covers the communication launched last, at or before that
    call, from the call's thread. The first GPU event launched on W after the wait depends on it:
    its result was needed when that event could otherwise have run, the later of its launch and
    the end of the work W had before the wait."""
    need = np.full(comm.size, np.nan)
    sync = np.flatnonzero(scan.codes == C.SYNC)
    if sync.size == 0 or scan.sync_record.size != sync.size or comm.size == 0:
        return need
    is_wait = np.array([n == C.STREAM_WAIT for n in names], dtype=bool)[scan.name_ids[sync]] & (scan.sync_record >= 0)
    waits, records = sync[is_wait], scan.sync_record[is_wait]
    launched = comm_launch >= 0
    c_rows, c_thread, c_ts = np.flatnonzero(launched), scan.thread[comm_launch[launched]], scan.ts[comm_launch[launched]]
    order = np.lexsort((c_ts, c_thread))
    c_rows, c_thread, c_ts = c_rows[order], c_thread[order], c_ts[order]
    # Per wait, vectorized by the records' threads and the waiting streams (a loop per wait over
    # every GPU event was quadratic: minutes on a trace with tens of thousands of waits).
    rec_thread, rec_ts = scan.thread[records], scan.ts[records]
    k = np.full(waits.size, -1, dtype=np.int64)
    for thread in np.flatnonzero(np.bincount(rec_thread)).tolist() if rec_thread.size else []:
        q = np.flatnonzero(rec_thread == thread)
        lo, hi = np.searchsorted(c_thread, thread, "left"), np.searchsorted(c_thread, thread, "right")
        got = lo + np.searchsorted(c_ts[lo:hi], rec_ts[q], "right") - 1
        k[q] = np.where(got >= lo, got, -1)
    g_launched = launch >= 0
    g_rows, g_launch = gpu_rows[g_launched], scan.ts[launch[g_launched]]
    g_stream, g_end = scan.thread[g_rows], scan.end(g_rows)
    ready = np.full(waits.size, np.nan)
    w_stream, w_ts = scan.thread[waits], scan.ts[waits]
    for stream in np.flatnonzero(np.bincount(w_stream[k >= 0])).tolist() if (k >= 0).any() else []:
        q = np.flatnonzero((w_stream == stream) & (k >= 0))
        on_w = g_stream == stream
        order = np.argsort(g_launch[on_w], kind="stable")
        starts, reach = g_launch[on_w][order], np.maximum.accumulate(g_end[on_w][order]) if order.size else order
        idx = np.searchsorted(starts, w_ts[q], "right")  # the GPU events on W launched at or before each wait
        after = idx < starts.size
        q, idx = q[after], idx[after]
        before = np.where(idx > 0, reach[np.maximum(idx - 1, 0)], -np.inf)
        ready[q] = np.maximum(starts[idx], before)  # the first launched after it, or W's work before it ends
    found = ~np.isnan(ready)
    np.fmin.at(need, c_rows[k[found]], ready[found])
    return need


def thread_reach(thread: np.ndarray, start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Host activity ``[start, end]`` per thread, compressed for :func:`need_times`: each
    thread's connected runs (closed intervals: touching ones join, zero-length ones count), as
    (thread, start, end) sorted by thread and start. The latest end of the activity that starts
    before a time t is the end of the last run that starts before t, or t itself is inside that
    run: so the need times of the runs are those of the activity (and runs of runs are the runs)."""
    if thread.size == 0:
        return thread, start, end
    order = np.lexsort((start, thread))
    thread, start, end = thread[order], start[order], end[order]
    reach = np.empty_like(end)
    new = np.ones(thread.size, dtype=bool)
    for t in np.flatnonzero(np.bincount(thread)).tolist():  # (np.unique imports numpy.ma)
        a, b = np.searchsorted(thread, (t, t + 1))
        reach[a:b] = np.maximum.accumulate(end[a:b])
        new[a + 1 : b] = start[a + 1 : b] > reach[a : b - 1]
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, thread.size - 1)
    return thread[first], start[first], reach[last]


def need_times(activity: tuple, thread: np.ndarray, issue: np.ndarray, end: np.ndarray) -> np.ndarray:
    """CPU mode: when the program needed each operation's result: the end of the last host
    ``activity`` ((thread, start, end): compute cpu_ops and communication calls, or their
    :func:`thread_reach`) on its issuing ``thread`` that started between its ``issue`` and its
    ``end``, clipped to ``[issue, end]``; its issue when the thread did nothing else (a blocking call)."""
    need = issue.copy()
    a_thread, a_start, a_end = activity
    if a_thread.size == 0 or issue.size == 0:
        return need
    order = np.lexsort((a_start, a_thread))
    a_thread, a_start, a_end = a_thread[order], a_start[order], a_end[order]
    lo, hi = np.searchsorted(a_thread, thread, "left"), np.searchsorted(a_thread, thread, "right")
    for t in np.flatnonzero(np.bincount(thread[hi > lo])).tolist():
        q = np.flatnonzero(thread == t)
        a, b = int(lo[q[0]]), int(hi[q[0]])
        reach = np.maximum.accumulate(a_end[a:b])  # the latest end so far on the thread
        j = np.searchsorted(a_start[a:b], end[q], "left") - 1  # the last activity starting before the end
        found = j >= 0
        last = np.where(found, reach[np.maximum(j, 0)], issue[q])
        need[q] = np.clip(last, issue[q], end[q])
    return need
