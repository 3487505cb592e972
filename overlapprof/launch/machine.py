"""The machine's load while a run measured its steps, and when it makes a comparison untrustworthy.

No torch here: the harness records (:class:`LoadMeter`), ``compare`` and the launcher judge
(:func:`load_factor`, :func:`explains`).

**What is recorded** (``run.json``: ``ranks.<r>.machine_load`` of each node's local rank 0, a
:class:`~overlapprof.launch.run_record.MachineLoad`): over the steps of each kind the comparison
uses (``unprofiled``, ``profiled``; the profiler cycles interleave them), the share of the
machine's CPU time taken by processes outside this run, from ``/proc/stat`` (every CPU's busy
time) less the CPU time of the launcher and all its descendants (the ranks), sampled between
steps when the kind of step changes (only over at least :data:`MIN_TICKS` ticks of CPU time:
steps that short are not judged); and the 1-minute load average at the start and at the end.

**The rule.** Let ``free`` = 1 − the other processes' share over a kind of steps: the part of the
machine left to the run. Two sets of steps compared (two variants' profiled steps, or a run's
profiled against its unprofiled steps) ran on machines that differed by the *load factor*
``F = max(free_a / free_b, free_b / free_a)``. A rank's CPU-bound work can differ by ``F`` from
the load alone, and ranks that meet in collectives each wait for the one the load held back, so
a step can differ by up to ``F ** EXPONENT`` (2). When ``F >= FLOOR`` (the load moved by 5% or
more) and ``F ** EXPONENT`` is at least the smallest difference the measurement allows (its
interval's edge nearest to 1x; 1x when the interval includes it), the load moved enough to
explain what was measured: the comparison is reported as not trusted, with a rerun suggested,
instead of a verdict.
"""

from __future__ import annotations

import os
import time

FLOOR = 1.05
EXPONENT = 2
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


def busiest(loads: list, kind: str) -> float | None:
    """The largest share of the CPU other processes took over ``kind`` steps, of the nodes'
    MachineLoads (None: not recorded)."""
    shares = [m.other_share[kind] for m in loads if m is not None and kind in m.other_share]
    return max(shares) if shares else None


def load_factor(other_a: float | None, other_b: float | None) -> float | None:
    """How much more (or less) of the machine one set of steps had than the other (>= 1); None
    when either share is unknown."""
    if other_a is None or other_b is None:
        return None
    free_a, free_b = max(1.0 - other_a, 1e-3), max(1.0 - other_b, 1e-3)
    return max(free_a / free_b, free_b / free_a)


def explains(factor: float | None, value: float | None, interval=None) -> bool:
    """Did the load move enough (``factor``, :func:`load_factor`) to explain a measured factor
    ``value`` with its interval ``(low, high)`` (see the module docstring)?"""
    if factor is None or value is None or factor < FLOOR:
        return False
    low, high = interval if interval is not None else (value, value)
    smallest = low if low > 1 else 1 / high if high < 1 else 1.0
    return factor ** EXPONENT >= smallest


def described(other_a: float, other_b: float, a: str, b: str, measured: float) -> str:
    """Why a factor ``measured`` between steps ``a`` and ``b`` is not trusted, in words."""
    factor = load_factor(other_a, other_b)
    return (f"other processes took {other_a:.0%} of the machine's CPU during {a} and {other_b:.0%} during {b} "
            f"(load factor {factor:.2f}x, which alone can change steps by up to {factor ** EXPONENT:.2f}x: "
            f"enough to explain the {measured:.2f}x measured)")
