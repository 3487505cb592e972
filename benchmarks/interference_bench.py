"""Predict, then run: is the interference factor measured from one trace real?

The async all-reduce (``workloads/allreduce.py``) runs each bucket's all_reduce beside the next
bucket's matmul; on CPU ranks gloo's threads then take cores from the matmul. From the async
run's trace alone the analysis gives, per rank, ``aten::matmul``'s factor (mean duration of its
spans wholly inside communication / of those wholly outside; OVERLAP.md section 6.4) and its two
means. That predicts what the same matmul takes when no communication runs beside it: the
*outside* mean, not the inside one. The sync variant (same sizes, every all_reduce blocking, so
no matmul ever runs beside communication) is then run, and its matmul's mean duration is read
straight from its trace (Kineto JSON, not through overlapprof). Per rank and repeat it prints:

- ``factor``: inside / outside mean, the async run's (the prediction: communication slows the
  matmul by this);
- ``sync / outside``: the sync run's matmul mean over the async run's outside mean (predicted
  1.00: the outside spans measure the matmul undisturbed);
- ``inside / sync``: the async run's inside mean over the sync run's mean: the factor measured
  against a run without communication (predicted: ``factor``).

Variants run interleaved (async, sync, async, ...), ``--repeat`` pairs.

    python benchmarks/interference_bench.py                       # 3 pairs, 2 ranks
    python benchmarks/interference_bench.py --repeat 5 --opt batch=8192
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import overlapprof  # noqa: E402

CLASS = "aten::matmul"


def launch(variant: str, args, out: Path, run_id: str) -> Path:
    command = [sys.executable, "-m", "overlapprof", "run", str(REPO / "workloads" / "allreduce.py"), "--nproc",
               str(args.nproc), "--variant", variant, "--active", str(args.active), "--run-id", run_id, "--out",
               str(out), "--no-analyze", "-q"]
    for opt in args.opt:
        command += ["--opt", opt]
    proc = subprocess.run(command, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"interference_bench: {run_id} failed:\n{proc.stderr[-3000:]}")
    return out / f"{run_id}-{variant}"


def matmul_means(run: Path) -> dict[int, float]:
    """Per rank, the mean duration (µs) of the profiled steps' aten::matmul, from the JSON."""
    out = {}
    for trace in sorted(run.glob("rank*.pt.trace.json")):
        rank = int(trace.name[4:].split(".")[0])
        events = [e for e in json.loads(trace.read_text())["traceEvents"] if e.get("ph") == "X"]
        steps = [(e["ts"], e["ts"] + e["dur"]) for e in events if e["name"].startswith("ProfilerStep#")]
        durs = [e["dur"] for e in events if e["name"] == CLASS and any(a <= e["ts"] < b for a, b in steps)]
        out[rank] = statistics.fmean(durs)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--active", type=int, default=16)
    parser.add_argument("--opt", action="append", default=[], help="a workload option (key=value), to both variants")
    args = parser.parse_args()
    print(f"# load at start: {os.getloadavg()[0]:.2f}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="interference_bench.") as tmp:
        for k in range(args.repeat):
            async_run = launch("async", args, Path(tmp), f"a{k}")
            sync_run = launch("sync", args, Path(tmp), f"s{k}")
            report = overlapprof.analyze(async_run, workers=1, comms=False)
            sync_mean = matmul_means(sync_run)
            for r in report.ranks:
                c = next((c for c in r.interference.classes if c.name == CLASS), None)
                if c is None or c.factor is None:
                    print(f"repeat {k} rank {r.rank}: {CLASS} has too few spans inside or outside "
                          f"({c.inside if c else 0} / {c.outside if c else 0})")
                    continue
                row = (k, r.rank, c.inside, c.outside, c.factor, sync_mean[r.rank] / c.outside_mean_us,
                       c.inside_mean_us / sync_mean[r.rank], c.outside_mean_us, c.inside_mean_us, sync_mean[r.rank],
                       r.interference.slowed_us, r.metrics.overlapped_us, r.interference.net_overlap_gain_us)
                rows.append(row)
                print("repeat {} rank {}: n in/out {}/{}, factor {:.3f}, sync/outside {:.3f}, inside/sync {:.3f} "
                      "(means: outside {:.1f} us, inside {:.1f} us, sync {:.1f} us); slowed {:.3f} of {:.3f} ms "
                      "overlapped, net gain {:.3f} ms".format(*row[:10], row[10] / 1000, row[11] / 1000,
                                                               row[12] / 1000), flush=True)
    print(f"# load at end: {os.getloadavg()[0]:.2f}")
    if rows:
        med = [statistics.median(r[i] for r in rows) for i in (4, 5, 6)]
        print(f"median over {len(rows)} (rank, repeat): factor {med[0]:.3f}, sync/outside {med[1]:.3f} "
              f"(predicted 1.000), inside/sync {med[2]:.3f} (predicted {med[0]:.3f})")


if __name__ == "__main__":
    main()
