"""A few processes forked from this one that run calls for it: the pool of one large file's
parallel read (:mod:`overlapprof.analysis.rank.parallel_scan`).

Why not ``concurrent.futures.ProcessPoolExecutor``: for a read of a fraction of a second its
fixed costs were a tenth of the run (mtia, 2026-12-04: importing ``multiprocessing``,
``concurrent.futures`` and ``tempfile`` took 16 ms, starting the pool 4 ms, and its threads and
finalizers 8 ms more at exit), and it moves results through a thread of this process that
contends for the GIL with the read. Here each process has two pipes: calls go down one (a
pickled function and its arguments, sent when the process is idle) and results come up the
other; this process reads them when it looks (:meth:`Task.done`, :meth:`Task.result`), so no
thread is needed. Results should be small (a file's name): a large one stalls its process
until this one looks.

A process that dies (killed, out of memory) closes its pipe: its task, and every later one,
raises :class:`PoolBroken`. An exception in a call comes back as :class:`CallFailed` with its
type and message. When the pool ends, its processes are told to end and not waited for (the
exit of a process that shares this one's memory took 2-3 ms); the next pool reaps them. POSIX
only (``os.fork``).
"""

from __future__ import annotations

import os
import pickle
import select
from collections import deque

_HEADER = 8  # bytes of a message's length, before it


class PoolBroken(Exception):
    """A process of the pool died (or could not be started)."""


class CallFailed(Exception):
    """A call raised in a process of the pool; the message is its type and text."""


def _send(fd: int, data: bytes) -> None:
    view = memoryview(len(data).to_bytes(_HEADER, "little") + data)
    while view:
        view = view[os.write(fd, view) :]


def _receive(fd: int) -> bytes | None:
    """One message; None at the end of the pipe before one starts, EOFError within one."""
    head = _read_exactly(fd, _HEADER)
    if head is None:
        return None
    body = _read_exactly(fd, int.from_bytes(head, "little"))
    if body is None:
        raise EOFError
    return body


def _read_exactly(fd: int, size: int) -> bytearray | None:
    buf = bytearray(size)
    view, got = memoryview(buf), 0
    while got < size:
        n = os.readv(fd, [view[got:]])
        if n == 0:
            if got:
                raise EOFError
            return None
        got += n
    return buf


def _serve(calls: int, results: int, initializer, initargs) -> None:
    """A pool process: run calls until the pipe of calls closes, then end (never returning into
    the caller's code, nor running its exit handlers)."""
    code = 0
    try:
        if initializer is not None:
            initializer(*initargs)
        while (message := _receive(calls)) is not None:
            fn, args = pickle.loads(message)
            try:
                out = (True, fn(*args))
            except BaseException as exc:  # noqa: BLE001 - reported to the caller, which decides
                out = (False, f"{type(exc).__name__}: {exc}")
            try:
                data = pickle.dumps(out, protocol=pickle.HIGHEST_PROTOCOL)
            except Exception as exc:  # noqa: BLE001 - an unpicklable result
                data = pickle.dumps((False, f"{type(exc).__name__}: {exc}"))
            _send(results, data)
    except BaseException:  # noqa: BLE001 - a broken pipe or an interrupt: the caller sees the pipe close
        code = 1
    finally:
        os._exit(code)


_UNREAPED: list[int] = []  # pool processes told to end, not waited for yet


def _reap() -> None:
    for pid in list(_UNREAPED):
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done = pid
        if done:
            _UNREAPED.remove(pid)


def _kill(pid: int) -> None:
    import signal  # only when a process has to be killed

    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


class Task:
    """One call: pending (not sent yet), running, then done (a value or an error)."""

    def __init__(self, pool: ForkPool, fn, args: tuple):
        self.pool, self.call = pool, (fn, args)
        self.state = "pending"
        self.value, self.error = None, None

    def done(self) -> bool:
        if self.state == "running":
            self.pool._collect(0)
        return self.state in ("done", "cancelled")

    def result(self):
        while self.state in ("pending", "running"):
            self.pool._collect(None)
        if self.error is not None:
            raise self.error
        return self.value

    def cancel(self) -> bool:
        """Drop the call if it has not been sent to a process; whether it was."""
        if self.state != "pending":
            return self.state == "cancelled"
        self.pool._queue.remove(self)
        self.state = "cancelled"
        return True


class _Process:
    def __init__(self, pid: int, calls: int, results: int):
        self.pid, self.calls, self.results = pid, calls, results
        self.task: Task | None = None


