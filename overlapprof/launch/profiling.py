"""``overlapprof.profile``: record your own training loop into an overlapprof run directory.

::

    with overlapprof.profile(out="traces", run_id="ddp-bucket25") as prof:   # on every rank
        for batch in loader:
            train_step(batch)
            prof.step()

Under any launcher (torchrun, srun, mpirun, torchelastic), after ``init_process_group``. It
writes what ``overlapprof run`` writes, so ``analyze``, ``compare``, ``report``, ``view`` and
``export`` read it unchanged: ``<out>/<run_id>/`` with ``run.json`` (written by rank 0 alone:
world size, backend, device, versions, the environment that matters, the profiler schedule,
every rank's host step times) and ``rank<N>.<time_ns>.pt.trace.json`` per rank and profiler
cycle. The loop is recorded as ``overlapprof run`` records a workload
(:mod:`overlapprof.launch.recording`): ``warmup_steps`` steps outside the profiler, then
``repeat`` cycles of ``unprofiled_steps`` steps with the profiler off (the baseline of its
overhead), ``wait``, ``warmup`` and ``active`` steps; steps after the last cycle are neither
traced nor timed (``prof.done`` says when the loop may stop).

Entering and leaving the block are collective when torch.distributed is initialized: rank 0
creates the directory and broadcasts its name (a directory that exists is an error on every
rank: runs are never overwritten), each rank claims its own files exclusively, and on leaving
every rank writes its record and meets the others at a barrier before rank 0 merges run.json.
Without torch.distributed (one process) it records rank 0 of 1 and says so.

One profiler at a time: entering while another ``profile()`` block or a torch profiler records
in the process is refused (ProfileError) before anything is made, on every rank (two at once
crash torch's profiler). Rank 0 says when each cycle starts and ends recording, and which loop
steps. A loop that ends (without an error) before the schedule is recorded is "incomplete": the
rank's record says how far it got and what to change, and so does run.json's status. Each
node's local rank 0 records the machine's load (:mod:`overlapprof.launch.machine`) over the
unprofiled and profiled steps, as the harness does, the job being its launcher's processes.
"""

from __future__ import annotations

import inspect
import os
import sys
import time
import warnings
from pathlib import Path

from overlapprof.errors import ProfileError, RunDirError
from overlapprof.launch import recording
from overlapprof.launch.host import relevant_env, usable_cores, versions
from overlapprof.launch.step_times import step_summary
from overlapprof.launch.machine import LoadMeter
from overlapprof.launch.profile_settings import ProfileConfig, settings_from, settings_help, signature_of
from overlapprof.launch.watchdog import describe_traceback, first_line
from overlapprof.rundir import blame, directory, run_record

_STEP_KINDS = ("warmup", "unprofiled", "profiler_wait", "profiler_warmup", "profiled")


def profile(config: ProfileConfig | None = None, **settings) -> Profiler:
    """A :class:`Profiler` for your own loop: ``with overlapprof.profile(out=..., run_id=...) as
    prof:`` on every rank, ``prof.step()`` after each step. The settings (keywords, or a
    :class:`ProfileConfig` as ``config``), with their defaults:
    """
    return Profiler(settings_from(config, settings))


# help(overlapprof.profile) and inspect.signature list every setting, made from ProfileConfig's
# fields (the one list of them).
profile.__signature__ = signature_of(profile)
profile.__doc__ = inspect.cleandoc(profile.__doc__ or "") + "\n\n" + settings_help() + "\n"  # (python -OO: None)


