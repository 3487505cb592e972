"""Planted misconfigurations with a known best (issue 37): does ``overlapprof advise`` find it?

Each case plants a configuration of a workload here (a bucket far too large or far too small,
prefetch off, a wait right after the issue, a host synchronization in the window, a slow rank
asleep or computing, two causes at once, and configurations where nothing should change) and
names the grid of options around it. Per case and repeat (2 gloo ranks, a short schedule):

1. run the planted configuration (``overlapprof run``), then ``overlapprof advise RUN --json``;
2. run every configuration of the grid (the brute-force ground truth, on the same machine);
3. run the configuration each listed change leads to (``joint_change``, mapped onto the workload's
   options by :func:`overlapprof.launch.rerun.change_to_request`), unless the grid ran it.

A configuration's step is the median over its ranks' profiled steps (host times, run.json), and a
configuration is run once per repeat however many cases name it, in an order that alternates with
the repeat. Per case it prints the planted step, the grid's best, the advice's changes in order,
the step its first change led to and the step all of them together led to (the last item's
``joint_change``: issue 37 predicts the items jointly, each saving on top of the ones above it,
so a case with two causes needs both), the predicted saving of them together (the sum of the
items' savings, from advise) against the realized one (the planted step − the step they led
to), and the slowest any listed change made the step; then the four targets' shares:

- **top**: the top suggestion (the first change, alone) within 5% of the grid's best (no
  suggestion counts when the planted configuration is itself within 5%), in >= 80% of cases: the
  issue's words; the changes together's share is printed beside it (a case with two causes
  needs both, which the first alone cannot reach);
- **saving**: the top suggestion's predicted saving within ±25% of the realized one, in >= 80% of
  the cases with a suggestion; that of the changes together (the sum of their savings) beside it;
- **slower**: no listed change makes the step more than 2% slower than the planted one;
- **quiet**: no advice at all where the grid finds nothing better than 3%, in every such case;

with ``uptime``'s load at the start and the end: quote idle runs only. ``--dry-run`` prints the
plan (cases, grid, runs, time estimate) and runs nothing.

A run warms up and traces per workload (``STEADY``: 0.2-0.3 s of warm-up steps, 0.3-0.4 s of
traced steps), so that a configuration's step is its steady state. What one run's step still
moves by between runs (a few % idle, far more under load) can exceed the differences a case
judges: ``--runs K`` runs every configuration K times a repeat, interleaved, scores each case
by the median of its configurations' K steps and prints, beside it, the scoring by their first
runs alone (K times the runs; the advice is the planted configuration's first run's).

    python benchmarks/advise_bench.py --dry-run
    python benchmarks/advise_bench.py                             # every case, once
    python benchmarks/advise_bench.py --only ddp --repeat 2 --out /tmp/ab
    python benchmarks/advise_bench.py --only allreduce --runs 3   # each configuration 3 times
    python benchmarks/advise_bench.py --rescore /tmp/ab --repeat 2 --runs 3   # runs nothing

``--rescore DIR`` runs nothing: it advises again, with this checkout, the planted runs a bench kept
(``--out DIR``) and scores that advice against the same bench's runs, so that a change to the
model is judged on the same measurements before and after (a configuration a new suggestion leads
to that the bench never ran is not scored).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

# 12 traced steps a run (4 until 2026-12-07: FSDP's same program ran 6 ms a step apart in two runs
# from its 4 steps' transfers alone, more than the changes it judged; 12 cost a run 0.1-0.3 s)
SCHEDULE = {"warmup_steps": 1, "wait": 0, "warmup": 1, "active": 12}
# Steady state (issue 37, 2026-12-07): the warm-up steps and the traced steps per workload, for about
# 0.2-0.3 s of warm-up before the first unprofiled step and 0.3-0.4 s of traced steps at these sizes'
# idle steps (all-reduce 5-10 ms, DDP 9-13, pipeline 7-9, ring 17-30, FSDP 28-37); a run's
# unprofiled steps (as many as the traced ones) come between the two. With 1 and 12, the median of
# one configuration's profiled steps moved by 26-95% (all-reduce), 23-26% (DDP) and 16-22% (FSDP)
# over 6 runs, loaded; 7-22%, 19% and 6-15% with these (benchmarks/RESULTS.md, "steady state").
STEADY = {"allreduce": {"warmup_steps": 30, "active": 30}, "ddp": {"warmup_steps": 20, "active": 24},
          "pipeline": {"warmup_steps": 30, "active": 30}, "ring": {"warmup_steps": 10, "active": 16},
          "fsdp": {"warmup_steps": 8, "active": 16}}
SECONDS_PER_RUN = 3.5  # a 2-rank run of these sizes, start to end (launch and torch's import most of it)
SECONDS_PER_ADVICE = 1.5  # overlapprof advise on one of them
# Sizes that keep a step to tens of milliseconds on 2 cores.
DDP = {"layers": 6, "width": 256, "batch": 128}  # 6 layers of 0.25 MiB: 1.5 MiB of gradients
# 24 layers of 16 KiB: DDP makes a bucket a layer under any cap up to 16 KiB (it never splits a parameter; with
# DDP's 0.25 MiB layers 0.01, 0.05 and 0.25 MiB were one program, 6 buckets a step, until 2026-12-08)
DDP_SMALL = {"layers": 24, "width": 64, "batch": 128}
FSDP = {"layers": 6, "width": 256, "batch": 128}
ALLREDUCE = {"buckets": 4, "width": 128, "batch": 2048}
RING = {"rounds": 2}  # 640-side matmuls, 512 KiB sends: a round's compute about its time on 1 Gbit/s
PIPELINE = {"layers": 2, "width": 256, "batch": 256, "micro_batches": 4}
SLOW = {"slow_rank": 1, "slow_ms": 12.0}


@dataclass
class Case:
    """A planted configuration and its grid: ``grid`` maps an option (or ``variant``) to the values
    tried, every combination once, the other options as planted."""

    name: str
    workload: str
    variant: str
    options: dict
    grid: dict
    rate: str | None = None
    what: str = ""
    expected: str = ""  # the change that should come first ("" for none), for the reader


CASES = [
    Case("ddp-bucket-large", "ddp", "async", {**DDP, "bucket_cap_mb": 25.0}, {"bucket_cap_mb": [0.05, 0.25, 0.5, 1.0, 25.0]},
         what="one bucket: the whole all_reduce after backward", expected="bucket_cap_mb smaller"),
    Case("ddp-bucket-small", "ddp", "async", {**DDP_SMALL, "bucket_cap_mb": 0.01}, {"bucket_cap_mb": [0.01, 0.1, 0.25, 1.0, 25.0]},
         what="a bucket per layer of 24 small ones: latency-bound", expected="bucket_cap_mb larger"),
    Case("ddp-bucket-fine", "ddp", "async", {**DDP, "bucket_cap_mb": 0.5}, {"bucket_cap_mb": [0.05, 0.25, 0.5, 1.0, 25.0]},
         what="DDP's buckets near their best", expected=""),
    Case("ddp-sync", "ddp", "sync", dict(DDP), {"variant": ["sync", "async"]},
         what="all gradients reduced after backward", expected="async=all_reduce"),
    Case("ddp-link-large", "ddp", "async", {**DDP, "bucket_cap_mb": 25.0}, {"bucket_cap_mb": [0.25, 0.5, 25.0]},
         rate="2gbit", what="one bucket over a 2 Gbit/s link", expected="bucket_cap_mb smaller"),
    Case("fsdp-prefetch-off", "fsdp", "async", {**FSDP, "prefetch": 0}, {"prefetch": [0, 1, 2]},
         what="no all-gather issued ahead", expected="prefetch=1"),
    Case("fsdp-sync", "fsdp", "sync", dict(FSDP), {"variant": ["sync", "async"]},
         what="every all-gather issued where needed", expected="prefetch=1"),
    Case("fsdp-fine", "fsdp", "async", {**FSDP, "prefetch": 1}, {"prefetch": [0, 1, 2]},
         what="prefetching one layer ahead", expected=""),
    Case("allreduce-wait-early", "allreduce", "async", {**ALLREDUCE, "wait_early": True}, {"wait_early": [True, False]},
         what="each all_reduce waited right after its issue", expected="async=all_reduce"),
    Case("allreduce-host-sync", "allreduce", "async", {**ALLREDUCE, "host_sync": True}, {"host_sync": [True, False]},
         what="a barrier after each issue, in the window", expected="(a hint: remove the host sync)"),
    Case("allreduce-sync", "allreduce", "sync", dict(ALLREDUCE), {"variant": ["sync", "async"]},
         what="blocking all_reduce per bucket", expected="async=all_reduce"),
    Case("allreduce-slow", "allreduce", "async", {**ALLREDUCE, **SLOW}, {"slow_ms": [12.0, 0.0]},
         what="rank 1 sleeps 12 ms a step", expected="no_straggler=1"),
    Case("allreduce-extra-work", "allreduce", "async", {**ALLREDUCE, **SLOW, "slow_compute": True}, {"slow_ms": [12.0, 0.0]},
         what="rank 1 computes 12 ms more a step", expected="no_straggler=1"),
    Case("allreduce-two", "allreduce", "async", {**ALLREDUCE, **SLOW, "wait_early": True},
         {"wait_early": [True, False], "slow_ms": [12.0, 0.0]},
         what="waits right after the issue and a slow rank", expected="no_straggler=1, async=all_reduce"),
    Case("allreduce-fine", "allreduce", "async", dict(ALLREDUCE), {"wait_early": [True, False], "variant": ["sync", "async"]},
         what="the async variant as written", expected=""),
    Case("ring-sync", "ring", "sync", dict(RING), {"variant": ["sync", "async"]}, rate="1gbit",
         what="blocking send/recv over a 1 Gbit/s link", expected="async=send_recv"),
    Case("ring-host-sync", "ring", "async", {**RING, "host_sync": True}, {"host_sync": [True, False]}, rate="1gbit",
         what="a barrier inside each round's window", expected="no_host_sync"),
    Case("ring-slow", "ring", "async", {**RING, **SLOW}, {"slow_ms": [12.0, 0.0]}, rate="1gbit",
         what="rank 1 sleeps 12 ms a step", expected="no_straggler=1"),
    Case("ring-two", "ring", "sync", {**RING, **SLOW, "slow_compute": True},
         {"variant": ["sync", "async"], "slow_ms": [12.0, 0.0]}, rate="1gbit",
         what="blocking ring and a rank with extra compute", expected="no_straggler=1, async=send_recv"),
    Case("ring-fine", "ring", "async", dict(RING), {"variant": ["sync", "async"]}, rate="1gbit",
         what="the async ring as written", expected=""),
    Case("pipeline-sync", "pipeline", "sync", dict(PIPELINE), {"variant": ["sync", "async"]}, rate="1gbit",
         what="blocking send/recv between stages", expected="async=send_recv"),
    Case("pipeline-fine", "pipeline", "async", dict(PIPELINE), {"variant": ["sync", "async"]}, rate="1gbit",
         what="micro-batches overlapped", expected=""),
]


def _key(workload: str, variant: str, rate: str | None, options: dict) -> tuple:
    return (workload, variant, rate, tuple(sorted(options.items())))


def grid_configs(case: Case) -> list[tuple]:
    """Every configuration of the case's grid, the planted one first, each with all its workload's
    options (as :func:`config_of` gives them)."""
    names = list(case.grid)
    out = [_full(_key(case.workload, case.variant, case.rate, case.options))]
    for values in itertools.product(*(case.grid[n] for n in names)):
        options, variant = dict(case.options), case.variant
        for name, value in zip(names, values):
            if name == "variant":
                variant = value
            else:
                options[name] = value
        out.append(_full(_key(case.workload, variant, case.rate, options)))
    return list(dict.fromkeys(out))


@dataclass
class Runner:
    """Runs configurations (``overlapprof run`` through verify.command), keeps their run
    directories and steps: ``run`` once per repeat (the first run of a configuration: its
    directory, its step), ``again`` once more (``--runs K``: each run's step in ``runs``)."""

    out: Path
    tag: str
    dirs: dict = field(default_factory=dict)
    steps: dict = field(default_factory=dict)
    count: int = 0
    runs: dict = field(default_factory=dict)  # config -> the step of each of its runs, in order

    def run(self, config: tuple, like: Path | None = None) -> Path:
        if config in self.dirs:
            return self.dirs[config]
        run_dir = self._launch(config)
        self.dirs[config], self.steps[config] = run_dir, step_ms(run_dir)
        self.runs[config] = [self.steps[config]]
        return run_dir

    def again(self, config: tuple) -> None:
        """One more run of a configuration run already (its step added to ``runs``)."""
        self.runs[config].append(step_ms(self._launch(config)))

    def _launch(self, config: tuple) -> Path:
        from overlapprof.launch import launcher, netns
        from overlapprof.launch.rerun import command
        from overlapprof.rundir.schedule import ProfilerSchedule

        workload, variant, rate, options = config
        loaded = _workload(workload)
        request = launcher.RunRequest(workload=loaded, variants=[variant],
                                      options=loaded.resolve_options([f"{k}={v}" for k, v in options]),
                                      nproc=2, device="cpu", backend="gloo", out=self.out, quiet=True,
                                      link=netns.link_for(rate) if rate else None,
                                      schedule=ProfilerSchedule(**{**SCHEDULE, **STEADY.get(workload, {})}))
        self.count += 1
        run_id = f"{self.tag}-{self.count:03d}-{workload}"
        proc = subprocess.run(command(request, run_id), capture_output=True, text=True)
        if proc.returncode != 0:
            sys.exit(f"advise_bench: {run_id} ({_describe(config)}) failed:\n{proc.stderr[-3000:]}")
        return self.out / f"{run_id}-{variant}"


@dataclass
class MedianOfRuns(Runner):
    """The runs a Runner made, each configuration's step the median of its runs (nothing run)."""

    def run(self, config: tuple, like: Path | None = None) -> Path:
        return self.dirs[config]


def median_of_runs(runner: Runner) -> MedianOfRuns:
    return MedianOfRuns(runner.out, runner.tag, dirs=runner.dirs, runs=runner.runs,
                        steps={k: statistics.median(v) for k, v in runner.runs.items()})


@dataclass
class Saved(Runner):
    """The run directories of an earlier bench (``--rescore DIR``): nothing is run; a configuration
    that was not run there has no directory (None)."""

    def run(self, config: tuple, like: Path | None = None) -> Path | None:
        return self.dirs.get(config)


def saved_runs(out: Path, tag: str) -> Saved:
    """The runs of repeat ``tag`` (``r0``, ``r1``, ...) in ``out``, each configuration's runs in the
    order they were made (their numbers), its first run's directory and step those a Runner keeps."""
    saved = Saved(out, tag)
    for run_dir in sorted(out.glob(f"{tag}-*"), key=lambda d: int(d.name.split("-")[1])):
        run = json.loads((run_dir / "run.json").read_text())
        rate = (run.get("link") or {}).get("rate")
        config = _full(_key(run["workload"]["name"], run["variant"], rate, run["options"]))
        saved.runs.setdefault(config, []).append(step_ms(run_dir))
        saved.dirs.setdefault(config, run_dir)
        saved.steps.setdefault(config, saved.runs[config][0])
    return saved


def step_ms(run_dir: Path) -> float:
    """The median of every rank's profiled host step times (run.json), ms."""
    run = json.loads((run_dir / "run.json").read_text())
    return statistics.median(t for r in run["ranks"].values() for t in r["step_times_ms"].get("profiled", []))


def config_of(run_dir: Path, change: str) -> tuple | str:
    """The configuration ``change`` leads to from the run ``run_dir``, or why none does."""
    from overlapprof.launch.rerun import change_to_request

    request = change_to_request(run_dir, change)
    if isinstance(request, str):
        return request
    rate = request.link["rate"] if request.link else None
    defaults = {k: o.default for k, o in request.workload.options.items()}
    return _key(request.workload.name, request.variants[0], rate, {k: v for k, v in request.options.items()
                                                                   if k in defaults})


_LOADED: dict = {}


def _workload(name: str):
    from overlapprof.launch import launcher

    if name not in _LOADED:
        _LOADED[name] = launcher.load_workload(REPO / "workloads" / f"{name}.py", 300)
    return _LOADED[name]


def _full(config: tuple) -> tuple:
    """A configuration with every option of its workload (defaults filled in), as config_of gives it."""
    workload, variant, rate, options = config
    loaded = _workload(workload)
    options = dict(options)
    if options.get("slow_ms", 0) <= 0:  # no slow rank, however it is said: the same configuration
        options.update({k: loaded.options[k].default for k in ("slow_rank", "slow_ms", "slow_compute")})
    return _key(workload, variant, rate, loaded.resolve_options([f"{k}={v}" for k, v in options.items()]))


def _describe(config: tuple) -> str:
    workload, variant, rate, options = config
    return f"{workload}/{variant}{' ' + rate if rate else ''} " + " ".join(f"{k}={v}" for k, v in options)


def advise_available() -> str | None:
    """None when ``overlapprof advise`` is here, else why not."""
    proc = subprocess.run([sys.executable, "-m", "overlapprof", "advise", "--help"], capture_output=True, text=True)
    return None if proc.returncode == 0 else (proc.stderr.strip().splitlines() or ["no output"])[-1]


_ADVICE: dict = {}


def advise(run_dir: Path) -> dict:
    """``overlapprof advise RUN --json`` (once per run directory: the median-of-K scoring asks again)."""
    if run_dir in _ADVICE:
        return _ADVICE[run_dir]
    proc = subprocess.run([sys.executable, "-m", "overlapprof", "advise", str(run_dir), "--json", "-q",
                           "--workers", "1"], capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"advise_bench: overlapprof advise {run_dir} failed:\n{proc.stderr[-3000:]}")
    _ADVICE[run_dir] = json.loads(proc.stdout)
    return _ADVICE[run_dir]


def _uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return "uptime: not available"


def plan(cases: list[Case], repeat: int, runs: int = 1) -> None:
    configs = {c.name: grid_configs(c) for c in cases}
    unique = {k for ks in configs.values() for k in ks}
    print(f"{len(cases)} cases, {repeat} repeat(s), each configuration run {runs} time(s); 2 gloo ranks; schedule "
          f"{SCHEDULE}, per workload {STEADY}")
    for c in cases:
        grid = ", ".join(f"{n} in {v}" for n, v in c.grid.items())
        print(f"  {c.name:<22} {_describe(_key(c.workload, c.variant, c.rate, c.options))}")
        print(f"  {'':<22} planted: {c.what}; grid: {grid} ({len(configs[c.name])} runs); expected first: "
              f"{c.expected or 'nothing'}")
    total = len(unique) * repeat * runs
    extra = len(cases) * repeat * runs  # about one configuration a suggestion leads to, outside its grid
    seconds = (total + extra) * SECONDS_PER_RUN + len(cases) * repeat * SECONDS_PER_ADVICE
    print(f"runs: {len(unique)} distinct configurations x {repeat} x {runs} = {total}, up to ~{extra} more for "
          f"suggestions outside the grids; {len(cases) * repeat} advise calls; about {seconds / 60:.0f} min on 2 idle "
          f"cores ({SECONDS_PER_RUN:g} s a run, {SECONDS_PER_ADVICE:g} s an advice)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", help="cases whose name starts with this (repeatable): " +
                        ", ".join(c.name for c in CASES))
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--runs", type=int, default=1, metavar="K",
                        help="run each configuration K times a repeat, interleaved (every configuration once, then "
                             "again, in alternating order), and score by the median of its K steps; the scoring "
                             "by each configuration's first run is printed beside it")
    parser.add_argument("--out", type=Path, default=None, help="keep the run directories here")
    parser.add_argument("--dry-run", action="store_true", help="print the plan, run nothing")
    parser.add_argument("--rescore", type=Path, default=None, metavar="DIR",
                        help="run nothing: advise again, with this checkout, the planted runs an earlier bench kept "
                             "in DIR (--out), and score the advice against that bench's runs (--repeat and --runs "
                             "as it ran); a change none of them ran is not scored")
    args = parser.parse_args()
    cases = [c for c in CASES if not args.only or any(c.name.startswith(o) for o in args.only)]
    if not cases:
        sys.exit(f"advise_bench: no case starts with {args.only}")
    if args.runs < 1 or args.repeat < 1:
        sys.exit("advise_bench: --runs and --repeat must be at least 1")
    if args.dry_run:
        plan(cases, args.repeat, args.runs)
        return
    missing = advise_available()
    if missing is not None:
        print(f"advise_bench: skipped: `overlapprof advise` is not in this checkout ({missing}); it comes with "
              "the advise branch (issue 37)")
        return
    if args.rescore is not None:
        rescore(cases, args.rescore, args.repeat, args.runs)
        return
    from overlapprof.launch.host import PIN_ENV

    os.environ.setdefault(PIN_ENV, "1")  # each rank on a core of its own (OVERLAPPROF_PIN=0 to compare)
    out = args.out or Path(tempfile.mkdtemp(prefix="advise-bench-"))
    out.mkdir(parents=True, exist_ok=True)
    start = _uptime()
    print(f"start: {time.strftime('%H:%M:%S', time.gmtime())} UTC; {start}; runs in {out}")
    print(f"{'case':<22} {'rep':>3} {'planted':>8} {'best':>8} {'its changes, in order':<36} {'1st ms':>8} "
          f"{'all ms':>8} {'5%':>4} {'pred sav':>8} {'real sav':>8} {'25%':>4} {'worst':>7} {'quiet':>5}")
    rows, median_rows = [], []
    for rep in range(args.repeat):
        runner = Runner(out, f"r{rep}")
        order = cases if rep % 2 == 0 else cases[::-1]
        for case in order:
            rows.append(_case(case, rep, runner))
        if args.runs > 1:
            median_rows += _median_of_runs(order, rep, runner, args.runs)
    if args.runs > 1:
        print(f"\nscored by the median of each configuration's {args.runs} runs:")
        _summary(median_rows)
        print("\nscored by each configuration's first run (the rows above the median-of-runs ones):")
    _summary(rows)
    print(f"end: {time.strftime('%H:%M:%S', time.gmtime())} UTC; {_uptime()}")


