"""Imported by the fork server of :mod:`overlapprof.launch.forkserver` only, before the harness
(and torch): notes the server's environment, and ends the server without the interpreter's
teardown. The server ends when the launcher does; its teardown after torch took ~1 s of wall
time under load (measured), and until it ends it holds the launcher's stdout and stderr open,
so a caller reading them to their end (a pipe, a test) waited for it."""

import atexit
import os
import signal

# The launcher spawned this server with SIGINT ignored and blocked (forkserver._server_environment):
# unblocked here, first, or the ranks forked from it would inherit it blocked; still ignored, a
# Ctrl-C pending since the spawn is dropped.
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})

SERVER_ENV = dict(os.environ)
"""The server's environment, as the ranks forked from it inherit it (see forkserver.forked_main)."""

# atexit runs the handlers last registered first: this one, registered before the harness is
# imported, runs after any torch registered, and skips only the interpreter's teardown.
atexit.register(os._exit, 0)
