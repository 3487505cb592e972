"""Launch the ranks of a run through torchelastic, one launch per variant.

``run(request)`` validates everything it can before any rank starts (device, run directories),
then for each variant creates (or joins) the run directory, writes this node's config to
``nodes/node<K>.json`` and calls ``torch.distributed.launcher.api.elastic_launch`` with the
harness as the entrypoint of every rank (a fork of :mod:`overlapprof.launch.forkserver`'s server,
which imported torch once; with ``OVERLAPPROF_FORKSERVER=0``, ``python -u -m
overlapprof.launch.harness``):

- single node: a c10d rendezvous on ``localhost:0`` (torchrun ``--standalone``);
- ``--nnodes N``: the static rendezvous of ``torchrun --node-rank K --master-addr/port``: node 0
  hosts the c10d TCPStore at ``--rdzv-endpoint`` and global ranks are K * nproc + local rank,
  so every node knows its ranks (and claims their files) before it starts;
- no restarts (a restart would mix attempts in one trace directory);
- each rank's stdout/stderr go to ``logs/rank<N>.std{out,err}.log`` and, prefixed with
  ``[rank<N>]:``, to the console; its elastic error file to ``logs/rank<N>.error.json``.

When the launch ends, ranks that never reported (killed, or dead before the harness could
write) get torchelastic's verdict (exit code or signal) in their fragment, and run.json is merged.
Environment for the ranks: ``OMP_NUM_THREADS=1`` unless set, ``NCCL_DEBUG`` and
``NCCL_DEBUG_SUBSYS`` from ``--nccl-debug``; the parent's environment is restored afterwards.
"""

import contextlib
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from overlapprof.launch import forkserver, netns, sigint
from overlapprof.launch.host import oversubscription, relevant_env, resolve_device, usable_cores, versions
from overlapprof.launch.step_times import step_summary
from overlapprof.launch.watchdog import first_line, main_thread_location
from overlapprof.rundir import directory, run_record
from overlapprof.rundir.schedule import ProfilerSchedule

_SHUTDOWN_TIMEOUT_S = 10  # how long a rank may take to save its traces after SIGTERM
_NODES_END_WAIT_S = 60  # how long a node waits for the other nodes' records when it is done


@dataclass
class RunRequest:
    """Everything ``overlapprof run`` was asked to do (the CLI fills it; defaults = its flags)."""

    workload: object
    """The loaded workload file (overlapprof.workload.Workload)."""
    variants: list
    """Variant names to run, one run directory each, in order (checked against the workload)."""
    options: dict
    """Every workload option, defaults applied and types checked."""
    nproc: int = 2
    """Ranks per node (``--nproc``); a GPU each on CUDA."""
    nnodes: int = 1
    """Nodes (``--nnodes``); each runs the same command with its own ``node_rank``."""
    node_rank: int = 0
    """This node's rank; its ranks are node_rank * nproc + local rank."""
    rdzv_endpoint: str = ""
    """HOST:PORT of node 0's rendezvous store (multi-node); "" for a free port on localhost."""
    run_id: str = ""
    """Names the run directories ``<out>/<run_id>-<variant>``; "" to name them by time."""
    device: str = "auto"
    """"auto", "cpu" or "cuda" (auto: cuda when there is a GPU per rank)."""
    backend: str = "auto"
    """"auto", "gloo" or "nccl" (auto: nccl on cuda, gloo on cpu)."""
    nccl_debug: str = ""
    """NCCL_DEBUG for the ranks ("" leaves it unset)."""
    nccl_debug_subsys: str = ""
    """NCCL_DEBUG_SUBSYS for the ranks."""
    timeout_s: float = 300.0
    """Seconds a rank may make no progress: watchdog, process group and rendezvous timeout."""
    schedule: ProfilerSchedule = field(default_factory=ProfilerSchedule)
    """The profiler's schedule (``--warmup-steps``, ``--wait``, ``--warmup``, ``--active``,
    ``--repeat``); each cycle starts with as many unprofiled steps as ``active``."""
    with_stack: bool = False
    """Record Python stacks in the traces."""
    gzip: bool = False
    """Write traces as .pt.trace.json.gz."""
    out: Path = Path("traces")
    """The folder of the run directories."""
    link: dict | None = None
    """``--link-rate``: the emulated link (overlapprof.launch.netns), set by netns.prepare."""
    command: list = field(default_factory=lambda: list(sys.argv))
    """The command line, recorded in the node's record."""
    quiet: bool = False
    """``--quiet``: no heartbeat on the console, and no rank's "ok" line (it stays in its log)."""


