"""What the cross-rank analysis (``Report.crossrank``) costs, against the same analysis without it.

For each trace set, in one run: the wall time of ``overlapprof.analyze(paths, comms=False)`` and
of ``analyze(paths)`` (comms on, the default), best of ``--repeat``, their ratio, and the time of
the cross-rank step alone (matching and metrics in the parent process). Then a scaling check:
the cross-rank step on a generated set with 2x the events per rank should take about 2x.

    python benchmarks/crossrank_bench.py [--repeat 3] [--ranks 64] [--events 20000]

Sets: ``tests/data/mtia`` (one rank, 83 MB of JSON, 146 comm ops), the two ranks of
``tests/data/trace_filter``, and generated sets (``benchmarks/gen_traces.py``: one NCCL
all_reduce with a sequence number per 10 events).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _timed_cross_rank():
    """Wrap the analyzer's build_crossrank to record its time (the benchmark's only patch)."""
    from overlapprof.analysis import analyzer

    spent = []
    inner = analyzer.build_crossrank

    def wrapper(*args, **kwargs):
        t = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            spent.append(time.perf_counter() - t)

    analyzer.build_crossrank = wrapper
    return spent


def best(fn, repeat):
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def measure(name, paths, repeat, spent):
    import overlapprof

    off = best(lambda: overlapprof.analyze(paths, comms=False), repeat)
    spent.clear()
    on = best(lambda: overlapprof.analyze(paths), repeat)
    report = overlapprof.analyze(paths)
    crossrank = report.crossrank
    ops = sum(r.ops for r in crossrank.ranks) if crossrank else 0
    print(f"{name:<28} comms off {off:7.3f} s   on {on:7.3f} s   ratio {on / off:5.2f}   "
          f"cross-rank step {min(spent):6.3f} s   ops {ops:>7}   instances {len(crossrank.instances) if crossrank else 0:>6}",
          flush=True)
    return min(spent)


def generate(out, ranks, events):
    subprocess.run([sys.executable, str(REPO / "benchmarks/gen_traces.py"), str(out), "--ranks", str(ranks),
                    "--events", str(events)], check=True, stdout=subprocess.DEVNULL)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--ranks", type=int, default=64, help="ranks of the generated scaling set")
    parser.add_argument("--events", type=int, default=20000, help="events per rank of the generated set (and 2x)")
    args = parser.parse_args()
    spent = _timed_cross_rank()
    data = REPO / "tests/data"
    measure("mtia (1 rank, 83 MB)", data / "mtia", args.repeat, spent)
    measure("trace_filter (2 of 128)", sorted((data / "trace_filter").glob("*.json.gz")), args.repeat, spent)
    with tempfile.TemporaryDirectory() as tmp:
        print(f"generating {args.ranks} ranks x {args.events} and x {2 * args.events} events ...", file=sys.stderr)
        small = generate(Path(tmp) / "small", args.ranks, args.events)
        large = generate(Path(tmp) / "large", args.ranks, 2 * args.events)
        a = measure(f"generated {args.ranks} x {args.events}", small, args.repeat, spent)
        b = measure(f"generated {args.ranks} x {2 * args.events}", large, args.repeat, spent)
        print(f"cross-rank step, 2x events per rank: {b / a:.2f}x the time (linear: about 2)")


if __name__ == "__main__":
    main()