def rescore(cases: list[Case], out: Path, repeat: int, runs: int) -> None:
    """``--rescore``: the cases scored again on the runs kept in ``out``, each planted run advised
    by this checkout (a model change judged on the same runs: no run's noise between before and
    after)."""
    print(f"rescore of {out} at {time.strftime('%H:%M:%S', time.gmtime())} UTC; {_uptime()}")
    rows, median_rows = [], []
    for rep in range(repeat):
        saved = saved_runs(out, f"r{rep}")
        order = cases if rep % 2 == 0 else cases[::-1]
        rows += [_case(case, rep, saved) for case in order]
        if runs > 1:
            print(f"-- repeat {rep}: each configuration's step the median of its runs --")
            medians = Saved(out, saved.tag, dirs=saved.dirs, runs=saved.runs,
                            steps={k: statistics.median(v) for k, v in saved.runs.items()})
            median_rows += [_case(case, rep, medians) for case in order]
    if runs > 1:
        print(f"\nscored by the median of each configuration's {runs} runs:")
        _summary(median_rows)
        print("\nscored by each configuration's first run (the rows above the median-of-runs ones):")
    _summary(rows)


def _median_of_runs(cases: list[Case], rep: int, runner: Runner, runs: int) -> list[dict]:
    """``--runs K``: every configuration the cases ran (grids, the configurations suggestions led
    to) K - 1 times more, all of them once a round in alternating order, so that the load moves
    them alike; then the cases scored again with each configuration's step the median of its K
    (the advice is still that of the planted configuration's first run)."""
    configs = list(runner.runs)
    for k in range(1, runs):
        for config in (configs if k % 2 == 0 else configs[::-1]):
            runner.again(config)
    print(f"-- repeat {rep}: the same cases, each configuration's step the median of its {runs} runs --")
    medians = median_of_runs(runner)
    return [_case(case, rep, medians) for case in cases]


