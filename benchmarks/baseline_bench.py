"""``overlapprof analyze`` of this tree against a baseline tree (by default the commit before),
measured side by side in one run.

    python benchmarks/baseline_bench.py [--baseline REF | --baseline-path DIR] [--repeat N]
        [--workers W ...] [--gen-mb MB [--gzip]] [--env NAME=VALUE] [FOLDER ...]

The baseline is a git worktree of ``REF`` (default ``HEAD~``) made in a temporary folder and
removed at the end, or an existing checkout (``--baseline-path``). Each run is a fresh Python
process with ``PYTHONPATH`` set to its tree (the child checks which ``overlapprof`` it
imported); the two trees' runs alternate, the first tree changing each round, so that a change
in the machine's load reaches both. Inputs: the folders given (default ``tests/data/mtia``) and,
with ``--gen-mb``, a generated single-rank trace of that many MB of JSON (``gen_traces``,
operation-dense: an operation every few events). Printed per input and worker count: the median
"work" time (the ``analyze`` call), "wall" time (the whole process) and "cpu" time (the
``analyze`` call's CPU time in this process: the workers' is not counted; steadier than the
clocks on a busy machine) of each tree, their spread (min-max), and new/baseline of the
medians; ``--peak`` adds one run of each that samples its peak memory (PSS of the process tree).
Benchmarks print; they do not assert.
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from analyze_bench import _RUSAGE, measure_once, trace_files  # noqa: E402
import gen_traces  # noqa: E402

# A child's first lines: import overlapprof from the tree PYTHONPATH names, and check it did.
FROM_TREE = (
    "import json, os, sys, time\ntree = os.path.realpath(os.environ['PYTHONPATH'])\n"
    "sys.path.insert(0, tree)  # before the working folder, which python -c puts first\n"
    "import overlapprof\n"
    "assert os.path.realpath(overlapprof.__file__).startswith(tree + os.sep), (overlapprof.__file__, tree)\n"
)

CHILD = FROM_TREE + (
    "RES = {}\nimport overlapprof.analysis.analyzer\n"
    "t, c = time.perf_counter(), time.process_time()\n"
    "r = overlapprof.analyze(sys.argv[2:], workers=int(sys.argv[1]) or None)  # 0: the default\n"
    "RES['work_s'], RES['cpu_s'] = time.perf_counter() - t, time.process_time() - c\n"
    "RES['ratios'] = {x.rank: x.metrics.overlap_ratio for x in r.ranks}\n" + _RUSAGE
)


class RunFailed(Exception):
    """A measured run exited with an error (its message names the tree and the error)."""


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):7.3f} ({min(values):.3f}-{max(values):.3f})"


@contextlib.contextmanager
def worktree(rev: str, parent: Path):
    """A detached git worktree of ``rev`` in ``parent``, removed at the end."""
    path = parent / "baseline"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(path), rev], check=True)
    try:
        yield path.resolve()
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)], check=False)


def prepare(trees: dict[str, Path]) -> None:
    """Write each tree's bytecode, as an installed package has it (see analyze_bench.compile_bytecode)."""
    for tree in trees.values():
        compileall.compile_dir(str(tree / "overlapprof"), quiet=1)


def describe(tree: Path) -> str:
    """The tree's commit, abbreviated, and its subject."""
    return subprocess.run(["git", "-C", str(tree), "log", "-1", "--format=%h %s"], capture_output=True,
                          text=True).stdout.strip()[:80]


