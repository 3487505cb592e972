"""Where a rank is stuck or failed, in words, and a watchdog that ends a rank making no progress.

A rank hung in communication is blocked inside a call such as ``dist.recv`` or ``work.wait()``
(gloo and NCCL release the GIL while they wait). The watchdog thread reads the main thread's
Python stack and names that call and the workload line that made it::

    in torch.distributed.recv at workloads/ring.py:41 `dist.recv(state.recv_buf, src=prev)`

The same description is made from an exception's traceback, so a crash and a hang read alike.
"""

import linecache
import os
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


def _is_user(frame):
    """Code of the user or of overlapprof: not torch, not the standard or installed libraries."""
    path = str(Path(frame.f_code.co_filename).resolve())
    if path.startswith(_torch_dir()):
        return False
    return path.startswith(_OVERLAPPROF_DIR) or not path.startswith(_LIBRARY_DIRS)


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
    """Calls ``on_hang(idle_s, description)`` from a daemon thread when ``progress.progress_at``
    (a ``time.monotonic()`` value the rank advances at every phase and step boundary) is more
    than ``timeout_s`` old. ``on_hang`` is expected to end the process."""

    def __init__(self, progress, timeout_s, on_hang):
        self._progress = progress
        self._timeout_s = timeout_s
        self._on_hang = on_hang
        self._main = threading.main_thread().ident
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="overlapprof-watchdog",
                                        daemon=True)

    def start(self):
        self._thread.start()

    def stop(self):
        self._stopped.set()

    def _watch(self):
        period = min(0.25, self._timeout_s / 4)
        while not self._stopped.wait(period):
            idle = time.monotonic() - self._progress.progress_at
            if idle >= self._timeout_s:
                frame = sys._current_frames().get(self._main)
                self._on_hang(idle, describe_stack(frame) if frame else "")
                return