def _case(case: Case, rep: int, runner: Runner) -> dict:
    grid = grid_configs(case)
    planted_dir = runner.run(grid[0])
    advice = advise(planted_dir)
    for k in grid[1:]:
        runner.run(k)
    steps = {k: runner.steps[k] for k in grid}
    planted = runner.steps[grid[0]]
    best = min(steps.values())
    items, led = advice.get("items", []), []
    for item in items:
        config = config_of(planted_dir, item["joint_change"])
        if isinstance(config, str):
            led.append((item, None, config))
            continue
        config = _full(config)
        if config not in steps:
            if runner.run(config) is None:  # --rescore: the bench it reads never ran it
                led.append((item, None, f"{_describe(config)} not run in the saved bench"))
                continue
            steps[config] = runner.steps[config]
        led.append((item, steps[config], ""))
    row = {"case": case.name, "rep": rep, "planted": planted, "best": best, "items": len(items),
           "nothing_better": best >= 0.97 * planted}
    if not led:
        row["top_ok"] = planted <= 1.05 * best
    else:
        # the advice is its items together: each saving on top of the ones above it (issue 37),
        # an item's joint_change it and every item above it; judged at the last item a rerun
        # makes with all those above it (a code change no option makes ends the run of them: its
        # why is said), the first alone printed beside it
        first = led[0]
        made = next((k for k, (_, ms, _) in enumerate(led) if ms is None), len(led))
        joint = led[max(made - 1, 0)]
        shown = led[:max(made, 1)]
        row["top"] = " + ".join(i["change"] for i, _, _ in shown) + (
            f" (+{len(led) - len(shown)} not rerun)" if len(led) > len(shown) else "")
        row["top_ms"], row["joint_ms"] = first[1], joint[1]
        row["top_ok"] = first[1] is not None and first[1] <= 1.05 * best
        row["joint_ok"] = joint[1] is not None and joint[1] <= 1.05 * best
        row["pred"] = first[0]["saving_us"] / 1e3
        row["joint_pred"] = sum(i["saving_us"] for i, _, _ in shown) / 1e3
        if first[1] is not None:
            row["real"] = planted - first[1]
            row["saving_ok"] = abs(row["pred"] - row["real"]) <= 0.25 * abs(row["real"])
        if joint[1] is not None:
            real = planted - joint[1]
            row["joint_saving_ok"] = abs(row["joint_pred"] - real) <= 0.25 * abs(real)
        row["why"] = led[made][2] if made < len(led) else ""
    slowest = [ms / planted - 1 for _, ms, _ in led if ms is not None]
    row["worst"] = max(slowest) if slowest else None
    row["quiet_ok"] = not items if row["nothing_better"] else None
    _print(row)
    return row


