"""Ranks forked from one process that imported torch, instead of each importing it.

Importing torch costs a process about 1.3 s of CPU (measured on the project's 2-core machine,
under load), and a launch started a fresh interpreter per rank that paid it each time. Here a
multiprocessing fork server imports the harness (and so torch) once; torchelastic then starts
every rank of every variant of the command as a fork of it (``start_method="forkserver"`` with
:func:`overlapprof.launch.harness.forked_main` as the entrypoint). The server imports only: no
torch operation, thread pool or CUDA context exists in it when it forks.

:func:`start` is called by ``overlapprof run`` before it imports torch itself, so that the
server's import runs beside the launcher's on another core. The server keeps the environment it
was started with, so the ranks are given the launcher's environment at launch time
(``forked_main`` sets it), as a fresh interpreter would have inherited it.
``OVERLAPPROF_FORKSERVER=0`` starts every rank as a fresh interpreter, as before.
"""

import contextlib
import multiprocessing
import multiprocessing.forkserver
import os
import signal
import threading

ENV = "OVERLAPPROF_FORKSERVER"
_PRELOAD = ["overlapprof.launch.rank_server", "overlapprof.launch.harness"]


def enabled() -> bool:
    """Whether ranks start as forks of the server (POSIX, and not turned off)."""
    return (os.environ.get(ENV, "1") != "0"
            and "forkserver" in multiprocessing.get_all_start_methods())


def start() -> bool:
    """Start the fork server (once per process; later calls do nothing) so that its import of
    torch runs while the launcher does its own work. Returns whether it is in use."""
    if not enabled():
        return False
    multiprocessing.set_forkserver_preload(_PRELOAD)
    with _server_environment():
        multiprocessing.forkserver.ensure_running()
    return True


@contextlib.contextmanager
def _server_environment():
    """What the server is started with: unbuffered output (the ``-u`` of a fresh rank: its lines
    reach the log files as they are printed), and OMP_NUM_THREADS as the launcher sets it for
    the ranks, in case a library reads it when torch loads it."""
    saved = dict(os.environ)
    os.environ["PYTHONUNBUFFERED"] = "1"
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # Ignored, SIGINT stays ignored across exec: a Ctrl-C while the server imports torch does not
    # print a KeyboardInterrupt traceback from it (the launcher reports the interruption; the
    # harness's import sets its own quiet handler, which the ranks get). Blocked first, so that a
    # Ctrl-C while the server is spawned is not lost to this process: on Linux a blocked signal
    # stays pending even where it is ignored, and reaches the launcher's own handler when it is
    # unblocked, after that handler is back (a fresh clone's suite lost one so: the run went on to
    # its end). The server inherits the blocked mask and unblocks it first thing (rank_server).
    main_thread = threading.current_thread() is threading.main_thread()
    if main_thread:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        handler = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)
        if main_thread:
            signal.signal(signal.SIGINT, handler)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def forked_main(argv, environ):
    """The entrypoint of a rank forked from the server: ``environ`` is the launcher's environment
    at launch time, which replaces the server's, with the variables torchelastic set for this
    rank on top, as a fresh interpreter would have had them. It returns (torchelastic collects
    the value; multiprocessing then ends the process without the interpreter's teardown); a
    failure exits with the code the harness gives it."""
    import sys

    from overlapprof.launch import harness, rank_server  # imported by the server already

    elastic = {k: v for k, v in os.environ.items() if rank_server.SERVER_ENV.get(k) != v}
    os.environ.clear()
    os.environ.update(environ)
    os.environ.update(elastic)
    sys.argv = [harness.__file__, *argv]
    harness.run_rank(argv)
    sys.stdout.flush()
    sys.stderr.flush()


@contextlib.contextmanager
def every_failure_reported():
    """While a launch of forked ranks runs: torchelastic's launch of function entrypoints
    (``MultiprocessContext``) reports only the first failed rank it notices, where its launch of
    fresh interpreters reports every rank that exited non-zero (those it then stopped included).
    Two ranks ending at once (one dying hard, its peer failing on the broken connection) would
    then be blamed by whichever the poll saw first; this reports each, as before."""
    from torch.distributed.elastic.multiprocessing.api import MultiprocessContext
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    poll = MultiprocessContext._poll

    def poll_every_failure(self):
        result = poll(self)
        # torch's private attributes (torch 2.13, which setup.sh pins); another torch reports as it does
        processes = getattr(getattr(self, "_pc", None), "processes", None)
        if result is not None and result.failures and processes is not None:
            for local_rank, process in enumerate(processes):
                if local_rank not in result.failures and process.exitcode:  # all ended: closed
                    result.failures[local_rank] = ProcessFailure(
                        local_rank=local_rank, pid=process.pid, exitcode=process.exitcode,
                        error_file=self.error_files[local_rank])
        return result

    MultiprocessContext._poll = poll_every_failure
    try:
        yield
    finally:
        MultiprocessContext._poll = poll
