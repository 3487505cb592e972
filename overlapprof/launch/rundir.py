"""Run directories: naming, creating (or joining, on a multi-node run), and the atomic ``run.json``.

No torch here: the analyzer reads run directories through ``load_run``.

Layout of one run directory (one per variant; the directory is a TensorBoard logdir)::

    <out>/<workload>-<YYYYmmdd-HHMMSS>-<variant>/   or   <out>/<run-id>-<variant>/
        run.json                              the merged record below
        rank{N}.<time_ns>.pt.trace.json[.gz]  one per rank and profiler cycle (torch-tb-profiler
                                              names: worker "rank{N}", span <time_ns>)
        logs/rank{N}.stdout.log, .stderr.log  each rank's output (global rank N)
        logs/rank{N}.error.json               torchelastic's error file of a failed rank
        ranks/rank{N}.json                    what rank N wrote about itself (its fragment)
        nodes/node{K}.json                    what the launcher of node K wrote (config, command)

``run.json`` (schema_version 1), written atomically (temp file + ``os.replace``) when the run
starts and again, merged from the fragments, when a launcher ends::

    schema_version  1
    status          "running" | "ok" | "failed" | "incomplete" (ranks missing: another node's
                    directory on a filesystem that is not shared)
    name, run_id    directory name; the --run-id (null when named by time)
    created         unix seconds (float) when the directory was created
    workload        {"name": "ring", "path": "/abs/workloads/ring.py"}
    variant         "async"
    options         {"size": 256, ...}  every option, defaults applied
    world_size, nnodes, nproc_per_node
    backend, device "gloo" | "nccl";  "cpu" | "cuda"
    timeout_s       --timeout
    link            null (plain loopback, or another node's network) | the --link-rate link:
                    {"kind": "tbf", "interface": "lo", "rate": "2gbit", "bits_per_s": 2e9,
                     "burst_bytes", "latency_ms", "shared": true (one medium of that rate for
                     all ranks, not a port per rank), "medium": what that means, "qdisc": the
                     `tc qdisc show dev lo` line inside the namespace}  (overlapprof.launch.netns)
    profiler        {"warmup_steps", "unprofiled_steps", "wait", "warmup", "active", "repeat",
                     "record_shapes", "with_stack", "gzip"}
    versions        {"python", "torch", "overlapprof", "cuda", "nccl", "gloo"}  (null: absent)
    env             {"OMP_NUM_THREADS": "1", "NCCL_DEBUG": ..., ...} relevant variables the
                    ranks were started with (CUDA_*, OMP_NUM_THREADS, NCCL_*, TORCH_NCCL_*, ...)
    nodes           {"0": {"host", "pid", "command": [argv], "started", "ended", "status",
                     "error"}}
    ranks           {"0": {"rank", "node_rank", "local_rank", "host", "pid", "device",
                     "status": "starting"|"running"|"ok"|"failed", "error": str|null,
                     "error_kind": "exception"|"timeout" (its own failure), "peer" (an error
                     because a peer died), "terminated" (stopped by the launcher), "exit" (died
                     without reporting: signal or exit code from torchelastic), or null,
                     "where": {"step", "step_kind", "phase"} (where a failure happened),
                     "started", "ended" (unix seconds),
                     "step_times_ms": {"warmup": [...], "unprofiled": [...],
                                       "profiler_wait": [...], "profiler_warmup": [...],
                                       "profiled": [...]},
                     "profiled_steps": [N, ...] (the ProfilerStep#N in the traces),
                     "metrics": {"name_unit": {"<step kind>": [values]}} (from ctx.metric),
                     "traces": ["rank0.<time_ns>.pt.trace.json", ...]}}
    traces          {"0": [...]}  the ranks' trace files, one per profiler cycle, in order
    missing_ranks   ranks of world_size with no fragment here
    failure         null | {"rank", "error", "error_kind"}: the root cause, i.e. the earliest
                    failure of kind exception or timeout, else the earliest of the others

Step times are host wall times in milliseconds around one call of the workload's step (on CUDA
after ``torch.cuda.synchronize()``). "warmup" steps run first, unprofiled (NCCL builds its
communicators then; the first one shows it). Then each profiler cycle runs "unprofiled" steps
(profiler off: the baseline of its overhead, ``unprofiled_steps`` = ``active`` per cycle), then
"profiler_wait", "profiler_warmup" and "profiled" steps, the ones in the trace.

Joining: on a single node a run directory is created with ``mkdir`` and never reused. With
``--nnodes`` > 1 every node computes the same path from ``--run-id``; the first to arrive creates
it, the others join it only while its run.json says "running" for the same run id and node
count, and each node claims its own ranks' fragment files exclusively (``O_EXCL``), so a
second launch with the same id and node rank, or a stale directory, is refused.
"""

