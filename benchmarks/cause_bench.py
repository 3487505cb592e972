"""Predict, then run: does removing a planted cause of exposure save the time attributed to it?

For each planted cause (issue 26) this runs the same workload with and without it, interleaved,
``--repeat`` times, on CPU/gloo ranks over an emulated link, and prints per pair:

- ``attributed``: per step, the µs the analysis gave the planted cause with it in, minus what it
  gave that cause without it: the medians over the steps of the rank where that difference is
  largest, with the 95% bootstrap interval of that difference (the same resampling as below).
  A barrier is a host synchronization that also waits for the last rank to arrive: its time is
  host_blocked on that rank and late_peer (waiting at it) on the others, so the host_blocked plant
  counts both;
- ``saved``: the step time without the cause subtracted from the step time with it (medians over
  every (rank, step) pair, ms), with the 95% bootstrap interval of that difference (the
  comparison's resampling: each run's steps drawn with replacement, seeded);
- whether the two intervals overlap (the attribution agrees with the measurement within their
  spread), and the ratio attributed / saved.

Plants (workload options): ``late_peer`` rank 1 sleeps ``--slow-ms`` before each step (ring);
``host_blocked`` a host synchronization in the async ring's window (a barrier on CPU);
``queued`` an extra all_reduce of 1 MiB just before the buckets' (allreduce).

    python benchmarks/cause_bench.py                  # every plant, 3 pairs each
    python benchmarks/cause_bench.py --plant late_peer --repeat 5
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent

# cause: (workload, variant, options with it, options without it). Each in a regime where the
# cause is what the step waits for: removing it can save at most the time its exposure lasted,
# and saves that only where nothing else (the link) would have kept the step as long.
PLANTS = {
    "late_peer": ("ring", "async", ["slow_rank=1", "slow_ms={slow_ms}"], []),
    # compute-bound: a 1024 matmul outlasts a round's transfer, so without the sync it hides it
    "host_blocked": ("ring", "async", ["size=768", "host_sync=true"], ["size=768"]),
    "queued": ("allreduce", "async", ["batch=8192", "extra_numel=262144"], ["batch=8192"]),
}
COUNTED = {"late_peer": ("late_peer",), "host_blocked": ("host_blocked", "late_peer"), "queued": ("queued",)}


def launch(workload, variant, opts, args, out: Path, run_id: str) -> Path:
    command = [sys.executable, "-m", "overlapprof", "run", str(REPO / "workloads" / f"{workload}.py"),
               "--nproc", str(args.nproc), "--variant", variant, "--link-rate", args.rate, "--active",
               str(args.active), "--run-id", run_id, "--out", str(out), "--no-analyze", "-q"]
    for opt in opts:
        command += ["--opt", opt.format(slow_ms=args.slow_ms)]
    proc = subprocess.run(command, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"cause_bench: {run_id} failed:\n{proc.stderr[-3000:]}")
    return out / f"{run_id}-{variant}"


def per_step(report, causes) -> dict[int, np.ndarray]:
    """Rank -> the µs of the causes in each of its steps."""
    return {r.rank: np.array([sum(getattr(s.exposure, f"{c}_us") for c in causes) for s in r.steps])
            for r in report.ranks}


def steps(report) -> np.ndarray:
    return np.array([s.step_us for r in report.ranks for s in r.steps])


def diff_interval(with_it: np.ndarray, without: np.ndarray, seed: int = 0) -> tuple[float, float]:
    """95% bootstrap interval of median(with_it) − median(without), each resampled apart."""
    rng = np.random.default_rng(seed)
    a = np.median(with_it[rng.integers(0, with_it.size, (2000, with_it.size))], axis=1)
    b = np.median(without[rng.integers(0, without.size, (2000, without.size))], axis=1)
    return float(np.percentile(a - b, 2.5)), float(np.percentile(a - b, 97.5))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--plant", action="append", choices=sorted(PLANTS))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--active", type=int, default=16)
    parser.add_argument("--rate", default="2gbit")
    parser.add_argument("--slow-ms", type=float, default=20.0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    from overlapprof import analyze
    from overlapprof.renderers.format import text_table

    head = ["cause", "pair", "load", "step without ms", "step with ms", "saved ms [95%]", "attributed ms [95%]",
            "agree", "attributed / saved"]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or Path(tmp)
        for rep in range(args.repeat):
            for cause in args.plant or list(PLANTS):
                workload, variant, with_opts, without_opts = PLANTS[cause]
                before = os.getloadavg()[0]
                reports = {}
                for name, opts in (("without", without_opts), ("with", with_opts)):
                    run = launch(workload, variant, opts, args, out, f"{cause}-{name}-r{rep}")
                    reports[name] = analyze([str(run)], workers=1)
                after = os.getloadavg()[0]
                a, b = steps(reports["with"]), steps(reports["without"])
                saved = float(np.median(a) - np.median(b))
                low, high = diff_interval(a, b)
                counted = COUNTED[cause]
                with_it, without = per_step(reports["with"], counted), per_step(reports["without"], counted)
                rank = max(with_it, key=lambda r: np.median(with_it[r]) - np.median(without.get(r, np.zeros(1))))
                w, o = with_it[rank], without.get(rank, np.zeros(1))
                attributed = float(np.median(w) - np.median(o))
                a_low, a_high = diff_interval(w, o)
                agree = a_low <= high and low <= a_high
                rows.append([cause, str(rep), f"{before:.1f}-{after:.1f}", f"{np.median(b) / 1e3:.2f}",
                             f"{np.median(a) / 1e3:.2f}", f"{saved / 1e3:+.2f} [{low / 1e3:+.2f}..{high / 1e3:+.2f}]",
                             f"{attributed / 1e3:+.2f} [{a_low / 1e3:+.2f}..{a_high / 1e3:+.2f}]",
                             "yes" if agree else "no", f"{attributed / saved:.2f}" if saved else "-"])
                print(f"cause_bench: {' | '.join(rows[-1])}", file=sys.stderr, flush=True)
    print(f"{args.nproc} CPU ranks over {args.rate}; {args.active} profiled steps a run; saved = median step with "
          f"the cause - without it; attributed = the cause's µs per step with it - without it (its largest rank)")
    print(text_table(head, rows))


if __name__ == "__main__":
    main()
