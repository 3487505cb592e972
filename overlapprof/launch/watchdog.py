"""Where a rank is stuck or failed, in words, and a watchdog that ends a rank making no progress.

A rank hung in communication is blocked inside a call such as ``dist.recv`` or ``work.wait()``
(gloo and NCCL release the GIL while they wait). The watchdog thread reads the main thread's
Python stack and names that call and the workload line that made it::

    in torch.distributed.recv at workloads/ring.py:41 `dist.recv(state.recv_buf, src=prev)`

The same description is made from an exception's traceback, so a crash and a hang read alike.
A rank blocked in such a call is *waiting on its peers* (:func:`waiting_on_peers`); a rank stuck
anywhere else (a sleep, a loop, a compute call that never returns) made no progress in its own
code, and is the cause of its peers' wait.

The watchdog thread also reports the rank's progress every ``tick_s`` (for the launcher's
heartbeat), and ends the rank when a SIGINT/SIGTERM has not ended it within ``signal_grace_s``:
Python runs signal handlers in the main thread only, between bytecodes, so a main thread blocked
in a C call (a gloo ``recv`` whose peer never sends) would otherwise ignore Ctrl-C until
torchelastic kills it. The thread learns of the signal through ``signal.set_wakeup_fd``.
"""

import linecache
import os
import re
import select
import signal
import sys
import sysconfig
import threading
import time
import traceback
from pathlib import Path

_TORCH_DIR = None
_LIBRARY_DIRS = tuple(str(Path(p).resolve()) for p in {sysconfig.get_paths()["stdlib"],
                                                        sysconfig.get_paths()["purelib"],
                                                        sysconfig.get_paths()["platlib"]})
_OVERLAPPROF_DIR = str(Path(__file__).resolve().parent.parent) + os.sep
# The workload API (ctx.phase, ctx.check_result...) is named like torch's: by the workload line calling it.
_WORKLOAD_API = str(Path(__file__).resolve().parent.parent / "workload.py")
_WRAPPER_MODULES = ("torch.distributed.c10d_logger", "contextlib", "functools")


def first_line(exc):
    """The first line of an exception's message (gloo's and NCCL's run on)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def describe_stack(frame):
    """Name the call ``frame``'s thread is in (see module docstring); "" if unknown."""
    return _describe([(f, lineno) for f, lineno in traceback.walk_stack(frame)][::-1])


def describe_traceback(tb):
    """Name the call an exception came out of, from its traceback."""
    return _describe(list(traceback.walk_tb(tb)))


def _describe(frames):
    """``frames``: (frame, lineno) from outermost to innermost."""
    users = [i for i, (frame, _) in enumerate(frames) if _is_user(frame)]
    if not users:
        return ""
    caller, lineno = frames[users[-1]]
    callee = next((f for f, _ in frames[users[-1] + 1:] if _is_api(f)), None)
    code = linecache.getline(caller.f_code.co_filename, lineno).strip()
    where = f"at {_short_path(caller.f_code.co_filename)}:{lineno}" + (f" `{code}`" if code else "")
    return f"in {_qualified_name(callee)} {where}" if callee else where


_WAIT_CALL = re.compile(r"\.wait\([^`]*\)`$")


def waiting_on_peers(description):
    """Is a rank described as blocked ``description`` (from :func:`describe_stack`) waiting for
    other ranks: inside a ``torch.distributed`` call, or in a ``work.wait()`` (a C method, so only
    the workload line names it)?"""
    return description.startswith("in torch.distributed.") or bool(_WAIT_CALL.search(description))


def main_thread_location():
    """Where the main thread is now, described (from another thread or a signal handler)."""
    frame = sys._current_frames().get(threading.main_thread().ident)
    return describe_stack(frame) if frame else ""


def _is_user(frame):
    """Code of the user or of overlapprof: not torch, not the standard or installed libraries,
    not frozen or generated code (``<frozen posixpath>``, ``<string>``: Python's own)."""
    if frame.f_code.co_filename.startswith("<"):
        return False
    path = str(Path(frame.f_code.co_filename).resolve())
    if path.startswith(_torch_dir()) or path == _WORKLOAD_API:
        return False
    return path.startswith(_OVERLAPPROF_DIR) or not path.startswith(_LIBRARY_DIRS)


