"""Profiler overhead of ``overlapprof run``, measured against its own unprofiled steps.

For each workload and variant this launches a real run (``overlapprof run``, CPU/gloo unless
``--device cuda``) with the default profiler schedule (wait 1, warmup 1, active 3) repeated
``--repeat`` times, reads the host-measured step times from the run's ``run.json``, and prints

    ratio = median(profiled step times) / median(unprofiled step times)

pooled over all ranks. Each profiler cycle runs ``active`` steps with the profiler off just
before its own wait/warmup/active steps, so the peer is measured in the same run, interleaved
with the profiled steps. Target: ratio < 1.05. ``paired`` is the same ratio per rank and
cycle (steps seconds apart), then its median: it does not drift with the machine's load.
``spread`` is the 75th over the 25th percentile of the unprofiled steps: when it is far above
the ratio, the machine is too noisy for the ratio to mean much (run with fewer ranks than
cores, or a larger --repeat).

    python benchmarks/overhead_bench.py                       # every workload, 2 ranks
    python benchmarks/overhead_bench.py --nproc 4 --repeat 10 --workload ring
    python benchmarks/overhead_bench.py --device cuda --nproc 1 --workload allreduce --opt width=4096
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TARGET = 1.05


def variants_of(workload):
    from overlapprof.workload import load

    return list(load(REPO / "workloads" / f"{workload}.py").variants)


def launch(workload, variants, args, out):
    """One ``overlapprof run`` of every variant; returns {variant: run.json}."""
    command = [sys.executable, "-m", "overlapprof", "run", str(REPO / "workloads" / f"{workload}.py"),
               "--nproc", str(args.nproc), "--device", args.device, "--repeat", str(args.repeat),
               "--run-id", f"bench-{workload}", "--out", str(out), "--no-analyze"]
    for variant in variants:
        command += ["--variant", variant]
    for opt in args.opt:
        command += ["--opt", opt]
    proc = subprocess.run(command, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"overhead_bench: {workload} failed:\n{proc.stderr[-3000:]}")
    return {v: json.loads((out / f"bench-{workload}-{v}" / "run.json").read_text())
            for v in variants}


def step_times(run, kind):
    return [t for info in run["ranks"].values() for t in info["step_times_ms"][kind]]


def quantile(values, q):
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def paired_ratio(run):
    """Median over (rank, cycle) of median(profiled) / median(unprofiled) within the cycle."""
    active = run["profiler"]["active"]
    ratios = []
    for info in run["ranks"].values():
        times = info["step_times_ms"]
        for start in range(0, len(times["profiled"]), active):
            cycle = slice(start, start + active)
            ratios.append(statistics.median(times["profiled"][cycle])
                          / statistics.median(times["unprofiled"][cycle]))
    return statistics.median(ratios)


def row(workload, variant, run):
    profiled, unprofiled = step_times(run, "profiled"), step_times(run, "unprofiled")
    ratio = statistics.median(profiled) / statistics.median(unprofiled)
    spread = quantile(unprofiled, 75) / quantile(unprofiled, 25)
    return [workload, variant, str(run["world_size"]), f"{statistics.median(profiled):.3f}",
            f"{statistics.median(unprofiled):.3f}", str(len(profiled)), f"{ratio:.3f}",
            f"{paired_ratio(run):.3f}", f"{spread:.2f}", "ok" if ratio < TARGET else "OVER"], ratio


def table(rows, header):
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.rjust(w) if i >= 2 else c.ljust(w) for i, (c, w) in
                        enumerate(zip(r, widths))) for r in rows]
    return "\n".join(lines)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", action="append", choices=["ring", "allreduce", "collectives"],
                        help="workload to measure (repeatable; default: all)")
    parser.add_argument("--nproc", type=int, default=2, help="ranks (default 2)")
    parser.add_argument("--repeat", type=int, default=12,
                        help="profiler cycles of the default schedule (default 12: 36 profiled "
                             "and 36 unprofiled steps per rank)")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--opt", action="append", default=[], metavar="KEY=VALUE",
                        help="a workload option, passed to overlapprof run (repeatable): on a GPU, sizes "
                             "whose kernels outlast the profiler's per-op cost, as a training step's do")
    return parser.parse_args(argv)


def main():
    args = parse_args()
    rows, ratios = [], []
    with tempfile.TemporaryDirectory(prefix="overhead_bench_") as out:
        for workload in args.workload or ["ring", "allreduce", "collectives"]:
            variants = variants_of(workload)
            print(f"overhead_bench: {workload}: {len(variants)} variant(s) on {args.nproc} ranks",
                  file=sys.stderr, flush=True)
            for variant, run in launch(workload, variants, args, Path(out)).items():
                cells, ratio = row(workload, variant, run)
                rows.append(cells)
                ratios.append(ratio)
    header = ["workload", "variant", "ranks", "profiled ms", "unprofiled ms", "steps", "ratio",
              "paired", "spread", f"< {TARGET}"]
    print(table(rows, header))
    print(f"\nmedian ratio over {len(ratios)} variants: {statistics.median(ratios):.3f} "
          f"(profiled / unprofiled step time, medians over ranks and steps; target < {TARGET})")


if __name__ == "__main__":
    main()
