"""The forked pool of the parallel decode: results, errors, a process that dies, no leftovers."""

from __future__ import annotations

import os
import signal
import time

import pytest

from overlapprof.analysis.forks import CallFailed, ForkPool, PoolBroken
from overlapprof.analysis.rank import parallel_scan as P
from overlapprof.analysis.rank import parts as PR
from overlapprof.analysis.columns import Index

import synthetic as S
from test_parallel_decode import _kineto_text, _tricky_events

_STATE = {}


def _remember(value):
    _STATE["value"] = value


def _square_in(x):
    return x * x, os.getpid(), _STATE.get("value")


def _fail(x):
    raise ValueError(f"no {x}")


def _die(_):
    os._exit(3)


def _sleep(s):
    time.sleep(s)
    return s


def _children() -> set[int]:
    here = os.getpid()
    found = set()
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == here and fields[0] != "Z":
                found.add(int(pid))
    return found


def _ended(before: set[int]) -> bool:
    """Whether the pool's processes have ended (they are not waited for: reaped later)."""
    deadline = time.monotonic() + 10
    while not _children() <= before and time.monotonic() < deadline:
        time.sleep(0.01)
    return _children() <= before


def test_results_come_from_other_processes_in_any_number():
    before = _children()
    with ForkPool(2, initializer=_remember, initargs=("set",)) as pool:
        tasks = [pool.submit(_square_in, k) for k in range(7)]  # more calls than processes
        got = [t.result() for t in tasks]
        assert len(_children() - before) == 2
    assert [g[0] for g in got] == [k * k for k in range(7)]
    assert {g[1] for g in got} <= set(range(1, 1 << 22)) - {os.getpid()}
    assert {g[2] for g in got} == {"set"}  # the initializer ran in each
    assert _ended(before)


def test_an_exception_comes_back_with_its_message():
    with ForkPool(1) as pool:
        bad, good = pool.submit(_fail, 5), pool.submit(_square_in, 3)
        with pytest.raises(CallFailed, match="ValueError: no 5"):
            bad.result()
        assert good.result()[0] == 9  # the process goes on


def test_a_process_that_dies_breaks_the_pool_without_a_hang():
    before = _children()
    with ForkPool(2) as pool:
        slow = pool.submit(_sleep, 30)
        dead = pool.submit(_die, 0)
        queued = pool.submit(_square_in, 2)
        t = time.monotonic()
        with pytest.raises(PoolBroken):
            dead.result()
        with pytest.raises(PoolBroken):
            slow.result()  # its process is killed, not waited for
        with pytest.raises(PoolBroken):
            queued.result()
        with pytest.raises(PoolBroken):
            pool.submit(_square_in, 1).result()
        assert time.monotonic() - t < 10
    assert _ended(before)


def test_ended_processes_are_reaped():
    """Not waited for when the pool ends, they are reaped by the next pool: no zombies pile up."""
    from overlapprof.analysis import forks

    for _ in range(3):
        with ForkPool(2) as pool:
            pool.submit(_square_in, 1).result()
    time.sleep(0.2)
    with ForkPool(1):
        pass
    assert len(forks._UNREAPED) <= 1


def test_cancel_drops_only_calls_not_sent():
    with ForkPool(1) as pool:
        running = pool.submit(_sleep, 0.2)
        waiting = pool.submit(_square_in, 4)
        assert waiting.cancel() and not running.cancel()
        assert running.result() == 0.2 and waiting.state == "cancelled"


def test_leaving_on_an_error_kills_busy_processes():
    before = _children()
    t = time.monotonic()
    with pytest.raises(KeyError):
        with ForkPool(1) as pool:
            pool.submit(_sleep, 30)
            raise KeyError("stop")
    assert time.monotonic() - t < 10 and _ended(before)


def test_a_worker_killed_mid_read_leaves_one_process_to_read(tmp_path, monkeypatch):
    """A pool process killed while it reads its range: the parallel read gives up (None), so the
    file is read in this process; no folder is left behind."""
    monkeypatch.setattr(P, "PARALLEL_MIN_TEXT", 0)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    path = S.write(tmp_path / "t.json", _kineto_text(_tricky_events(3000)), gz=False)
    parent = os.getpid()
    real = PR.read_part

    def killed(job, between=None):
        if os.getpid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(job, between)

    monkeypatch.setattr(PR, "read_part", killed)
    assert P.read(path, Index(), None, 2) is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json"]
    monkeypatch.setattr(PR, "read_part", real)
    assert P.read(path, Index(), None, 2) is not None
