"""What rerun makes a what-if change: :func:`change_to_request` turns a change (``overlapprof
whatif``'s ``--set`` strings, comma-combined ones too) into the
:class:`~overlapprof.launch.launcher.RunRequest` of a rerun of the same workload, from the run's
``run.json`` (its variant, options, ranks, device, link and profiler schedule), or into a
one-line reason when no rerun makes that change:

- ``bucket_cap_mb=N``: the workload's ``bucket_cap_mb`` option (DDP's bucket size), N MiB, on
  the variant whose buckets it sizes (:data:`BUCKETED`: ddp's sync variant reduces every gradient
  in one all_reduce after backward, whatever the size);
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
- ``micro_batches=N``: the workload's ``micro_batches`` option (the replay does not model it);
- ``no_host_sync``: the workload's ``host_sync`` option turned off, where it was on.

:func:`command` is the ``overlapprof run`` command line that makes a request. ``advise --verify``
(:mod:`overlapprof.launch.verify`) and the advice benchmark use it. It launches nothing, but reads
each change with the replay's own parser (:mod:`overlapprof.analysis.replay.changes`): with
verify.py, the modules tests/test_architecture.py allows both sides.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from overlapprof.errors import LaunchError, OverlapprofError
from overlapprof.launch import launcher, netns
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
# bucket_cap_mb=N: per bundled workload, the variant whose gradient buckets the option sizes
BUCKETED = {"ddp": "async"}
_ASYNC_NOTE = {"ddp": "DDP's async variant also splits the gradients into buckets (bucket_cap_mb), which the replay "
                      "of one all_reduce made asynchronous does not"}


def variant_change(workload: str, traced: str, variant: str) -> str | None:
    """The whatif change that makes ``variant`` of a bundled workload from its ``traced`` variant
    with the same options (:data:`ASYNC`'s entries that set none): the ring's sync to async is
    ``async=send_recv``; None where no change says it."""
    made = [(kind, waits) for (v, kind), (to, options, waits) in ASYNC.get(workload, {}).items()
            if v == traced and to == variant and not options]
    return ",".join(f"async={kind}{'@end' if waits == 'end' else ''}" for kind, waits in made) or None


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
    planned = plan_rerun(Path(run_dir), change)
    return planned if isinstance(planned, str) else planned.request


def plan_rerun(run_dir: Path, change: str) -> _Plan | str:
    """The rerun being planned for ``change`` (its request, its notes, the changes as it makes
    them), or the one-line reason no rerun makes it."""
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
        bucketed = BUCKETED.get(workload)
        if bucketed and req.variants != [bucketed]:
            plan.notes.append(f"bucket_cap_mb={value}: rerun with --variant {bucketed} (the {req.variants[0]} variant "
                              "has no buckets: its gradients are reduced in one all_reduce after backward)")
            req.variants = [bucketed]
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
    elif name == "no_host_sync":
        if not opts.get("host_sync"):
            return f"workload {workload} has no host_sync option turned on: its host synchronizations are its code's"
        opts["host_sync"] = False
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
