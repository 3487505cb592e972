"""``overlapprof advise RUN --verify``: rerun the workload of a run of ``overlapprof run`` with
the advised changes, and put what the replay predicted beside what the reruns measured.

:func:`change_to_request` turns a what-if change (``overlapprof whatif``'s ``--set`` strings,
comma-combined ones too) into the :class:`~overlapprof.launch.launcher.RunRequest` of a rerun of
the same workload, from the run's ``run.json`` (its variant, options, ranks, device, link and
profiler schedule), or into a one-line reason when no rerun makes that change:

- ``bucket_cap_mb=N``: the workload's ``bucket_cap_mb`` option (DDP's bucket size), N MiB;
- ``prefetch=N``: the workload's ``prefetch`` option (FSDP), on its ``async`` variant; the replay
  issues each all-gather N units earlier *than traced*, so the rerun prefetches the traced depth
  (0 for the sync variant) + N;
- ``async=KIND[@end]``: the variant or option of this workload that issues the KIND operations
  asynchronously (:data:`ASYNC`; for the bundled workloads), or the ``wait_early``/``overlap``
  option turned off/on where that is what makes them so;
- ``link_rate=RATE``, ``bandwidth=xK``: ``--link-rate`` (the traced run's link at RATE, or at K
  times its rate; its queue kept);
- ``no_straggler=R``: the run without its slow-rank options, when R is their ``slow_rank``;
- ``compute=xF``: the workload's ``compute_repeat`` times F where that is a whole number (each
  compute op done that many times: exactly F x the compute), else its size option that scales
  compute alone (:data:`COMPUTE`),
  rounded: the factor the rerun really makes is said;
- ``micro_batches=N``: the workload's ``micro_batches`` option (the replay does not model it).

:func:`verify` predicts each change set with the replay (:mod:`overlapprof.analysis.replay`),
reruns the traced configuration (the baseline) and each set, the top K changes one at a time and
all together, with the baseline's rerun in the middle of the sequence so the machine's load moves
it as it moves the changed ones; each rerun is ``overlapprof run`` in a child process (the
launcher, and ``--link-rate``'s namespace, as a user's command would use them: :func:`command`
is that command). Each changed rerun is compared with the baseline's as ``overlapprof compare``
does (:func:`overlapprof.compare.compare`: median step over the (rank, step) pairs, the speedup's
95% bootstrap interval, and whether the machine's load moved enough to explain it). Runs go to
``out`` (default: ``<run>-verify`` beside the run), with ``verification.json``, rewritten after
each rerun so a failed one keeps what was measured before it.

This module launches (the launching side) and reads the runs back (it imports the reading side;
tests/test_architecture.py allows this one module both).
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from overlapprof.errors import LaunchError, OverlapprofError
from overlapprof.launch import launcher, netns
from overlapprof.report.advice import TriedSet, Verification
from overlapprof.rundir import directory
from overlapprof.rundir.schedule import ProfilerSchedule

# compute=xF: the option of a bundled workload whose value scales its compute alone, and the power
# the compute grows with (a matmul's side: its cube; rows of a batch: linearly). The pipeline's
# batch also sets what its stages send, so it has none.
COMPUTE = {"ring": ("size", 3), "collectives": ("size", 3), "allreduce": ("batch", 1), "ddp": ("batch", 1),
           "fsdp": ("batch", 1)}

# async=KIND: per bundled workload, (traced variant, KIND) -> (variant, options, where it waits): "use" where
# the result is first used (what async=KIND replays), "end" at the step's end (async=KIND@end). Either
# form of the change reruns the same; a form the workload does not wait as is said in the note.
ASYNC = {
    "ring": {("sync", "send_recv"): ("async", {}, "use")},
    "pipeline": {("sync", "send_recv"): ("async", {}, "use")},
    "collectives": {("sync", "send_recv"): ("async", {}, "end"),
                    **{(v, v): (v, {"overlap": True}, "end") for v in ("broadcast", "all_reduce")}},
    "allreduce": {("sync", "all_reduce"): ("async", {}, "end"),
                  ("async", "all_reduce"): ("async", {"wait_early": False, "host_sync": False}, "end")},
    "ddp": {("sync", "all_reduce"): ("async", {}, "end")},
}
_ASYNC_NOTE = {"ddp": "DDP's async variant also splits the gradients into buckets (bucket_cap_mb), which the replay "
                      "of one all_reduce made asynchronous does not"}
RESULT = "verification.json"


def _reason(change: str, why: str) -> str:
    return f"{change}: {why}"


@dataclasses.dataclass
class _Plan:
    """A rerun being planned: the request so far, and what the rerun does not do as replayed."""

    request: launcher.RunRequest
    notes: list[str]
    replayed: list[str] = dataclasses.field(default_factory=list)  # the changes as the rerun makes them, to predict


_WORKLOADS: dict = {}


def baseline_request(run_dir: Path) -> launcher.RunRequest:
    """The RunRequest that reruns the traced configuration of ``run_dir`` (run.json): the same
    workload, variant, options, ranks, device, backend, link, timeout and profiler schedule.
    Raises an OverlapprofError (one line) for a run that cannot be rerun here."""
    run = directory.load_run(run_dir)
    if run.nnodes != 1:
        raise LaunchError(f"{run_dir}: a run over {run.nnodes} nodes is not rerun by --verify (one node only)")
    path = Path(run.workload.path)
    if not run.workload.path or not path.is_file():
        raise LaunchError(f"{run_dir}: its workload file {run.workload.path or '(none)'} is not here to rerun")
    timeout = run.timeout_s or 300.0
    if path not in _WORKLOADS:
        _WORKLOADS[path] = launcher.load_workload(path, timeout)
    loaded = _WORKLOADS[path]
    options = loaded.resolve_options([f"{k}={v}" for k, v in run.options.items()])
    p = run.profiler
    link = None
    if run.link:
        link = netns.link_for(run.link["rate"], run.link.get("burst_bytes"), run.link.get("latency_ms"))
    return launcher.RunRequest(
        workload=loaded, variants=loaded.check_variants([run.variant]), options=options,
        nproc=run.nproc_per_node or run.world_size or 1, device=run.device or "auto", backend=run.backend or "auto",
        timeout_s=timeout, schedule=ProfilerSchedule(warmup_steps=p.warmup_steps, wait=p.wait, warmup=p.warmup,
                                                     active=p.active, repeat=p.repeat),
        with_stack=p.with_stack, gzip=p.gzip, out=Path(run_dir).parent, link=link, quiet=True)


def change_to_request(run_dir: Path, change: str) -> launcher.RunRequest | str:
    """The RunRequest of a rerun of ``run_dir``'s configuration that makes ``change`` (a what-if
    change; commas combine several), or a one-line reason why no rerun makes it. See the module
    docstring for what each change becomes."""
    plan = _plan(Path(run_dir), change)
    return plan if isinstance(plan, str) else plan.request


def _plan(run_dir: Path, change: str) -> _Plan | str:
    from overlapprof.analysis.replay.changes import parse

    try:
        pairs = parse(change)
    except OverlapprofError as exc:
        return str(exc).removeprefix("--set ")
    plan = _Plan(baseline_request(run_dir), [])
    plan.request.options = dict(plan.request.options)
    for name, value in pairs:
        plan.replayed.append(f"{name}={value}")
        why = _apply(plan, name, value)
        if why:
            return _reason(f"{name}={value}", why)
    req = plan.request
    try:  # the options' types, as `overlapprof run --opt` checks them
        req.options = req.workload.resolve_options([f"{k}={v}" for k, v in req.options.items()])
    except OverlapprofError as exc:
        return _reason(change, str(exc))
    return plan


def _apply(plan: _Plan, name: str, value: str) -> str | None:
    """Make one change in ``plan``; a reason when it cannot be made."""
    req = plan.request
    opts, workload = req.options, req.workload.name
    if name == "bucket_cap_mb":
        if "bucket_cap_mb" not in opts:
            return f"workload {workload} has no bucket_cap_mb option (DDP's bucket size) to set"
        try:
            mb = float(value)
        except ValueError:
            mb = -1.0
        if not 0 < mb < float("inf"):
            return "a size in MiB, a positive number"
        opts["bucket_cap_mb"] = mb
    elif name == "prefetch":
        if "prefetch" not in opts or "async" not in req.workload.variants:
            return f"workload {workload} has no prefetch option on an async variant (FSDP's prefetching)"
        if not value.isdigit() or int(value) < 1:
            return "how many units earlier, a whole number of at least 1"
        traced = opts["prefetch"] if req.variants == ["async"] else 0
        req.variants, opts["prefetch"] = ["async"], traced + int(value)
        plan.notes.append(f"prefetch={value}: rerun with --opt prefetch={traced + int(value)} "
                          f"(the traced {traced} + {value})")
    elif name == "async":
        kind, _, at = value.strip().lower().partition("@")
        table = ASYNC.get(workload, {})
        made = table.get((req.variants[0], kind))
        if made is None:
            said = ", ".join(f"async={k} from {v}" for v, k in table) or "none"
            return (f"no variant or option of workload {workload} makes it from its {req.variants[0]} variant "
                    f"(what reruns make: {said})")
        variant, options, waits = made
        req.variants = [variant]
        opts.update({k: v for k, v in options.items() if k in opts})
        if (at == "end") != (waits == "end"):
            where = "at the step's end" if waits == "end" else "where each result is first used"
            plan.replayed[-1] = f"async={kind}{'@end' if waits == 'end' else ''}"
            plan.notes.append(f"async={value}: the rerun waits {where}: predicted as {plan.replayed[-1]}, "
                              "what it makes")
        if workload in _ASYNC_NOTE:
            plan.notes.append(f"async={value}: {_ASYNC_NOTE[workload]}")
    elif name in ("link_rate", "bandwidth"):
        return _link(plan, name, value)
    elif name == "no_straggler":
        if not value.strip().lstrip("-").isdigit():
            return "a rank number"
        if opts.get("slow_rank") != int(value) or not opts.get("slow_ms", 0) > 0:
            return (f"rank {value} is not this run's slow rank (slow_rank={opts.get('slow_rank')}, slow_ms="
                    f"{opts.get('slow_ms')}): what makes it late is not an option a rerun can remove")
        for key in ("slow_rank", "slow_ms", "slow_compute"):
            opts[key] = req.workload.options[key].default
    elif name == "compute":
        return _compute(plan, value)
    elif name == "micro_batches":
        if "micro_batches" not in opts:
            return f"workload {workload} has no micro_batches option"
        if not value.isdigit() or int(value) < 1:
            return "a whole number of at least 1"
        opts["micro_batches"] = int(value)
    else:
        return "not a change a rerun makes"
    return None


def _link(plan: _Plan, name: str, value: str) -> str | None:
    from overlapprof.analysis.replay.changes import factor

    req = plan.request
    if req.link is None:
        return ("the traced run had no --link-rate link (plain loopback, or a GPU's interconnect): "
                "no rerun changes its bandwidth")
    if name == "link_rate":
        rate = value.strip().lower()
    else:
        try:
            k = factor(name, value)
        except OverlapprofError as exc:
            return str(exc).removeprefix("--set ")
        rate = _rate(req.link["bits_per_s"] * k)
    traced_default = req.link["burst_bytes"] == netns.default_burst(req.link["bits_per_s"])
    try:
        bits = netns.parse_rate(rate)
        req.link = netns.link_for(rate, None if traced_default else req.link["burst_bytes"], req.link["latency_ms"])
    except LaunchError as exc:
        return str(exc)
    plan.notes.append(f"{name}={value}: rerun with --link-rate {rate} ({bits / 1e9:g} Gbit/s)")
    return None


def _rate(bits: float) -> str:
    """tc's spelling of ``bits`` per second: ``4gbit``, ``500mbit``, else whole bits."""
    bits = int(round(bits))
    for unit, n in (("gbit", 10**9), ("mbit", 10**6), ("kbit", 10**3)):
        if bits % n == 0:
            return f"{bits // n}{unit}"
    return f"{bits}bit"


