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

``run.json`` (schema_version 1) is one typed record, :class:`RunRecord` (its fields documented
there; :class:`RankRecord` and :class:`NodeRecord` are the fragments, :class:`ProfilerConfig`
the profiler settings the launcher hands the harness). ``load_run`` is its one reader and
``merge`` (through ``write_record``) its one writer; fields added since a run directory was
written take their defaults, so old run directories still load. It is written atomically (temp
file + ``os.replace``) when the run starts and again, merged from the fragments, when a launcher
ends. Its parts: the run's config (workload, variant, options, world size, nodes, backend,
device, ``--timeout``, the ``--link-rate`` link, the profiler settings, versions, environment),
then ``status``, ``created``, ``nodes`` and ``ranks`` (the fragments, by number), ``traces``
(each rank's trace files), ``missing_ranks`` and ``failure`` (the root cause and its
consequences, from ``overlapprof.launch.blame``).

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

import os
import time
from pathlib import Path
from typing import Any

import msgspec

from overlapprof.errors import RunDirError
from overlapprof.launch import blame

SCHEMA_VERSION = 1
RUN_FILE = "run.json"
FINAL_RANK_STATES = ("ok", "failed", "interrupted")
_JOIN_WAIT_S = 10.0  # how long a joining node waits for the creator's run.json to appear


# -- the records ------------------------------------------------------------------------------
# Every field has a default, so that a run.json of an earlier version (or a hand-made one) loads;
# msgspec checks the types of what is there and skips fields it does not know.


class ProfilerConfig(msgspec.Struct, kw_only=True):
    """The profiler settings the launcher hands every rank's harness (``run.json`` "profiler")."""

    warmup_steps: int = 2
    """Unprofiled steps before the first cycle (``--warmup-steps``): NCCL builds its
    communicators, and its first ``recv`` blocks the host, during these."""
    unprofiled_steps: int = 3
    """Steps with the profiler off at the start of each cycle, the baseline of its overhead
    (as many as ``active``)."""
    wait: int = 1
    """``torch.profiler.schedule`` wait: steps skipped after the unprofiled ones (``--wait``)."""
    warmup: int = 1
    """Steps traced and discarded before the active ones (``--warmup``)."""
    active: int = 3
    """Steps recorded per cycle: the ProfilerSteps in each trace file (``--active``)."""
    repeat: int = 1
    """Cycles, one trace file per rank each (``--repeat``)."""
    record_shapes: bool = True
    """Record input shapes (message sizes of the collectives come from them)."""
    with_stack: bool = False
    """Record Python stacks in the traces (``--with-stack``; costly)."""
    gzip: bool = False
    """Write ``.pt.trace.json.gz`` (``--gzip``)."""


class Workload(msgspec.Struct, kw_only=True):
    name: str = ""
    """The workload file's name without ``.py`` (``ring``)."""
    path: str = ""
    """Its absolute path."""


class RunConfig(msgspec.Struct, kw_only=True):
    """The run-level part of run.json, fixed when a run starts; also each node's config."""

    schema_version: int = SCHEMA_VERSION
    name: str = ""
    """The run directory's name."""
    run_id: str | None = None
    """``--run-id``; null when the directory is named by the time."""
    workload: Workload = msgspec.field(default_factory=Workload)
    variant: str = ""
    """The workload variant this directory ran."""
    options: dict[str, Any] = {}
    """Every workload option, defaults applied."""
    world_size: int | None = None
    """Ranks over all nodes."""
    nnodes: int = 1
    nproc_per_node: int | None = None
    backend: str | None = None
    """"gloo" or "nccl"."""
    device: str | None = None
    """"cpu" or "cuda"."""
    timeout_s: float | None = None
    """``--timeout``: the longest a rank may make no progress."""
    link: dict[str, Any] | None = None
    """The ``--link-rate`` link (overlapprof.launch.netns), null for plain loopback."""
    profiler: ProfilerConfig = msgspec.field(default_factory=ProfilerConfig)
    versions: dict[str, str | None] = {}
    """python, torch, overlapprof, cuda, nccl, gloo (null: absent)."""
    env: dict[str, str] = {}
    """The relevant environment variables the ranks started with (CUDA_*, NCCL_*, ...)."""


class Where(msgspec.Struct, kw_only=True):
    """Where in the loop a rank was when it failed or stopped."""

    step: int | None = None
    """The step index: ProfilerStep#N, or the N-th warm-up step; null before the steps."""
    step_kind: str | None = None
    """"warmup", "unprofiled", "profiler_wait", "profiler_warmup", "profiled" or "setup"."""
    phase: str | None = None
    """The workload's ``ctx.phase`` it was in, if any."""


