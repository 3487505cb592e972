"""Giving the memory of freed arrays back to the operating system between the analysis's phases.

glibc's malloc serves allocations below its mmap threshold from its heap, and that threshold
grows (up to 32 MB) each time a larger array is freed; so after a GB-sized trace's scan most of
the arrays of its chunks and of the classification live in the heap, and the heap keeps their
pages when they are freed while anything above them is still allocated. The next phases' peak
would count those hundreds of MB. ``malloc_trim(0)`` hands every free page of the heap back
(glibc 2.8 and later), in a few ms; it is called only after large ranks (:data:`LARGE_EVENTS`),
and only where glibc is the allocator. (Dask's workers do the same, for the same reason.)
"""

from __future__ import annotations

import sys

LARGE_EVENTS = 1_000_000  # complete events of a rank above which its phases end with a trim
_trim = None


def release(events: int) -> None:
    """After a phase of a rank of ``events`` complete events: give the free heap back, when
    the rank is large and the allocator is glibc's."""
    global _trim
    if events < LARGE_EVENTS or not sys.platform.startswith("linux"):
        return
    if _trim is None:
        import ctypes  # here: a small rank never pays its import

        try:
            _trim = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):  # musl and others: nothing to do
            _trim = lambda _pad: 0  # noqa: E731
    _trim(0)