class Profiler:
    """Records a loop (see the module docstring); made by :func:`profile`.

    Attributes, once entered: ``run_dir`` (Path), ``rank``, ``world_size``, ``device``
    ("cpu"/"cuda"), ``steps`` (``step()`` calls so far), ``done`` (the last cycle is recorded).
    """

    def __init__(self, config: ProfileConfig):
        config.check()
        self.config = config
        self.run_dir: Path | None = None
        self.rank, self.world_size, self.device = 0, 1, "cpu"
        self.steps = 0
        self._kinds = (["warmup"] * config.warmup_steps) + _schedule_kinds(config)
        self._times: dict[str, list[float]] = {kind: [] for kind in _STEP_KINDS}
        self._metrics: dict[str, dict[str, list[float]]] = {}
        self._profiled: list[int] = []
        self._traces: list[str] = []
        self._prof = None
        self._since = 0.0
        self._meter = None  # local rank 0: the machine's load over the measured steps

    @property
    def done(self) -> bool:
        return self.steps >= len(self._kinds)

    def _kind(self) -> str:
        return self._kinds[self.steps] if self.steps < len(self._kinds) else "after"

    # -- entering ------------------------------------------------------------------------------

    def __enter__(self) -> Profiler:
        import torch
        import torch.distributed as dist

        _refuse_a_second_profiler(torch)
        _ACTIVE.append(self)
        try:
            return self._enter(torch, dist)
        except BaseException:
            _ACTIVE.remove(self)
            raise

    def _enter(self, torch, dist) -> Profiler:
        distributed = dist.is_available() and dist.is_initialized()
        if distributed:
            self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
            backend = str(dist.get_backend())
        else:
            launched = int(os.environ.get("WORLD_SIZE", "1") or 1)
            if launched > 1:
                raise ProfileError(f"overlapprof.profile: WORLD_SIZE={launched} but torch.distributed is not "
                                   "initialized: call init_process_group() before entering overlapprof.profile")
            backend = None
            self._say("torch.distributed is not initialized: recording this process alone, as rank 0 of 1")
        self.device = self._resolve_device(torch, backend)
        # torch warns at each new cycle that the last one's events are gone: each was saved, by design
        warnings.filterwarnings("ignore", message=".*Profiler clears events at the end of each cycle")
        self.run_dir = self._open_run_dir(backend, dist if distributed else None)
        self._write(status="running", started=time.time(), host=directory.host(), pid=os.getpid(),
                    device=self._device_name(torch))
        self._prof = recording.torch_profiler(self.config.profiler_config(), self.device == "cuda",
                                              self._save_trace, skip_first=self.config.warmup_steps,
                                              cuda_sync_events=self.config.cuda_sync_events)
        self._prof.__enter__()
        local_rank = _launcher_int(("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK"), self.rank)
        if local_rank == 0:  # one per node; the run is the launcher's processes (ours alone without one)
            self._meter = LoadMeter(os.getppid() if distributed else os.getpid())
            self._meter.at(self._kind())
        self._announce()
        self._since = time.perf_counter()
        return self

    def _resolve_device(self, torch, backend) -> str:
        device = self.config.device
        if device == "auto":
            cuda_in_use = torch.cuda.is_available() and torch.cuda.is_initialized()
            device = "cuda" if backend == "nccl" or cuda_in_use else "cpu"
        if device == "cuda" and not torch.cuda.is_available():
            raise ProfileError(f"overlapprof.profile: device 'cuda' but no CUDA device is available "
                               f"(torch {torch.__version__})")
        return device

    def _device_name(self, torch) -> str:
        return f"cuda:{torch.cuda.current_device()}" if self.device == "cuda" else "cpu"

    def _open_run_dir(self, backend, dist) -> Path:
        """Rank 0 creates the directory and run.json; every rank learns its name and claims its
        own fragment (rank 0 also the node record)."""
        out = Path(self.config.out)
        name = error = None
        if self.rank == 0:
            script = _script()
            name = self.config.run_id or f"{script.stem if script else 'profile'}-{time.strftime('%Y%m%d-%H%M%S')}"
            try:
                directory.create_run_dir(out / name, self._header(name, backend))
            except FileExistsError:
                error = f"run directory {out / name} exists; runs are never overwritten"
            except (RunDirError, OSError) as exc:
                error = str(exc) if isinstance(exc, RunDirError) else f"cannot create {out / name}: {exc}"
        if dist is not None and self.world_size > 1:
            shared = [name, error]
            dist.broadcast_object_list(shared, src=0)
            name, error = shared
        if error:
            raise RunDirError(f"overlapprof.profile: {error}" if self.rank == 0
                              else f"overlapprof.profile: rank 0 could not create the run directory: {error}")
        path = out / name
        for sub in ("", "ranks", "nodes"):  # a node without the shared filesystem makes its own
            (path / sub).mkdir(parents=True, exist_ok=True)
        local_rank = _launcher_int(("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK"), self.rank)
        directory.claim(path, _node_rank(), [self.rank], first_local_rank=local_rank, node=self.rank == 0)
        if self.rank == 0:
            nproc = _launcher_int(("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE", "OMPI_COMM_WORLD_LOCAL_SIZE"), None)
            run_record.update_node(directory.node_file(path, _node_rank()), host=directory.host(), pid=os.getpid(),
                                   command=[sys.executable, *sys.argv], started=time.time(), status="running",
                                   cpu_cores=usable_cores(), nproc=nproc)
        return path

    def _header(self, name, backend) -> run_record.RunConfig:
        script = _script()
        nproc = _launcher_int(("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE", "OMPI_COMM_WORLD_LOCAL_SIZE"), None)
        return run_record.RunConfig(
            name=name, run_id=self.config.run_id,
            workload=run_record.Workload(name=script.stem if script else "", path=str(script or "")),
            variant=self.config.variant, options=dict(self.config.options),
            world_size=self.world_size, nnodes=_launcher_int(("GROUP_WORLD_SIZE", "SLURM_NNODES"), 1),
            nproc_per_node=nproc, backend=backend, device=self.device,
            profiler=self.config.profiler_config(), versions=versions(), env=relevant_env())

    # -- the loop ------------------------------------------------------------------------------

    def step(self) -> None:
        """End one step of your loop: its host time is kept, and the profiler moves on."""
        if self._prof is None:
            raise ProfileError("overlapprof.profile: step() outside the `with` block")
        if self.device == "cuda" and self.config.synchronize:
            import torch

            torch.cuda.synchronize()
        elapsed_ms = (time.perf_counter() - self._since) * 1000
        kind = self._kind()
        if kind != "after":
            self._times[kind].append(round(elapsed_ms, 4))
        if kind == "profiled":
            self._profiled.append(self._prof.step_num)
        self.steps += 1
        if self._meter is not None:
            self._meter.at(self._kind())
        self._announce()
        self._prof.step()
        self._since = time.perf_counter()  # the profiler's own step() is no part of a step

    def metric(self, name: str, value: float) -> None:
        """Keep a number in run.json (``ranks.<rank>.metrics.<name>.<kind of step>``), as a
        workload's ``ctx.metric`` does; name it with its unit (``_ms``, ``_bytes``)."""
        self._metrics.setdefault(name, {}).setdefault(self._kind(), []).append(float(value))

    def _save_trace(self, prof) -> None:
        name = recording.save_trace(prof, self.run_dir, self.rank, self.config.gzip)
        self._traces.append(name)
        active, cycle = self.config.active, len(self._traces)
        steps = self._profiled[(cycle - 1) * active:cycle * active]  # cycles are saved in order
        if steps:  # ProfilerStep#N is step N + 1 of the loop
            self._say0(f"recorded steps {steps[0] + 1}-{steps[-1] + 1} ({self._cycle(cycle)}"
                       f"{'' if len(steps) == active else f', cut short: {len(steps)} of {active}'}"
                       f"): {name}")

    def _announce(self) -> None:
        """Rank 0: a line when the next step begins a cycle's profiled steps."""
        if self._kind() == "profiled" and len(self._profiled) % self.config.active == 0:
            first = self.steps + 1
            self._say0(f"recording steps {first}-{first + self.config.active - 1} of the loop "
                       f"({self._cycle()}) into {self.run_dir}")

    def _cycle(self, number=None) -> str:
        number = number or len(self._profiled) // self.config.active + 1
        return f"cycle {number} of {self.config.repeat}"

    # -- leaving -------------------------------------------------------------------------------

    def __exit__(self, exc_type, exc, tb) -> bool:
        if self._prof is None:
            return False
        try:
            self._prof.__exit__(exc_type, exc, tb)  # saves the cycle in progress, if any
        finally:
            self._prof = None
            _ACTIVE.remove(self)
        if self._meter is not None:
            self._meter.at(None)
        ended = time.time()
        short = self._shortfall()
        if exc_type is None and short:
            self._write(status="incomplete", error_kind="incomplete", error=short, ended=ended, **self._results())
        elif exc_type is None:
            self._write(status="ok", ended=ended, **self._results())
        else:
            interrupted = issubclass(exc_type, KeyboardInterrupt)
            where = run_record.Where(step=self.steps, step_kind=self._kind())
            location = "" if interrupted else describe_traceback(tb)
            error = "interrupted" if interrupted else f"{exc_type.__name__}: {first_line(exc)}" + (
                f" {location}" if location else "")
            self._write(status="interrupted" if interrupted else "failed", error_kind="interrupted"
                        if interrupted else "exception", error=error + blame.where_text(where),
                        where=run_record.to_builtins(where), ended=ended, **self._results())
        if self.rank == 0:
            run_record.update_node(directory.node_file(self.run_dir, _node_rank()), ended=ended,
                                   status="ok" if exc_type is None else "failed")
        if exc_type is None:
            self._barrier()
        if self.rank == 0:
            self._finish(directory.merge(self.run_dir))
        return False

    def _barrier(self) -> None:
        """Every rank's record is written before rank 0 merges them; a peer that failed ends
        the barrier with an error, and rank 0 merges what it has."""
        import torch.distributed as dist

        if self.world_size > 1 and dist.is_initialized():
            try:
                dist.barrier()
            except Exception as exc:  # noqa: BLE001 - a peer died: its record says why
                self._say(f"rank {self.rank}: the closing barrier failed ({type(exc).__name__}: {first_line(exc)})")

    def _shortfall(self) -> str | None:
        """Why the loop ended before the schedule was recorded, and what to change (None: it
        was recorded)."""
        config, needed = self.config, self.config.steps_needed()
        if self.steps >= needed:
            return None
        first = config.warmup_steps + config.unprofiled() + config.wait + config.warmup
        cycle = f"{config.unprofiled()} unprofiled + {config.wait} wait + {config.warmup} warmup + {config.active} active"
        told = (f"the loop ended after {self.steps} prof.step() call(s); the schedule needs {needed} (warmup_steps "
                f"{config.warmup_steps} + {config.repeat} x ({cycle}); the first profiled step is step {first + 1}): "
                f"{len(self._profiled)} of {config.repeat * config.active} profiled steps recorded")
        change = ("call prof.step() once after each step of the loop" if self.steps == 0 else
                  f"run at least {needed} steps (`while not prof.done:`), or ask for fewer (active, repeat, "
                  "warmup_steps, unprofiled_steps)")
        return f"{told}: {change}"

    def _finish(self, run) -> None:
        traces = sum(len(t) for t in run.traces.values())
        short = blame.incomplete_rank(run)
        if run.status == "incomplete" and short is not None:
            who = "" if short[0] == self.rank else f"rank {short[0]}: "
            then = (f"overlapprof analyze {self.run_dir} reads the profiled steps recorded" if traces
                    else "nothing to analyze")
            self._say(f"incomplete: {who}{short[1]}. {traces} trace(s) in {self.run_dir}; {then}")
            return
        self._say(f"{run.status}: {self.world_size} rank(s), {traces} trace(s) in {self.run_dir}; "
                  f"{step_summary(run)}. Next: overlapprof analyze {self.run_dir}")

    def _results(self) -> dict:
        return {"step_times_ms": self._times, "profiled_steps": self._profiled, "metrics": self._metrics,
                "traces": self._traces, "machine_load": self._meter.result() if self._meter is not None else None}

    def _write(self, **fields) -> None:
        run_record.update_rank(directory.rank_file(self.run_dir, self.rank), **fields)

    def _say(self, line: str) -> None:
        if not self.config.quiet:
            # one write with its newline: the other rank's kineto log shares the pipe, and print()'s
            # separate end write let a fragment of it in before our newline
            sys.stderr.write(f"overlapprof.profile: {line}\n")
            sys.stderr.flush()

    def _say0(self, line: str) -> None:
        if self.rank == 0:
            self._say(line)


