"""The per-rank harness: the entrypoint torchelastic starts on every rank.

``python -m overlapprof.launch.harness --run-dir DIR --node-rank K`` reads its configuration
from ``DIR/nodes/nodeK.json`` (written by the launcher) and, on global rank ``RANK``:

1. pins ``cuda:LOCAL_RANK`` on CUDA and joins the process group (timeout from ``--timeout``);
2. loads the workload file and calls its ``setup(ctx)``;
3. runs ``warmup_steps`` unprofiled steps (NCCL builds communicators, and its first ``recv``
   blocks the host, during these), then ``repeat`` cycles of ``unprofiled_steps + wait +
   warmup + active`` steps under ``torch.profiler.schedule(wait=unprofiled_steps + wait,
   warmup, active, repeat)``, saving one trace per cycle as
   ``rankN.<time_ns>.pt.trace.json[.gz]``. The first ``unprofiled_steps`` of each cycle run
   with the profiler off: they are the baseline of the profiler's overhead, interleaved with
   the profiled steps so that a machine getting slower or faster over the run biases neither;
4. times every step on the host (after ``torch.cuda.synchronize()`` on CUDA) and writes
   ``ranks/rankN.json`` with the step times, metrics, traces and status.

A rank whose step raises records the error (with the workload line and the phase) and exits
non-zero through torchelastic's ``@record``, keeping the traces of completed cycles and of the
cycle in progress. A rank that makes no progress for ``--timeout`` seconds is ended by the
watchdog, which names the call it is blocked in and says whether that is a wait on its peers (a
``torch.distributed`` call) or its own code; a rank the launcher stops records the same about
where the signal found it, so that the launcher can name the rank the others waited for.

Every 2 s the watchdog writes ``progress/rankN.json`` (step, kind, phase, seconds without
progress): the launcher's heartbeat reads it. Ctrl-C (SIGINT) during start-up ends the rank at
once (there is nothing to save); later it is recorded as "interrupted", the traces of the cycle
in progress are saved, and a rank whose main thread is stuck in a C call is ended by the
watchdog two seconds after the signal.
"""

import os
import signal
import sys

# Before torch is imported (seconds, under load): Ctrl-C then ends the rank quietly, instead of a
# KeyboardInterrupt traceback from inside an import; the launcher records the interruption.
signal.signal(signal.SIGINT, lambda signum, frame: os._exit(130))

import argparse  # noqa: E402
import contextlib  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.elastic.multiprocessing.errors import record  # noqa: E402

from overlapprof import workload as workload_api  # noqa: E402
from overlapprof.launch import blame, run_record, rundir  # noqa: E402
from overlapprof.launch.logs import RANK_OK  # noqa: E402
from overlapprof.launch.watchdog import (Watchdog, describe_stack, describe_traceback,  # noqa: E402
                                         first_line, main_thread_location, waiting_on_peers)

# The process group's own timeout is this much longer than --timeout, so that the watchdog,
# which can name the hung call, fires first (NCCL's watchdog would abort the process silently).
_PG_TIMEOUT_MARGIN_S = 10
_TIMEOUT_EXIT_CODE = 124
_TERMINATED_EXIT_CODE = 143  # 128 + SIGTERM
_INTERRUPTED_EXIT_CODE = 130  # 128 + SIGINT
_SIGNAL_GRACE_S = 2.0  # how long a signalled rank may take to save its traces and exit
_PROGRESS_EVERY_S = 2.0  # progress/rankN.json: rarely enough to cost the steps nothing
# Errors a rank gets because a peer died: a consequence, not the root cause of a failed run.
_PEER_GONE = re.compile(r"closed by peer|reset by peer|remote worker|Broken pipe|"
                        r"communicator was aborted|remote process exited", re.IGNORECASE)


class Terminated(Exception):
    """SIGTERM from the launcher, which stops every rank once one has failed."""


class Stopped:
    """Where the first SIGINT/SIGTERM found the rank (its handler runs in the main thread, so
    ``frame`` is where the main thread was): what the rank's record says about it."""

    def __init__(self, ctx, signum, frame, sampled=None):
        self.signum = signum
        self.location = describe_stack(frame) if frame is not None else ""
        self.stalled_s = time.monotonic() - ctx.progress_at if ctx is not None else None
        # A rank blocked in a C call (a collective) runs the handler only once the call returns
        # (its peer died), in the workload's frame: where the watchdog saw it during the stall
        # is where it was stuck.
        if sampled and ctx is not None and sampled[0] == ctx.progress_at:
            self.location = sampled[1]

    def fields(self):
        return stall_fields(self.stalled_s, self.location)


