"""Starting TensorBoard on a run directory (or a folder of them), bound to 127.0.0.1.

:func:`start` writes the missing overlap scalars (``overlapprof.renderers.tensorboard``), then starts
``python -m tensorboard.main`` as a child process on a free port and returns a
:class:`TensorBoardServer` once TensorBoard answers HTTP. The preferred port is used when free;
a busy one gives way to a port the OS picks. The URL is read from TensorBoard's own start-up
line, so a port lost to a race is still reported right.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from overlapprof.errors import InputError, OverlapprofError

HOST = "127.0.0.1"
DEFAULT_PORT = 6006
_URL_LINE = re.compile(r"TensorBoard \S+ at (http://\S+?)/? ")


class TensorBoardError(OverlapprofError):
    """TensorBoard did not start."""


def port_is_free(port: int, host: str = HOST) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as TensorBoard's server does
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def stop_process(process: subprocess.Popen, timeout: float = 10.0, group: bool = False) -> None:
    """Terminate a child process, and kill it if it has not ended within ``timeout`` seconds.
    ``group``: the child leads a session of its own (TensorBoard), and its whole process group
    is stopped, so that no worker process it started keeps its port."""
    def send(sig):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig) if group else process.send_signal(sig)

    if process.poll() is None:
        send(signal.SIGTERM)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            send(signal.SIGKILL)
            process.wait()
    if group:  # what is left of its group (a pid stays reserved while a group of its number lives)
        send(signal.SIGKILL)


class TensorBoardServer:
    """A running TensorBoard child process; ``url`` is where it serves."""

    def __init__(self, process: subprocess.Popen, log_path: Path, url: str):
        self.process, self.log_path, self.url = process, log_path, url

    def get(self, path: str, timeout: float = 30.0) -> bytes:
        """GET ``path`` (e.g. ``/data/plugin/scalars/tags``) from this TensorBoard."""
        with urllib.request.urlopen(self.url + path, timeout=timeout) as response:
            return response.read()

    def log_tail(self, lines: int = 5) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def wait(self) -> int:
        return self.process.wait()

    def stop(self) -> None:
        stop_process(self.process, group=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def _die_with_parent() -> None:  # pragma: no cover - runs in the child, between fork and exec
    """Linux: the child gets SIGTERM when the process that started it dies, so a TensorBoard
    is never left behind by a crashed or killed parent."""
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _launch(logdir: Path, port: int, log_path: Path, timeout_s: float) -> TensorBoardServer | None:
    """Start TensorBoard on ``port``; None when it exits because the port is taken."""
    log = open(log_path, "w")
    cmd = [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir), "--host", HOST,
           "--port", str(port), "--load_fast", "false"]
    process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                               start_new_session=True,
                               preexec_fn=_die_with_parent if sys.platform == "linux" else None)
    log.close()
    try:
        return _answering(process, log_path, timeout_s)
    except BaseException:  # Ctrl-C or SIGTERM while it starts: it must not outlive us
        stop_process(process, group=True)
        raise


def _answering(process, log_path: Path, timeout_s: float) -> TensorBoardServer | None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = log_path.read_text(errors="replace")
        if process.poll() is not None:
            if "already in use" in text or "Address in use" in text:
                return None
            last = (text.strip().splitlines() or ["no output"])[-1]
            raise TensorBoardError(f"TensorBoard exited with code {process.returncode}: {last}")
        match = _URL_LINE.search(text)
        if match:
            server = TensorBoardServer(process, log_path, match.group(1).rstrip("/"))
            try:
                server.get("/data/logdir", timeout=5)
                return server
            except OSError:
                pass
        time.sleep(0.2)
    raise TensorBoardError(f"TensorBoard did not answer within {timeout_s:.0f} s (log: {log_path})")


def check_logdir(path: str | Path) -> Path:
    """``path`` as a Path when TensorBoard has something to show below it; InputError (one
    line) when it is missing, not a directory, or holds no traces and no event files."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: no such run directory or folder")
    if not path.is_dir():
        raise InputError(f"{path}: not a directory (give a run directory or a folder of them)")
    if not any(path.rglob("*.pt.trace.json*")) and not any(path.rglob("events.out.tfevents.*")):
        raise InputError(f"{path}: nothing for TensorBoard below this folder (no *.pt.trace.json[.gz] traces, "
                         "no event files)")
    return path


def start(path: str | Path, port: int | None = None, *, scalars: bool = True, log=None,
          timeout_s: float = 120.0) -> TensorBoardServer:
    """Start TensorBoard with ``path`` (a run directory or a folder of them) as its logdir.

    ``port``: the preferred port (default 6006); when busy, another free one. ``scalars``: first
    write the overlap scalars of run directories (and other folders of traces) that lack them.
    ``log(line)`` gets notes.
    Raises InputError for a path with nothing to show (:func:`check_logdir`), TensorBoardError when it won't start."""
    path = check_logdir(path)
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        from overlapprof.renderers.tensorboard import TensorBoardMissing

        raise TensorBoardMissing("TensorBoard is not installed: pip install 'overlapprof[tensorboard]'") from None
    if scalars:
        from overlapprof.renderers.tensorboard import ensure_scalars

        for folder in ensure_scalars(path, log=log):
            if log:
                log(f"wrote overlap scalars in {folder}/scalars")
    try:
        import torch_tb_profiler  # noqa: F401
    except ImportError:
        if log:
            log("torch-tb-profiler is not installed: traces will not show (pip install torch-tb-profiler)")
    preferred = DEFAULT_PORT if port is None else port
    log_dir = Path(tempfile.mkdtemp(prefix="overlapprof-tensorboard-"))
    for attempt, candidate in enumerate([preferred, 0, 0]):
        if candidate and not port_is_free(candidate):
            if log:
                log(f"port {candidate} is busy; using a free one")
            continue
        server = _launch(path.resolve(), candidate, log_dir / f"tensorboard.{attempt}.log", timeout_s)
        if server is not None:
            return server
    raise TensorBoardError("TensorBoard found no free port")
