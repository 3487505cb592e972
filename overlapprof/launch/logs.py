"""Where torchelastic puts each rank's output: files in the run directory, teed to the console.

torchelastic's ``DefaultLogsSpecs`` writes ``<log_dir>/<run>/attempt_<n>/<local_rank>/...``;
this puts the same files under the run directory, named by global rank, so the logs of all
nodes of a multi-node run sit side by side: ``logs/rank<N>.stdout.log``,
``logs/rank<N>.stderr.log`` and ``logs/rank<N>.error.json`` (torchelastic's error file).
"""

import contextlib
import logging
import re

from torch.distributed.elastic.multiprocessing.api import LogsDest, LogsSpecs, Std

from overlapprof.rundir import directory


class RunLogsSpecs(LogsSpecs):
    def __init__(self, run_dir):
        super().__init__(log_dir=str(run_dir), redirects=Std.ALL, tee=Std.ALL)
        self._run_dir = run_dir

    @property
    def root_log_dir(self):
        return str(self._run_dir)

    def reify(self, envs):
        """Log files of each local rank, from the global ``RANK`` torchelastic gives it."""
        dest = LogsDest()
        for local_rank, env in envs.items():
            stdout, stderr, error_file = map(str, directory.log_paths(self._run_dir, int(env["RANK"])))
            dest.stdouts[local_rank] = dest.tee_stdouts[local_rank] = stdout
            dest.stderrs[local_rank] = dest.tee_stderrs[local_rank] = stderr
            dest.error_files[local_rank] = error_file
            env["TORCHELASTIC_ERROR_FILE"] = error_file
        return dest


class ConsoleLines:
    """The console side of the tee: drops kineto's "profiler_start/stop" lines (noise that stays
    in the log files), with ``quiet`` each rank's "ok" line (:data:`RANK_OK`, also in the log
    files), and the ``[rankN]:`` prefix torch puts on tracebacks, which the tee adds already.
    Wraps ``sys.stdout`` / ``sys.stderr`` while torchelastic tails the logs."""

    def __init__(self, stream, before_write=None, quiet=False):
        self._stream = stream
        self._before_write = before_write  # e.g. erase the heartbeat line first
        self._quiet = quiet

    def write(self, text):
        if _KINETO_NOISE.search(text) or (self._quiet and _RANK_OK.search(text)):
            return len(text)
        if self._before_write is not None and text:
            self._before_write()
        return self._stream.write(_DOUBLE_PREFIX.sub(r"\1", text))

    def __getattr__(self, name):
        return getattr(self._stream, name)


_KINETO_NOISE = re.compile(r"ActivityProfilerHandler\.cpp:\d+\] profiler_(start|stop)")
RANK_OK = "rank {rank}: {workload}/{variant} ok, "
"""How a rank's last line starts when it finished (the harness prints it, the console drops it
with ``--quiet``)."""
_RANK_OK = re.compile(r"^\[rank\d+\]: rank \d+: \S+/\S+ ok, ")
_DOUBLE_PREFIX = re.compile(r"^(\[rank(\d+)\]: )\[rank\2\]: ?")


@contextlib.contextmanager
def elastic_logging_to(path):
    """Send torchelastic's own log lines ("Received 2 death signal, shutting down workers", its
    failure reports) to the file ``path`` instead of the console, for the ``with`` block, and
    torch.multiprocessing's ("Terminating process N via signal SIGTERM", when it stops the
    forked ranks of a failed run). Their loggers set their own levels (LOGLEVEL, default
    WARNING), so only their common parents' handlers and propagation are changed."""
    parents = [logging.getLogger(name) for name in ("torch.distributed.elastic", "torch.multiprocessing")]
    handler = logging.FileHandler(path, delay=True)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    propagate = [parent.propagate for parent in parents]
    for parent in parents:
        parent.addHandler(handler)
        parent.propagate = False
    try:
        yield
    finally:
        for parent, was in zip(parents, propagate):
            parent.removeHandler(handler)
            parent.propagate = was
        handler.close()
