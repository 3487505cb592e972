"""The run directory's record, ``run.json``, and its fragments: typed records (msgspec), read and
written atomically. No torch here: the analyzer reads them.

``run.json`` (schema_version 1) is one typed record, :class:`RunRecord` (its fields documented
there; :class:`RankRecord` and :class:`NodeRecord` are the fragments, :class:`ProfilerConfig`
the profiler settings the launcher hands the harness, their schedule the one
:class:`~overlapprof.rundir.schedule.ProfilerSchedule`). ``directory.load_run`` is its one reader
and ``directory.merge`` (through :func:`write_record`) its one writer; fields added since a run
directory was written take their defaults, so old run directories still load. It is written atomically (temp
file + ``os.replace``) when the run starts and again, merged from the fragments, when a launcher
ends. Its parts: the run's config (workload, variant, options, world size, nodes, backend,
device, ``--timeout``, the ``--link-rate`` link, the profiler settings, versions, environment),
then ``status``, ``created``, ``nodes`` and ``ranks`` (the fragments, by number), ``traces``
(each rank's trace files), ``missing_ranks`` and ``failure`` (the root cause and its
consequences, from ``overlapprof.rundir.blame``).

Step times are host wall times in milliseconds around one call of the workload's step (on CUDA
after ``torch.cuda.synchronize()``). "warmup" steps run first, unprofiled (NCCL builds its
communicators then; the first one shows it). Then each profiler cycle runs "unprofiled" steps
(profiler off: the baseline of its overhead, ``unprofiled_steps`` = ``active`` per cycle), then
"profiler_wait", "profiler_warmup" and "profiled" steps, the ones in the trace.
"""

import os
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import msgspec

from overlapprof.rundir.schedule import ProfilerSchedule

SCHEMA_VERSION = 1
FINAL_RANK_STATES = ("ok", "failed", "interrupted", "incomplete")


# Every field has a default, so that a run.json of an earlier version (or a hand-made one) loads;
# msgspec checks the types of what is there and skips fields it does not know.


@dataclass
class ProfilerConfig(ProfilerSchedule):
    """The profiler settings the launcher hands every rank's harness (``run.json`` "profiler"): the
    schedule (:class:`~overlapprof.rundir.schedule.ProfilerSchedule`'s fields, ``unprofiled_steps``
    resolved: :meth:`of`) and what is recorded."""

    record_shapes: bool = True
    """Record input shapes (message sizes of the collectives come from them)."""
    with_stack: bool = False
    """Record Python stacks in the traces (``--with-stack``; costly)."""
    gzip: bool = False
    """Write ``.pt.trace.json.gz`` (``--gzip``)."""
    cuda_sync_events: bool = False
    """CUDA runs: the profiler records CUDA synchronization events (``cuda_sync``: which stream
    waited for which event), where the installed torch can (``_ExperimentalConfig``); the causes
    of exposure read the windows of communication from them."""

    @classmethod
    def of(cls, schedule: ProfilerSchedule, **recorded) -> "ProfilerConfig":
        """run.json's ``profiler``: ``schedule`` (its ``unprofiled_steps`` resolved) and ``recorded``."""
        return cls(**asdict(schedule.schedule()), **recorded)


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
    """The ``--link-rate`` link (overlapprof.launch.netns; :func:`describe_link` in words), null for
    plain loopback."""
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


class MachineLoad(msgspec.Struct, kw_only=True):
    """The machine's load while this node's ranks ran their measured steps (recorded by the
    node's local rank 0, as :mod:`overlapprof.launch.machine` says).

    **The rule.** Let ``free`` = 1 − the other processes' share over a kind of steps: the part of the
    machine left to the run. Two sets of steps compared (two variants' profiled steps, or a run's
    profiled against its unprofiled steps) ran on machines that differed by the *load factor*
    ``F = max(free_a / free_b, free_b / free_a)``. A rank's CPU-bound work can differ by ``F`` from
    the load alone, and ranks that meet in collectives each wait for the one the load held back, so
    a step can differ by up to ``F ** EXPONENT`` (2). When ``F >= FLOOR`` (the load moved by 5% or
    more) and ``F ** EXPONENT`` is at least the smallest difference the measurement allows (its
    interval's edge nearest to 1x; 1x when the interval includes it), the load moved enough to
    explain what was measured: the comparison is reported as not trusted, with a rerun suggested,
    instead of a verdict.
    """

    host: str | None = None
    cores: int | None = None
    load_average: list[float] = []
    """The 1-minute load average when the measured steps began and when they ended."""
    other_share: dict[str, float] = {}
    """By kind of step (``unprofiled``, ``profiled``): the share (0-1) of the machine's CPU time
    that processes outside this run took while the run's steps of that kind ran."""
    seconds: dict[str, float] = {}
    """By kind of step: the wall seconds measured."""
    ticks: dict[str, int] = {}
    """By kind of step: the machine's CPU time measured, in clock ticks (100 a second per CPU);
    a kind with fewer than ``overlapprof.launch.machine.MIN_TICKS`` has no ``other_share`` (too coarse)."""


