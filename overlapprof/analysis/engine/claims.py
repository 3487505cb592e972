"""The shared record of how far each range of a parallel read is read, for work stealing
(:mod:`overlapprof.analysis.engine.parallel`)."""

from __future__ import annotations

import os

try:
    import fcntl
except ImportError:  # not POSIX: no fork either
    fcntl = None


def can_share() -> bool:
    """Whether processes can be forked and share claims here (POSIX)."""
    return fcntl is not None and hasattr(os, "fork")


class Claims:
    """Work stealing between this process and the pool's: for each range handed to the pool,
    its end and how far its reader has given out pieces (``claimed``), in a file of the spool
    folder that every process maps (a pool's task opens it by its path, :meth:`attach`). The reader
    claims each piece before it decodes it (:meth:`claim`, through
    :class:`~overlapprof.trace.ranges.RangeText`); this process, with no range of its own left,
    takes the second half of what is not claimed yet (:meth:`steal`), so that a dense range
    (mtia's first half: complete events with large args, against its second half of metadata)
    does not leave it waiting. A lock of the file (``lockf``: a process's own, let go if it
    dies) makes claim and steal atomic."""

    def __init__(self, folder: str, count: int):
        size = 16 * max(count, 1)  # [end, claimed] per range
        self.path = os.path.join(folder, "claims")
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        os.ftruncate(fd, size)
        self._open(fd, size)

    def _open(self, fd: int, size: int) -> None:
        import mmap

        self.fd = fd
        self._map = mmap.mmap(fd, size)
        self.slots = memoryview(self._map).cast("q")

    @classmethod
    def attach(cls, path: str) -> Claims:
        """The claims another process made at ``path`` (a task of its pool); :meth:`close` it."""
        self = cls.__new__(cls)
        self.path = path
        fd = os.open(path, os.O_RDWR)
        self._open(fd, os.fstat(fd).st_size)
        return self

    def close(self) -> None:
        self.slots.release()
        self._map.close()
        os.close(self.fd)

    def _lock(self) -> None:
        fcntl.lockf(self.fd, fcntl.LOCK_EX)

    def _unlock(self) -> None:
        fcntl.lockf(self.fd, fcntl.LOCK_UN)

    def open(self, slot: int, a: int, b: int) -> None:
        self.slots[2 * slot], self.slots[2 * slot + 1] = b, a

    def claim(self, slot: int, hi: int) -> int:
        """Record the event starts below ``hi`` as read (no further than the end); the end."""
        self._lock()
        try:
            end = self.slots[2 * slot]
            self.slots[2 * slot + 1] = min(hi, end)
            return end
        finally:
            self._unlock()

    def steal(self, slot: int, least: int, skip_cost: float = 0.0, free: int | None = None) -> tuple[int, int] | None:
        """``(cut, end)``: the range now ends at ``cut`` and ``[cut, end)`` is the thief's; None
        when that would be less than ``least`` bytes. The cut makes both finish together: the
        reader decodes ``cut - claimed``, the thief first inflates and drops the ``cut`` bytes
        before its range (gzip, at ``skip_cost`` a byte) and decodes ``end - cut``, so
        ``cut = (end + claimed) / (2 - skip_cost)``: the middle of what is left for plain JSON.
        From ``free`` on (gzip text this process kept on its way, ``ranges.Kept``) reaching it
        costs nothing: the cut is then the middle, or ``free`` if that is lower and sooner done."""
        self._lock()
        try:
            end, claimed = self.slots[2 * slot], self.slots[2 * slot + 1]
            cut = (end + claimed) / (2 - skip_cost)
            if free is not None:
                cut = min(cut, max((end + claimed) / 2, free))
            cut = int(cut)
            if end - cut < least:
                return None
            self.slots[2 * slot] = cut
            return cut, end
        finally:
            self._unlock()
