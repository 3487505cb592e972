"""Where work runs beyond this process: the stdlib's process pool, forked here
(:func:`forked`), or a Dask distributed cluster (:func:`run_on_dask`, :class:`DaskRanges`).

Both are a :class:`Pool`: ``submit(fn, *args)`` gives a task with ``done()`` and ``result()``,
``shutdown()`` cancels what has not started, and the pool is a context manager. The parallel
read of one file (:mod:`overlapprof.analysis.engine.parallel`) takes either; every argument a
task needs travels with it (nothing is inherited through ``fork``).

The analyzer's per-rank work (:func:`overlapprof.analysis.analyzer.analyze_group`: decode,
classify and measure one rank's files) is independent across ranks and returns a small
``RankResult``, so it maps onto Dask futures directly: one task per rank, largest first, the
results collected as they complete. Only the file paths travel to the workers, never the traces:
**each worker opens the traces itself, at the paths the client found them**, so the traces must be
on a filesystem every worker mounts at the same place (a cluster filesystem: Lustre, GPFS, NFS).
The analyzer sends them as absolute paths (a worker's working folder is not the client's).

Before the real work, one task on a worker opens every trace path; the first one it cannot read
is a one-line :class:`~overlapprof.errors.InputError` naming the worker and the path, instead of
as many failed ranks as there are files.

A worker that dies while it runs a rank (killed, out of memory, its node lost) has its task
retried by Dask on another worker, up to the scheduler's ``distributed.scheduler.allowed-failures``
(3 by default); past that the run ends with a one-line :class:`~overlapprof.errors.ClusterError`
naming the rank's first file. Nothing waits forever: connecting to the scheduler, waiting for
its first worker, and a cluster left with no worker at all are each bounded by ``timeout``; a lost
scheduler cancels the tasks, which is one error line too.

A rank whose file is large, on a cluster with worker threads to spare (more than one per rank),
has its file's byte ranges read as tasks of the cluster too (:class:`DaskRanges`, given to
:func:`overlapprof.analysis.engine.parallel.read`): its task reads some ranges itself, other
workers the rest, and their arrays come back to it to be merged, so the report is the one a
single process gives. A range task that fails past Dask's retries makes the rank's task read
the whole file itself.

``distributed`` is the optional extra ``[cluster]``; it is imported here, and only when a
scheduler is given.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from overlapprof.errors import ClusterError, InputError



class Task(Protocol):
    def done(self) -> bool: ...

    def result(self): ...


class Pool(Protocol):
    """Processes that run tasks: ``concurrent.futures.ProcessPoolExecutor`` is one, and so is
    :class:`DaskRanges`."""

    def submit(self, fn, *args) -> Task: ...

    def shutdown(self) -> None: ...

    def __enter__(self) -> Pool: ...

    def __exit__(self, kind, exc, tb) -> None: ...


def forked(processes: int, method: str | None = None) -> Pool:
    """The stdlib's pool of ``processes`` processes, forked from this one on Linux (no re-import
    of the caller's main module), spawned elsewhere, or started by ``method``. Their tasks get
    what they need as arguments."""
    import multiprocessing  # here: a process pool costs import time that one rank does not need
    import sys
    from concurrent.futures import ProcessPoolExecutor

    class Forked(ProcessPoolExecutor):
        def submit(self, fn, /, *args, **kwargs):
            # The first submit forks the workers. A SIGTERM (or Ctrl-C) handled while a worker is
            # forked raises inside the interpreter's at-fork hooks (logging's lock), where the
            # exception is printed and dropped: the analysis then ran on to exit 0. Held until the
            # forks are done, it raises here. The threads the pool starts inherit the mask, so the
            # signal goes to this one, which has it again once this returns.
            with _signals_held():
                return super().submit(fn, *args, **kwargs)

    context = multiprocessing.get_context(method or ("fork" if sys.platform == "linux" else "spawn"))
    return Forked(max_workers=processes, mp_context=context, initializer=_end_with_parent, initargs=(os.getpid(),))


@contextmanager
def _signals_held():
    import signal

    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _end_with_parent(parent: int) -> None:
    """A pool process ends when the process that made it does (Linux): a SIGTERM that lands in
    the parent while it starts a worker leaves that worker out of the pool's books, and it would
    wait on its task pipe for ever, holding the parent's stdout and stderr open. It takes SIGINT
    and SIGTERM again (forked while the parent held them)."""
    import signal
    import sys

    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    if sys.platform != "linux":
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # it ended before the signal was asked for
        os._exit(1)


# Seconds to wait for the scheduler to answer, and then for its first worker to join.
DEFAULT_TIMEOUT_S = 30.0
# Seconds between looks at the running tasks (and at whether the cluster still has a worker).
POLL_S = 0.05


@dataclass(frozen=True)
class DaskScheduler:
    """Where to send the per-rank work: a scheduler ``address`` (``tcp://HOST:PORT``) or the
    ``scheduler_file`` that ``dask scheduler --scheduler-file``, dask-mpi and dask-jobqueue write
    (JSON holding the ``address``). ``timeout``: seconds to wait for the scheduler, then for its
    first worker."""

    address: str | None = None
    scheduler_file: str | None = None
    timeout: float = DEFAULT_TIMEOUT_S

    def __post_init__(self):
        if (self.address is None) == (self.scheduler_file is None):
            raise InputError("give a Dask scheduler address or a scheduler file, not both")
        if not self.timeout > 0:
            raise InputError(f"the Dask timeout must be a positive number of seconds (got {self.timeout})")

    def resolve(self) -> str:
        """The scheduler's address, read from the scheduler file when one was given."""
        if self.address is not None:
            if "://" not in self.address and ":" not in self.address:
                raise InputError(f"Dask scheduler {self.address!r} is not an address (tcp://HOST:PORT)")
            return self.address
        path = Path(self.scheduler_file)
        try:
            info = json.loads(path.read_text())
        except FileNotFoundError:
            raise InputError(f"{path}: no such Dask scheduler file (is the scheduler started?)") from None
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise InputError(f"{path}: not a Dask scheduler file ({exc.__class__.__name__})") from None
        address = info.get("address") if isinstance(info, dict) else None
        if not isinstance(address, str) or not address:
            raise InputError(f"{path}: not a Dask scheduler file (no 'address')")
        return address

    def describe(self, address: str) -> str:
        return address if self.scheduler_file is None else f"{address} (from {self.scheduler_file})"


def first_unreadable(paths: list[str]) -> tuple[str, str, str] | None:
    """``(path, reason, worker address)`` of the first path this worker cannot open for
    reading, else None. Runs on a Dask worker."""
    from distributed import get_worker

    from overlapprof.trace.nsys import split

    for path in paths:
        try:
            with open(split(path)[0], "rb") as f:  # a rank of an Nsight Systems export: its file
                f.read(1)
        except OSError as exc:
            return path, exc.strerror or exc.__class__.__name__, get_worker().address
    return None


@contextmanager
def _quiet_dask():
    """Dask's own loggers warn on stderr about what this module turns into one error line
    (a lost worker, a failed connection); silence them while a client runs."""
    loggers = [logging.getLogger(name) for name in ("distributed", "distributed.client", "distributed.comm")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def _import_distributed():
    try:
        import distributed
    except ImportError:
        raise InputError("a Dask scheduler needs the 'distributed' package: "
                         "pip install 'overlapprof[cluster]'") from None
    return distributed


def run_on_dask(scheduler: DaskScheduler | str, work, jobs: list[list[str]], sizes: list[int], args: tuple, finish,
                ranges: bool = False) -> None:
    """Run ``work(jobs[k], *args)`` for every k on the Dask cluster, largest job first, calling
    ``finish(k, result)`` as each completes. Raises InputError when the scheduler cannot be
    reached, no worker joins, or a worker cannot read a trace; ClusterError when a rank's task
    failed on the cluster (its workers kept dying, or it raised). A str ``scheduler`` is an
    address. ``ranges``: when the cluster has at least one worker thread per job beyond the
    jobs' own, each job also gets ``(processes, DaskRanges)`` as arguments: a large file of
    its rank is read in ``processes`` byte ranges, the others as tasks of the cluster."""
    if isinstance(scheduler, str):
        scheduler = DaskScheduler(address=scheduler)
    distributed = _import_distributed()
    address = scheduler.resolve()
    where = scheduler.describe(address)
    with _quiet_dask():
        client = _connect(distributed, address, where, scheduler.timeout)
        with client:
            _run(client, where, scheduler.timeout, distributed, work, jobs, sizes, args, finish, ranges)


def _connect(distributed, address: str, where: str, timeout: float):
    """A Client of the scheduler at ``address``, or InputError within about ``timeout`` s.

    distributed bounds the TCP connection by its ``timeout`` but not the handshake after it, so a
    listener that accepts and never answers (another service on that port, a stopped scheduler
    process) would hang the client: it is started in a daemon thread, waited for a bounded time."""
    box = {}

    def start():
        try:
            box["client"] = distributed.Client(address, timeout=timeout, set_as_default=False)
        except BaseException as exc:  # handed to the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=start, name="overlapprof-dask-connect", daemon=True)
    thread.start()
    thread.join(2 * timeout + 1)  # the connection, then the registration: each bounded by timeout
    if thread.is_alive():
        raise InputError(f"the Dask scheduler at {where} did not answer within {timeout:g} s "
                         "(is a Dask scheduler listening there?)")
    exc = box.get("error")
    if isinstance(exc, (OSError, TimeoutError)):
        raise InputError(f"cannot reach the Dask scheduler at {where} within {timeout:g} s "
                         f"({exc.__class__.__name__})")
    if isinstance(exc, ValueError):  # a malformed address
        raise InputError(f"Dask scheduler {address!r}: {exc}")
    if exc is not None:
        raise exc
    return box["client"]


def _run(client, where, timeout, distributed, work, jobs, sizes, args, finish, ranges=False) -> None:
    try:
        client.wait_for_workers(1, timeout=timeout)
    except (TimeoutError, distributed.TimeoutError, OSError):
        raise InputError(f"no Dask worker joined the scheduler at {where} within {timeout:g} s") from None
    paths = [p for files in jobs for p in files]
    tag = uuid.uuid4().hex  # task keys unique on a scheduler that other clients may share
    check = client.submit(first_unreadable, paths, key=f"overlapprof-check-{tag}")
    try:
        _wait_any(client, {check}, timeout, where)
        bad = check.result()
    except ClusterError:
        raise
    except Exception as exc:  # the check's worker died past the retries: the cluster is not usable
        raise ClusterError(f"the Dask cluster at {where} could not run the path check ({exc.__class__.__name__}: "
                           f"{exc})") from None
    if bad is not None:
        raise InputError(f"Dask worker {bad[2]} cannot read {bad[0]} ({bad[1]}): the workers read the traces at "
                         "these paths, so they must be on a filesystem every worker mounts at the same place")
    if ranges and jobs:
        # Threads the ranks' own tasks leave free, shared among them: every range task then
        # finds a thread, and no rank's task waits on ranges that cannot start.
        spare = (sum(client.nthreads().values()) - len(jobs)) // len(jobs)
        if spare >= 1:
            args = (*args, spare + 1, DaskRanges)
    order = sorted(range(len(jobs)), key=lambda k: -sizes[k])  # largest first: none starts last
    # submitted in this order, so Dask starts them in this order (first submitted, first run)
    futures = {client.submit(work, jobs[k], *args, key=f"overlapprof-rank-{k}-{tag}"): k for k in order}
    pending = set(futures)
    while pending:
        done, pending = _wait_any(client, pending, timeout, where)
        for future in done:
            _collect(future, futures[future], jobs, where, distributed, finish)


def _wait_any(client, pending: set, timeout: float, where: str):
    """``(done, not done)`` once one of ``pending`` is done; ClusterError when the cluster has
    had no worker for ``timeout`` s (Dask would wait for one forever)."""
    no_worker_since, looked = None, 0.0
    while True:
        done = {f for f in pending if f.done()}
        if done:
            return done, pending - done
        now = time.monotonic()
        if now - looked < 1.0:  # ask the scheduler about its workers once a second
            time.sleep(POLL_S)
            continue
        looked = now
        if client.nthreads():
            no_worker_since = None
        elif no_worker_since is None:
            no_worker_since = now
        elif now - no_worker_since > timeout:
            raise ClusterError(f"the Dask cluster at {where} has had no worker for {timeout:g} s; "
                               f"{len(pending)} ranks not analyzed")
        time.sleep(POLL_S)


def _collect(future, k: int, jobs, where: str, distributed, finish) -> None:
    """Hand a done rank's result to ``finish``, or end the run with its one-line error."""
    try:
        result = future.result()
    except distributed.KilledWorker:
        raise ClusterError(f"{jobs[k][0]}: the Dask workers running this rank kept dying (killed, or out of "
                           f"memory?); the scheduler at {where} gave up on it") from None
    except distributed.client.FutureCancelledError as exc:  # the scheduler was lost, or cancelled the work
        raise ClusterError(f"{jobs[k][0]}: the Dask cluster at {where} dropped this rank's task "
                           f"({exc.reason})") from None
    except Exception as exc:  # the work itself raised on the worker: a bug, or a broken worker
        text = str(exc).splitlines()[0] if str(exc) else ""
        raise ClusterError(f"{jobs[k][0]}: the rank's task failed on the Dask cluster at {where} "
                           f"({exc.__class__.__name__}: {text})") from None
    finish(k, result)


class DaskRanges:
    """The pool that reads a large file's byte ranges (:func:`overlapprof.analysis.engine.parallel.read`)
    when its rank's analysis runs as a task of a Dask cluster: each range is another task of that
    cluster, on whichever worker is free, which opens the trace at its path and sends back the
    range's arrays. Runs on a Dask worker (``get_client``: the cluster of the running task).
    ``processes``: the ranges read at once (the schedule submits no more than that)."""

    def __init__(self, processes: int):
        from distributed import get_client

        self.client = get_client()
        self.tag, self.count, self.futures = uuid.uuid4().hex, 0, []

    def submit(self, fn, *args) -> _DaskTask:
        future = self.client.submit(fn, *args, key=f"overlapprof-range-{self.count}-{self.tag}", pure=False)
        self.count += 1
        self.futures.append(future)
        return _DaskTask(future)

    def shutdown(self) -> None:
        left = [f for f in self.futures if not f.done()]
        if left:
            self.client.cancel(left)
        self.futures = []

    def __enter__(self) -> DaskRanges:
        return self

    def __exit__(self, kind, exc, tb) -> None:
        self.shutdown()


class _DaskTask:
    """A range's Dask future, as the range schedule asks a task."""

    def __init__(self, future):
        self.future = future

    def done(self) -> bool:
        return self.future.done()

    def result(self):
        if self.future.done():
            return self.future.result()
        from distributed import rejoin, secede

        # While this thread waits it leaves its worker's thread pool: a range that Dask moved
        # onto this worker (the one it was on died) can then run here, not wait for this task.
        secede()
        try:
            return self.future.result()
        finally:
            rejoin()
