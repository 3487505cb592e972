"""How well the baseline's overlap bound predicts the overlapping variant (issue 26), and what
overlap buys, over sizes from communication-bound to compute-bound.

For each configuration (workload, ranks, option) and repeat this launches one real
``overlapprof run`` of the sync and async variants over ``--link-rate`` (CPU/gloo), then reads
them with ``overlapprof.compare`` and prints, per configuration and repeat:

- the measured step times (median ProfilerStep of each variant, ms), the speedups (traced, and
  unprofiled host steps, with their 95% bootstrap intervals);
- ``predicted``: the sync run's overlap bound (median per step, OVERLAP.md section 6.2), and its
  error against the measured async step: ``predicted / async − 1`` (negative: optimistic);
- ``comm-free``: the old bound (sync step − exposed) and its error, for comparison;
- the load average before and after the pair (a busy host moves results: quote idle runs).

Then, per group (workload × ranks): mean error, mean |error| and range over every run.
Target (issue 26): mean |error| at most 10% on the ring.

    python benchmarks/bound_bench.py                                   # the full sweep (~20 min idle)
    python benchmarks/bound_bench.py --ring-sizes 512,640 --nproc 4 --repeat 1 --no-allreduce
    python benchmarks/bound_bench.py --out /tmp/bb                     # keep the run directories
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
TARGET = 0.10


def load() -> float:
    return os.getloadavg()[0]


def launch(workload: str, nproc: int, opts: list[str], rate: str, out: Path, run_id: str, active: int) -> None:
    command = [sys.executable, "-m", "overlapprof", "run", str(REPO / "workloads" / f"{workload}.py"),
               "--nproc", str(nproc), "--variant", "sync", "--variant", "async", "--link-rate", rate,
               "--active", str(active), "--run-id", run_id, "--out", str(out), "--no-analyze", "-q"]
    for opt in opts:
        command += ["--opt", opt]
    proc = subprocess.run(command, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"bound_bench: {run_id} failed:\n{proc.stderr[-3000:]}")


def measure(out: Path, run_id: str) -> dict:
    from overlapprof.compare import compare
    from overlapprof.compare.inputs import load_reports

    reports, _ = load_reports([out / f"{run_id}-sync", out / f"{run_id}-async"])
    sync, async_ = compare(reports).variants
    return {
        "sync": sync.step_us / 1e3, "async": async_.step_us / 1e3,
        "speedup": async_.speedup, "speedup_ci": async_.speedup_ci,
        "host": async_.host_speedup, "host_ci": async_.host_speedup_ci,
        "predicted": sync.overlap_bound_us / 1e3 if sync.overlap_bound_us else None,
        "own": async_.overlap_bound_us / 1e3 if async_.overlap_bound_us else None,
        "comm_free": sync.comm_free_bound_us / 1e3,
        "slowdown": async_.compute_slowdown,
        "form": sync.overlap_bound_form,
    }


def _ci(value, ci) -> str:
    return "-" if value is None else f"{value:.2f}x" + (f" [{ci[0]:.2f}-{ci[1]:.2f}]" if ci else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ring-sizes", default="384,512,640,704,768", help="ring --opt size values")
    parser.add_argument("--allreduce-widths", default="128,256", help="allreduce --opt width values")
    parser.add_argument("--nproc", type=int, action="append", help="ranks (default: 2 and 4)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--active", type=int, default=16, help="profiled (and unprofiled) steps")
    parser.add_argument("--rate", default="2gbit")
    parser.add_argument("--no-allreduce", action="store_true")
    parser.add_argument("--out", type=Path, help="keep the run directories here")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    from overlapprof.renderers.format import text_table

    nprocs = args.nproc or [2, 4]
    configs = [("ring", n, [f"size={s}"]) for n in nprocs for s in args.ring_sizes.split(",") if s]
    if not args.no_allreduce:
        configs += [("allreduce", 4, [f"width={w}"]) for w in args.allreduce_widths.split(",") if w]
    head = ["workload", "ranks", "option", "rep", "load", "sync ms", "async ms", "speedup traced",
            "speedup unprofiled", "slowdown", "predicted ms", "error", "async's own bound ms", "comm-free ms",
            "comm-free error"]
    rows, errors, free_errors = [], {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or Path(tmp)
        for rep in range(args.repeat):  # repeats interleaved: a burst of load hits one of each, not one config
            for workload, nproc, opts in configs:
                run_id = f"{workload}{nproc}-{'-'.join(o.replace('=', '') for o in opts)}-r{rep}"
                before = load()
                started = time.time()
                launch(workload, nproc, opts, args.rate, out, run_id, args.active)
                m = measure(out, run_id)
                after = load()
                err = m["predicted"] / m["async"] - 1 if m["predicted"] else None
                free = m["comm_free"] / m["async"] - 1
                group = f"{workload} x{nproc}"
                if err is not None:
                    errors.setdefault(group, []).append(err)
                free_errors.setdefault(group, []).append(free)
                rows.append([workload, str(nproc), " ".join(opts), str(rep), f"{before:.1f}-{after:.1f}",
                             f"{m['sync']:.2f}", f"{m['async']:.2f}", _ci(m["speedup"], m["speedup_ci"]),
                             _ci(m["host"], m["host_ci"]), f"{m['slowdown']:.2f}x",
                             "-" if m["predicted"] is None else f"{m['predicted']:.2f}",
                             "-" if err is None else f"{100 * err:+.0f}%",
                             "-" if m["own"] is None else f"{m['own']:.2f}", f"{m['comm_free']:.2f}",
                             f"{100 * free:+.0f}%"])
                print(f"bound_bench: {' | '.join(rows[-1])} ({time.time() - started:.0f} s)", file=sys.stderr,
                      flush=True)
    print(f"{args.rate} shared link; steps: median ProfilerStep per variant (ms); predicted = the sync run's overlap "
          f"bound; error = predicted / async - 1 (negative: optimistic); load = 1-min load average before-after")
    print(text_table(head, rows))
    print()
    summary = [[group, str(len(errs)), f"{100 * statistics.mean(errs):+.1f}%",
                f"{100 * statistics.mean(abs(e) for e in errs):.1f}%", f"{100 * min(errs):+.0f}..{100 * max(errs):+.0f}%",
                f"{100 * statistics.mean(abs(e) for e in free_errors[group]):.1f}%"]
               for group, errs in errors.items()]
    print(text_table(["group", "runs", "mean error", "mean |error|", "range", "comm-free mean |error|"], summary))
    ring = [abs(e) for g, errs in errors.items() if g.startswith("ring") for e in errs]
    if ring:
        verdict = "met" if statistics.mean(ring) <= TARGET else "NOT met"
        print(f"ring: mean |error| {100 * statistics.mean(ring):.1f}% over {len(ring)} runs; target "
              f"<= {100 * TARGET:.0f}%: {verdict}")


if __name__ == "__main__":
    main()