@dataclass
class VariantResult:
    variant: str
    run_dir: Path
    run: run_record.RunRecord  # the merged run.json
    seconds: float
    local_ranks: list  # the global ranks this node ran

    @property
    def ok(self):
        """No rank failed and this node's ranks all finished (on a multi-node run whose
        directory is not on a shared filesystem, the other nodes' ranks are missing here)."""
        ranks = self.run.ranks
        return (self.run.failure is None and self.run.status not in ("failed", "interrupted")
                and all(str(r) in ranks and ranks[str(r)].status == "ok"
                        for r in self.local_ranks))

    @property
    def has_traces(self):
        """Whether any rank's trace was written (run.json lists them)."""
        return any(self.run.traces.values())

    @property
    def interrupted(self):
        """Stopped by Ctrl-C (a signal to the launcher), not by a failure of its own."""
        return self.run.status == "interrupted"

    def failure_line(self):
        """One line naming the rank that failed first and its error, and the ranks that failed
        as a consequence (for a rank that stalled: those waiting for it, and where); "" when
        the run is ok."""
        failure = self.run.failure
        if failure:
            return f"rank {failure.rank}: {failure.error}{self._consequences(failure)}"
        failed_nodes = [f"node {k}: {v.error}" for k, v in self.run.nodes.items() if v.error]
        return failed_nodes[0] if failed_nodes else ("" if self.ok else self.run.status)

    def _consequences(self, failure):
        others = failure.consequences
        if not others:
            return ""
        if failure.error_kind == "stalled":
            waiting = []
            for rank in others:
                info = self.run.ranks.get(str(rank))
                blocked = f" (blocked {info.location})" if info and info.waiting_on_peers else ""
                waiting.append(f"rank {rank}{blocked}")
            return "; waiting for it: " + ", ".join(waiting)
        return (f"; {len(others)} other rank{'s' * (len(others) != 1)} failed as a consequence")


def load_workload(path, timeout_s):
    """``overlapprof.workload.load(path)`` within ``timeout_s``: a file whose import makes no
    progress that long (a module-level wait) ends the command with one ``Error:`` line naming
    where it blocks, exit 2. Nothing has been written yet, so nothing is lost."""
    from overlapprof import workload as workload_api

    done = threading.Event()

    def watch():
        if not done.wait(timeout_s):
            where = main_thread_location() or "somewhere"
            sys.stdout.flush()
            print(f"Error: cannot load workload {path}: its import made no progress for {timeout_s:g} s "
                  f"(--timeout {timeout_s:g}); blocked {where}", file=sys.stderr, flush=True)
            os._exit(2)

    threading.Thread(target=watch, name="overlapprof-import-watch", daemon=True).start()
    try:
        return workload_api.load(path)
    finally:
        done.set()


@contextlib.contextmanager
def rank_environment(request):
    """The environment the ranks inherit, restored when the launch is over."""
    saved = dict(os.environ)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if request.nccl_debug:
        os.environ["NCCL_DEBUG"] = request.nccl_debug
    if request.nccl_debug_subsys:
        os.environ["NCCL_DEBUG_SUBSYS"] = request.nccl_debug_subsys
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def plan(request):
    """Resolve device and backend and choose the run directories, before anything starts.
    Returns ({variant: run_dir}, device, backend); raises LaunchError or RunDirError."""
    device, backend = resolve_device(request.device, request.backend, request.nproc)
    dirs = directory.plan_run_dirs(request.out, request.workload.name, request.variants,
                                   run_id=request.run_id or None, joinable=request.nnodes > 1)
    return dirs, device, backend


