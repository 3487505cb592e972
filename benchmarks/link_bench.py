"""What overlap buys over an emulated link: sync vs async per workload and ``--link-rate``.

For each workload (ring, allreduce) and rate (plain loopback, then each ``--rates`` entry) this
launches one real ``overlapprof run`` of both variants (CPU/gloo, ``--nproc`` ranks, the rate as
``--link-rate``), then prints, per (workload, rate):

    speedup = median(sync unprofiled step times) / median(async unprofiled step times)

host-measured in run.json (steps with the profiler off), pooled over ranks and cycles, with its
spread ``[q25(sync)/q75(async), q75(sync)/q25(async)]`` (the quartiles of each side crossed: a
range that excludes 1.0 is a real difference), and

    exposed saved = 1 - median(async exposed_comm_us) / median(sync exposed_comm_us)

from the traces (per-step medians, overlapprof.compare), with the quartiles of each variant's
per-step exposed communication (ms). Target (docs/running-workloads.md): ring and allreduce async >= 1.3x faster
than sync at 2gbit with 4 ranks on a 2-core machine.

    python benchmarks/link_bench.py                         # ring + allreduce, 4 ranks
    python benchmarks/link_bench.py --workload ring --rates 2gbit --repeat 3
    python benchmarks/link_bench.py --rates 2gbit --no-loopback --burst 131072,1048576 --latency 10,100
    python benchmarks/link_bench.py --workload ring --rates 2gbit --options "ring=--chunk 32768"

``--burst`` and ``--latency`` (comma-separated; tbf's burst in bytes and queue in ms, passed as
``--link-burst``/``--link-latency``) make one row per combination for each paced rate: what
settings give stable results is read off the spreads.
"""

import argparse
import itertools
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TARGET = 1.3
# Options that make communication and compute of similar size at 2gbit with 4 ranks on 2 cores
# (swept with --options at 2gbit on a quiet machine, tbf burst 128 KiB: ring chunk 65536/131072/262144 with size 512,
# 768; allreduce width 256 with batch 2048-8192 and 4, 6, 8, 12 buckets; docs/running-workloads.md, "An emulated link"). The
# ring's are its defaults.
OPTIONS = {"ring": ["--chunk", "131072", "--size", "512"], "allreduce": ["--width", "256", "--batch", "3072", "--buckets", "12"]}


def launch(workload, rate, args, out, burst=None, latency=None):
    """One ``overlapprof run`` of sync and async; returns (run id, {variant: run.json})."""
    run_id = f"{workload}-{rate or 'loopback'}" + (f"-b{burst}" if burst else "") + (f"-q{latency}" if latency else "")
    command = [sys.executable, "-m", "overlapprof", "run", str(REPO / "workloads" / f"{workload}.py"),
               "--nproc", str(args.nproc), "--variant", "sync", "--variant", "async",
               "--warmup-steps", "2", "--wait", "0", "--warmup", "1", "--active", str(args.active),
               "--repeat", str(args.repeat), "--run-id", run_id, "--out", str(out), "--no-analyze"]
    command += ["--link-rate", rate] if rate else []
    command += ["--link-burst", burst] if rate and burst else []
    command += ["--link-latency", latency] if rate and latency else []
    command += ["--", *args.options.get(workload, OPTIONS[workload])]
    proc = subprocess.run(command, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"link_bench: {workload} at {rate or 'loopback'} failed:\n{proc.stderr[-3000:]}")
    return run_id, {v: json.loads((out / f"{run_id}-{v}" / "run.json").read_text())
                    for v in ("sync", "async")}


def quartiles(values):
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], statistics.median(values), q[2]


def unprofiled(run):
    return [t for info in run["ranks"].values() for t in info["step_times_ms"]["unprofiled"]]


def exposed_ms(run_dir):
    """Per-(rank, step) exposed communication of a run directory's traces, ms."""
    from overlapprof.compare.inputs import load_reports

    reports, _ = load_reports([run_dir])
    return [s.exposed_comm_us / 1000 for r in reports[0].ranks for s in r.steps]


