"""How far one configuration's step moves between runs (issues 35 and 37): the what-if and advise
benches' short-step configurations run N times each, interleaved, with the schedule the benches
had until 2026-12-07 (1 warm-up step, 12 traced) and with their steady-state one (STEADY in
whatif_bench.py and advise_bench.py).

A run's step is what both benches take: the median of every rank's profiled host step times
(run.json). Per (configuration, schedule) it prints the N steps, their spread ((max − min) /
median), their standard deviation over their mean, and a run's median wall time (the cost);
the runs pin each rank to a core (``OVERLAPPROF_PIN=1``, as the benches). Quote ``uptime``
with it: on a loaded machine the spread is the load's (benchmarks/RESULTS.md, "steady state").

    python benchmarks/steady_bench.py --runs 6                     # every configuration, both schedules
    python benchmarks/steady_bench.py --runs 8 --only allreduce-async --out /tmp/sb
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

import advise_bench  # noqa: E402
import whatif_bench  # noqa: E402

# (workload, variant, options): the what-if grid's all-reduce (its default sizes), the advise
# bench's FSDP and DDP (DDP with 0.5 MiB buckets, its grid's middle)
CONFIGS = {
    "allreduce-sync": ("allreduce", "sync", {}),
    "allreduce-async": ("allreduce", "async", {}),
    "fsdp-async": ("fsdp", "async", dict(advise_bench.FSDP)),
    "ddp-async-0.5": ("ddp", "async", {**advise_bench.DDP, "bucket_cap_mb": 0.5}),
}
BEFORE = {"--warmup-steps": "1", "--active": "12"}


def steady(workload: str) -> dict:
    """The benches' steady-state schedule for the workload: the what-if bench's for the
    all-reduce (the advise bench's is the same), the advise bench's for the others."""
    if workload in whatif_bench.STEADY:
        return dict(whatif_bench.STEADY[workload])
    s = advise_bench.STEADY[workload]
    return {"--warmup-steps": str(s["warmup_steps"]), "--active": str(s["active"])}


def run_once(name: str, schedule: str, out: Path, tag: str) -> tuple[float, float]:
    """(the run's step ms, its wall seconds)."""
    workload, variant, options = CONFIGS[name]
    flags = BEFORE if schedule == "before" else steady(workload)
    run_id = f"{tag}-{name}-{schedule}".replace(".", "p")
    command = [sys.executable, "-m", "overlapprof", "run", str(REPO / "workloads" / f"{workload}.py"), "--nproc", "2",
               "--variant", variant, "--run-id", run_id, "--out", str(out), "--no-analyze", "-q", "--wait", "0",
               "--warmup", "1", *[x for kv in flags.items() for x in kv]]
    command += [x for k, v in options.items() for x in ("--opt", f"{k}={v}")]
    start = time.time()
    proc = subprocess.run(command, capture_output=True, text=True)
    wall = time.time() - start
    if proc.returncode != 0:
        sys.exit(f"steady_bench: {run_id} failed:\n{proc.stderr[-2000:]}")
    return advise_bench.step_ms(out / f"{run_id}-{variant}"), wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=6, help="runs per configuration and schedule")
    parser.add_argument("--only", action="append", choices=list(CONFIGS), help="configurations (repeatable)")
    parser.add_argument("--out", type=Path, default=None, help="keep the run directories here")
    args = parser.parse_args()
    if args.runs < 2:
        sys.exit("steady_bench: --runs must be at least 2 (a spread needs two runs)")
    os.environ.setdefault("OVERLAPPROF_PIN", "1")
    out = args.out or Path(tempfile.mkdtemp(prefix="steady-bench-"))
    pairs = [(name, schedule) for name in (args.only or CONFIGS) for schedule in ("before", "steady")]
    print(f"load average at the start: {os.getloadavg()[0]:.2f}; {args.runs} runs of each of {len(pairs)}; "
          f"runs in {out}")
    results: dict = {}
    for k in range(args.runs):
        for name, schedule in (pairs if k % 2 == 0 else pairs[::-1]):
            results.setdefault((name, schedule), []).append(run_once(name, schedule, out, f"s{k}"))
    print(f"{'configuration':<16} {'schedule':<8} {'flags':<34} {'steps (ms)':<50} {'spread':>7} {'sd/mean':>7} "
          f"{'wall':>5}")
    for (name, schedule), values in results.items():
        steps = [s for s, _ in values]
        flags = BEFORE if schedule == "before" else steady(CONFIGS[name][0])
        spread = (max(steps) - min(steps)) / statistics.median(steps)
        print(f"{name:<16} {schedule:<8} {' '.join(f'{k} {v}' for k, v in flags.items()):<34} "
              f"{' '.join(f'{s:.2f}' for s in sorted(steps)):<50} {100 * spread:>6.1f}% "
              f"{100 * statistics.pstdev(steps) / statistics.mean(steps):>6.1f}% "
              f"{statistics.median(w for _, w in values):>4.1f}s")
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
