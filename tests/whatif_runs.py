"""Real runs of every workload for the replay's tests: the ones the session already makes for
other tests (conftest's ``runs``, ``workload_runs`` and ``user_runs``), so that the replay adds no
launch of its own (it made 6, 13 variants, ~50 s of CPU, before: issue 36 item 5). Every variant of
every workload that the session runs is replayed: the ring's on 2 ranks (the default schedule) and 4, the
allreduce's on 2, collectives' on 2 and 4 (conftest.variants_run), and ddp, fsdp and pipeline's
sync and async (``user_runs``: 3 profiled steps). A test module imports the fixture:
``from whatif_runs import whatif_runs  # noqa: F401``."""

from __future__ import annotations

import pytest

WORKLOADS = ("ring", "allreduce", "collectives", "ddp", "fsdp", "pipeline")


@pytest.fixture(scope="session")
def whatif_runs(workload_runs, user_runs):
    """``whatif_runs(name)`` -> {label: run directory} of workloads/<name>.py (label: the variant,
    and for the workloads of ``workload_runs`` its ranks, ``async-4``), made on first use by the
    fixtures that own them; each run's command is asserted here."""
    from conftest import USER_WORKLOADS, variants_run

    def get(name):
        if name in USER_WORKLOADS:
            proc = user_runs.procs[name]
            assert proc.returncode == 0, proc.stderr[-3000:]
            return {v: user_runs.dirs[name, v] for v in ("sync", "async")}
        dirs = {}
        for nproc in (2, 4):
            if variants_run(name, nproc):
                made = workload_runs(name, nproc)
                assert made.proc.returncode == 0, made.proc.stderr[-3000:]
                dirs.update({f"{v}-{nproc}": d for v, d in made.dirs.items()})
        assert dirs, name
        return dirs

    return get
