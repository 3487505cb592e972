"""How the analysis runs, apart from what it measures (issue 36).

- :mod:`~overlapprof.analysis.engine.pool`: where work runs beyond this process: the stdlib's
  forked process pool or a Dask cluster, behind one protocol (:class:`~overlapprof.analysis.engine.pool.Pool`);
- :mod:`~overlapprof.analysis.engine.parallel`: one large file read by several processes, a
  byte range each, with work stealing (:mod:`~overlapprof.analysis.engine.claims`);
- :mod:`~overlapprof.analysis.engine.store`: batches of rows kept in memory up to a budget and
  on disk past it.

Nothing that measures imports this package (``tests/test_architecture.py``): the orchestration
(:mod:`overlapprof.analysis.analyzer`) builds what it needs here and hands it to the measuring
code as arguments (a reader, a store), so every piece of state a worker uses is passed to it,
none inherited through ``fork``.
"""

import os

from overlapprof.trace.ranges import text_bytes

# Below this much text (bytes, decompressed) a file is read in one process
# (:mod:`~overlapprof.analysis.engine.parallel`). Here, not there: the analyzer checks a rank's
# files against it before it imports that module, which a small rank does not need. On a quiet
# 2-core machine, `overlapprof analyze` end to end with two workers against one (2026-12-03,
# fastest of 5): 20 MB of plain JSON 0.334 -> 0.307 s, 40 MB 0.528 -> 0.457 s (gzip 0.553 ->
# 0.439 s), the 87 MB mtia trace 0.535 -> 0.432 s (gzip), 80 MB plain 0.895 -> 0.634 s.
PARALLEL_MIN_TEXT = int(os.environ.get("OVERLAPPROF_PARALLEL_MIN_MB", "16")) << 20


def may_split(path) -> bool:
    """Whether :func:`~overlapprof.analysis.engine.parallel.read` may read the file in several
    processes (else it reads it in one, and the caller need not import it): its text
    (:func:`~overlapprof.trace.ranges.text_bytes`, at least what that reader's probe finds) is
    not under :data:`PARALLEL_MIN_TEXT`."""
    try:
        return text_bytes(path) >= PARALLEL_MIN_TEXT
    except OSError:
        return True  # the reader says what is wrong
