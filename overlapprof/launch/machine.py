"""The machine's load while a run measured its steps: :class:`LoadMeter`, used by the harness.

No torch here.

**What is recorded** (``run.json``: ``ranks.<r>.machine_load`` of each node's local rank 0, a
:class:`~overlapprof.rundir.run_record.MachineLoad`): over the steps of each kind the comparison
uses (``unprofiled``, ``profiled``; the profiler cycles interleave them), the share of the
machine's CPU time taken by processes outside this run, from ``/proc/stat`` (every CPU's busy
time) less the CPU time of the launcher and all its descendants (the ranks), sampled between
steps when the kind of step changes (only over at least :data:`MIN_TICKS` ticks of CPU time:
steps that short are not judged); and the 1-minute load average at the start and at the end.

How a comparison uses it: :class:`overlapprof.rundir.run_record.MachineLoad` (the rule, and
:func:`~overlapprof.rundir.run_record.explains`).
"""

from __future__ import annotations

import os
import time

KINDS = ("unprofiled", "profiled")
# /proc/stat counts CPU time in ticks (100 a second per CPU): a share over fewer than this many
# is too coarse to judge by (2 cores: a quarter of a second of steps), and is not recorded.
MIN_TICKS = 50


def _cpu_ticks() -> tuple[int, int] | None:
    """(busy, total) clock ticks of every CPU since boot, from /proc/stat; None without it."""
    try:
        with open("/proc/stat", "rb") as f:
            fields = [int(x) for x in f.readline().split()[1:9]]  # user .. steal (guest is in user)
    except (OSError, ValueError):
        return None
    total = sum(fields)
    return total - fields[3] - fields[4], total  # idle and iowait are not busy


def _process_ticks(pid: int) -> int:
    """utime + stime of a process (all its threads), in clock ticks; 0 when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, ValueError, IndexError):
        return 0


def _descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (from each thread's ``children``)."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children", "rb") as f:
                    todo += [int(c) for c in f.read().split()]
        except (OSError, ValueError):
            continue
    return found


class LoadMeter:
    """Samples the machine between steps: ``at(kind)`` when the steps of ``kind`` begin (None: no
    kind measured until the next call); ``result()`` gives the fields of a MachineLoad, or None
    where /proc cannot be read. ``root``: the run's top process (the launcher)."""

    def __init__(self, root: int):
        self.root = root
        self.kind = None
        self.last = None  # (busy, total, run ticks, monotonic s) of the previous sample
        self.sums = {}  # kind -> [busy, total, run, seconds]
        self.load_average = []

    def at(self, kind: str | None) -> None:
        if kind == self.kind and self.last is not None:
            return
        cpu = _cpu_ticks()
        if cpu is None:
            return
        now = (*cpu, sum(_process_ticks(p) for p in _descendants(self.root)), time.monotonic())
        if self.last is not None and self.kind in KINDS:
            sums = self.sums.setdefault(self.kind, [0, 0, 0, 0.0])
            for k in range(4):
                sums[k] += now[k] - self.last[k]
        self.load_average.append(os.getloadavg()[0])
        self.last, self.kind = now, kind

    def result(self) -> dict | None:
        shares = {}
        for kind, (busy, total, run, _) in self.sums.items():
            if total >= MIN_TICKS:
                shares[kind] = round(min(max((busy - run) / total, 0.0), 1.0), 4)
        if not self.sums:
            return None
        return {"host": os.uname().nodename, "cores": os.cpu_count() or 1,
                "load_average": [round(x, 2) for x in self.load_average[:1] + self.load_average[-1:]],
                "other_share": shares, "seconds": {k: round(v[3], 3) for k, v in self.sums.items()},
                "ticks": {k: v[1] for k, v in self.sums.items()}}
