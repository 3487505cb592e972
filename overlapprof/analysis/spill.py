"""Rows kept on disk: records of one numpy dtype appended a chunk at a time to segments of one
file (:class:`SpillLog`) and read back whole or a window at a time (:class:`SpillFile`), and bins
that rows are routed to by a bucket number (:class:`Buckets`).

What a :class:`~overlapprof.analysis.engine.store.Store` writes past its budget: memory then
holds a chunk and each bin's write buffer, whatever the trace's size. Every bin of a store writes
to one file (:class:`SpillLog`), read with plain reads, not mapped (the pages of a mapped file
count in a process's resident memory), into arrays that are let go of once used.
"""

from __future__ import annotations

import os
import sys
import threading

import numpy as np

from overlapprof.errors import SpillError

# Each spilled bin's write buffer (bytes): a few dozen bins are written at once.
WRITE_BUFFER = 1 << 16


def folder_name() -> str:
    """A path for a new private folder (``overlapprof-*``) in ``$TMPDIR`` as it is set now
    (``tempfile`` reads it once per process), or the system's temporary folder; not made yet.
    The caller records it, then makes it (:func:`make_folder`) and removes it: a SIGTERM that
    unwinds between the two (``tempfile.mkdtemp`` made and named it in one call, and one that
    landed before its caller stored the name left the folder behind) leaves nothing unrecorded."""
    import secrets
    import tempfile

    return os.path.join(os.environ.get("TMPDIR") or tempfile.gettempdir(), f"overlapprof-{secrets.token_hex(6)}")


def make_folder(path: str) -> None:
    """Make the folder :func:`folder_name` named, private to this user."""
    os.mkdir(path, 0o700)


def spill_error(label: str, error: OSError) -> SpillError:
    """The one line that says the files of ``label``'s rows could not be made, written or read
    back: the machine is at fault (:class:`~overlapprof.analysis.engine.store.Store`)."""
    base = os.environ.get("TMPDIR") or "/tmp"
    return SpillError(f"past the memory budget: cannot keep the events of {label} on disk in {base} "
                      f"({error.strerror or error}); set TMPDIR to a folder with room")


class SpillFailed(Exception):
    """The files cannot be made, written or read back (a full disk, too many open files): the
    ``OSError`` with the spill's ``path``."""

    def __init__(self, path: str, error: OSError):
        self.path, self.error = path, error
        super().__init__(f"{path}: {error.strerror or error}")


class SpillLog:
    """One file that every bin of a store writes to (created here): a bin's records are a list of
    *segments* (offset, bytes) of it, written and read at their offsets. One file, not one a
    bin: a store past its budget has hundreds of bins (a bucket's rows of each kind), and making a
    file costs from 40 µs to a millisecond on a slow or network file system (0.9 ms in this
    project's test VM's ``/tmp``: 7 of a 10 s test's seconds), and each open file a descriptor. A
    removed bin's bytes are given back to the file system where it can punch holes (Linux),
    else when the store closes."""

    def __init__(self, path: str):
        self.path, self.end, self.live = path, 0, 0  # live: bytes of the segments not removed
        self._lock = threading.Lock()  # bins are written and read from two threads (the engine's ``ahead``)
        try:
            self._file = open(path, "x+b", buffering=0)  # noqa: SIM115 - closed by close()
        except OSError as exc:
            raise SpillFailed(path, exc) from None

    def write(self, data: memoryview) -> int:
        """Where ``data`` went (its offset), written whole."""
        with self._lock:
            at = self.end
            try:
                self._file.seek(at)
                done = 0
                while done < data.nbytes:
                    done += self._file.write(data[done:])
            except OSError as exc:
                raise SpillFailed(self.path, exc) from None
            self.end += data.nbytes
            self.live += data.nbytes
        return at

    def read_into(self, out: memoryview, at: int) -> None:
        with self._lock:
            try:
                self._file.seek(at)
                done = 0
                while done < out.nbytes:
                    got = self._file.readinto(out[done:])
                    if not got:
                        raise OSError(5, "the file ended early")
                    done += got
            except OSError as exc:
                raise SpillFailed(self.path, exc) from None

    def release(self, at: int, nbytes: int) -> None:
        with self._lock:
            self.live -= nbytes
            _punch(self._file.fileno(), at, nbytes)

    def close(self) -> None:
        self._file.close()
        try:
            os.remove(self.path)
        except OSError:
            pass  # the folder is removed after


def _punch(fd: int, at: int, nbytes: int) -> None:
    """Give the file system back ``nbytes`` at ``at`` (a hole; the file keeps its size), where it can."""
    global _fallocate
    if _fallocate is None:
        try:
            import ctypes

            if not sys.platform.startswith("linux"):
                raise OSError("no fallocate(PUNCH_HOLE)")
            _fallocate = ctypes.CDLL(None, use_errno=True).fallocate
            _fallocate.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)
        except (OSError, AttributeError):
            _fallocate = False
    if _fallocate:
        _fallocate(fd, _PUNCH_HOLE | _KEEP_SIZE, at, nbytes)  # a file system that cannot: the space waits for close


_fallocate = None
_PUNCH_HOLE, _KEEP_SIZE = 0x02, 0x01  # linux/falloc.h