class RankRecord(msgspec.Struct, kw_only=True):
    """What a rank wrote about itself (``ranks/rank<N>.json``), completed by the launcher."""

    rank: int | None = None
    node_rank: int | None = None
    local_rank: int | None = None
    host: str | None = None
    pid: int | None = None
    device: str | None = None
    status: str = "starting"
    """"starting", "running", "ok", "failed", "interrupted", or "incomplete" (``overlapprof.profile``:
    the loop ended, without an error, before the profiler's schedule was recorded; ``error`` says
    how far it got and what to change)."""
    error: str | None = None
    """One line: what went wrong, where (workload line, phase, step)."""
    error_kind: str | None = None
    """"exception" or "timeout" (its own failure), "exit" (died without reporting: exit code or
    signal, from torchelastic), "peer" (an error because a peer died), "terminated" (stopped by
    the launcher), "interrupted" (Ctrl-C), "incomplete" (status "incomplete"), or null."""
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
    machine_load: MachineLoad | None = None
    """Local rank 0 of each node: the machine's load over the measured steps (null elsewhere,
    and in run directories written before it was recorded)."""


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
    cpu_cores: int | None = None
    """CPU cores this node's ranks can use: its affinity mask, capped by a cgroup CPU quota
    (the overlap bound's host-cores floor)."""
    nproc: int | None = None
    """Ranks started on this node."""
    config: RunConfig | None = None


class Failure(msgspec.Struct, kw_only=True):
    """The root cause of a failed run (overlapprof.rundir.blame.root_cause)."""

    rank: int
    error: str | None = None
    error_kind: str | None = None
    """The rank's error_kind, or "stalled": no progress in its own code while others waited."""
    consequences: list[int] = []
    """The other ranks that failed, because of it."""


class RunRecord(RunConfig, kw_only=True):
    """``run.json``: the run's config and what became of it."""

    status: str = "running"
    """"running", "ok", "failed", "interrupted" or "incomplete" (ranks missing, or a rank's loop
    ended before its schedule was recorded: blame.run_status)."""
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
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")  # a rank's watchdog writes too
    tmp.write_bytes(msgspec.json.format(msgspec.json.encode(record), indent=1) + b"\n")
    os.replace(tmp, path)


def read_rank(path):
    return msgspec.json.decode(Path(path).read_bytes(), type=RankRecord)


def read_rank_or_none(path):
    """A rank's record, or None when it is missing or unreadable (a rank killed mid-write)."""
    try:
        return read_rank(path)
    except (OSError, msgspec.DecodeError):
        return None


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


# How a comparison judges MachineLoads: the rule in MachineLoad's docstring.
FLOOR = 1.05
EXPONENT = 2


def busiest(loads: list, kind: str) -> float | None:
    """The largest share of the CPU other processes took over ``kind`` steps, of the nodes'
    MachineLoads (None: not recorded)."""
    shares = [m.other_share[kind] for m in loads if m is not None and kind in m.other_share]
    return max(shares) if shares else None


def load_factor(other_a: float | None, other_b: float | None) -> float | None:
    """How much more (or less) of the machine one set of steps had than the other (>= 1); None
    when either share is unknown."""
    if other_a is None or other_b is None:
        return None
    free_a, free_b = max(1.0 - other_a, 1e-3), max(1.0 - other_b, 1e-3)
    return max(free_a / free_b, free_b / free_a)


def explains(factor: float | None, value: float | None, interval=None) -> bool:
    """Did the load move enough (``factor``, :func:`load_factor`) to explain a measured factor
    ``value`` with its interval ``(low, high)`` (the rule in :class:`MachineLoad`)?"""
    if factor is None or value is None or factor < FLOOR:
        return False
    low, high = interval if interval is not None else (value, value)
    smallest = low if low > 1 else 1 / high if high < 1 else 1.0
    return factor ** EXPONENT >= smallest


def described(other_a: float, other_b: float, a: str, b: str, measured: float) -> str:
    """Why a factor ``measured`` between steps ``a`` and ``b`` is not trusted, in words."""
    factor = load_factor(other_a, other_b)
    return (f"other processes took {other_a:.0%} of the machine's CPU during {a} and {other_b:.0%} during {b} "
            f"(load factor {factor:.2f}x, which alone can change steps by up to {factor ** EXPONENT:.2f}x: "
            f"enough to explain the {measured:.2f}x measured)")


def describe_link(link, world_size=None):
    """``2 Gbit/s shared`` for a link record (run.json's ``link``); None for None."""
    if not link:
        return None
    bits = link.get("bits_per_s") or 0
    unit, scale = next(((u, s) for u, s in (("Tbit/s", 1e12), ("Gbit/s", 1e9), ("Mbit/s", 1e6),
                                             ("kbit/s", 1e3)) if bits >= s), ("bit/s", 1))
    by = f" by {world_size} ranks" if world_size else ""
    return f"{bits / scale:g} {unit} shared{by}"
