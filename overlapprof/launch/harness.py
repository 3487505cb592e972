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
non-zero (:mod:`overlapprof.launch.rank_end`), keeping the traces of completed cycles and of the
cycle in progress. A rank that makes no progress for ``--timeout`` seconds is ended by the
watchdog, which names the call it is blocked in and says whether that is a wait on its peers (a
``torch.distributed`` call) or its own code, then unwinds the rank so that the profiler saves
the cycle it hung in (a rank blocked in a collective unwinds when a peer's exit ends the call);
a rank the launcher stops records the same about where the signal found it, so that the
launcher can name the rank the others waited for.

overlapprof's own work is not the workload's and --timeout does not count it (_HARNESS_TIMEOUT_S
does): the profiler's first start (Kineto's, and CUPTI's on CUDA; torch._inductor is not imported
for it: recording.Profile), done once by every rank before the process group forms; each
``prof.step()``; saving a trace, after which the ranks meet (a barrier, profiler off) so that no
peer's wait for a slow save counts as the workload's; the final barrier.

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
import statistics  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.elastic.multiprocessing.errors import record  # noqa: E402

from overlapprof import workload as workload_api  # noqa: E402
from overlapprof.launch import host, recording  # noqa: E402
from overlapprof.launch.logs import RANK_OK  # noqa: E402
from overlapprof.launch.machine import LoadMeter  # noqa: E402
from overlapprof.launch.rank_end import (INTERRUPTED_EXIT_CODE, PEER_GONE, TERMINATED_EXIT_CODE,  # noqa: E402
                                         TIMEOUT_EXIT_CODE, Stopped, Terminated, TimedOut, exit_code,
                                         stall_fields, write_elastic_error_file)
from overlapprof.launch.watchdog import Watchdog, describe_traceback, first_line, main_thread_location  # noqa: E402
from overlapprof.rundir import blame, directory, run_record  # noqa: E402

# The process group's own timeout is this much longer than --timeout, so that the watchdog,
# which can name the hung call, fires first (NCCL's watchdog would abort the process silently).
_PG_TIMEOUT_MARGIN_S = 10
_SIGNAL_GRACE_S = 2.0  # how long a signalled rank may take to save its traces and exit
# overlapprof's own work on a rank (the profiler starting: 5-51 s with 16 ranks on 2 cores when torch
# imported torch._dynamo and torch._inductor for it; saving a trace; the ranks meeting) is not the
# workload's: --timeout does not count it, this limit does (at least --timeout).
_HARNESS_TIMEOUT_S = 600.0
# A rank whose watchdog fired unwinds so that the profiler saves the cycle in progress; one blocked
# in a C call (a collective) unwinds only when a peer's exit ends it. The lowest rank gives up
# first, freeing the others, which have _HANG_GRACE_STAGGER_S more; at once where every rank is so
# blocked (a deadlock: the grace would only wait).
_HANG_GRACE_S = 8.0
_HANG_GRACE_STAGGER_S = 4.0
_SAVE_LIMIT_S = 30.0  # how long a trace being saved may take before a hung rank exits anyway
_PROGRESS_EVERY_S = 2.0  # progress/rankN.json: rarely enough to cost the steps nothing


