"""How the comparison's intervals narrow with the number of profiled steps (``--active``).

For each ``--active`` value this launches ``--repeat`` real ``overlapprof run``s of the ring
(sync and async, ``--nproc`` ranks, CPU/gloo, one profiler cycle), compares them with
``overlapprof.compare`` (the first, sync, as baseline) and prints, per value, the medians (and
ranges) over the repeats of:

    width    = high - low of the 95% bootstrap interval of the step-time speedup (speedup_ci;
               per-step samples of the traces, (rank, step) pairs)
    host     = the same for the unprofiled-step speedup (host_speedup_ci; host step times)
    speedup  = the step-time speedup itself (baseline step_us / step_us)
    rel      = width / speedup of each run (the interval's width relative to the value)
    run s    = wall seconds of one ``overlapprof run`` of both variants

The default ``--active`` of ``overlapprof run`` is picked from this table: the smallest value
past which the width stops narrowing much, within a run of tens of seconds.

    python benchmarks/active_bench.py                       # --active 3 5 8 12 16, 3 repeats
    python benchmarks/active_bench.py --active 3 8 --repeat 5
"""

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def launch(active: int, nproc: int, out: Path, run_id: str) -> float:
    """One ``overlapprof run`` of sync and async; returns its wall seconds."""
    command = [sys.executable, "-m", "overlapprof", "run", str(REPO / "workloads" / "ring.py"),
               "--nproc", str(nproc), "--variant", "sync", "--variant", "async",
               "--active", str(active), "--run-id", run_id, "--out", str(out), "--no-analyze"]
    start = time.monotonic()
    proc = subprocess.run(command, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"active_bench: --active {active} failed:\n{proc.stderr[-3000:]}")
    return time.monotonic() - start


def widths(out: Path, run_id: str) -> tuple[float | None, float | None, float | None]:
    """(speedup interval width, host speedup interval width, speedup) of one run pair."""
    from overlapprof.analysis import analyze
    from overlapprof.compare import compare

    reports = [analyze([str(out / f"{run_id}-{v}")]) for v in ("sync", "async")]
    async_ = compare(reports, ["sync", "async"]).variants[1]

    def width(ci):
        return None if ci is None else ci[1] - ci[0]

    return width(async_.speedup_ci), width(async_.host_speedup_ci), async_.speedup


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else float("nan")


def relative(row) -> float | None:
    width, _, speedup = row
    return None if width is None or not speedup else width / speedup


def spread(values) -> str:
    values = [v for v in values if v is not None]
    return f"{min(values):.2f}-{max(values):.2f}" if values else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--active", type=int, nargs="+", default=[3, 5, 8, 12, 16])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--nproc", type=int, default=2)
    args = parser.parse_args()
    print(f"ring, {args.nproc} ranks, sync vs async, {args.repeat} runs per --active "
          "(medians over the runs)")
    print(f"{'--active':>8} {'samples':>8} {'width':>7} {'(range)':>11} {'rel':>5} {'host':>7} {'speedup':>8} "
          f"{'(range)':>11} {'run s':>6}")
    with tempfile.TemporaryDirectory(prefix="active_bench-") as tmp:
        for active in args.active:
            rows, seconds = [], []
            for k in range(args.repeat):
                run_id = f"a{active}-{k}"
                seconds.append(launch(active, args.nproc, Path(tmp), run_id))
                rows.append(widths(Path(tmp), run_id))
            print(f"{active:>8} {active * args.nproc:>8} {median(r[0] for r in rows):>7.2f} "
                  f"{spread(r[0] for r in rows):>11} {median(relative(r) for r in rows):>5.2f} "
                  f"{median(r[1] for r in rows):>7.2f} "
                  f"{median(r[2] for r in rows):>7.2f}x {spread(r[2] for r in rows):>11} "
                  f"{median(seconds):>6.1f}", flush=True)


if __name__ == "__main__":
    main()