class ForkPool:
    """``processes`` forked processes (each runs ``initializer(*initargs)`` first); a context
    manager that ends them on leaving (killing those still busy)."""

    def __init__(self, processes: int, initializer=None, initargs: tuple = ()):
        _reap()
        self._processes: list[_Process] = []
        self._queue: deque[Task] = deque()
        self._broken: str | None = None
        try:
            for _ in range(processes):
                self._start(initializer, initargs)
        except OSError as exc:
            self.shutdown(cancel_futures=True)
            raise PoolBroken(f"cannot start a process ({exc})") from None

    def _start(self, initializer, initargs) -> None:
        calls_r, calls_w = os.pipe()
        results_r, results_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            for p in self._processes:  # the others' pipes: they must see theirs close
                os.close(p.calls)
                os.close(p.results)
            os.close(calls_w)
            os.close(results_r)
            _serve(calls_r, results_w, initializer, initargs)
        os.close(calls_r)
        os.close(results_w)
        self._processes.append(_Process(pid, calls_w, results_r))

    def submit(self, fn, *args) -> Task:
        task = Task(self, fn, args)
        if self._broken is not None:
            task.state, task.error = "done", PoolBroken(self._broken)
            return task
        self._queue.append(task)
        self._dispatch()
        return task

    def _dispatch(self) -> None:
        for p in self._processes:
            if not self._queue:
                return
            if p.task is None:
                task = self._queue.popleft()
                try:
                    _send(p.calls, pickle.dumps(task.call, protocol=pickle.HIGHEST_PROTOCOL))
                except OSError:  # it died: its pipe is closed
                    self._queue.appendleft(task)
                    self._break(f"process {p.pid} ended")
                    return
                p.task, task.state = task, "running"

    def _collect(self, timeout: float | None) -> None:
        """Take the results that have come (waiting up to ``timeout`` seconds, None: until one
        comes), and send the waiting calls to the processes they freed."""
        busy = {p.results: p for p in self._processes if p.task is not None}
        if not busy:
            return
        ready, _, _ = select.select(list(busy), [], [], timeout)
        for fd in ready:
            p = busy[fd]
            task, p.task = p.task, None
            try:
                message = _receive(fd)
            except (EOFError, OSError):
                message = None
            if message is None:
                task.state, task.error = "done", PoolBroken(f"process {p.pid} ended while running a call")
                self._break(f"process {p.pid} ended")
                return
            ok, value = pickle.loads(message)
            task.state = "done"
            if ok:
                task.value = value
            else:
                task.error = CallFailed(value)
        self._dispatch()

    def _break(self, why: str) -> None:
        """One process died: every task not done fails, and the busy processes are killed
        (what they compute can no longer be used)."""
        self._broken = why
        for task in self._queue:
            task.state, task.error = "done", PoolBroken(why)
        self._queue.clear()
        for p in self._processes:
            if p.task is not None:
                p.task.state, p.task.error = "done", PoolBroken(why)
                p.task = None
                _kill(p.pid)

    def shutdown(self, cancel_futures: bool = False) -> None:
        """End the processes: calls not sent are dropped; running ones are waited for, or with
        ``cancel_futures`` their processes killed; idle processes end when their pipe of calls
        closes."""
        for task in self._queue:
            task.state = "cancelled"
        self._queue.clear()
        while not cancel_futures and any(p.task is not None for p in self._processes):
            self._collect(None)
        for p in self._processes:
            if p.task is not None:
                _kill(p.pid)
            os.close(p.calls)
            os.close(p.results)
        _UNREAPED.extend(p.pid for p in self._processes)
        _reap()  # those still ending are reaped next time: waiting for them took ms
        self._processes = []

    def __enter__(self) -> ForkPool:
        return self

    def __exit__(self, kind, exc, tb) -> None:
        self.shutdown(cancel_futures=kind is not None)


def make_folder() -> str:
    """A new private folder for files the pool's processes and this one share, under ``$TMPDIR``
    (or /tmp); ``tempfile`` is not imported for it (3 ms)."""
    base = os.environ.get("TMPDIR") or "/tmp"
    for k in range(1000):
        path = os.path.join(base, f"overlapprof-{os.getpid()}-{k}")
        try:
            os.mkdir(path, 0o700)
            return path
        except FileExistsError:
            continue
    raise OSError(f"no new folder can be made in {base}")


def remove_folder(path: str) -> None:
    try:
        for name in os.listdir(path):  # flat
            os.remove(os.path.join(path, name))
        os.rmdir(path)
    except OSError:
        pass  # what is left is in the temporary folder