def run(request, log=None):
    """Run every requested variant, one after another; stop at the first that fails.
    Returns a VariantResult per variant run. ``log(line)`` receives progress lines."""
    log = log or _log_to_stderr
    dirs, device, backend = plan(request)
    if device == "cpu" and (crowded := oversubscription(request.nproc)):
        log(crowded)
    if request.link:
        log(netns.header_line(request.link, request.nnodes * request.nproc))
    elif device == "cpu" and request.nnodes == 1:
        log(netns.plain_loopback_note())
    results = []
    for number, (variant, run_dir) in enumerate(dirs.items(), 1):
        where = f"[{number}/{len(dirs)}] {request.workload.name}/{variant}"
        link = f", link {run_record.describe_link(request.link)}" if request.link else ""
        log(f"{where}: {request.nnodes * request.nproc} ranks ({device}, {backend}{link}) -> "
            f"{run_dir}")
        result = launch_variant(request, variant, run_dir, device, backend)
        log(f"{where}: {result.run.status} in {result.seconds:.1f} s; {step_summary(result.run)}")
        results.append(result)
        if not result.ok:
            break
    return results


def launch_variant(request, variant, run_dir, device, backend):
    """One elastic launch of one variant into ``run_dir``; returns its VariantResult."""
    started = time.time()
    first = request.node_rank * request.nproc
    local_ranks = list(range(first, first + request.nproc))
    with rank_environment(request):
        header = _header(request, variant, run_dir, device, backend)
        directory.open_run_dir(run_dir, header, request.node_rank, local_ranks)
        node_path = directory.node_file(run_dir, request.node_rank)
        try:
            with sigint.remembered():  # until torchelastic installs its own handlers
                run_record.write_record(node_path, run_record.NodeRecord(
                    node_rank=request.node_rank, host=directory.host(), pid=os.getpid(),
                    command=[str(a) for a in request.command], started=started, status="running",
                    cpu_cores=usable_cores(), nproc=request.nproc, config=header))
                failures, error = _elastic_launch(request, variant, run_dir)
        except KeyboardInterrupt:  # before torchelastic's own handlers were installed
            failures, error = {}, "interrupted (SIGINT)"
    for rank in local_ranks:
        _finalize_rank(run_dir, rank, failures.get(rank), error)
    run_record.update_node(node_path, ended=time.time(), error=error,
                           status="failed" if error or failures else "ok")
    run = _merge_when_nodes_end(run_dir, wait_s=min(_NODES_END_WAIT_S, request.timeout_s))
    return VariantResult(variant, Path(run_dir), run, time.time() - started, local_ranks)


def _merge_when_nodes_end(run_dir, wait_s):
    """Merge run.json once every node visible here has ended. On a shared filesystem the other
    nodes' files are here, and their ranks end within moments of ours (the final barrier);
    elsewhere only this node's are, and the run is "incomplete" here."""
    deadline = time.monotonic() + wait_s
    while True:
        run = directory.merge(run_dir)
        if run.status != "running" or time.monotonic() > deadline:
            return run
        time.sleep(0.5)


def _header(request, variant, run_dir, device, backend):
    """The run-level part of run.json (a RunConfig), also the config every rank reads."""
    return run_record.RunConfig(
        name=Path(run_dir).name, run_id=request.run_id or None,
        workload=run_record.Workload(name=request.workload.name, path=str(request.workload.path)),
        variant=variant, options=request.options,
        world_size=request.nnodes * request.nproc, nnodes=request.nnodes,
        nproc_per_node=request.nproc, backend=backend, device=device,
        timeout_s=request.timeout_s, link=request.link,
        profiler=run_record.ProfilerConfig.of(
            request.schedule, with_stack=request.with_stack, gzip=request.gzip,
            cuda_sync_events=device == "cuda" and _cuda_sync_events_supported()),
        versions=versions(), env=relevant_env())


def _cuda_sync_events_supported() -> bool:
    """Whether this torch's profiler records CUDA synchronization events (run.json says so)."""
    from overlapprof.launch.recording import cuda_sync_events_config

    return cuda_sync_events_config() is not None


def _shutdown_timeout(config_class) -> dict:
    """``shutdown_timeout`` where this torch's LaunchConfig has it (torch 2.11 has not: its agent
    waits its own default for ranks to save their traces after SIGTERM)."""
    fields = getattr(config_class, "__dataclass_fields__", {})
    return {"shutdown_timeout": _SHUTDOWN_TIMEOUT_S} if "shutdown_timeout" in fields else {}