import json
import os
import socket
import time
from pathlib import Path

from overlapprof.errors import RunDirError

SCHEMA_VERSION = 1
RUN_FILE = "run.json"
FINAL_RANK_STATES = ("ok", "failed", "interrupted")
_JOIN_WAIT_S = 10.0  # how long a joining node waits for the creator's run.json to appear


def run_dir_names(workload, variants, run_id=None, stamp=None):
    """Directory name per variant: ``<run_id>-<variant>``, else
    ``<workload>-<YYYYmmdd-HHMMSS>-<variant>`` so the variants of one invocation sort together."""
    prefix = run_id or f"{workload}-{stamp or time.strftime('%Y%m%d-%H%M%S')}"
    return {variant: f"{prefix}-{variant}" for variant in variants}


def plan_run_dirs(out, workload, variants, run_id=None, joinable=False):
    """Paths of the run directories of one invocation, checked before anything starts.

    A name made from the time that is taken gets a counter (``...-HHMMSS-2-async``); a
    ``run_id`` name that is taken is an error unless ``joinable`` (multi-node: checked again
    when the directory is opened)."""
    out = Path(out)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for attempt in range(1, 1000):
        suffix = stamp if attempt == 1 else f"{stamp}-{attempt}"
        names = run_dir_names(workload, variants, run_id, suffix)
        taken = [out / name for name in names.values() if (out / name).exists()]
        if not taken or joinable:
            return {variant: out / name for variant, name in names.items()}
        if run_id:
            raise RunDirError(f"run directory {taken[0]} exists; runs are never overwritten "
                              "(pick another --run-id or --out)")
    raise RunDirError(f"no free run directory name under {out}")


def trace_file_name(rank, gzip=False):
    """A ``tensorboard_trace_handler``-style name: worker ``rank{N}``, span ``<time_ns>``."""
    return f"rank{rank}.{time.time_ns()}.pt.trace.json" + (".gz" if gzip else "")


def log_paths(run_dir, rank):
    """(stdout, stderr, torchelastic error file) of global rank ``rank``."""
    logs = Path(run_dir) / "logs"
    return (logs / f"rank{rank}.stdout.log", logs / f"rank{rank}.stderr.log",
            logs / f"rank{rank}.error.json")


def rank_file(run_dir, rank):
    return Path(run_dir) / "ranks" / f"rank{rank}.json"


def node_file(run_dir, node_rank):
    return Path(run_dir) / "nodes" / f"node{node_rank}.json"


def progress_file(run_dir, rank):
    """``progress/rank{N}.json``, rewritten by rank N's watchdog every second while it runs:
    {"rank", "updated" (unix s), "idle_s" (seconds since its last step or phase boundary),
    "traces" (saved so far), "step", "step_kind", "phase"}; the launcher's heartbeat reads it."""
    return Path(run_dir) / "progress" / f"rank{rank}.json"


def launcher_log(run_dir, node_rank):
    """``logs/node{K}.launcher.log``: torchelastic's own log lines of node K's launcher."""
    return Path(run_dir) / "logs" / f"node{node_rank}.launcher.log"