def _compute(plan: _Plan, value: str) -> str | None:
    from overlapprof.analysis.replay.changes import factor

    req = plan.request
    known = COMPUTE.get(req.workload.name)
    if known is None or known[0] not in req.options:
        return (f"workload {req.workload.name} has no option that scales its compute alone (a faster device is "
                "not something a rerun here can make)")
    try:
        f = factor("compute", value)
    except OverlapprofError as exc:
        return str(exc).removeprefix("--set ")
    repeat = req.options.get("compute_repeat")
    if isinstance(repeat, int) and abs(repeat * f - round(repeat * f)) < 1e-9 and round(repeat * f) >= 1:
        req.options["compute_repeat"] = round(repeat * f)  # the same ops N times: exactly F x the compute
        plan.notes.append(f"compute={value}: rerun with --opt compute_repeat={round(repeat * f)} (each compute op "
                          f"done {round(repeat * f)} times, not {repeat})")
        return None
    key, power = known
    old = req.options[key]
    new = max(1, round(old * f ** (1 / power)))
    if new == old:
        return f"{key}={old} scaled by {f:g}^(1/{power}) rounds to itself"
    req.options[key] = new
    plan.notes.append(f"compute={value}: rerun with --opt {key}={new} (compute x{(new / old) ** power:.3f}, "
                      f"as {key}^{power})")
    return None


