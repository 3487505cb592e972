"""heap.release gives the pages of freed arrays back to the system after a large rank, and
leaves a small rank alone. Run in a fresh process: its heap holds nothing else."""

from __future__ import annotations

import json
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
                                reason="malloc_trim is glibc's")

SCRIPT = """
import json, sys
import numpy as np
from overlapprof.analysis import heap

def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 >> 20

big = np.ones(3 << 20)  # 24 MB, mmapped: freeing it raises glibc's mmap threshold to 24 MB
del big
arrays, keep = [], []
for _ in range(40):
    arrays.append(np.ones(1 << 20))  # 8 MB each, now from the heap
    keep.append(np.ones(30_000))  # a live block above each: the heap cannot shrink from its top
del arrays
freed = rss_mb()
heap.release(int(sys.argv[1]))
print(json.dumps({"freed": freed, "after": rss_mb()}))
"""


def _run(events: int) -> dict:
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(events)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_a_large_rank_gives_the_free_heap_back():
    from overlapprof.analysis.heap import LARGE_EVENTS

    got = _run(LARGE_EVENTS)
    assert got["freed"] - got["after"] >= 250, got  # 320 MB of freed arrays were held


def test_a_small_rank_is_left_alone():
    got = _run(10)
    assert got["freed"] - got["after"] < 50, got