def write_json_atomic(path, data):
    """Write JSON to a temp file in the same directory, then rename it over ``path``."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, default=str)
        f.write("\n")
    os.replace(tmp, path)


def read_json(path):
    with open(path) as f:
        return json.load(f)


def update_json(path, **fields):
    """Read a fragment, set ``fields``, write it back atomically; returns the new content."""
    data = read_json(path)
    data.update(fields)
    write_json_atomic(path, data)
    return data


def open_run_dir(path, header, node_rank, ranks):
    """Create the run directory (or join it, on a multi-node run) and claim this node's files.

    ``header`` is the run-level part of run.json; ``ranks`` the global ranks this node starts.
    Raises RunDirError when the directory exists and may not be joined, or a rank is taken."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        path.mkdir()
        created = True
    except FileExistsError:
        if header["nnodes"] == 1:
            raise RunDirError(f"run directory {path} exists; runs are never overwritten") from None
        created = False
    if created:
        for sub in ("logs", "ranks", "nodes", "progress"):
            (path / sub).mkdir()
        write_json_atomic(path / RUN_FILE, {**header, "status": "running", "created": time.time(),
                                            "nodes": {}, "ranks": {}, "traces": {},
                                            "missing_ranks": [], "failure": None})
    else:
        _check_joinable(path, header)
        (path / "progress").mkdir(exist_ok=True)
    _claim(node_file(path, node_rank), {"node_rank": node_rank, "status": "claimed"}, path)
    for local_rank, rank in enumerate(ranks):
        _claim(rank_file(path, rank), {"rank": rank, "node_rank": node_rank,
                                       "local_rank": local_rank, "status": "starting"}, path)
    return path


def _check_joinable(path, header):
    run_file = path / RUN_FILE
    deadline = time.monotonic() + _JOIN_WAIT_S
    while not run_file.exists() and time.monotonic() < deadline:
        time.sleep(0.1)  # the creator is between mkdir and writing run.json
    try:
        existing = read_json(run_file)
    except (OSError, ValueError):
        raise RunDirError(f"run directory {path} exists and is not an overlapprof run") from None
    same = (existing.get("status") == "running" and existing.get("run_id") == header["run_id"]
            and existing.get("nnodes") == header["nnodes"])
    if not same:
        raise RunDirError(f"run directory {path} exists and is not a running {header['nnodes']}-"
                          f"node run of --run-id {header['run_id']}; runs are never overwritten")


def _claim(path, content, run_dir):
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        raise RunDirError(f"{path.name} of run directory {run_dir} is already taken (another "
                          "launcher with the same --node-rank, or a stale run)") from None
    with os.fdopen(fd, "w") as f:
        json.dump(content, f)


def _fragments(directory, prefix):
    """{number: content} of ``<prefix><number>.json`` files in ``directory``."""
    found = {}
    for file in sorted(Path(directory).glob(f"{prefix}*.json")):
        try:
            found[int(file.stem[len(prefix):])] = read_json(file)
        except (ValueError, OSError):
            continue  # a file being replaced right now; the next merge sees it
    return dict(sorted(found.items()))


def merge(run_dir):
    """Fold the node and rank fragments into run.json (atomically) and return it."""
    run_dir = Path(run_dir)
    run = read_json(run_dir / RUN_FILE)
    nodes = _fragments(run_dir / "nodes", "node")
    ranks = _fragments(run_dir / "ranks", "rank")
    run["nodes"] = {str(k): _without(v, "config") for k, v in nodes.items()}
    run["ranks"] = {str(k): v for k, v in ranks.items()}
    run["traces"] = {str(k): v.get("traces", []) for k, v in ranks.items()}
    run["missing_ranks"] = [r for r in range(run["world_size"]) if r not in ranks]
    run["failure"] = root_cause(ranks)
    run["status"] = run_status(ranks.values(), nodes.values(), run["failure"],
                               run["missing_ranks"])
    write_json_atomic(run_dir / RUN_FILE, run)
    return run


