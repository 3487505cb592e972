"""Ctrl-C remembered as well as raised, while the launcher starts the ranks.

A SIGINT that lands while Python runs code called back from C (importlib's module-lock weakref
callbacks, during an import) raises KeyboardInterrupt there, and CPython prints it as "Exception
ignored" and goes on: the run would then go to its end as if nothing happened (seen in CI: a Ctrl-C
during torchelastic's import, the run finished 19 s later with exit code 0). Inside
:func:`remembered` the signal is also noted, the ignored exception is not printed, and
:func:`raise_if_seen` raises it again where the launcher can act on it. One that lands where Python
wraps what it raises (a class body's ``__set_name__`` turns it into a RuntimeError, seen in a fresh
clone's suite: Ctrl-C during ``torch.distributed.elastic``'s import) leaves the block as the
KeyboardInterrupt it was.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading

_seen = False


@contextlib.contextmanager
def remembered():
    """SIGINT raises KeyboardInterrupt and is remembered (:func:`seen`) from the block's start.
    Only in the main thread (the only one signals reach); elsewhere it does nothing."""
    global _seen
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _seen = False
    previous_handler = signal.signal(signal.SIGINT, _on_sigint)
    previous_hook = sys.unraisablehook

    def quiet_if_interrupt(unraisable):
        if not isinstance(unraisable.exc_value, KeyboardInterrupt):
            previous_hook(unraisable)

    sys.unraisablehook = quiet_if_interrupt
    try:
        yield
    except Exception as exc:
        if _seen:
            raise KeyboardInterrupt from exc
        raise
    finally:
        sys.unraisablehook = previous_hook
        signal.signal(signal.SIGINT, previous_handler)


def _on_sigint(signum, frame):
    global _seen
    _seen = True
    raise KeyboardInterrupt


def seen() -> bool:
    """Whether a SIGINT arrived inside the current (or last) :func:`remembered` block."""
    return _seen


def raise_if_seen() -> None:
    """Raise KeyboardInterrupt if a SIGINT arrived inside the current :func:`remembered` block,
    even one whose exception was ignored where it was raised."""
    if _seen:
        raise KeyboardInterrupt