class SpillFile:
    """Records of ``dtype`` appended in order to segments of ``log``: gathered in memory up to
    :data:`WRITE_BUFFER` bytes, a segment each time (a batch as large is a segment of its own)."""

    def __init__(self, log: SpillLog, dtype: np.dtype):
        self.log, self.dtype, self.rows = log, np.dtype(dtype), 0
        self.segments: list[tuple[int, int]] = []  # (offset, bytes), in order
        self._buffer = bytearray()

    def append(self, records: np.ndarray) -> None:
        if not records.size:
            return
        data = memoryview(np.ascontiguousarray(records, self.dtype)).cast("B")
        self.rows += records.size
        if data.nbytes >= WRITE_BUFFER:
            self._flush()
            self.segments.append((self.log.write(data), data.nbytes))
            return
        self._buffer += data
        if len(self._buffer) >= WRITE_BUFFER:
            self._flush()

    def _flush(self) -> None:
        if self._buffer:
            self.segments.append((self.log.write(memoryview(self._buffer)), len(self._buffer)))
            self._buffer = bytearray()

    def read(self) -> np.ndarray:
        """Every record (the bin stays)."""
        return self.span(0, self.rows)

    def windows(self, rows: int):
        """The records, at most ``rows`` at a time, in order."""
        for lo in range(0, self.rows, rows):
            yield self.span(lo, min(lo + rows, self.rows))

    def span(self, lo: int, hi: int) -> np.ndarray:
        """Records ``lo`` to ``hi`` (not included)."""
        self._flush()
        size = self.dtype.itemsize
        lo, hi = max(lo, 0), min(hi, self.rows)
        out = np.empty(max(hi - lo, 0), dtype=self.dtype)
        if out.size == 0:
            return out
        view = memoryview(out).cast("B")
        want_lo, want_hi, pos = lo * size, hi * size, 0
        for at, nbytes in self.segments:
            a, b = max(want_lo, pos), min(want_hi, pos + nbytes)
            if a < b:
                self.log.read_into(view[a - want_lo : b - want_lo], at + a - pos)
            pos += nbytes
            if pos >= want_hi:
                break
        return out

    def remove(self) -> None:
        for at, nbytes in self.segments:
            self.log.release(at, nbytes)
        self.segments, self._buffer, self.rows = [], bytearray(), 0


def take(records, at):
    """``records[at]``, for rows or for a dict of columns (a field each)."""
    return {k: v[at] for k, v in records.items()} if isinstance(records, dict) else records[at]


class Buckets:
    """Bins (spill files, or the store's bins: anything with ``append`` and ``remove``);
    :meth:`route` sends each record to the bin of its bucket number, keeping the records' order
    within a bucket."""

    def __init__(self, files: list):
        self.files = files

    def __len__(self) -> int:
        return len(self.files)

    def __iter__(self):
        return iter(self.files)

    def route(self, bucket: np.ndarray, records) -> None:
        """``records``: rows, or a dict of columns (:func:`take`)."""
        if len(self.files) == 1:
            self.files[0].append(records)
            return
        if len(self.files) <= np.iinfo(np.int16).max:  # a stable sort of int16 is a radix sort: 5x faster
            bucket = bucket.astype(np.int16)
        order = np.argsort(bucket, kind="stable")
        bounds = np.searchsorted(bucket[order], np.arange(len(self.files) + 1))
        records = take(records, order)
        for k in np.flatnonzero(np.diff(bounds)).tolist():
            self.files[k].append(take(records, slice(bounds[k], bounds[k + 1])))

    def remove(self) -> None:
        for f in self.files:
            f.remove()


class Sample:
    """An evenly thinned sample of the values added, at most ``size`` of them: every
    ``stride``-th, the stride doubling (and every other value kept dropped) when it is full."""

    def __init__(self, size: int = 1 << 16):
        self.size, self.stride, self.offset = size, 1, 0
        self.values = np.empty(0, dtype=np.float64)

    def add(self, values: np.ndarray) -> None:
        picked = values[(self.stride - self.offset) % self.stride :: self.stride]
        self.offset = (self.offset + values.size) % self.stride
        self.values = np.concatenate((self.values, picked))
        while self.values.size > self.size:
            self.values = self.values[::2]
            self.offset = self.offset % (2 * self.stride)  # keeps the cadence close; exactness does not matter
            self.stride *= 2

    def quantiles(self, count: int) -> np.ndarray:
        """``count - 1`` cut points that split the values into ``count`` parts of about equal size."""
        return cut_points(self.values, count)


def cut_points(values: np.ndarray, count: int) -> np.ndarray:
    """The distinct cut points, sorted, that split ``values`` into ``count`` parts of about equal
    size: numpy's linear quantiles, without ``np.quantile``/``np.unique`` (which import
    ``numpy.ma`` on first use: 15 ms of every rank's first analysis)."""
    if count <= 1 or values.size == 0:
        return np.empty(0, dtype=np.float64)
    v = np.sort(values)
    at = np.arange(1, count) / count * (v.size - 1)
    lo = np.floor(at).astype(np.int64)
    hi = np.minimum(lo + 1, v.size - 1)
    q = np.maximum.accumulate(v[lo] + (v[hi] - v[lo]) * (at - lo))
    keep = np.ones(q.size, dtype=bool)
    keep[1:] = q[1:] != q[:-1]
    return q[keep]