def command(request: launcher.RunRequest, run_id: str) -> list[str]:
    """The ``overlapprof run`` command line that makes ``request`` (its one variant) as run
    ``<request.out>/<run_id>-<variant>``, without analysis, quiet."""
    r = request
    cmd = [sys.executable, "-m", "overlapprof", "run", str(r.workload.path), "--nproc", str(r.nproc),
           "--device", r.device, "--backend", r.backend, "--timeout", f"{r.timeout_s:g}",
           "--warmup-steps", str(r.schedule.warmup_steps), "--wait", str(r.schedule.wait), "--warmup",
           str(r.schedule.warmup), "--active", str(r.schedule.active), "--repeat", str(r.schedule.repeat),
           "--variant", r.variants[0], "--run-id", run_id,
           "--out", str(r.out), "--no-analyze", "-q"]
    cmd += ["--gzip"] if r.gzip else []
    cmd += ["--with-stack"] if r.with_stack else []
    if r.link:
        cmd += ["--link-rate", r.link["rate"], "--link-burst", str(r.link["burst_bytes"]),
                "--link-latency", f"{r.link['latency_ms']:g}"]
    defaults = {k: o.default for k, o in r.workload.options.items()}
    for key, value in r.options.items():
        if value != defaults.get(key):
            cmd += ["--opt", f"{key}={str(value).lower() if isinstance(value, bool) else value}"]
    return cmd


