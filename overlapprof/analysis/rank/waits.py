"""GPU need times from CUDA sync events, measured a batch of GPU events at a time.

What :func:`~overlapprof.analysis.rank.events.extract` computes over a whole file
(``events._waited_for``: when the program needed each communication event's result, from the
``Stream Wait Event`` rows of ``enable_cuda_sync_events``), for a rank whose GPU events are
classified a time bucket at a time (:mod:`overlapprof.analysis.rank.bounded`). A wait on stream
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
            self.first_after = np.full(self.ts.size, np.inf)
            self.reach_before = np.full(self.ts.size, -np.inf)

    def add_gpu(self, stream: np.ndarray, launch: np.ndarray, end: np.ndarray) -> None:
        """GPU events whose launch was found: their stream's thread code, launch time and end."""
        self._ready()
        if self.ts.size == 0 or launch.size == 0:
            return
        for s in np.intersect1d(self.stream, stream).tolist():
            q = np.flatnonzero(self.stream == s)
            on_w = stream == s
            order = np.argsort(launch[on_w], kind="stable")
            starts, reach = launch[on_w][order], np.maximum.accumulate(end[on_w][order])
            idx = np.searchsorted(starts, self.ts[q], "right")
            after = idx < starts.size
            self.first_after[q[after]] = np.minimum(self.first_after[q[after]], starts[idx[after]])
            before = idx > 0
            self.reach_before[q[before]] = np.maximum(self.reach_before[q[before]], reach[idx[before] - 1])

    def add_comm(self, corr: np.ndarray, ts: np.ndarray, launch_thread: np.ndarray, launch_ts: np.ndarray) -> None:
        """Communication events: their correlation and start (what :meth:`result` keys them by),
        and their launch's thread code and time (NaN: not found)."""
        if ts.size:
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
        for t in np.unique(self.rec_thread).tolist():
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
    return np.array([needs.get(key, np.nan) for key in zip(corr.tolist(), ts.tolist())], dtype=np.float64)