def _elastic_launch(request, variant, run_dir):
    """Run the ranks of this node. Returns ({global rank: ProcessFailure}, node error or None)."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from overlapprof.launch.heartbeat import Heartbeat
    from overlapprof.launch.logs import ConsoleLines, RunLogsSpecs, elastic_logging_to

    timeout = max(1, int(request.timeout_s))
    if request.nnodes == 1:
        rdzv = dict(rdzv_backend="c10d", rdzv_endpoint=request.rdzv_endpoint or "localhost:0",
                    rdzv_configs={"timeout": timeout, "join_timeout": timeout},
                    run_id=Path(run_dir).name)
    else:
        rdzv = dict(rdzv_backend="static", rdzv_endpoint=request.rdzv_endpoint,
                    rdzv_configs={"rank": request.node_rank, "timeout": timeout},
                    run_id=f"{request.run_id}-{variant}")
    harness_args = ["--run-dir", str(run_dir), "--node-rank", str(request.node_rank)]
    if forkserver.start():  # every rank a fork of the server that imported torch once
        start_method, entrypoint = "forkserver", forkserver.forked_main
        entrypoint_args = (harness_args, dict(os.environ))
        failures_reported = forkserver.every_failure_reported()
    else:
        start_method, entrypoint = "spawn", sys.executable
        entrypoint_args = ["-u", "-m", "overlapprof.launch.harness", *harness_args]
        failures_reported = contextlib.nullcontext()
    config = LaunchConfig(min_nodes=request.nnodes, max_nodes=request.nnodes,
                          nproc_per_node=request.nproc, max_restarts=0, monitor_interval=0.1,
                          start_method=start_method, log_line_prefix_template="[rank${rank}]: ",
                          logs_specs=RunLogsSpecs(run_dir), **_shutdown_timeout(LaunchConfig), **rdzv)
    quiet = request.quiet
    beat = (Heartbeat(run_dir, range(request.nnodes * request.nproc), sys.stderr).start()
            if not quiet else None)
    clear = beat.clear if beat else None
    try:
        with elastic_logging_to(directory.launcher_log(run_dir, request.node_rank)), failures_reported, \
                contextlib.redirect_stdout(ConsoleLines(sys.stdout, clear, quiet)), \
                contextlib.redirect_stderr(ConsoleLines(sys.stderr, clear, quiet)):
            sigint.raise_if_seen()  # a Ctrl-C ignored inside the imports above
            elastic_launch(config, entrypoint)(*entrypoint_args)
    except ChildFailedError as exc:
        return dict(exc.failures), None
    except SignalException as exc:
        return {}, f"interrupted ({exc.sigval.name})"
    except Exception as exc:  # rendezvous timeout, store errors: the ranks never started
        return {}, f"{type(exc).__name__}: {first_line(exc)}"
    finally:
        if beat:
            beat.stop()
    return {}, None


def _finalize_rank(run_dir, rank, failure, node_error):
    """Give a rank that did not report an end (killed, never started) the launcher's verdict;
    after Ctrl-C, a rank that failed because of it (its peer stopped, or the launcher stopped
    it) was interrupted."""
    path = directory.rank_file(run_dir, rank)
    fragment = run_record.read_rank_or_none(path)
    if fragment is None:  # never let the launcher fail on it: the rank gets the launcher's verdict
        fragment = run_record.RankRecord(rank=rank)
        run_record.write_record(path, fragment)
    interrupted = bool(node_error) and node_error.startswith("interrupted")
    if interrupted and fragment.status != "ok" and fragment.error_kind not in (
            "exception", "timeout"):
        run_record.update_rank(path, status="interrupted", error_kind="interrupted",
                               error=fragment.error or node_error,
                               ended=fragment.ended or time.time())
        return
    if fragment.status in run_record.FINAL_RANK_STATES:
        return
    if failure is not None and failure.exitcode != 0:
        how = (f"killed by signal {failure.signal_name()}" if failure.exitcode < 0
               else f"exited with code {failure.exitcode}")
        kind = "exit"
    elif node_error:
        how, kind = f"never finished: {node_error}", "exit"
    else:
        how, kind = "terminated by the launcher (another rank failed)", "terminated"
    run_record.update_rank(path, status="failed", error=how, error_kind=kind,
                           ended=fragment.ended or time.time())


def _log_to_stderr(line):
    print(f"overlapprof: {line}", file=sys.stderr, flush=True)