class VerifyFailed(LaunchError):
    """A rerun failed: the message is one line; ``verification`` holds what was measured before
    (also in ``<out>/verification.json``). Exit code 1: the run failed, not the input."""

    exit_code = 1

    def __init__(self, message: str, verification: Verification):
        super().__init__(message)
        self.verification = verification


def _rerun(request, run_id: str, label: str, where: str, progress) -> Path:
    run_dir = Path(request.out) / f"{run_id}-{request.variants[0]}"
    log = Path(request.out) / f"{run_id}.log"
    progress(f"{where} {label}: running ({run_dir})")
    started = time.monotonic()
    with open(log, "w") as f:
        proc = subprocess.run(command(request, run_id), stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        said = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
        line = next((ln for ln in reversed(said) if ln.startswith("Error:")), said[-1] if said else "no output")
        raise _Failed(f"{line.removeprefix('Error: ')} (exit {proc.returncode}; its output in {log})")
    progress(f"{where} {label}: done in {time.monotonic() - started:.0f} s")
    return run_dir


class _Failed(Exception):
    pass


def _steps(report) -> list[float]:
    return [s.step_us for r in report.ranks for s in r.steps]


def verify(run_dir: Path, changes: list[str], *, top: int, out: Path | None,
           progress: Callable[[str], None]) -> Verification:
    """Rerun ``run_dir``'s configuration and the first ``top`` of ``changes`` one at a time and
    all together (one set when ``top`` is 1), and compare each with the baseline's rerun (see the
    module docstring). Raises an OverlapprofError (one line) before any rerun when a change cannot
    be rerun or the run cannot be read, and :class:`VerifyFailed` when a rerun fails."""
    from overlapprof.analysis.analyzer import analyze
    from overlapprof.analysis.replay.predict import whatif
    from overlapprof.analysis.stats import median, percentile
    from overlapprof.compare import compare
    from overlapprof.errors import InputError

    run_dir = Path(run_dir)
    chosen = list(changes[:max(top, 1)])
    if not chosen:
        raise InputError("--verify: no change to verify")
    sets = [[c] for c in chosen] + ([chosen] if len(chosen) > 1 else [])
    plans = [_plan(run_dir, ",".join(s)) for s in sets]
    for s, plan in zip(sets, plans):
        if isinstance(plan, str):
            raise InputError(f"--verify cannot rerun {','.join(s)}: {plan}")
    base = baseline_request(run_dir)
    out = Path(out) if out is not None else run_dir.parent / f"{run_dir.name}-verify"
    out.mkdir(parents=True, exist_ok=True)
    progress(f"predicting {len(sets)} change set{'s' if len(sets) > 1 else ''} from {run_dir}")
    predicted = whatif([str(run_dir)], [",".join(plan.replayed) for plan in plans], workers=1)
    result = Verification(traced_step_us=predicted.traced_step_us)
    tried = [TriedSet(changes=[], predicted_step_us=predicted.traced_step_us,
                      note="the traced configuration, rerun: the baseline of the speedups")]
    for s, p, plan in zip(sets, predicted.predictions, plans):
        notes = list(plan.notes) + ([] if p.modelled else [f"not predicted: {p.reason}"])
        tried.append(TriedSet(changes=list(s), predicted_step_us=p.step_us, predicted_low_us=p.low_us,
                              predicted_high_us=p.high_us, note="; ".join(notes) or None))
    requests = [base] + [plan.request for plan in plans]
    for r in requests:
        r.out = out
    half = len(sets) // 2  # the baseline in the middle: the load moves it as it moves the others
    order = [*range(1, 1 + half), 0, *range(1 + half, len(requests))]
    stamp = time.strftime("%H%M%S")
    run_ids = {k: f"{stamp}-{'baseline' if k == 0 else f'set{k}'}" for k in order}
    reports = {}
    for n, k in enumerate(order, 1):
        label = "baseline" if k == 0 else ",".join(tried[k].changes)
        try:
            rerun = _rerun(requests[k], run_ids[k], label, f"[{n}/{len(order)}]", progress)
        except _Failed as exc:
            _note(tried[k], f"rerun failed: {exc}")
            result.sets = tried
            _save(result, out)
            raise VerifyFailed(f"--verify: the rerun of {label} failed: {exc}; what was measured before is in "
                               f"{out / RESULT}", result) from None
        tried[k].run = str(rerun)
        reports[k] = analyze([str(rerun)], workers=1)
        steps = _steps(reports[k])
        if steps:
            t = tried[k]
            t.realized_step_us, t.realized_low_us, t.realized_high_us = \
                median(steps), percentile(steps, 2.5), percentile(steps, 97.5)
            if t.predicted_low_us is not None and t.predicted_high_us is not None:
                t.within = t.predicted_low_us <= t.realized_step_us <= t.predicted_high_us
        if 0 in reports:
            if k == 0:
                _drift(tried[0], result.traced_step_us)
            for j in [j for j in reports if j != 0 and tried[j].speedup is None]:
                _against(tried[j], reports[0], reports[j], compare, result.traced_step_us)
        result.sets = tried
        _save(result, out)
    return result


def _note(t: TriedSet, line: str) -> None:
    t.note = "; ".join(filter(None, [t.note, line]))


DRIFT = 0.10  # a baseline rerun this far from the traced step says the machine changed between them


def _drift(base: TriedSet, traced_us: float | None) -> None:
    """Say when the baseline's rerun is far from the traced step: the predicted steps (from the
    traced run) then cannot match the reruns' steps, and the speedups are what to judge."""
    if traced_us and base.realized_step_us and abs(base.realized_step_us / traced_us - 1) > DRIFT:
        _note(base, f"the rerun took {base.realized_step_us / traced_us:.2f}x the traced step: the machine (its load) "
                    "changed since the trace; judge the changes by their speedups against this rerun")


def _against(t: TriedSet, base_report, report, compare, traced_us: float | None) -> None:
    """The speedup of ``report``'s steps against the baseline rerun's, as ``compare`` gives it,
    and whether the predicted speedup (traced step / predicted step) lies in its interval."""
    v = compare([base_report, report], labels=["baseline", "changed"]).variants[1]
    t.speedup = v.speedup
    if v.speedup_ci is not None:
        t.speedup_low, t.speedup_high = v.speedup_ci
        if traced_us and t.predicted_step_us:
            predicted = traced_us / t.predicted_step_us
            inside = t.speedup_low <= predicted <= t.speedup_high
            _note(t, f"predicted speedup {predicted:.2f}x: {'inside' if inside else 'outside'} the realized one's "
                     f"interval")
    if "speedup" in v.not_trusted:
        _note(t, "speedup not trusted: the machine's load moved enough between the baseline's rerun and this one "
                 "to explain it")


def _save(result: Verification, out: Path) -> None:
    import msgspec

    (out / RESULT).write_bytes(msgspec.json.format(msgspec.json.encode(result), indent=2) + b"\n")
