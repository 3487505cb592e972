"""Ctrl-C during the launcher's start-up: a SIGINT whose KeyboardInterrupt CPython ignores (raised
inside a weakref callback, as importlib's module locks run them during an import) is still acted on."""

import subprocess
import sys
import textwrap

from conftest import REPO

SWALLOWED = textwrap.dedent("""
    import os, signal, weakref
    from overlapprof.launch import sigint

    class Held:
        pass

    def callback(ref):
        os.kill(os.getpid(), signal.SIGINT)  # the handler runs here, inside the callback
        sum(range(1000))

    def swallowed():
        held = Held()
        ref = weakref.ref(held, callback)
        del held  # the callback runs; its KeyboardInterrupt is "ignored"
        return ref

    {body}
    print("went on")
""")


def run(body):
    return subprocess.run([sys.executable, "-c", SWALLOWED.format(body=body)],
                          capture_output=True, text=True, cwd=REPO, timeout=60)


def test_an_ignored_ctrl_c_is_remembered_and_raised_again_without_noise():
    done = run("with sigint.remembered():\n"
               "    ref = swallowed()\n"
               "    print('seen', sigint.seen())\n"
               "    try:\n"
               "        sigint.raise_if_seen()\n"
               "    except KeyboardInterrupt:\n"
               "        print('raised again')\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["seen True", "raised again"], done.stdout
    assert done.stderr == ""  # not CPython's "Exception ignored ... KeyboardInterrupt"


def test_without_it_the_ctrl_c_is_lost():
    """What the block guards against: CPython prints the exception and the program goes on."""
    done = run("ref = swallowed()\n")
    assert done.returncode == 0 and done.stdout == "went on\n", done.stdout + done.stderr
    assert "Exception ignored" in done.stderr and "KeyboardInterrupt" in done.stderr


def test_outside_the_block_sigint_is_as_before_and_a_new_block_starts_unseen():
    done = run("with sigint.remembered():\n"
               "    ref = swallowed()\n"
               "with sigint.remembered():\n"
               "    print('seen', sigint.seen())\n"
               "import signal\n"
               "print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)\n")
    assert done.stdout.split("\n")[:2] == ["seen False", "True"], done.stdout + done.stderr


def test_a_ctrl_c_python_wraps_in_another_error_leaves_the_block_as_ctrl_c():
    """A class body's ``__set_name__`` turns the handler's KeyboardInterrupt into a RuntimeError
    (Ctrl-C during torchelastic's import, seen in a fresh clone's suite): the block raises
    KeyboardInterrupt; an error with no SIGINT behind it stays what it is."""
    done = run("class Named:\n"
               "    def __set_name__(self, owner, name):\n"
               "        os.kill(os.getpid(), signal.SIGINT)\n"
               "        sum(range(1000))\n"
               "for block in (sigint.remembered, __import__('contextlib').nullcontext):\n"
               "    try:\n"
               "        with block():\n"
               "            class Owner:\n"
               "                field = Named()\n"
               "    except KeyboardInterrupt:\n"
               "        print('interrupted')\n"
               "    except RuntimeError as exc:\n"
               "        print('runtime error', type(exc.__cause__).__name__)\n"
               "with sigint.remembered():\n"
               "    try:\n"
               "        with sigint.remembered():\n"
               "            raise ValueError('mine')\n"
               "    except ValueError as exc:\n"
               "        print('stays', exc)\n")
    assert done.stdout.split("\n")[:3] == ["interrupted", "runtime error KeyboardInterrupt", "stays mine"], \
        done.stdout + done.stderr