def _fmt(value, spec) -> str:
    return "-" if value is None else format(value, spec)


def _yes(value) -> str:
    return "-" if value is None else "yes" if value else "NO"


def _print(r: dict) -> None:
    print(f"{r['case']:<22} {r['rep']:>3} {r['planted']:>8.2f} {r['best']:>8.2f} {r.get('top', '(none)')[:36]:<36} "
          f"{_fmt(r.get('top_ms'), '8.2f'):>8} {_fmt(r.get('joint_ms'), '8.2f'):>8} {_yes(r['top_ok']):>4} "
          f"{_fmt(r.get('pred'), '8.2f'):>8} {_fmt(r.get('real'), '8.2f'):>8} {_yes(r.get('saving_ok')):>4} "
          f"{'-' if r['worst'] is None else format(100 * r['worst'], '+.1f') + '%':>7} {_yes(r['quiet_ok']):>5}"
          + (f"  ({r['why']})" if r.get("why") else ""), flush=True)


def _share(values: list) -> tuple[float | None, str]:
    judged = [v for v in values if v is not None]
    return (sum(judged) / len(judged) if judged else None), f"{sum(judged)}/{len(judged)}"


def _summary(rows: list[dict]) -> None:
    top, top_n = _share([r["top_ok"] for r in rows])
    saving, saving_n = _share([r.get("saving_ok") for r in rows])
    slower = [r for r in rows if r["worst"] is not None and r["worst"] > 0.02]
    quiet, quiet_n = _share([r["quiet_ok"] for r in rows])

    def verdict(share, target):
        return "n/a" if share is None else "PASS" if share >= target else "FAIL"

    joint, joint_n = _share([r.get("joint_ok", r["top_ok"]) for r in rows])
    joint_saving, joint_saving_n = _share([r.get("joint_saving_ok") for r in rows])
    print(f"\ntop suggestion within 5% of the grid's best: {top_n} = {_fmt(top and 100 * top, '.0f')}% "
          f"(target >= 80%: {verdict(top, 0.8)}); its changes together: {joint_n} = {_fmt(joint and 100 * joint, '.0f')}%")
    print(f"predicted saving within ±25% of realized: {saving_n} = {_fmt(saving and 100 * saving, '.0f')}% "
          f"(target >= 80%: {verdict(saving, 0.8)}); its changes together: {joint_saving_n} = "
          f"{_fmt(joint_saving and 100 * joint_saving, '.0f')}%")
    print(f"a suggestion more than 2% slower: {len(slower)} ({', '.join(r['case'] for r in slower) or 'none'}; "
          f"target 0: {'PASS' if not slower else 'FAIL'})")
    print(f"no advice where the grid finds nothing better than 3%: {quiet_n} = {_fmt(quiet and 100 * quiet, '.0f')}% "
          f"(target 100%: {verdict(quiet, 1.0)})")


if __name__ == "__main__":
    main()