class RankRecord(msgspec.Struct, kw_only=True):
    """What a rank wrote about itself (``ranks/rank<N>.json``), completed by the launcher."""

    rank: int | None = None
    node_rank: int | None = None
    local_rank: int | None = None
    host: str | None = None
    pid: int | None = None
    device: str | None = None
    status: str = "starting"
    """"starting", "running", "ok", "failed" or "interrupted"."""
    error: str | None = None
    """One line: what went wrong, where (workload line, phase, step)."""
    error_kind: str | None = None
    """"exception" or "timeout" (its own failure), "exit" (died without reporting: exit code or
    signal, from torchelastic), "peer" (an error because a peer died), "terminated" (stopped by
    the launcher), "interrupted" (Ctrl-C), or null."""
    where: Where | None = None
    stalled_s: float | None = None
    """A rank that timed out or was stopped: seconds since its last step or phase boundary."""
    location: str | None = None
    """... and the call it was in (``in torch.distributed.recv at ring.py:41 `...```)."""
    waiting_on_peers: bool | None = None
    """... and whether that call waits on other ranks (a torch.distributed call)."""
    started: float | None = None
    """Unix seconds."""
    ended: float | None = None
    step_times_ms: dict[str, list[float]] = {}
    """Host milliseconds of each step, by kind of step (see the module docstring)."""
    profiled_steps: list[int] = []
    """The ProfilerStep#N in the traces."""
    metrics: dict[str, dict[str, list[float]]] = {}
    """``ctx.metric`` values: {name_unit: {step kind: [values]}}."""
    traces: list[str] = []
    """Its trace files, one per profiler cycle, in order."""


class NodeRecord(msgspec.Struct, kw_only=True):
    """What node K's launcher wrote (``nodes/node<K>.json``); run.json's copy has config null."""

    node_rank: int | None = None
    host: str | None = None
    pid: int | None = None
    command: list[str] | None = None
    """The launcher's argv."""
    started: float | None = None
    ended: float | None = None
    status: str = "claimed"
    """"claimed", "running", "ok" or "failed"."""
    error: str | None = None
    """The launch's own error ("interrupted (SIGINT)", a rendezvous timeout), else null."""
    config: RunConfig | None = None


class Failure(msgspec.Struct, kw_only=True):
    """The root cause of a failed run (overlapprof.launch.blame.root_cause)."""

    rank: int
    error: str | None = None
    error_kind: str | None = None
    """The rank's error_kind, or "stalled": no progress in its own code while others waited."""
    consequences: list[int] = []
    """The other ranks that failed, because of it."""


class RunRecord(RunConfig, kw_only=True):
    """``run.json``: the run's config and what became of it."""

    status: str = "running"
    """"running", "ok", "failed", "interrupted" or "incomplete" (blame.run_status)."""
    created: float | None = None
    """Unix seconds when the directory was created."""
    nodes: dict[str, NodeRecord] = {}
    ranks: dict[str, RankRecord] = {}
    traces: dict[str, list[str] | str] = {}
    """Each rank's trace files, relative to the directory."""
    missing_ranks: list[int] = []
    """Ranks of world_size with no record here (:func:`missing_ranks`)."""
    failure: Failure | None = None


def missing_ranks(world_size, present):
    """The ranks of ``world_size`` not among ``present`` (ints or digit strings), sorted; [] when
    the world size is unknown."""
    if not isinstance(world_size, int):
        return []
    return sorted(set(range(world_size)) - {int(r) for r in present if str(r).isdigit()})


def decode_run(data):
    """A RunRecord from run.json's bytes; raises ValueError (with msgspec's reason) if they are
    not one."""
    try:
        return msgspec.json.decode(data, type=RunRecord)
    except msgspec.DecodeError as exc:
        raise ValueError(str(exc)) from None


def run_from_builtins(run):
    """A RunRecord from run.json as a dict (a saved report's ``run``), or None if it is not."""
    try:
        return msgspec.convert(run, RunRecord) if isinstance(run, dict) else None
    except msgspec.ValidationError:
        return None


def to_builtins(record):
    """A record as plain dicts and lists (what run.json holds)."""
    return msgspec.to_builtins(record)


def write_record(path, record):
    """Write a record as indented JSON, atomically (see :func:`write_json_atomic`)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(msgspec.json.format(msgspec.json.encode(record), indent=1) + b"\n")
    os.replace(tmp, path)


def read_rank(path):
    return msgspec.json.decode(Path(path).read_bytes(), type=RankRecord)


def read_node(path):
    return msgspec.json.decode(Path(path).read_bytes(), type=NodeRecord)


def update_rank(path, **fields):
    """Set ``fields`` (plain values: a ``where`` may be a dict) of a rank's record, atomically;
    returns the new record."""
    data = to_builtins(read_rank(path))
    data.update(to_builtins(fields))
    record = msgspec.convert(data, RankRecord)
    write_record(path, record)
    return record


def update_node(path, **fields):
    record = msgspec.structs.replace(read_node(path), **fields)
    write_record(path, record)
    return record


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
    """``progress/rank{N}.json``, rewritten by rank N's watchdog every 2 s while it runs:
    {"rank", "updated" (unix s), "idle_s" (seconds since its last step or phase boundary),
    "traces" (saved so far), "ended" (null, "ok" or "stopped"), "step", "step_kind", "phase"};
    the launcher's heartbeat reads it."""
    return Path(run_dir) / "progress" / f"rank{rank}.json"