def run_status(ranks, nodes, failure, missing_ranks):
    """The run's status from its rank and node records (see the module docstring)."""
    states = {v.get("status") for v in ranks} | {v.get("status") for v in nodes}
    interrupted = "interrupted" in states or any(
        str(v.get("error") or "").startswith("interrupted") for v in nodes)
    if interrupted and (failure is None or failure["error_kind"] not in _OWN_FAILURES):
        return "interrupted"
    if failure or "failed" in states:
        return "failed"
    if states & {"starting", "running", "claimed"}:
        return "running"
    return "incomplete" if missing_ranks else "ok"


# A rank's own failure, not a consequence of another's or of the launcher stopping it.
_OWN_FAILURES = ("exception", "timeout", "stalled", "exit")
_STALL_MIN_S = 1.0  # a stopped rank this long without progress, outside communication, stalled


def stalled_in_own_code(info):
    """Did a failed rank stop making progress in its own code (not waiting on its peers in a
    torch.distributed call) for at least a second before the watchdog or the launcher ended it?"""
    return (info.get("error_kind") in ("timeout", "terminated")
            and info.get("waiting_on_peers") is False
            and (info.get("stalled_s") or 0) >= _STALL_MIN_S)


def root_cause(ranks):
    """The failure that started it, with the ranks that failed as its consequence.

    Preference, then the earliest: a rank's own error (exception), or a rank that stalled in its
    own code (see :func:`stalled_in_own_code`: the ranks waiting for it time out in
    communication, and whichever watchdog fires first ends the run); then a death of its own
    (exit code, signal: its "ended" is when the launcher noticed, later than the peers' errors
    it caused); then a timeout while waiting on peers (a deadlock: all wait); then the rest.
    Returns {"rank", "error", "error_kind", "consequences": [ranks]} or None."""
    failed = [(rank, info) for rank, info in ranks.items() if info.get("status") == "failed"]
    if not failed:
        return None

    def preference(item):
        rank, info = item
        stalled = stalled_in_own_code(info)
        order = 0 if stalled or info.get("error_kind") == "exception" else {
            "exit": 1, "timeout": 2}.get(info.get("error_kind"), 3)
        # a stall is dated by its start, when the rank stopped making progress
        when = ((info.get("ended") or float("inf")) - (info.get("stalled_s") or 0)
                if stalled else info.get("ended") or float("inf"))
        return order, when, int(rank)

    rank, info = min(failed, key=preference)
    kind, error = info.get("error_kind"), info.get("error")
    if stalled_in_own_code(info):
        kind = "stalled"
        error = (f"made no progress for {info['stalled_s']:.0f} s in its own code, "
                 f"{info.get('location')}{where_text(info.get('where'))}")
    consequences = sorted((int(r) for r, _ in failed if r != rank))
    return {"rank": rank, "error": error, "error_kind": kind, "consequences": consequences}


def where_text(where):
    """", in phase 'compute' of ProfilerStep#0 (unprofiled)" from a record's "where"."""
    if not where or where.get("step") is None:
        return f", in phase '{where['phase']}'" if where and where.get("phase") else ""
    step = (f"warmup step {where['step']}" if where.get("step_kind") == "warmup"
            else f"ProfilerStep#{where['step']} ({where.get('step_kind')})")
    return f", in phase '{where['phase']}' of {step}" if where.get("phase") else f", in {step}"


def load_run(run_dir):
    """run.json of a run directory, as a dict (see the module docstring for its fields).
    Raises RunDirError when it is missing or unreadable."""
    path = Path(run_dir) / RUN_FILE
    try:
        run = read_json(path)
    except FileNotFoundError:
        raise RunDirError(f"{run_dir} is not a run directory (no {RUN_FILE})") from None
    except (OSError, ValueError) as exc:
        raise RunDirError(f"{path}: unreadable: {exc}") from None
    if run.get("schema_version") != SCHEMA_VERSION:
        raise RunDirError(f"{path}: schema_version {run.get('schema_version')!r} is not "
                          f"{SCHEMA_VERSION}")
    return run


def host():
    return socket.gethostname()


def _without(mapping, key):
    return {k: v for k, v in mapping.items() if k != key}
