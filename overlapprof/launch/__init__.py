"""Launching ranks and recording their traces (``overlapprof run``).

- ``launcher`` starts the ranks through torchelastic, one launch per variant;
- ``harness`` is what every rank runs: process group, warm-up, profiler, step timing;
- ``recording`` and ``host``: the profiler of a rank's loop, and what the host is;
- ``logs`` and ``watchdog`` route rank output and name where a rank hung or failed.

The run directory these write (``run.json``, the fragments, the failure records) is
:mod:`overlapprof.rundir`, shared with the reading side. Importing this package imports nothing
else (no torch).
"""
