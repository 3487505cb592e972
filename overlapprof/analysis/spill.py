"""Rows kept on disk: records of one numpy dtype appended a chunk at a time to a file and read
back whole or a window at a time (:class:`SpillFile`), and files that rows are routed to by a
bucket number (:class:`Buckets`).

What a :class:`~overlapprof.analysis.engine.store.Store` writes past its budget: memory then
holds a chunk and each open file's write buffer, whatever the trace's size. The files are read
with plain reads, not mapped (the pages of a mapped file count in a process's resident memory),
into arrays that are let go of once used.
"""

from __future__ import annotations

import os

import numpy as np

from overlapprof.errors import SpillError

# Each open file's write buffer (bytes): a few dozen files are open at once.
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


class SpillFile:
    """Records of ``dtype`` appended in order to the file ``path`` (created here)."""

    def __init__(self, path: str, dtype: np.dtype):
        self.path, self.dtype, self.rows = path, np.dtype(dtype), 0
        try:
            self._out = open(path, "xb", buffering=WRITE_BUFFER)  # noqa: SIM115 - closed by read, windows or remove
        except OSError as exc:
            raise SpillFailed(path, exc) from None

    def append(self, records: np.ndarray) -> None:
        if records.size:
            try:
                self._out.write(np.ascontiguousarray(records, self.dtype).data)
            except OSError as exc:
                raise SpillFailed(self.path, exc) from None
            self.rows += records.size

    def _close(self) -> None:
        if not self._out.closed:
            try:
                self._out.close()  # writes what is buffered
            except OSError as exc:
                raise SpillFailed(self.path, exc) from None

    def read(self) -> np.ndarray:
        """Every record (the file stays)."""
        self._close()
        try:
            return np.fromfile(self.path, dtype=self.dtype)
        except OSError as exc:
            raise SpillFailed(self.path, exc) from None

    def windows(self, rows: int):
        """The records, at most ``rows`` at a time, in order."""
        self._close()
        try:
            with open(self.path, "rb") as f:
                while True:
                    got = np.fromfile(f, dtype=self.dtype, count=rows)
                    if got.size == 0:
                        return
                    yield got
        except OSError as exc:
            raise SpillFailed(self.path, exc) from None

    def span(self, lo: int, hi: int) -> np.ndarray:
        """Records ``lo`` to ``hi`` (not included)."""
        self._close()
        try:
            with open(self.path, "rb") as f:
                return np.fromfile(f, dtype=self.dtype, count=max(hi - lo, 0), offset=lo * self.dtype.itemsize)
        except OSError as exc:
            raise SpillFailed(self.path, exc) from None

    def remove(self) -> None:
        self._close()
        try:
            os.remove(self.path)
        except OSError:
            pass  # the folder is removed after


def take(records, at):
    """``records[at]``, for rows or for a dict of columns (a field each)."""
    return {k: v[at] for k, v in records.items()} if isinstance(records, dict) else records[at]


class Buckets:
    """Bins (spill files, or the store's bins: anything with ``append`` and ``remove``);
    :meth:`route` sends each record to the bin of its bucket number, keeping the records' order
    within a bucket."""

    def __init__(self, files: list):
        self.files = files

    @classmethod
    def in_folder(cls, folder: str, name: str, dtype: np.dtype, count: int) -> "Buckets":
        """``count`` spill files ``<name>.<k>`` in ``folder``."""
        return cls([SpillFile(os.path.join(folder, f"{name}.{k}"), dtype) for k in range(count)])

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
