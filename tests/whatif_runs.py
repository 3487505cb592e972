"""Real runs of every workload for the replay's tests, made once per test session: the smallest
sizes and schedule that keep each workload's shape (its communication pattern and overlap), so
the traces, and the replays of them, are small. A test module imports the fixture:
``from whatif_runs import whatif_runs  # noqa: F401``."""

from __future__ import annotations

import pytest

SCHEDULE = ("--warmup-steps", 1, "--wait", 0, "--warmup", 1, "--active", 2)
# workload -> (variants, options)
WORKLOADS = {
    "ring": (("sync", "async"), ("--size", 64, "--chunk", 4096, "--rounds", 2)),
    "allreduce": (("sync", "async"), ("--width", 64, "--batch", 256, "--buckets", 3)),
    "collectives": (("sync", "async", "all_reduce"), ("--size", 64, "--numel", 1024)),
    "ddp": (("sync", "async"), ("--layers", 3, "--width", 128, "--batch", 64, "--bucket_cap_mb", 0.1)),
    "fsdp": (("sync", "async"), ("--layers", 3, "--width", 128, "--batch", 64)),
    "pipeline": (("sync", "async"), ("--layers", 2, "--width", 128, "--batch", 64, "--micro_batches", 4)),
}


@pytest.fixture(scope="session")
def whatif_runs(tmp_path_factory):
    """``whatif_runs(name)`` -> {variant: run directory} of workloads/<name>.py on 2 ranks, made
    on first use and shared (the command's result is asserted there)."""
    from conftest import REPO, _overlapprof

    root = tmp_path_factory.mktemp("whatif_runs")
    made: dict[str, dict] = {}

    def get(name):
        if name not in made:
            variants, options = WORKLOADS[name]
            proc = _overlapprof("run", REPO / "workloads" / f"{name}.py", "--nproc", 2, "--run-id", name, "--out",
                                root, "--no-analyze", "-q", *SCHEDULE, *[a for v in variants for a in ("--variant", v)],
                                "--", *options, timeout=600)
            assert proc.returncode == 0, proc.stderr[-3000:]
            made[name] = {v: root / f"{name}-{v}" for v in variants}
        return made[name]

    return get