def launcher_log(run_dir, node_rank):
    """``logs/node{K}.launcher.log``: torchelastic's own log lines of node K's launcher."""
    return Path(run_dir) / "logs" / f"node{node_rank}.launcher.log"


def write_json_atomic(path, data):
    """Write JSON to a temp file in the same directory, then rename it over ``path``."""
    import json  # here, as in read_json: the analyzer reads run directories without it

    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, default=str)
        f.write("\n")
    os.replace(tmp, path)


def write_progress(path, data):
    """A rank's progress record, atomically and cheaply: it is written from the rank's watchdog
    thread while the steps run, so it holds the GIL as briefly as it can (msgspec, one write)."""
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, msgspec.json.encode(data))
    finally:
        os.close(fd)
    os.replace(tmp, path)


def read_json(path):
    import json

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

    ``header`` (a RunConfig) is the run-level part of run.json; ``ranks`` the global ranks this
    node starts. Raises RunDirError when the directory exists and may not be joined, or a rank
    is taken."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        path.mkdir()
        created = True
    except FileExistsError:
        if header.nnodes == 1:
            raise RunDirError(f"run directory {path} exists; runs are never overwritten") from None
        created = False
    if created:
        for sub in ("logs", "ranks", "nodes", "progress"):
            (path / sub).mkdir()
        write_record(path / RUN_FILE, RunRecord(**msgspec.structs.asdict(header),
                                                status="running", created=time.time()))
    else:
        _check_joinable(path, header)
        (path / "progress").mkdir(exist_ok=True)
    _claim(node_file(path, node_rank), NodeRecord(node_rank=node_rank, status="claimed"), path)
    for local_rank, rank in enumerate(ranks):
        _claim(rank_file(path, rank), RankRecord(rank=rank, node_rank=node_rank,
                                                 local_rank=local_rank, status="starting"), path)
    return path


def _check_joinable(path, header):
    run_file = path / RUN_FILE
    deadline = time.monotonic() + _JOIN_WAIT_S
    while not run_file.exists() and time.monotonic() < deadline:
        time.sleep(0.1)  # the creator is between mkdir and writing run.json
    try:
        existing = decode_run(run_file.read_bytes())
    except (OSError, ValueError):
        raise RunDirError(f"run directory {path} exists and is not an overlapprof run") from None
    same = (existing.status == "running" and existing.run_id == header.run_id
            and existing.nnodes == header.nnodes)
    if not same:
        raise RunDirError(f"run directory {path} exists and is not a running {header.nnodes}-"
                          f"node run of --run-id {header.run_id}; runs are never overwritten")


def _claim(path, record, run_dir):
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        raise RunDirError(f"{path.name} of run directory {run_dir} is already taken (another "
                          "launcher with the same --node-rank, or a stale run)") from None
    with os.fdopen(fd, "wb") as f:
        f.write(msgspec.json.encode(record))


def _records(directory, prefix, kind):
    """{number: record} of the ``<prefix><number>.json`` files in ``directory``."""
    found = {}
    for file in sorted(Path(directory).glob(f"{prefix}*.json")):
        try:
            found[int(file.stem[len(prefix):])] = msgspec.json.decode(file.read_bytes(), type=kind)
        except (ValueError, OSError, msgspec.DecodeError):
            continue  # a file being replaced right now; the next merge sees it
    return dict(sorted(found.items()))


def merge(run_dir):
    """Fold the node and rank records into run.json (atomically) and return it (a RunRecord)."""
    run_dir = Path(run_dir)
    run = decode_run((run_dir / RUN_FILE).read_bytes())
    nodes = _records(run_dir / "nodes", "node", NodeRecord)
    ranks = _records(run_dir / "ranks", "rank", RankRecord)
    run.nodes = {str(k): msgspec.structs.replace(v, config=None) for k, v in nodes.items()}
    run.ranks = {str(k): v for k, v in ranks.items()}
    run.traces = {str(k): v.traces for k, v in ranks.items()}
    run.missing_ranks = missing_ranks(run.world_size, ranks)
    cause = blame.root_cause(ranks)
    run.failure = None if cause is None else Failure(
        rank=cause[0], error=cause[1], error_kind=cause[2], consequences=cause[3])
    run.status = blame.run_status(ranks.values(), nodes.values(), run.failure, run.missing_ranks)
    write_record(run_dir / RUN_FILE, run)
    return run


def load_run(run_dir):
    """The RunRecord of a run directory: run.json's one reader. Raises RunDirError when it is
    missing, unreadable, or of another schema version."""
    path = Path(run_dir) / RUN_FILE
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise RunDirError(f"{run_dir} is not a run directory (no {RUN_FILE})") from None
    except OSError as exc:
        raise RunDirError(f"{path}: unreadable: {exc}") from None
    try:
        run = decode_run(data)
    except ValueError as exc:
        raise RunDirError(f"{path}: unreadable: {exc}") from None
    if run.schema_version != SCHEMA_VERSION:
        raise RunDirError(f"{path}: schema_version {run.schema_version!r} is not "
                          f"{SCHEMA_VERSION}")
    return run


def host():
    import socket  # here: the analyzer reads run directories without it (as json)

    return socket.gethostname()
