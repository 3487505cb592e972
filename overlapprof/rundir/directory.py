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

``run.json`` is one typed record (:mod:`overlapprof.rundir.run_record`): ``load_run`` is its one
reader and ``merge`` its one writer.

Joining: on a single node a run directory is created with ``mkdir`` and never reused. With
``--nnodes`` > 1 every node computes the same path from ``--run-id``; the first to arrive creates
it, the others join it only while its run.json says "running" for the same run id and node
count, and each node claims its own ranks' fragment files exclusively (``O_EXCL``), so a
second launch with the same id and node rank, or a stale directory, is refused.
"""

import os
import tempfile
import time
from pathlib import Path

import msgspec

from overlapprof.errors import RunDirError
from overlapprof.rundir import RUN_FILE, blame
from overlapprof.rundir.run_record import (SCHEMA_VERSION, Failure, NodeRecord, RankRecord, RunRecord,
                                          decode_run, missing_ranks, write_record)

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
    check_writable(out)
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


def check_writable(out):
    """Raise RunDirError (one line) unless run directories can be made under ``out``: every part
    of it that exists is a folder, and the deepest that exists takes a new folder (tried for
    real, then removed: permissions, a read-only filesystem, root's exceptions all answer)."""
    out = Path(out)
    existing = out
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise RunDirError(f"--out {out}: {existing} is a file, not a folder")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".overlapprof-check-", dir=existing))
    except OSError as exc:
        raise RunDirError(f"--out {out}: cannot create folders in {existing} "
                          f"({exc.strerror or exc})") from None


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
    try:
        create_run_dir(path, header)
    except FileExistsError:
        if header.nnodes == 1:
            raise RunDirError(f"run directory {path} exists; runs are never overwritten") from None
        _check_joinable(path, header)
        (path / "progress").mkdir(exist_ok=True)
    claim(path, node_rank, ranks)
    return path


def create_run_dir(path, header):
    """Make a new run directory with its folders and run.json ("running"). FileExistsError when
    ``path`` exists (runs are never overwritten; a multi-node run joins it); RunDirError (one
    line) when it cannot be made."""
    path = Path(path)
    existing = path.parent
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():  # mkdir would say "exists" (or "not a directory")
        raise RunDirError(f"cannot create run directory {path}: {existing} is a file, not a folder")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.mkdir()
    except FileExistsError:
        raise
    except OSError as exc:  # checked before the launch (check_writable), but a disk can fill since
        raise RunDirError(f"cannot create run directory {path}: {exc.strerror or exc}") from None
    for sub in ("logs", "ranks", "nodes", "progress"):
        (path / sub).mkdir()
    write_record(path / RUN_FILE, RunRecord(**msgspec.structs.asdict(header), status="running",
                                            created=time.time()))


def claim(path, node_rank, ranks, first_local_rank=0, node=True):
    """Claim node ``node_rank``'s record (unless ``node`` is False) and the fragments of
    ``ranks`` (local ranks from ``first_local_rank`` on) exclusively (``O_EXCL``): RunDirError
    when one is taken."""
    path = Path(path)
    if node:
        _claim(node_file(path, node_rank), NodeRecord(node_rank=node_rank, status="claimed"), path)
    for local_rank, rank in enumerate(ranks, first_local_rank):
        _claim(rank_file(path, rank), RankRecord(rank=rank, node_rank=node_rank,
                                                 local_rank=local_rank, status="starting"), path)


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