def stall_fields(stalled_s, location):
    """The fragment's account of where a stuck or stopped rank was (see run_record.RankRecord)."""
    return {"stalled_s": None if stalled_s is None else round(stalled_s, 3),
            "location": location or None,
            "waiting_on_peers": waiting_on_peers(location) if location else None}


def schedule_kinds(unprofiled, wait, warmup, active, repeat):
    """The kind of each step of the profiled loop (see the module docstring)."""
    cycle = (["unprofiled"] * unprofiled + ["profiler_wait"] * wait
             + ["profiler_warmup"] * warmup + ["profiled"] * active)
    return cycle * repeat


class Harness:
    def __init__(self, run_dir, node_rank):
        self.run_dir = run_dir
        self.config = run_record.read_node(rundir.node_file(run_dir, node_rank)).config
        self.rank = int(os.environ["RANK"])
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.world_size = int(os.environ["WORLD_SIZE"])
        self.node_rank = int(os.environ.get("GROUP_RANK", node_rank))
        self.fragment_path = rundir.rank_file(run_dir, self.rank)
        self.times = {kind: [] for kind in ("warmup", "unprofiled", "profiler_wait",
                                            "profiler_warmup", "profiled")}
        self.profiled_steps = []
        self.traces = []
        self.ctx = None
        self.stopped = None  # a Stopped, once SIGINT or SIGTERM arrived
        self.progress_path = rundir.progress_file(run_dir, self.rank)
        self.stall_sample = None  # (progress_at, where the main thread was) during a stall

    # -- the run -------------------------------------------------------------------------------

    def run(self):
        config = self.config
        cuda = config.device == "cuda"
        device = torch.device("cuda", self.local_rank) if cuda else torch.device("cpu")
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        self._write(status="running", error=None, error_kind=None, where=None,
                    started=time.time(), ended=None, host=rundir.host(), pid=os.getpid(),
                    node_rank=self.node_rank, local_rank=self.local_rank, device=str(device))
        watchdog = None
        try:
            if cuda:
                torch.cuda.set_device(device)
            ctx = self.ctx = workload_api.Context(
                rank=self.rank, world_size=self.world_size, local_rank=self.local_rank,
                node_rank=self.node_rank, device=device, backend=config.backend,
                variant=config.variant, options=config.options)
            watchdog = Watchdog(ctx, config.timeout_s, self._hang, on_tick=self._report_progress,
                                tick_s=_PROGRESS_EVERY_S, on_signal_stuck=self._signal_stuck,
                                signal_grace_s=_SIGNAL_GRACE_S)
            ctx._mark("init_process_group")
            watchdog.start()
            self._init_process_group(device)
            ctx._mark("load workload")
            work = workload_api.load(config.workload.path)
            step = work.step_function(ctx.variant)
            ctx._mark("setup")
            state = work.setup(ctx)
            ctx.synchronize()  # setup's device work is not part of the first step
            self._run_steps(step, state)
            ctx._mark("final barrier")
            dist.barrier()
        except BaseException as exc:
            if watchdog is not None:
                watchdog.stop()
            self._fail(exc)
            self._report_progress(0.0, ended="stopped")
            raise
        watchdog.stop()
        dist.destroy_process_group()
        self._write(status="ok", ended=time.time(), **self._results())
        self._report_progress(0.0, ended="ok")
        ok = RANK_OK.format(rank=self.rank, workload=self.config.workload.name, variant=self.config.variant)
        print(f"{ok}{len(self.traces)} trace(s); {self._summary()}", flush=True)

    def _init_process_group(self, device):
        timeout = self.config.timeout_s + _PG_TIMEOUT_MARGIN_S
        kwargs = {"device_id": device} if device.type == "cuda" else {}
        dist.init_process_group(self.config.backend, timeout=datetime.timedelta(seconds=timeout),
                                **kwargs)

    def _run_steps(self, step, state):
        prof_cfg = self.config.profiler
        for i in range(prof_cfg.warmup_steps):
            self._timed_step("warmup", i, step, state)
        kinds = schedule_kinds(prof_cfg.unprofiled_steps, prof_cfg.wait, prof_cfg.warmup,
                               prof_cfg.active, prof_cfg.repeat)
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.ctx.is_cuda:
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        schedule = torch.profiler.schedule(wait=prof_cfg.unprofiled_steps + prof_cfg.wait,
                                           warmup=prof_cfg.warmup, active=prof_cfg.active,
                                           repeat=prof_cfg.repeat)
        with torch.profiler.profile(activities=activities, schedule=schedule,
                                    on_trace_ready=self._save_trace,
                                    record_shapes=prof_cfg.record_shapes,
                                    with_stack=prof_cfg.with_stack) as prof:
            for i, kind in enumerate(kinds):
                self._timed_step(kind, i, step, state)  # runs inside ProfilerStep#i
                if kind == "profiled":
                    self.profiled_steps.append(prof.step_num)
                self.ctx._mark("profiler step")
                prof.step()

    def _timed_step(self, kind, index, step, state):
        ctx = self.ctx
        ctx.step_kind, ctx.step_index = kind, index
        ctx._mark(None)
        start = time.perf_counter()
        slow_ms = ctx.opts.slow_ms
        if ctx.rank == ctx.opts.slow_rank and slow_ms > 0:
            with ctx.phase("straggle"):  # a deliberately late rank (COMMON_OPTIONS)
                time.sleep(slow_ms / 1000)
        step(ctx, state)
        ctx._mark("synchronize after step")
        ctx.synchronize()
        self.times[kind].append(round((time.perf_counter() - start) * 1000, 4))

    def _save_trace(self, prof):
        name = rundir.trace_file_name(self.rank, gzip=self.config.profiler.gzip)
        prof.export_chrome_trace(str(self.run_dir / name))
        self.traces.append(name)

    # -- reporting -----------------------------------------------------------------------------

    def _results(self):
        return {"step_times_ms": self.times, "profiled_steps": self.profiled_steps,
                "metrics": self.ctx.metrics if self.ctx else {}, "traces": self.traces}

    def _where(self):
        ctx = self.ctx
        if ctx is None:
            return {"step": None, "step_kind": None, "phase": None}
        return {"step": ctx.step_index if ctx.step_index >= 0 else None,
                "step_kind": ctx.step_kind, "phase": ctx.current_phase}

    def _where_text(self):
        """", in phase 'comm' of ProfilerStep#3 (profiled)" for the error line."""
        return blame.where_text(run_record.Where(**self._where()))

    def _on_signal(self, signum, frame):
        """SIGTERM (the launcher stops the ranks) or SIGINT (Ctrl-C): the first raises in the main
        thread, where the rank was is noted; later ones are ignored while the rank saves."""
        if self.stopped is not None:
            return
        self.stopped = Stopped(self.ctx, signum, frame, self.stall_sample)
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise Terminated()

    def _signal_stuck(self, signum, location):
        """The watchdog's verdict when a signal did not end the rank in time: the main thread is
        stuck in a C call. Record it and end the process now."""
        interrupted = signal.SIGINT in (signum, getattr(self.stopped, "signum", None))
        stall = stall_fields(time.monotonic() - self.ctx.progress_at, location)
        if interrupted:
            self._write_interrupted(**stall)
        else:
            self._write_failure("terminated", "terminated by the launcher" + self._where_text(),
                                **stall)
        sys.stdout.flush()
        os._exit(_INTERRUPTED_EXIT_CODE if interrupted else _TERMINATED_EXIT_CODE)

    def _report_progress(self, idle_s, ended=None):
        """The heartbeat: a small file the launcher reads (see rundir.progress_file); during a
        stall, also where the main thread is stuck (for a stop that comes later)."""
        if idle_s >= 1.0:
            self.stall_sample = (self.ctx.progress_at, main_thread_location())
        with contextlib.suppress(OSError):  # the heartbeat is a nicety, never a failure
            rundir.write_progress(self.progress_path, {
                "rank": self.rank, "updated": time.time(), "idle_s": round(idle_s, 1),
                "traces": len(self.traces), "ended": ended, **self._where()})

    def _fail(self, exc):
        stall = self.stopped.fields() if self.stopped is not None else {}
        if isinstance(exc, KeyboardInterrupt) or self._interrupted():
            self._write_interrupted(**stall)  # whatever the error, Ctrl-C came first
            return
        if isinstance(exc, Terminated):
            kind, error = "terminated", "terminated by the launcher"
        else:
            message = first_line(exc)
            kind = "peer" if _PEER_GONE.search(message) else "exception"
            location = describe_traceback(exc.__traceback__)
            error = f"{type(exc).__name__}: {message}" + (f" {location}" if location else "")
            if not stall and self.ctx is not None:  # a peer's death ends a wait: how long, where
                stall = stall_fields(time.monotonic() - self.ctx.progress_at, location)
        self._write_failure(kind, error + self._where_text(), **stall)

    def _hang(self, idle_s, location):
        """The watchdog's verdict: record the hung call and end the process now."""
        error = (f"timed out: no progress for {idle_s:.0f} s (--timeout "
                 f"{self.config.timeout_s:g}); blocked {location or 'somewhere'}"
                 + self._where_text())
        self._write_failure("timeout", error, **stall_fields(idle_s, location))
        _write_elastic_error_file(error)
        print(f"rank {self.rank}: {error}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(_TIMEOUT_EXIT_CODE)

    def _interrupted(self):
        return self.stopped is not None and self.stopped.signum == signal.SIGINT

    def _write_interrupted(self, **fields):
        self._write(status="interrupted", error="interrupted" + self._where_text(),
                    error_kind="interrupted", where=self._where(), ended=time.time(),
                    **fields, **self._results())

    def _write_failure(self, kind, error, **fields):
        self._write(status="failed", error=error, error_kind=kind, where=self._where(),
                    ended=time.time(), **fields, **self._results())

    def _write(self, **fields):
        run_record.update_rank(self.fragment_path, **fields)

    def _summary(self):
        parts = [f"{kind} median {statistics.median(v):.2f} ms" for kind, v in self.times.items()
                 if v and kind in ("unprofiled", "profiled")]
        if self.times["warmup"]:
            parts.insert(0, f"first warm-up step {self.times['warmup'][0]:.2f} ms")
        return ", ".join(parts)


def _write_elastic_error_file(message, callstack=None):
    """What ``@record`` writes for an exception (``callstack``: its whole traceback; the
    watchdog's exit has no exception, and gives the message alone)."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if path:
        data = {"message": {"message": message,
                            "extraInfo": {"py_callstack": callstack or message,
                                          "timestamp": str(int(time.time()))}}}
        with open(path, "w") as f:
            json.dump(data, f)


_PACKAGE = str(Path(workload_api.__file__).parent) + os.sep


def _workload_traceback(rank, exc) -> str:
    """The exception with the frames outside overlapprof (the workload's, and what it called):
    the harness's frames are noise to the workload's author, and stay in the error file. All
    of them when none is left (then the failure is overlapprof's own)."""
    frames = traceback.extract_tb(exc.__traceback__)
    own = [f for f in frames if not f.filename.startswith(_PACKAGE)] or frames
    head = (f"Traceback of rank {rank} (its workload's frames; every frame is in logs/rank{rank}.error.json):\n"
            if len(own) < len(frames) else "Traceback (most recent call last):\n")
    return head + "".join(traceback.format_list(own) + traceback.format_exception_only(type(exc), exc)).rstrip()


@record
def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m overlapprof.launch.harness",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", required=True, help="the run directory")
    parser.add_argument("--node-rank", type=int, required=True,
                        help="this node's rank; its config is nodes/node<K>.json")
    args = parser.parse_args(argv)
    harness = Harness(Path(args.run_dir), args.node_rank)
    try:
        harness.run()
    except (Terminated, KeyboardInterrupt):  # recorded; a traceback would be noise
        if harness._interrupted() or harness.stopped is None:
            sys.exit(_INTERRUPTED_EXIT_CODE)  # the launcher says "interrupted", once
        print(f"rank {harness.rank}: terminated by the launcher", file=sys.stderr)
        sys.exit(_TERMINATED_EXIT_CODE)
    except Exception as exc:
        if harness._interrupted():
            sys.exit(_INTERRUPTED_EXIT_CODE)  # a peer's error after Ctrl-C: recorded, no noise
        said = first_line(exc)
        if not _PEER_GONE.search(said):
            # The root cause, probably: the error file as @record writes it, with the whole traceback.
            _write_elastic_error_file(f"{type(exc).__name__}: {exc}", traceback.format_exc())
            print(_workload_traceback(harness.rank, exc), file=sys.stderr)
            sys.exit(1)
        # gloo's "[.../pair.cc:553] Connection closed by peer [addr]. This is typically caused by ...": its first sentence
        said = re.sub(r"^\[[^\]]*\]\s*", "", said).split(". ")[0]
        print(f"rank {harness.rank}: stopped, a peer went away ({type(exc).__name__}: {said})", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