def is_workload_file(filename):
    """Is ``filename`` the workload's code (or a helper of the user's): not overlapprof, torch,
    the standard or installed libraries, nor frozen or generated code?"""
    if filename.startswith("<"):
        return False
    path = str(Path(filename).resolve())
    return not path.startswith((_OVERLAPPROF_DIR, _torch_dir(), *_LIBRARY_DIRS))


def _is_api(frame):
    module = frame.f_globals.get("__name__", "")
    return (module.startswith("torch") and module not in _WRAPPER_MODULES
            and frame.f_code.co_name != "wrapper")


def _qualified_name(frame):
    module = frame.f_globals.get("__name__", "")
    module = module.replace("torch.distributed.distributed_c10d", "torch.distributed")
    name = getattr(frame.f_code, "co_qualname", frame.f_code.co_name)
    return f"{module}.{name}"


def _short_path(path):
    try:
        relative = os.path.relpath(path)
    except ValueError:
        return path
    return path if relative.startswith("..") else relative


def _torch_dir():
    global _TORCH_DIR
    if _TORCH_DIR is None:
        import torch

        _TORCH_DIR = str(Path(torch.__file__).resolve().parent) + os.sep
    return _TORCH_DIR


class Watchdog:
    """A daemon thread watching the rank's ``progress.progress_at`` (a ``time.monotonic()`` value
    the rank advances at every phase and step boundary). It calls, from that thread:

    - ``on_hang(idle_s, description)`` when progress is more than ``timeout_s`` old, or more
      than ``harness_timeout_s`` while ``progress.in_harness`` (overlapprof's own work, which
      can take long with many ranks per core, is not the workload's);
    - ``on_tick(idle_s)`` every ``tick_s`` seconds (the rank's heartbeat);
    - ``on_signal_stuck(signum, description)`` when a SIGINT or SIGTERM (with a Python handler)
      arrived ``signal_grace_s`` ago and the process is still alive.

    ``on_hang`` and ``on_signal_stuck`` are expected to end the process. ``start`` and ``stop``
    must be called from the main thread (they set and reset the signal wakeup fd)."""

    def __init__(self, progress, timeout_s, on_hang, on_tick=None, tick_s=1.0,
                 on_signal_stuck=None, signal_grace_s=2.0, harness_timeout_s=None):
        self._progress = progress
        self._timeout_s = timeout_s
        self._harness_timeout_s = max(timeout_s, harness_timeout_s or 0)
        self._on_hang = on_hang
        self._on_tick = on_tick
        self._tick_s = tick_s
        self._on_signal_stuck = on_signal_stuck
        self._signal_grace_s = signal_grace_s
        self._stopped = threading.Event()
        self._wakeup = None  # (read fd, write fd) of the signal wakeup pipe
        self._thread = threading.Thread(target=self._watch, name="overlapprof-watchdog",
                                        daemon=True)

    def start(self):
        if self._on_signal_stuck is not None:
            read_fd, write_fd = os.pipe()
            os.set_blocking(write_fd, False)
            signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
            self._wakeup = (read_fd, write_fd)
        self._thread.start()

    def stop(self):
        self._stopped.set()
        if self._wakeup is not None:
            signal.set_wakeup_fd(-1)

    def _watch(self):
        period = min(0.25, self._timeout_s / 4)
        ticked = time.monotonic()
        signalled = None  # (signum, monotonic time) of the first SIGINT/SIGTERM
        while not self._stopped.is_set():
            if self._wakeup is not None:
                ready, _, _ = select.select([self._wakeup[0]], [], [], period)
                if ready:
                    for signum in os.read(self._wakeup[0], 64):
                        if signum in (signal.SIGINT, signal.SIGTERM) and signalled is None:
                            signalled = (signal.Signals(signum), time.monotonic())
            else:
                self._stopped.wait(period)
            if self._stopped.is_set():
                return
            now = time.monotonic()
            if signalled and now - signalled[1] >= self._signal_grace_s:
                self._on_signal_stuck(signalled[0], main_thread_location())
                return
            idle = now - self._progress.progress_at
            limit = self._harness_timeout_s if getattr(self._progress, "in_harness", False) else self._timeout_s
            if idle >= limit and not signalled:
                self._on_hang(idle, main_thread_location())
                return
            if self._on_tick is not None and now - ticked >= self._tick_s:
                ticked = now
                self._on_tick(idle)