_ACTIVE: list[Profiler] = []  # the profile() block recording in this process: one at a time


def _refuse_a_second_profiler(torch) -> None:
    """ProfileError (one line) while a profiler records in this process: two at once crash
    torch's profiler (SIGSEGV, on every rank, the first run left "running")."""
    if _ACTIVE:
        raise ProfileError(f"overlapprof.profile: another overlapprof.profile block is recording in this process "
                           f"(into {_ACTIVE[0].run_dir}): one at a time, so end it before entering another")
    if torch._C._autograd._profiler_enabled():
        raise ProfileError("overlapprof.profile: a torch profiler is recording in this process: one at a time, "
                           "so end it (torch.profiler.profile, torch.autograd.profiler) before entering "
                           "overlapprof.profile")


def _schedule_kinds(config: ProfileConfig) -> list[str]:
    return recording.schedule_kinds(config.unprofiled(), config.wait, config.warmup, config.active, config.repeat)


def _node_rank() -> int:
    """The node this process runs on, as its launcher says (torchelastic, Slurm), else 0."""
    return _launcher_int(("GROUP_RANK", "SLURM_NODEID"), 0)


def _launcher_int(names, default):
    """The first of the launcher's environment variables ``names`` that holds a number."""
    for name in names:
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return default


def _script() -> Path | None:
    """The script being run (the user's training script), or None (``python -c``, a notebook)."""
    argv0 = sys.argv[0] if sys.argv else ""
    return Path(argv0).resolve() if argv0 and argv0 != "-c" and Path(argv0).is_file() else None