class Harness:
    def __init__(self, run_dir, node_rank):
        self.run_dir = run_dir
        self.config = run_record.read_node(directory.node_file(run_dir, node_rank)).config
        self.rank = int(os.environ["RANK"])
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.world_size = int(os.environ["WORLD_SIZE"])
        self.node_rank = int(os.environ.get("GROUP_RANK", node_rank))
        self.fragment_path = directory.rank_file(run_dir, self.rank)
        self.times = {kind: [] for kind in ("warmup", "unprofiled", "profiler_wait",
                                            "profiler_warmup", "profiled")}
        self.profiled_steps = []
        self.traces = []
        self.ctx = None
        self.stopped = None  # a Stopped, once SIGINT or SIGTERM arrived
        self.progress_path = directory.progress_file(run_dir, self.rank)
        self.stall_sample = None  # (progress_at, where the main thread was) during a stall
        self.hung = False  # the watchdog fired: recorded as a timeout, the rank unwinds
        self.held = 0  # > 0 while a signal must not raise (the profiler changing state or saving)
        self.pending = None  # the exception a signal raises once nothing holds it
        self.saving = False  # a trace is being written
        self.finished = False  # the record is final: a signal now only ends the process
        self.record_lock = threading.Lock()  # the watchdog thread writes the record too
        self.meter = None  # the machine's load over the measured steps (local rank 0: LoadMeter)

    # -- the run -------------------------------------------------------------------------------

    def run(self):
        config = self.config
        cuda = config.device == "cuda"
        device = torch.device("cuda", self.local_rank) if cuda else torch.device("cpu")
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        self._write(status="running", error=None, error_kind=None, where=None,
                    started=time.time(), ended=None, host=directory.host(), pid=os.getpid(),
                    node_rank=self.node_rank, local_rank=self.local_rank, device=str(device))
        watchdog = None
        try:
            if cuda:
                torch.cuda.set_device(device)
            else:  # before any thread of gloo's or the profiler's starts: they inherit it
                host.pin_rank(self.local_rank, int(os.environ.get("LOCAL_WORLD_SIZE", 1)))
            ctx = self.ctx = workload_api.Context(
                rank=self.rank, world_size=self.world_size, local_rank=self.local_rank,
                node_rank=self.node_rank, device=device, backend=config.backend,
                variant=config.variant, options=config.options)
            watchdog = Watchdog(ctx, config.timeout_s, self._hang, on_tick=self._report_progress,
                                tick_s=_PROGRESS_EVERY_S, on_signal_stuck=self._signal_stuck,
                                signal_grace_s=_SIGNAL_GRACE_S, harness_timeout_s=_HARNESS_TIMEOUT_S)
            watchdog.start()
            with self._own("profiler start-up", hold=True):
                self._start_up_profiler()
            with self._own("init_process_group"):
                self._init_process_group(device)
            ctx._mark("load workload")
            work = workload_api.load(config.workload.path)
            step = work.step_function(ctx.variant)
            ctx._mark("setup")
            state = work.setup(ctx)
            ctx.synchronize()  # setup's device work is not part of the first step
            self._run_steps(step, state)
            with self._own("final barrier"):
                dist.barrier()
        except BaseException as exc:
            if watchdog is not None:
                watchdog.stop()
            self._fail(exc)
            self.finished = True  # the record is final: a signal from here raises nothing (teardown, finalizers)
            self._report_progress(0.0, ended="stopped")
            raise
        watchdog.stop()
        dist.destroy_process_group()
        self._write(status="ok", ended=time.time(), **self._results())
        self.finished = True
        self._report_progress(0.0, ended="ok")
        ok = RANK_OK.format(rank=self.rank, workload=self.config.workload.name, variant=self.config.variant)
        print(f"{ok}{len(self.traces)} trace(s); {self._summary()}", flush=True)

    @contextlib.contextmanager
    def _own(self, what, hold=False):
        """overlapprof's own work (``what`` names it in the heartbeat and in a hang): the
        watchdog measures it against _HARNESS_TIMEOUT_S, not --timeout. ``hold``: a signal
        arriving meanwhile raises only once it is done (torch's profiler left half-changed by an
        exception fails again on the way out, and a trace cut mid-write is lost)."""
        ctx = self.ctx
        outer = ctx.current_phase  # where a failure on the way out is recorded stays named
        ctx._mark(what)
        ctx.in_harness = True
        self.held += hold
        try:
            yield
        finally:
            self.held -= hold
            ctx.in_harness = False
            ctx._mark(outer)
        if self.pending is not None and not self.held:
            pending, self.pending = self.pending, None
            raise pending

    def _start_up_profiler(self):
        """Start and stop a profiler once, recording nothing: what torch does the first time
        (start Kineto and CUPTI) happens here, with every rank before the process group (which
        waits for them all), not in a step that peers wait on."""
        with recording.Profile(activities=recording.activities(self.ctx.is_cuda)):
            pass

    def _init_process_group(self, device):
        # The process group's own timeout is a backstop behind the watchdog; it must also let the
        # slowest rank of many per core arrive (gloo connects every pair here).
        timeout = max(self.config.timeout_s + _PG_TIMEOUT_MARGIN_S, _HARNESS_TIMEOUT_S)
        kwargs = {"device_id": device} if device.type == "cuda" else {}
        dist.init_process_group(self.config.backend, timeout=datetime.timedelta(seconds=timeout),
                                **kwargs)

    def _run_steps(self, step, state):
        prof_cfg = self.config.profiler
        for i in range(prof_cfg.warmup_steps):
            self._timed_step("warmup", i, step, state)
        kinds = recording.schedule_kinds(prof_cfg.unprofiled(), prof_cfg.wait,
                                         prof_cfg.warmup, prof_cfg.active, prof_cfg.repeat)
        meter = self.meter = LoadMeter(os.getppid()) if self.local_rank == 0 else None  # one per node
        # torch warns at each new cycle that the last one's events are gone: each was saved, by design
        warnings.filterwarnings("ignore", message=".*Profiler clears events at the end of each cycle")
        prof = recording.torch_profiler(prof_cfg, self.ctx.is_cuda, self._save_trace,
                                        cuda_sync_events=prof_cfg.cuda_sync_events)
        with self._own("profiler step", hold=True):
            prof.start()
        try:
            for i, kind in enumerate(kinds):
                if meter is not None:
                    meter.at(kind)
                self._timed_step(kind, i, step, state)  # runs inside ProfilerStep#i
                if kind == "profiled":
                    self.profiled_steps.append(prof.step_num)
                saved = len(self.traces)
                with self._own("profiler step", hold=True):
                    prof.step()
                if len(self.traces) > saved and i + 1 < len(kinds):
                    with self._own("ranks meeting after a trace was saved"):
                        dist.barrier()  # the profiler is off: not in any trace
        except BaseException:
            with self._own("saving the cycle in progress", hold=True):
                self._stop_profiler(prof)
            raise
        if meter is not None:
            meter.at(None)
        with self._own("profiler stop", hold=True):
            prof.stop()

    def _stop_profiler(self, prof):
        """Stop the profiler on the way out of a failed or stopped rank, saving what the cycle
        in progress recorded; a profiler that cannot (stopped in the middle of changing state)
        does not hide why the rank stopped."""
        try:
            prof.stop()
        except Exception as exc:
            print(f"rank {self.rank}: the cycle in progress could not be saved ({type(exc).__name__}: "
                  f"{first_line(exc)})", file=sys.stderr, flush=True)

    def _timed_step(self, kind, index, step, state):
        ctx = self.ctx
        ctx.step_kind, ctx.step_index = kind, index
        ctx._mark(None)
        start = time.perf_counter()
        workload_api.straggle(ctx)  # a deliberately late rank (COMMON_OPTIONS)
        step(ctx, state)
        ctx._mark("synchronize after step")
        ctx.synchronize()
        self.times[kind].append(round((time.perf_counter() - start) * 1000, 4))

    def _save_trace(self, prof):
        self.saving = True
        try:
            name = recording.save_trace(prof, self.run_dir, self.rank, self.config.profiler.gzip)
        finally:
            self.saving = False
        self.traces.append(name)

    # -- reporting -----------------------------------------------------------------------------

    def _results(self):
        return {"step_times_ms": self.times, "profiled_steps": self.profiled_steps,
                "metrics": self.ctx.metrics if self.ctx else {}, "traces": self.traces,
                "machine_load": self.meter.result() if self.meter is not None else None}

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
        """SIGTERM (the launcher stops the ranks, or the watchdog of a hung rank) or SIGINT
        (Ctrl-C): the first raises in the main thread (once nothing holds it: see _own), where
        the rank was is noted; later ones are ignored while the rank saves. Once the record is
        final (teardown, finalizers running) a signal raises nothing: it would only print a
        traceback from wherever it landed."""
        if self.finished or self.stopped is not None:
            return
        self.stopped = Stopped(self.ctx, signum, frame, self.stall_sample)
        if self.hung:  # the watchdog's own signal, or the launcher's: either way, unwind and save
            exc = TimedOut()
        else:
            exc = KeyboardInterrupt() if signum == signal.SIGINT else Terminated()
        if self.held:
            self.pending = exc
            return
        raise exc

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
        os._exit(INTERRUPTED_EXIT_CODE if interrupted else TERMINATED_EXIT_CODE)

    def _report_progress(self, idle_s, ended=None):
        """The heartbeat: a small file the launcher reads (see directory.progress_file); during a
        stall, also where the main thread is stuck (for a stop that comes later)."""
        if idle_s >= 1.0:
            self.stall_sample = (self.ctx.progress_at, main_thread_location())
        with contextlib.suppress(OSError):  # the heartbeat is a nicety, never a failure
            directory.write_progress(self.progress_path, {
                "rank": self.rank, "updated": time.time(), "idle_s": round(idle_s, 1),
                "traces": len(self.traces), "ended": ended, **self._where()})

    def _fail(self, exc):
        if self.hung:  # recorded by _hang; what the way out saved is added
            self._write(**self._results())
            return
        stall = self.stopped.fields() if self.stopped is not None else {}
        if isinstance(exc, KeyboardInterrupt) or self._interrupted():
            self._write_interrupted(**stall)  # whatever the error, Ctrl-C came first
            return
        if isinstance(exc, Terminated):
            kind, error = "terminated", "terminated by the launcher"
        else:
            message = first_line(exc)
            kind = "peer" if PEER_GONE.search(message) else "exception"
            location = describe_traceback(exc.__traceback__)
            error = f"{type(exc).__name__}: {message}" + (f" {location}" if location else "")
            if not stall and self.ctx is not None:  # a peer's death ends a wait: how long, where
                stall = stall_fields(time.monotonic() - self.ctx.progress_at, location)
        self._write_failure(kind, error + self._where_text(), **stall)

    def _hang(self, idle_s, location):
        """The watchdog's verdict (in its thread): record the hung call, then make the main
        thread unwind (SIGTERM to it; its handler raises TimedOut), so that the profiler saves
        the cycle in progress, and end the process when that is done or cannot be."""
        if self.ctx.in_harness:
            error = (f"timed out: overlapprof's own work ('{self.ctx.current_phase}') made no progress for "
                     f"{idle_s:.0f} s (its limit: {max(_HARNESS_TIMEOUT_S, self.config.timeout_s):g} s); "
                     f"blocked {location or 'somewhere'}")
            stall = {"stalled_s": round(idle_s, 3), "location": location or None, "waiting_on_peers": None}
        else:
            error = (f"timed out: no progress for {idle_s:.0f} s (--timeout "
                     f"{self.config.timeout_s:g}); blocked {location or 'somewhere'}" + self._where_text())
            stall = stall_fields(idle_s, location)
        self._write_failure("timeout", error, **stall)
        write_elastic_error_file(error)
        print(f"rank {self.rank}: {error}", file=sys.stderr, flush=True)
        self.hung = True
        if self.stopped is None:
            signal.pthread_kill(threading.main_thread().ident, signal.SIGTERM)
        grace = _HANG_GRACE_S + (_HANG_GRACE_STAGGER_S if self.rank else 0.0)
        deadline = time.monotonic() + grace
        deadlocked = self.rank == 0 and stall.get("waiting_on_peers") is True
        while time.monotonic() < deadline or (self.saving and time.monotonic() < deadline + _SAVE_LIMIT_S):
            if deadlocked and self._all_waiting_on_peers():
                break  # nobody can unwind until one rank exits: this one, now, not after the grace
            time.sleep(0.05)
        sys.stdout.flush()
        os._exit(TIMEOUT_EXIT_CODE)

    def _all_waiting_on_peers(self) -> bool:
        """Whether every rank of the run, all on this node, timed out blocked in a communication
        call (each rank's record says so): a deadlock, which the grace cannot end."""
        if int(os.environ.get("LOCAL_WORLD_SIZE", 0)) != self.world_size:
            return False  # another node's ranks are not seen here
        for rank in range(self.world_size):
            try:
                record = run_record.read_rank(directory.rank_file(self.run_dir, rank))
            except Exception:  # not written yet, or being replaced
                return False
            if record.error_kind != "timeout" or record.waiting_on_peers is not True:
                return False
        return True

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
        with self.record_lock:
            run_record.update_rank(self.fragment_path, **fields)

    def _summary(self):
        parts = [f"{kind} median {statistics.median(v):.2f} ms" for kind, v in self.times.items()
                 if v and kind in ("unprofiled", "profiled")]
        if self.times["warmup"]:
            parts.insert(0, f"first warm-up step {self.times['warmup'][0]:.2f} ms")
        return ", ".join(parts)


@record
def main(argv=None):
    """The entrypoint of a rank started as a fresh interpreter (``python -u -m ...harness``)."""
    run_rank(argv)
    # Everything is written (traces, the rank's record, its progress). The interpreter's teardown
    # after torch's profiler took ~0.65 s a rank (measured; ~0.3 s after `import torch` alone), and
    # the launcher waited that long for each launch's "ok": end here instead.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_rank(argv):
    """Parse the harness's arguments and run the rank; a failure exits (SystemExit) with its code."""
    parser = argparse.ArgumentParser(prog="python -m overlapprof.launch.harness",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", required=True, help="the run directory")
    parser.add_argument("--node-rank", type=int, required=True,
                        help="this node's rank; its config is nodes/node<K>.json")
    args = parser.parse_args(argv)
    harness = Harness(Path(args.run_dir), args.node_rank)
    try:
        harness.run()
    except BaseException as exc:
        sys.exit(exit_code(harness, exc))


if __name__ == "__main__":
    main()
