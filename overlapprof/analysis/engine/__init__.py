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