def hidden_of_hideable(out, run_id):
    """What async hid of what it could hide, as tests/test_run_link.py asked of each workload (the
    allreduce's case moved here): (sync exposed - async exposed) / min(sync compute, sync exposed),
    per-step medians of the comparison; the test asked more than 0.3 (HIDDEN_SHARE)."""
    from overlapprof.compare import compare
    from overlapprof.compare.inputs import load_reports

    reports, _ = load_reports([out / f"{run_id}-sync", out / f"{run_id}-async"])
    sync, async_ = compare(reports).variants
    hideable = min(sync.compute_us, sync.exposed_comm_us)
    return (sync.exposed_comm_us - async_.exposed_comm_us) / hideable if hideable else float("nan")


def tbf_of(run):
    """``1024 KiB/100 ms``: the burst and queue of the run's tbf (run.json), "-" on plain loopback."""
    link = run.get("link")
    return f"{link['burst_bytes'] // 1024} KiB/{link['latency_ms']:g} ms" if link else "-"


def row(workload, rate, out, runs, run_id):
    sync_q, async_q = quartiles(unprofiled(runs["sync"])), quartiles(unprofiled(runs["async"]))
    exp_s = quartiles(exposed_ms(out / f"{run_id}-sync"))
    exp_a = quartiles(exposed_ms(out / f"{run_id}-async"))
    saved = 1 - exp_a[1] / exp_s[1] if exp_s[1] else float("nan")
    return [workload, rate or "loopback", tbf_of(runs["sync"]), f"{sync_q[1]:.1f}", f"{async_q[1]:.1f}",
            f"{sync_q[1] / async_q[1]:.2f}x", f"{sync_q[0] / async_q[2]:.2f}-{sync_q[2] / async_q[0]:.2f}",
            f"{exp_s[1]:.1f} ({exp_s[0]:.1f}-{exp_s[2]:.1f})",
            f"{exp_a[1]:.1f} ({exp_a[0]:.1f}-{exp_a[2]:.1f})", f"{100 * saved:+.0f}%",
            f"{hidden_of_hideable(out, run_id):.2f}"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workload", action="append", choices=sorted(OPTIONS))
    parser.add_argument("--rates", default="1gbit,2gbit,10gbit",
                        help="comma-separated tc rates (plain loopback is always run first)")
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--active", type=int, default=5, help="profiled (and unprofiled) steps per cycle")
    parser.add_argument("--repeat", type=int, default=2, help="profiler cycles")
    parser.add_argument("--no-loopback", action="store_true", help="skip the plain-loopback row")
    parser.add_argument("--out", type=Path, help="keep the run directories here")
    parser.add_argument("--burst", default="", help="comma-separated tbf bursts, bytes (default: the run's)")
    parser.add_argument("--latency", default="", help="comma-separated tbf queue lengths, ms (default: the run's)")
    parser.add_argument("--options", action="append", default=[], metavar="WORKLOAD=ARGS",
                        help="workload options instead of OPTIONS[WORKLOAD], e.g. 'ring=--chunk 32768'")
    args = parser.parse_args()
    args.options = {k: shlex.split(v) for k, _, v in (o.partition("=") for o in args.options)}
    sys.path.insert(0, str(REPO))
    from overlapprof.renderers.format import text_table

    rates = ([] if args.no_loopback else [""]) + [r for r in args.rates.split(",") if r]
    header = ["workload", "link", "tbf burst/queue", "sync ms", "async ms", "speedup", "spread",
              "sync exposed ms (q25-q75)", "async exposed ms (q25-q75)", "exposed saved",
              "hidden / hideable (> 0.3)"]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or Path(tmp)
        for workload in args.workload or ["ring", "allreduce"]:
            for rate in rates:
                tbfs = itertools.product(args.burst.split(",") if rate and args.burst else [None],
                                         args.latency.split(",") if rate and args.latency else [None])
                for burst, latency in tbfs:
                    run_id, runs = launch(workload, rate, args, out, burst, latency)
                    rows.append(row(workload, rate, out, runs, run_id))
                    print(f"link_bench: {' '.join(rows[-1])}", file=sys.stderr, flush=True)
    options = "; ".join(f"{w} {' '.join(args.options.get(w, OPTIONS[w]))}" for w in args.workload or OPTIONS)
    print(f"{args.nproc} ranks ({options}); step times: unprofiled host steps, median over ranks x "
          f"{args.active * args.repeat} steps; link shared by all ranks; target {TARGET}x at 2gbit")
    print(text_table(header, rows))


if __name__ == "__main__":
    main()
