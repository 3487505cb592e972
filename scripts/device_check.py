"""The CUDA check (issues 10 and 29): everything the GPUs of this machine allow, one verdict line
per check. Run it through scripts/device_check.sh (which installs the wheels the machine lacks).

On one GPU (NCCL refuses two ranks on one device) every workload variant that runs on one rank
runs with ``--nproc 1 --device cuda``: allreduce, collectives (broadcast, all_reduce, scatter,
wait_vs_sync), ddp and fsdp; ring, pipeline and collectives' sync/async need two ranks and are
left out (said in a SKIP line). On N >= 2 GPUs every workload and variant runs on ``--nproc N``.
Then ``overlapprof.profile`` records examples/ddp_profile.py under torch.distributed.run (DDP
and its no_sync baseline), and benchmarks/overhead_bench.py measures the profiler's overhead.

Checks, per run: it ended ok; every rank's traces hold CUDA kernels, the workload's
``record_function`` phases, ``distributedInfo`` (nccl) and CUDA event-sync records
(``cuda_sync`` events or ``cudaStreamWaitEvent`` calls); in async variants, communication and
compute on different streams, overlapping in time (or, for a 1-rank group, what NCCL launched);
``overlapprof analyze`` reads them in GPU mode, and tests/test_cuda_traces.py finds its numbers
equal to an independent computation from the raw events; the ddp/fsdp/pipeline variants computed
the same results; wait() vs torch.cuda.synchronize() on the host; the profiler's overhead
(target < 1.05); the whole check under 8 minutes.

Into --out (``$OUT`` on the device machine): device_check.log (everything), verdicts.txt,
cuda_traces.tar.gz (every run directory's run.json and its rank 0 traces, for tests/data/cuda).

``--dry-run`` (CI, no GPU): checks the wiring instead: every command above parses (the CLI's own
parser, the workloads' variants and options, the scripts' arguments), the wheel list pins what is
installed here, and the trace checks run on a GPU trace recorded elsewhere (tests/data).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # gpu_reference: the classifier shared with the tests
import gpu_reference  # noqa: E402

WHEELS = REPO / "scripts" / "device_wheels.txt"
BUDGET_S = 8 * 60
COMMAND_TIMEOUT_S = 240
SETTINGS = ["--warmup-steps", "2", "--wait", "1", "--warmup", "1", "--active", "8"]
# Sizes for a GPU: compute kernels long enough for communication to hide under.
GPU_OPTIONS = {
    "allreduce": {"width": 4096, "batch": 16384},
    "collectives": {"size": 4096, "numel": 4194304},
    "ddp": {"width": 4096, "batch": 4096, "bucket_cap_mb": 25.0},
    "fsdp": {"width": 4096, "batch": 4096},
    "ring": {"size": 8192, "chunk": 4194304},
    "pipeline": {"width": 4096, "batch": 8192},
}
TWO_RANKS = {"ring": None, "pipeline": None, "collectives": ("sync", "async")}  # None: every variant
PHASES = {"allreduce": {"compute", "comm"}, "collectives": {"compute"}, "ddp": {"forward", "backward"},
          "fsdp": {"forward", "backward"}, "ring": {"compute", "comm"}, "pipeline": {"forward", "backward"}}
CHECKSUMS = ("ddp", "fsdp", "pipeline")


@dataclass
class Command:
    name: str
    argv: list[str]
    run_dirs: dict[str, Path] = field(default_factory=dict)  # variant -> run directory it makes
    workload: str | None = None
    overlapping: tuple[str, ...] = ()  # the variants whose communication should run under compute
    stdout: str = ""


@dataclass
class Verdicts:
    lines: list[str] = field(default_factory=list)
    failed: int = 0

    def say(self, status: str, check: str, detail: str = "") -> None:
        line = f"{status:<4}  {check}" + (f": {detail}" if detail else "")
        self.lines.append(line)
        self.failed += status == "FAIL"
        print(line, flush=True)


def variants_of(workload: str) -> list[str]:
    from overlapprof.workload import load

    return list(load(REPO / "workloads" / f"{workload}.py").variants)


def plan(gpus: int, work: Path) -> list[Command]:
    """The commands of the check on ``gpus`` GPUs, in order."""
    commands = []
    for workload, options in GPU_OPTIONS.items():
        variants = variants_of(workload)
        if gpus < 2 and workload in TWO_RANKS:
            two = TWO_RANKS[workload]
            variants = [v for v in variants if two is not None and v not in two]
        if not variants:
            continue
        argv = [sys.executable, "-m", "overlapprof", "run", str(REPO / "workloads" / f"{workload}.py"),
                "--device", "cuda", "--nproc", str(gpus), "--run-id", workload, "--out", str(work),
                "--no-analyze", "-q", "--gzip", *SETTINGS]
        argv += [a for v in variants for a in ("--variant", v)]
        argv += [a for k, v in options.items() for a in ("--opt", f"{k}={v}")]
        commands.append(Command(f"run {workload} ({', '.join(variants)})", argv,
                                {v: work / f"{workload}-{v}" for v in variants}, workload, ("async",)))
    for run_id, extra in (("profile-ddp-no-sync", ["--no-sync"]), ("profile-ddp", [])):
        argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(gpus),
                str(REPO / "examples" / "ddp_profile.py"), "--out", str(work), "--run-id", run_id, "--active", "8",
                "--width", "4096", "--batch", "4096", "--bucket-cap-mb", "25", *extra]
        commands.append(Command(f"overlapprof.profile {run_id}", argv, {run_id: work / run_id},
                                overlapping=() if extra else (run_id,)))
    commands.append(Command("overhead", [sys.executable, str(REPO / "benchmarks" / "overhead_bench.py"),
                                         "--device", "cuda", "--nproc", str(gpus), "--workload", "allreduce",
                                         "--repeat", "3",
                                         *[a for k, v in GPU_OPTIONS["allreduce"].items() for a in ("--opt", f"{k}={v}")]]))
    return commands


def skipped(gpus: int) -> list[str]:
    if gpus >= 2:
        return []
    return [f"{w}: {'every variant' if v is None else ', '.join(v)} (needs 2 ranks; NCCL refuses 2 ranks on 1 GPU)"
            for w, v in TWO_RANKS.items()]


# ---- the checks on traces ----------------------------------------------------------------------

def trace_verdicts(v: Verdicts, label: str, path: Path, phases: set[str] | None, is_async: bool) -> None:
    trace = gpu_reference.load(path)
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
    kernels = sum(e.get("cat") in ("kernel", "Kernel") for e in events)
    v.say("PASS" if kernels else "FAIL", f"{label}: CUDA kernels", f"{kernels} in {path.name}")
    if phases:
        seen = {e.get("name") for e in events if e.get("cat") == "user_annotation"} & phases
        v.say("PASS" if seen else "FAIL", f"{label}: record_function phases", ", ".join(sorted(seen)) or "none of "
              + ", ".join(sorted(phases)))
    info = trace.get("distributedInfo") or {}
    v.say("PASS" if info.get("backend") == "nccl" else "FAIL", f"{label}: distributedInfo",
          f"backend {info.get('backend')}, rank {info.get('rank')} of {info.get('world_size')}")
    sync = sum(e.get("cat") == "cuda_sync" for e in events)
    waits = sum(e.get("name") == "cudaStreamWaitEvent" for e in events)
    v.say("PASS" if sync or waits else "FAIL", f"{label}: CUDA event-sync records",
          f"{sync} cuda_sync events, {waits} cudaStreamWaitEvent calls")
    if is_async:
        stream_verdict(v, label, gpu_reference.classify(trace))


def stream_verdict(v: Verdicts, label: str, classes) -> None:
    """Communication and compute on different streams, overlapping in time; else what NCCL launched."""
    if not classes.comm:
        v.say("INFO", f"{label}: streams", "no communication activity on the GPU (NCCL launched nothing here)")
        return
    names: dict[str, int] = {}
    for a in classes.comm:
        names[a.name] = names.get(a.name, 0) + 1
    launched = ", ".join(f"{n} x{c}" for n, c in sorted(names.items(), key=lambda x: -x[1])[:3])
    comm_streams = {a.stream for a in classes.comm}
    compute_streams = {a.stream for a in classes.compute}
    overlap = gpu_reference.length(gpu_reference.intersection(
        gpu_reference.union((a.start, a.end) for a in classes.comm),
        gpu_reference.union((a.start, a.end) for a in classes.compute)))
    ok = bool(comm_streams - compute_streams) and overlap > 0
    v.say("PASS" if ok else "FAIL", f"{label}: comm and compute on different streams, overlapping",
          f"comm streams {sorted(map(str, comm_streams))}, compute streams {sorted(map(str, compute_streams))}, "
          f"{overlap:.1f} us overlapped; NCCL launched {launched}")


# ---- the real check ----------------------------------------------------------------------------

def execute(v: Verdicts, command: Command, log, deadline: float) -> bool:
    left = deadline - time.monotonic()
    if left < 30:
        v.say("SKIP", command.name, "out of time")
        return False
    start = time.monotonic()
    try:
        proc = subprocess.run(command.argv, capture_output=True, text=True, cwd=REPO,
                              timeout=min(COMMAND_TIMEOUT_S, left))
    except subprocess.TimeoutExpired:
        v.say("FAIL", command.name, f"timed out after {min(COMMAND_TIMEOUT_S, left):.0f} s")
        return False
    log.write(f"\n$ {' '.join(command.argv)}\n{proc.stdout}{proc.stderr}")
    log.flush()
    took = time.monotonic() - start
    if proc.returncode != 0:
        v.say("FAIL", command.name, f"exit {proc.returncode} after {took:.0f} s: {proc.stderr.strip()[-300:]}")
        return False
    v.say("PASS", command.name, f"{took:.0f} s")
    command.stdout = proc.stdout
    return True


def analyze_json(run_dir: Path) -> dict | None:
    out = run_dir.parent / f"{run_dir.name}.report.json"
    proc = subprocess.run([sys.executable, "-m", "overlapprof", "analyze", str(run_dir), "--json", str(out)],
                          capture_output=True, text=True, cwd=REPO, timeout=COMMAND_TIMEOUT_S)
    return json.loads(out.read_text()) if proc.returncode == 0 and out.is_file() else None


def run_verdicts(v: Verdicts, command: Command) -> dict[str, dict]:
    """Every check of one command's run directories; returns {variant: analyze's report}."""
    reports = {}
    for variant, run_dir in command.run_dirs.items():
        label = run_dir.name
        run = json.loads((run_dir / "run.json").read_text())
        v.say("PASS" if run["status"] == "ok" else "FAIL", f"{label}: run.json", f"status {run['status']}")
        phases = PHASES.get(command.workload) if command.workload else None
        for rank, files in sorted(run["traces"].items()):
            for name in files[:1]:
                trace_verdicts(v, f"{label} rank {rank}", run_dir / name, phases, variant in command.overlapping)
        report = analyze_json(run_dir)
        modes = sorted({r["mode"] for r in report["ranks"]}) if report else []
        v.say("PASS" if modes == ["gpu"] else "FAIL", f"{label}: overlapprof analyze", f"modes {modes}")
        if report:
            reports[variant] = report
            s = report["summary"]
            v.say("INFO", f"{label}: overlap", f"comm {s['comm_us'] / 1000:.3f} ms, overlapped "
                  f"{s['overlapped_us'] / 1000:.3f} ms, pooled ratio {s['pooled_ratio']}")
    return reports


def checksums(run_dir: Path) -> dict:
    run = json.loads((run_dir / "run.json").read_text())
    return {rank: {name: values.get("profiled") for name, values in info["metrics"].items()
                   if name.endswith("_checksum")} for rank, info in run["ranks"].items()}


def workload_verdicts(v: Verdicts, command: Command, reports: dict, gpus: int) -> None:
    dirs = command.run_dirs
    if command.workload in CHECKSUMS and len(dirs) > 1:
        sums = {variant: checksums(d) for variant, d in dirs.items()}
        first = next(iter(sums.values()))
        same = all(s == first for s in sums.values()) and any(first.values())
        v.say("PASS" if same else "FAIL", f"{command.workload}: results equal across variants", json.dumps(sums)[:300])
    if "sync" in reports and "async" in reports:
        hidden = {k: reports[k]["summary"]["pooled_ratio"] or 0.0 for k in ("sync", "async")}
        status = "PASS" if hidden["async"] > hidden["sync"] else ("FAIL" if gpus >= 2 else "INFO")
        v.say(status, f"{command.workload}: async hides more than sync",
              f"overlap ratio {hidden['sync']:.2%} (sync) vs {hidden['async']:.2%} (async)")
    if "wait_vs_sync" in dirs:
        run = json.loads((dirs["wait_vs_sync"] / "run.json").read_text())
        values = {name: [x for info in run["ranks"].values() for x in info["metrics"].get(name, {}).get("profiled", [])]
                  for name in ("wait_host_ms", "synchronize_host_ms")}
        if all(values.values()):
            wait, sync = (statistics.median(values[n]) for n in ("wait_host_ms", "synchronize_host_ms"))
            v.say("PASS" if wait < sync else "FAIL", "collectives wait_vs_sync: wait() returns before "
                  "torch.cuda.synchronize()", f"host median {wait:.3f} ms vs {sync:.3f} ms")
        else:
            v.say("FAIL", "collectives wait_vs_sync", "no wait_host_ms/synchronize_host_ms metrics")


def real_check(args) -> int:
    import torch

    started = time.monotonic()
    deadline = started + BUDGET_S - 20
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    v = Verdicts()
    gpus = torch.cuda.device_count()
    with open(out / "device_check.log", "w") as log:
        if gpus == 0:
            v.say("FAIL", "GPU", f"torch {torch.__version__} sees no CUDA device")
            return finish(v, out, work, started)
        nccl = ".".join(map(str, torch.cuda.nccl.version())) if hasattr(torch.cuda, "nccl") else "?"
        v.say("INFO", "machine", f"{gpus} x {torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA "
              f"{torch.version.cuda}, NCCL {nccl}, python {sys.version.split()[0]}")
        from overlapprof.launch.recording import cuda_sync_events_config

        v.say("PASS" if cuda_sync_events_config() is not None else "FAIL", "profiler option enable_cuda_sync_events")
        for line in skipped(gpus):
            v.say("SKIP", line)
        for command in plan(gpus, work):
            if not execute(v, command, log, deadline):
                continue
            if command.name == "overhead":
                overhead_verdict(v, command.stdout)
                continue
            reports = run_verdicts(v, command)
            if command.workload:
                workload_verdicts(v, command, reports, gpus)
        profile_compare(v, work, log)
        reference = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                    "tests/test_cuda_traces.py"], capture_output=True, text=True, cwd=REPO,
                                   env={**os.environ, "OVERLAPPROF_CUDA_TRACES": str(work)}, timeout=COMMAND_TIMEOUT_S)
        log.write(f"\n$ pytest tests/test_cuda_traces.py\n{reference.stdout}{reference.stderr}")
        tail = (reference.stdout.strip().splitlines() or ["no output"])[-1]
        v.say("PASS" if reference.returncode == 0 else "FAIL", "analyzer = independent reference "
              "(tests/test_cuda_traces.py)", tail)
    return finish(v, out, work, started)


def profile_compare(v: Verdicts, work: Path, log) -> None:
    dirs = [work / "profile-ddp-no-sync", work / "profile-ddp"]
    if not all((d / "run.json").is_file() for d in dirs):
        return
    proc = subprocess.run([sys.executable, "-m", "overlapprof", "compare", *map(str, dirs)], capture_output=True,
                          text=True, cwd=REPO, timeout=COMMAND_TIMEOUT_S)
    log.write(f"\n$ overlapprof compare {' '.join(map(str, dirs))}\n{proc.stdout}{proc.stderr}")
    v.say("PASS" if proc.returncode == 0 else "FAIL", "overlapprof compare of the overlapprof.profile runs",
          f"exit {proc.returncode}")


def overhead_verdict(v: Verdicts, stdout: str) -> None:
    line = next((ln for ln in stdout.splitlines() if ln.startswith("median ratio")), "")
    try:
        ratio = float(line.split(":")[1].split()[0])
    except (IndexError, ValueError):
        v.say("FAIL", "profiler overhead", "no ratio in overhead_bench's output")
        return
    v.say("PASS" if ratio < 1.05 else "FAIL", "profiler overhead on CUDA steps (target < 1.05)", line)


def finish(v: Verdicts, out: Path, work: Path, started: float) -> int:
    took = time.monotonic() - started
    v.say("PASS" if took < BUDGET_S else "FAIL", "the whole check under 8 minutes", f"{took:.0f} s")
    with tarfile.open(out / "cuda_traces.tar.gz", "w:gz") as tar:
        for run_json in sorted(work.glob("*/run.json")):
            run = json.loads(run_json.read_text())
            tar.add(run_json, arcname=f"{run_json.parent.name}/run.json")
            for name in run.get("traces", {}).get("0", []):
                tar.add(run_json.parent / name, arcname=f"{run_json.parent.name}/{name}")
    (out / "verdicts.txt").write_text("\n".join(v.lines) + "\n")
    print(f"device check: {v.failed} failed of {len(v.lines)} lines; {took:.0f} s", flush=True)
    return 1 if v.failed else 0


# ---- the dry run -------------------------------------------------------------------------------

def load_script(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def validate(command: Command) -> str | None:
    """Why ``command`` would not run as written, or None."""
    argv = command.argv[1:]
    try:
        if argv[:3] == ["-m", "overlapprof", "run"]:
            from overlapprof.cli.run_cmd import run
            from overlapprof.workload import load

            ctx = run.make_context("run", argv[3:])
            workload = load(ctx.params["workload"])
            workload.check_variants(ctx.params["variants"])
            workload.resolve_options(ctx.params["opts"], ctx.params["workload_args"])
        elif argv[:2] == ["-m", "torch.distributed.run"]:
            script = next(Path(a) for a in argv if a.endswith(".py"))
            rest = argv[argv.index(str(script)) + 1:]
            load_script(script).parse_args(rest)
        else:
            load_script(Path(argv[0])).parse_args(argv[1:])
    except SystemExit as exc:
        return f"arguments refused (exit {exc.code})"
    except Exception as exc:  # noqa: BLE001 - any refusal is the answer
        return f"{type(exc).__name__}: {exc}"
    return None


def wheel_problems() -> list[str]:
    from importlib.metadata import PackageNotFoundError, version

    problems, pins = [], [ln.split("#")[0].strip() for ln in WHEELS.read_text().splitlines()]
    for pin in filter(None, pins):
        name, eq, wanted = pin.partition("==")
        try:
            have = version(name)
        except PackageNotFoundError:
            have = None
        if not eq or have != wanted:
            problems.append(f"{pin}: installed here {have}")
    return problems


def dry_run(args) -> int:
    v = Verdicts()
    work = Path(args.work)
    for gpus in (1, 2):
        for command in plan(gpus, work):
            problem = validate(command)
            v.say("FAIL" if problem else "PASS", f"dry run, {gpus} GPU(s): {command.name}", problem or "parses")
        for line in skipped(gpus):
            v.say("SKIP", f"dry run, {gpus} GPU(s): {line}")
    problems = wheel_problems()
    v.say("FAIL" if problems else "PASS", f"dry run: wheels ({WHEELS.name})", "; ".join(problems) or "pinned to "
          "the versions installed here")
    sample = REPO / "tests" / "data" / "trace_filter" / "sampled_rank-0.json.gz"
    checks = Verdicts()  # the trace checks on a GPU trace from elsewhere: their code runs; their verdicts inform
    print("dry run: the trace checks on tests/data/trace_filter (a GPU trace recorded elsewhere):", flush=True)
    trace_verdicts(checks, "trace_filter rank 0", sample, None, True)
    print(f"dry run: {v.failed} failed of {len(v.lines)} checks", flush=True)
    return 1 if v.failed else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="check the wiring, without a GPU")
    parser.add_argument("--out", default=os.environ.get("OUT") or "device_check_out",
                        help="where the log, the verdicts and the traces go (default: $OUT)")
    parser.add_argument("--work", default=None,
                        help="where the run directories go (default: a fresh folder under /tmp; runs never overwrite)")
    args = parser.parse_args(argv)
    args.work = args.work or tempfile.mkdtemp(prefix="device_check-")
    return dry_run(args) if args.dry_run else real_check(args)


if __name__ == "__main__":
    sys.exit(main())
