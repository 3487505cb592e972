"""The profiler's schedule, declared once: ``overlapprof run``'s flags (``RunRequest``),
``overlapprof.profile``'s settings (``ProfileConfig``) and run.json's ``profiler`` embed it, with
these defaults. A loop is recorded as ``warmup_steps`` steps outside the profiler, then ``repeat``
cycles of ``unprofiled`` steps with the profiler off (the baseline of its overhead), ``wait``,
``warmup`` and ``active`` steps (:mod:`overlapprof.launch.recording`). A dataclass (msgspec reads
and writes it in run.json), each field with its meaning (``metadata["doc"]``: the help of
``overlapprof.profile`` is made from it). No torch here.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields


def _step_count(default: int | None, doc: str):
    return field(default=default, metadata={"doc": doc})


@dataclass
class ProfilerSchedule:
    """How many steps of each kind a run records (see the module docstring)."""

    warmup_steps: int = _step_count(2, "Steps before the profiler cycles, outside the profiler (communicators are "
                                       "built then, and NCCL's first recv blocks the host); their host times are "
                                       "kept as \"warmup\".")
    unprofiled_steps: int | None = _step_count(None, "Steps with the profiler off at the start of each cycle: the "
                                                     "baseline of the profiler's overhead. None: as many as active.")
    wait: int = _step_count(1, "torch.profiler.schedule wait: steps skipped after the unprofiled ones.")
    warmup: int = _step_count(1, "Steps traced and discarded before the active ones.")
    # 16: the comparison's bootstrap intervals narrow up to about there within a run of seconds
    # (benchmarks/active_bench.py; docs/running-workloads.md).
    active: int = _step_count(16, "Steps recorded per cycle: the ProfilerSteps in each trace file.")
    repeat: int = _step_count(1, "Profiler cycles: one trace file per rank each.")

    def __post_init__(self):
        # msgspec decodes a dataclass without setting the fields a file lacks (their defaults are
        # the class's): set them, so that run.json is written back whole.
        for f in fields(self):
            self.__dict__.setdefault(f.name, getattr(self, f.name))

    def unprofiled(self) -> int:
        return self.active if self.unprofiled_steps is None else self.unprofiled_steps

    def steps_needed(self) -> int:
        """Steps until the last cycle is recorded."""
        return self.warmup_steps + self.repeat * (self.unprofiled() + self.wait + self.warmup + self.active)

    def schedule(self) -> ProfilerSchedule:
        """The schedule alone (of a subclass: its schedule's fields), ``unprofiled_steps`` resolved."""
        return ProfilerSchedule(**{**{name: getattr(self, name) for name in SCHEDULE_FIELDS},
                                   "unprofiled_steps": self.unprofiled()})


SCHEDULE_FIELDS = tuple(asdict(ProfilerSchedule()))
