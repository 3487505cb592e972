"""Interval boundaries held in memory up to a budget and sorted run files past it, read back a
window of consecutive positions at a time (an external merge sort): what the engine's prototype
(:mod:`overlapprof.analysis.rank.coverage`) sweeps, whatever order its batches come in and
whatever the trace's size.

Past the budget the held boundaries are sorted by position and written to a *run file* (in a
private folder of ``$TMPDIR``); past :data:`MAX_RUNS` files they are merged into one, so a window
reads from few files. A small trace's boundaries never leave memory.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import numpy as np

from overlapprof.analysis.spill import new_folder
from overlapprof.analysis.sweep import BOUNDARY, boundary_records

BUDGET_BYTES = 64 << 20  # boundaries held in memory before the held ones go to a run file
WINDOW_ROWS = 1 << 18  # boundaries swept at once (about 90 bytes each while swept)
MAX_RUNS = 32  # run files before they are merged into one


class Boundaries:
    """Boundaries held up to ``budget`` bytes; past it, each full hold is sorted and written to a
    run file in a folder of its own (removed by :meth:`remove`)."""

    def __init__(self, budget: int = BUDGET_BYTES):
        self.budget, self.held, self.held_bytes = budget, [], 0
        self.folder: str | None = None
        self.runs: list[str] = []
        self.made = 0  # run files written (merged ones included)

    def add(self, start: np.ndarray, end: np.ndarray, seg, cls: int) -> None:
        rec = boundary_records(start, end, seg, cls)
        if rec is None:
            return
        self.held.append(rec)
        self.held_bytes += rec.nbytes
        if self.held_bytes > self.budget:
            self._spill()

    def _spill(self) -> None:
        if self.folder is None:
            self.folder = new_folder()
        rec = np.concatenate(self.held)
        self.held, self.held_bytes = [], 0
        rec = rec[np.argsort(rec["pos"], kind="stable")]
        self.runs.append(self._path())
        rec.tofile(self.runs[-1])
        if len(self.runs) >= MAX_RUNS:  # merged into one, so that a window reads from few files
            path = self._path()
            with open(path, "wb") as f:
                for window in _merged(self.runs, WINDOW_ROWS):
                    window[np.argsort(window["pos"], kind="stable")].tofile(f)
            for old in self.runs:
                os.remove(old)
            self.runs = [path]

    def _path(self) -> str:
        self.made += 1
        return os.path.join(self.folder, f"run{self.made}")

    def windows(self, rows: int = WINDOW_ROWS) -> Iterator[np.ndarray]:
        """Every boundary, in windows of consecutive positions of about ``rows`` (all those at one
        position in one window)."""
        if not self.runs:
            rec = np.concatenate(self.held) if self.held else np.empty(0, dtype=BOUNDARY)
            self.held = []
            if rec.size <= rows:
                yield rec
                return
            rec = rec[np.argsort(rec["pos"], kind="stable")]
            pos = rec["pos"]
            a = 0
            while a < rec.size:  # cut where the position changes, so one position is in one window
                b = min(a + rows, rec.size)
                if b < rec.size:
                    b = int(np.searchsorted(pos, pos[b], "left"))
                    b = b if b > a else int(np.searchsorted(pos, pos[a], "right"))
                yield rec[a:b]
                a = b
            return
        if self.held:
            self._spill()
        yield from _merged(self.runs, rows)

    def remove(self) -> None:
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)


def _merged(paths: list[str], rows: int) -> Iterator[np.ndarray]:
    """The boundaries of sorted run files, in windows of consecutive positions (about ``rows``
    in all; each window's rows are not sorted)."""
    files = [_RunFile(path, max(1, rows // len(paths))) for path in paths]
    while any(not f.done for f in files):
        for f in files:
            f.fill()
        unread = [f for f in files if f.more]
        cut = min(float(f.buffer["pos"][-1]) for f in unread) if unread else np.inf
        got = [f.take(cut) for f in files]
        if not any(g.size for g in got):  # one position fills a whole buffer: read further there
            next(f for f in unread if float(f.buffer["pos"][-1]) == cut).grow()
            continue
        yield np.concatenate(got)


class _RunFile:
    """A sorted run file read a buffer at a time."""

    def __init__(self, path: str, rows: int):
        self.path, self.rows, self.offset = path, rows, 0
        self.size = os.path.getsize(path) // BOUNDARY.itemsize
        self.buffer = np.empty(0, dtype=BOUNDARY)

    @property
    def more(self) -> bool:  # rows in the file past the buffer
        return self.offset < self.size

    @property
    def done(self) -> bool:
        return not self.more and self.buffer.size == 0

    def fill(self) -> None:
        if self.buffer.size == 0 and self.more:
            self.grow()

    def grow(self) -> None:
        got = np.fromfile(self.path, dtype=BOUNDARY, count=self.rows, offset=self.offset * BOUNDARY.itemsize)
        self.offset += got.size
        self.buffer = np.concatenate((self.buffer, got))

    def take(self, cut: float) -> np.ndarray:
        """The buffered rows before ``cut`` (all of them when ``cut`` is infinite)."""
        k = self.buffer.size if cut == np.inf else int(np.searchsorted(self.buffer["pos"], cut, "left"))
        out, self.buffer = self.buffer[:k], self.buffer[k:]
        return out
