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
watchdog, which names the call it is blocked in.
"""

import argparse
import datetime
import json
import os
import re
import signal
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from overlapprof import workload as workload_api
from overlapprof.launch import rundir
from overlapprof.launch.watchdog import Watchdog, describe_traceback, first_line

# The process group's own timeout is this much longer than --timeout, so that the watchdog,
# which can name the hung call, fires first (NCCL's watchdog would abort the process silently).
_PG_TIMEOUT_MARGIN_S = 10
_TIMEOUT_EXIT_CODE = 124
_TERMINATED_EXIT_CODE = 143  # 128 + SIGTERM
# Errors a rank gets because a peer died: a consequence, not the root cause of a failed run.
_PEER_GONE = re.compile(r"closed by peer|reset by peer|remote worker|Broken pipe|"
                        r"communicator was aborted|remote process exited", re.IGNORECASE)


class Terminated(Exception):
    """SIGTERM from the launcher, which stops every rank once one has failed."""


def schedule_kinds(unprofiled, wait, warmup, active, repeat):
    """The kind of each step of the profiled loop (see the module docstring)."""
    cycle = (["unprofiled"] * unprofiled + ["profiler_wait"] * wait
             + ["profiler_warmup"] * warmup + ["profiled"] * active)
    return cycle * repeat


class Harness:
    def __init__(self, run_dir, node_rank):
        self.run_dir = run_dir
        self.config = rundir.read_json(rundir.node_file(run_dir, node_rank))["config"]
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

    # -- the run -------------------------------------------------------------------------------

    def run(self):
        config = self.config
        cuda = config["device"] == "cuda"
        device = torch.device("cuda", self.local_rank) if cuda else torch.device("cpu")
        self._write(status="running", error=None, error_kind=None, where=None,
                    started=time.time(), ended=None, host=rundir.host(), pid=os.getpid(),
                    node_rank=self.node_rank, local_rank=self.local_rank, device=str(device))
        signal.signal(signal.SIGTERM, _raise_terminated)
        watchdog = None
        try:
            if cuda:
                torch.cuda.set_device(device)
            ctx = self.ctx = workload_api.Context(
                rank=self.rank, world_size=self.world_size, local_rank=self.local_rank,
                node_rank=self.node_rank, device=device, backend=config["backend"],
                variant=config["variant"], options=config["options"])
            watchdog = Watchdog(ctx, config["timeout_s"], self._hang)
            ctx._mark("init_process_group")
            watchdog.start()
            self._init_process_group(device)
            ctx._mark("load workload")
            work = workload_api.load(config["workload"]["path"])
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
            raise
        watchdog.stop()
        dist.destroy_process_group()
        self._write(status="ok", ended=time.time(), **self._results())
        print(f"rank {self.rank}: ok, {len(self.traces)} trace(s); {self._summary()}", flush=True)

    def _init_process_group(self, device):
        timeout = self.config["timeout_s"] + _PG_TIMEOUT_MARGIN_S
        kwargs = {"device_id": device} if device.type == "cuda" else {}
        dist.init_process_group(self.config["backend"], timeout=datetime.timedelta(seconds=timeout),
                                **kwargs)

    def _run_steps(self, step, state):
        prof_cfg = self.config["profiler"]
        for i in range(prof_cfg["warmup_steps"]):
            self._timed_step("warmup", i, step, state)
        kinds = schedule_kinds(prof_cfg["unprofiled_steps"], prof_cfg["wait"],
                               prof_cfg["warmup"], prof_cfg["active"], prof_cfg["repeat"])
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.ctx.is_cuda:
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        schedule = torch.profiler.schedule(wait=prof_cfg["unprofiled_steps"] + prof_cfg["wait"],
                                           warmup=prof_cfg["warmup"], active=prof_cfg["active"],
                                           repeat=prof_cfg["repeat"])
        with torch.profiler.profile(activities=activities, schedule=schedule,
                                    on_trace_ready=self._save_trace,
                                    record_shapes=prof_cfg["record_shapes"],
                                    with_stack=prof_cfg["with_stack"]) as prof:
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
        name = rundir.trace_file_name(self.rank, gzip=self.config["profiler"]["gzip"])
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
        where = self._where()
        step = where["step"]
        if step is None:
            step_text = ""
        elif where["step_kind"] == "warmup":
            step_text = f"{where['step_kind']} step {step}"
        else:
            step_text = f"ProfilerStep#{step} ({where['step_kind']})"
        if where["phase"]:
            return f", in phase '{where['phase']}'" + (f" of {step_text}" if step_text else "")
        return f", in {step_text}" if step_text else ""

    def _fail(self, exc):
        if isinstance(exc, Terminated):
            kind, error = "terminated", "terminated by the launcher (another rank failed)"
        elif isinstance(exc, KeyboardInterrupt):
            kind, error = "terminated", "interrupted"
        else:
            message = first_line(exc)
            kind = "peer" if _PEER_GONE.search(message) else "exception"
            location = describe_traceback(exc.__traceback__)
            error = f"{type(exc).__name__}: {message}" + (f" {location}" if location else "")
        self._write_failure(kind, error + self._where_text())

    def _hang(self, idle_s, location):
        """The watchdog's verdict: record the hung call and end the process now."""
        error = (f"timed out: no progress for {idle_s:.0f} s (--timeout "
                 f"{self.config['timeout_s']:g}); blocked {location or 'somewhere'}"
                 + self._where_text())
        self._write_failure("timeout", error)
        _write_elastic_error_file(error)
        print(f"rank {self.rank}: {error}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(_TIMEOUT_EXIT_CODE)

    def _write_failure(self, kind, error):
        self._write(status="failed", error=error, error_kind=kind, where=self._where(),
                    ended=time.time(), **self._results())

    def _write(self, **fields):
        rundir.update_json(self.fragment_path, **fields)

    def _summary(self):
        parts = [f"{kind} median {statistics.median(v):.2f} ms" for kind, v in self.times.items()
                 if v and kind in ("unprofiled", "profiled")]
        if self.times["warmup"]:
            parts.insert(0, f"first warm-up step {self.times['warmup'][0]:.2f} ms")
        return ", ".join(parts)


def _raise_terminated(signum, frame):
    raise Terminated()


def _write_elastic_error_file(message):
    """What ``@record`` writes for an exception, for the watchdog's exit (no exception there)."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if path:
        data = {"message": {"message": message,
                            "extraInfo": {"py_callstack": message,
                                          "timestamp": str(int(time.time()))}}}
        with open(path, "w") as f:
            json.dump(data, f)


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
    except (Terminated, KeyboardInterrupt) as exc:  # recorded; a traceback would be noise
        how = "interrupted" if isinstance(exc, KeyboardInterrupt) else "terminated"
        print(f"rank {harness.rank}: {how} by the launcher", file=sys.stderr)
        sys.exit(_TERMINATED_EXIT_CODE)
    except Exception as exc:
        if not _PEER_GONE.search(first_line(exc)):
            raise  # the root cause, probably: @record writes the error file, with traceback
        print(f"rank {harness.rank}: {type(exc).__name__}: {first_line(exc)}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
