"""Launching ranks and recording their traces (``overlapprof run``).

- ``launcher`` starts the ranks through torchelastic, one launch per variant;
- ``harness`` is what every rank runs: process group, warm-up, profiler, step timing;
- ``rundir`` names run directories and reads/writes ``run.json`` (no torch: the analyzer
  uses ``rundir.load_run``);
- ``logs`` and ``watchdog`` route rank output and name where a rank hung or failed.

Importing this package imports nothing else (no torch).
"""