def alternate(trees: dict[str, Path], args: list[str], repeat: int, env: dict | None = None,
              done=None) -> dict[str, list[dict]]:
    """``repeat`` timed runs of :data:`CHILD` (``args``: workers, then the inputs) per tree, not
    sampled; the trees alternate, the first one changing each round, so that a change in the
    machine's load reaches both. ``done(name, round, result)`` is called after each run. A run
    that fails raises :class:`RunFailed`."""
    runs: dict[str, list[dict]] = {name: [] for name in trees}
    for k in range(repeat):
        order = list(trees) if k % 2 == 0 else list(trees)[::-1]
        for name in order:
            res = measure_once(CHILD, args, env={**(env or {}), "PYTHONPATH": str(trees[name])}, sample=False)
            if "error" in res:
                raise RunFailed(f"{name}: {res['error']}")
            runs[name].append(res)
            if done is not None:
                done(name, k, res)
    return runs


def compare(trees: dict[str, Path], files: list[str], workers: int, repeat: int, env: dict, peak: bool) -> None:
    try:
        runs = alternate(trees, [str(workers), *files], repeat, env)
    except RunFailed as exc:
        print(f"  {exc}")
        return
    ratios = {name: runs[name][0]["ratios"] for name in trees}
    for name in trees:
        work = [r["work_s"] for r in runs[name]]
        wall = [r["wall_s"] for r in runs[name]]
        cpu = [r["cpu_s"] for r in runs[name]]
        line = f"  {name:<9} work {_spread(work)}  wall {_spread(wall)}  cpu {_spread(cpu)}"
        if peak:
            sampled = measure_once(CHILD, [str(workers), *files], env={**env, "PYTHONPATH": str(trees[name])})
            line += f"  peak {sampled.get('peak_mb', float('nan')):6.0f} MB"
        print(line)
    base, new = ({key: statistics.median(r[key] for r in runs[name]) for key in ("work_s", "wall_s", "cpu_s")}
                 for name in ("baseline", "new"))
    print(f"  new/baseline (medians): work {new['work_s'] / base['work_s']:.3f}x,"
          f" wall {new['wall_s'] / base['wall_s']:.3f}x, cpu {new['cpu_s'] / base['cpu_s']:.3f}x;"
          f" same overlap ratios: {'yes' if ratios['baseline'] == ratios['new'] else f'NO {ratios}'}")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folders", nargs="*", type=Path, default=[ROOT / "tests" / "data" / "mtia"])
    p.add_argument("--baseline", default="HEAD~", help="a git revision, checked out in a temporary worktree")
    p.add_argument("--baseline-path", type=Path, help="an existing checkout instead")
    p.add_argument("--repeat", type=int, default=7, help="runs per tree, input and worker count")
    p.add_argument("--workers", type=int, action="append", help="worker counts (default 1 and 2)")
    p.add_argument("--gen-mb", type=float, help="also a generated single-rank trace of this many MB of JSON")
    p.add_argument("--gzip", action="store_true", help="the generated trace gzipped")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="set in both trees' runs")
    p.add_argument("--peak", action="store_true", help="one more run per tree that samples peak memory")
    a = p.parse_args(argv)
    env = dict(e.split("=", 1) for e in a.env)
    work = Path(tempfile.mkdtemp(prefix="baseline-bench-"))
    try:
        with contextlib.ExitStack() as stack:
            base = a.baseline_path.resolve() if a.baseline_path else stack.enter_context(worktree(a.baseline, work))
            trees = {"baseline": base, "new": ROOT}
            prepare(trees)
            inputs = [(str(f.resolve().relative_to(ROOT) if f.resolve().is_relative_to(ROOT) else f), trace_files(f))
                      for f in a.folders]
            if a.gen_mb:
                out = work / "generated"
                gen_traces.generate_size(out, int(a.gen_mb * 1e6), compress=a.gzip)
                inputs.append((f"generated {a.gen_mb:.0f} MB{' gzip' if a.gzip else ''}", trace_files(out)))
            print(f"baseline: {base} ({describe(base)}); {a.repeat} runs per tree; median (min-max) seconds")
            for label, files in inputs:
                for w in a.workers or [1, 2]:
                    print(f"\n== {label}, {w} worker{'s' if w > 1 else ''}")
                    compare(trees, files, w, a.repeat, env, a.peak)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
