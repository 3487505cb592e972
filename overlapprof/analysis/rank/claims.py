"""The shared record of how far each range of a parallel read is read, for work stealing
(:mod:`overlapprof.analysis.rank.parallel_scan`)."""

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
    folder that every process maps (the pool's inherit it when they are forked). The reader
    claims each piece before it decodes it (:meth:`claim`, through
    :class:`~overlapprof.trace.ranges.RangeText`); this process, with no range of its own left,
    takes the second half of what is not claimed yet (:meth:`steal`), so that a dense range
    (mtia's first half: complete events with large args, against its second half of metadata)
    does not leave it waiting. A lock of the file (``lockf``: a process's own, let go if it
    dies) makes claim and steal atomic."""

    def __init__(self, folder: str, count: int):
        import mmap

        size = 16 * max(count, 1)  # [end, claimed] per range
        self.fd = os.open(os.path.join(folder, "claims"), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        os.ftruncate(self.fd, size)
        self._map = mmap.mmap(self.fd, size)
        self.slots = memoryview(self._map).cast("q")

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
