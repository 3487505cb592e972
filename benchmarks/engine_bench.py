"""The engine's prototype core (``analysis/rank/coverage.py``) against today's metrics stage.

    python benchmarks/engine_bench.py [--repeat N] [--gen-mb MB ...] [--budget-mb MB ...] [FOLDER ...]

For each input (default ``tests/data/mtia`` and, with ``--gen-mb``, generated operation-dense
traces of that many MB of JSON, ``gen_traces``), each variant runs in a fresh process, the
variants alternating: the rank's events are read and classified as today (``rank_events``), then
its metrics, steps, partition, kinds and timeline are computed ``--repeat`` times by

- ``today``: :func:`~overlapprof.analysis.rank.metrics.rank_report` (segmented interval algebra);
- ``sweep``: :func:`~overlapprof.analysis.rank.coverage.measure` with the default budget (a trace
  whose boundaries fit it never touches the disk), and with each ``--budget-mb`` (spilled).

Printed per variant: the median and min-max of the stage's time, the stage's own peak of
allocated memory (``tracemalloc``, numpy's arrays included) and the process's peak RSS
(``ru_maxrss``: the read and classification dominate it). Checks that each variant's report is
today's, float for float. Benchmarks print; they do not assert.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

CHILD = r"""
import json, resource, sys, time, tracemalloc
import msgspec
from pathlib import Path
from overlapprof.analysis.rank.classify import compile_comm_annotations, compile_comm_kernels
from overlapprof.analysis.rank.events import rank_events
from overlapprof.analysis.rank.metrics import rank_report
from overlapprof.analysis.rank import coverage

files, variant, budget, repeat = json.loads(sys.argv[1])
ev = rank_events([Path(f) for f in files], compile_comm_kernels(()), comm_ann=compile_comm_annotations(()))
if variant == "today":
    run = lambda: rank_report(ev)
else:
    run = lambda: coverage.measure(ev, budget=budget or coverage.BUDGET_BYTES)
times = []
got = run()  # warm
for _ in range(repeat):
    t = time.perf_counter()
    got = run()
    times.append(time.perf_counter() - t)
tracemalloc.start()
run()
_, peak = tracemalloc.get_traced_memory()
tracemalloc.stop()
got.comm_records = None
print(json.dumps({"times": times, "stage_peak_mb": peak / 2**20, "events": ev.events,
                  "intervals": len(ev.comm) + len(ev.compute) + len(ev.memory), "steps": int(ev.steps.start.size),
                  "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "report": msgspec.to_builtins(got)}))
"""


def run_child(files: list[str], variant: str, budget: int | None, repeat: int) -> dict:
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps([files, variant, budget, repeat])],
                          capture_output=True, text=True, cwd=ROOT, check=True)
    return json.loads(proc.stdout)


def trace_files(folder: Path) -> list[str]:
    return sorted(str(p) for p in folder.iterdir() if p.name.endswith((".json", ".json.gz")))


def bench(label: str, files: list[str], repeat: int, rounds: int, budgets: list[float]) -> None:
    variants = [("today", None), ("sweep", None)] + [(f"sweep {b:g} MB", int(b * 2**20)) for b in budgets]
    got: dict[str, list[dict]] = {name: [] for name, _ in variants}
    for _ in range(rounds):  # the variants alternate
        for name, budget in variants:
            got[name].append(run_child(files, "today" if name == "today" else "sweep", budget, repeat))
    base = got["today"][0]
    size = sum(Path(f).stat().st_size for f in files) / 1e6
    print(f"\n== {label}: {size:.0f} MB on disk, {base['events']:,} events, {base['intervals']:,} intervals, "
          f"{base['steps']} steps; {rounds} processes x {repeat} runs each")
    print(f"  {'variant':<16} {'median s':>9} {'min-max s':>15} {'vs today':>9} {'stage peak MB':>14} {'RSS MB':>8}  same")
    today = statistics.median([t for r in got["today"] for t in r["times"]])
    for name, _ in variants:
        times = [t for r in got[name] for t in r["times"]]
        med = statistics.median(times)
        same = all(r["report"] == base["report"] for r in got[name])
        print(f"  {name:<16} {med:9.3f} {min(times):7.3f}-{max(times):<7.3f} {med / today:8.2f}x "
              f"{max(r['stage_peak_mb'] for r in got[name]):14.1f} {max(r['maxrss_mb'] for r in got[name]):8.0f}  {same}")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folders", nargs="*", type=Path)
    p.add_argument("--repeat", type=int, default=5, help="runs of the stage per process (after a warm one)")
    p.add_argument("--rounds", type=int, default=3, help="processes per variant, alternating")
    p.add_argument("--gen-mb", type=float, action="append", default=[])
    p.add_argument("--budget-mb", type=float, action="append", default=[])
    a = p.parse_args(argv)
    for folder in a.folders or [ROOT / "tests" / "data" / "mtia"]:
        bench(str(folder), trace_files(folder), a.repeat, a.rounds, a.budget_mb)
    if a.gen_mb:
        import gen_traces

        work = Path(tempfile.mkdtemp(prefix="engine-bench-"))
        try:
            for mb in a.gen_mb:
                gen_traces.generate_size(work / f"g{mb:g}", int(mb * 1e6))
                bench(f"generated {mb:g} MB, an operation every 10 events", trace_files(work / f"g{mb:g}"), a.repeat,
                      a.rounds, a.budget_mb)
                shutil.rmtree(work / f"g{mb:g}")
        finally:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
