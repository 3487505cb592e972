"""The run directory: what ``overlapprof run`` writes and the analyzer reads, the one ground the
launching side (:mod:`overlapprof.launch`) and the reading side share. No torch; it imports
nothing of ours but ``report``, ``errors`` and ``units``, so neither side reaches into the other.

- :mod:`~overlapprof.rundir.run_record`: ``run.json``'s schema (typed records, msgspec) and the
  machine-load rule a comparison applies to them;
- :mod:`~overlapprof.rundir.directory`: a run directory's layout, naming, creating or joining,
  merging its fragments into ``run.json`` (the one writer) and ``load_run`` (the one reader);
- :mod:`~overlapprof.rundir.schedule`: the profiler's schedule (``ProfilerSchedule``), one
  declaration with its defaults for ``overlapprof run``, ``overlapprof.profile`` and run.json;
- :mod:`~overlapprof.rundir.blame`: which rank a failed run is blamed on, the run's status, and
  the note its readers print (``status_note``).

Importing this package imports none of them; the reading side finds a run directory by its
:data:`RUN_FILE` without them.
"""

RUN_FILE = "run.json"  # a run directory's record: what makes a folder one
