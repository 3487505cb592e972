"""The settings of :func:`overlapprof.profile`: :class:`ProfileConfig`, each field with its default
and meaning, the one list of them (``help(overlapprof.profile)``, its signature and
``ProfileConfig``'s own help are made from it). No torch here.
"""

from __future__ import annotations

import inspect
import textwrap
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

from overlapprof.errors import ProfileError
from overlapprof.rundir import run_record
from overlapprof.rundir.schedule import SCHEDULE_FIELDS, ProfilerSchedule


def _setting(default=None, doc="", factory=None):
    """A ProfileConfig field with its meaning: the one place a setting is described (the help of
    :func:`profile` and of :class:`ProfileConfig` are made from it)."""
    if factory is not None:
        return field(default_factory=factory, metadata={"doc": doc})
    return field(default=default, metadata={"doc": doc})


@dataclass
class ProfileConfig(ProfilerSchedule):
    """What :func:`profile` records, and where: the schedule
    (:class:`~overlapprof.rundir.schedule.ProfilerSchedule`, ``overlapprof run``'s) and the rest."""

    out: str | Path = _setting("traces", "The folder the run directory is made in.")
    run_id: str | None = _setting(None, "The run directory's name, <out>/<run_id>; None: <script>-<YYYYmmdd-HHMMSS>, "
                                        "chosen by rank 0. A directory that exists is an error: runs are never "
                                        "overwritten.")
    variant: str = _setting("", "What `compare` calls this run (run.json variant); \"\": the directory's name.")
    options: dict[str, Any] = _setting(doc="Settings of your job to keep in run.json options "
                                           "({\"bucket_cap_mb\": 25}): `compare` says where two runs' options differ.",
                                       factory=dict)
    record_shapes: bool = _setting(True, "Record input shapes (the collectives' message sizes come from them).")
    with_stack: bool = _setting(False, "Record Python stacks in the traces (costly).")
    gzip: bool = _setting(False, "Write .pt.trace.json.gz.")
    device: str = _setting("auto", "\"cuda\": record CUDA activity too; \"cpu\": host activity only; \"auto\": "
                                   "\"cuda\" when the backend is NCCL, or when CUDA is initialized in this process.")
    cuda_sync_events: bool = _setting(True, "On CUDA, record CUDA synchronization events (cuda_sync: stream waits on "
                                            "events, synchronizes), where this torch has the option.")
    synchronize: bool = _setting(True, "On CUDA, torch.cuda.synchronize() at each step() before the step's host time "
                                       "is taken (as `overlapprof run` does), so that a step's time includes its GPU "
                                       "work.")
    quiet: bool = _setting(False, "Print nothing (otherwise rank 0 says, on stderr, which steps each cycle records "
                                  "when it starts and ends, and sums the run up at the end; a process without "
                                  "torch.distributed says so).")

    def check(self) -> None:
        """ProfileError (one line) on a setting that cannot work."""
        counts = {"warmup_steps": self.warmup_steps, "unprofiled_steps": self.unprofiled(),
                  "wait": self.wait, "warmup": self.warmup}
        for name, value in counts.items():
            if not isinstance(value, int) or value < 0:
                raise ProfileError(f"overlapprof.profile: {name} must be an integer >= 0, not {value!r}")
        for name in ("active", "repeat"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ProfileError(f"overlapprof.profile: {name} must be an integer >= 1, not {value!r}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ProfileError(f"overlapprof.profile: device must be 'auto', 'cpu' or 'cuda', not {self.device!r}")
        if self.run_id is not None and (not self.run_id or "/" in self.run_id or self.run_id in (".", "..")):
            raise ProfileError(f"overlapprof.profile: run_id {self.run_id!r} is not a directory name")

    def profiler_config(self) -> run_record.ProfilerConfig:
        """run.json's ``profiler``."""
        return run_record.ProfilerConfig.of(self, record_shapes=self.record_shapes, with_stack=self.with_stack,
                                            gzip=self.gzip, cuda_sync_events=self.cuda_sync_events)


def setting_fields() -> list:
    """ProfileConfig's fields in the order help lists them: where, then the schedule (its base
    class's fields, first in ``fields()``), then what is recorded."""
    own = [f for f in fields(ProfileConfig) if f.name not in SCHEDULE_FIELDS]
    where = [f.name for f in own].index("options") + 1
    return own[:where] + [f for f in fields(ProfileConfig) if f.name in SCHEDULE_FIELDS] + own[where:]


def default(f):
    return f.default_factory() if f.default is MISSING else f.default


def settings_help() -> str:
    """Every setting, its default and its meaning, from ProfileConfig's fields."""
    return "\n".join(f"{f.name} = {default(f)!r}\n" + textwrap.fill(f.metadata["doc"], 96, initial_indent="    ",
                                                                   subsequent_indent="    ")
                     for f in setting_fields())



def signature_of(function) -> inspect.Signature:
    """``function(config=None, *, <every setting>=<its default>)``: what ``help()`` shows of
    :func:`overlapprof.profile`."""
    config = inspect.Parameter("config", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None,
                               annotation="ProfileConfig | None")
    return inspect.Signature(
        [config] + [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=default(f), annotation=f.type)
                    for f in setting_fields()],
        return_annotation=inspect.signature(function).return_annotation)


def settings_from(config: ProfileConfig | None, settings: dict) -> ProfileConfig:
    """The ProfileConfig of :func:`overlapprof.profile`'s arguments; ProfileError (one line) on
    both, or on a setting it does not have."""
    if config is not None and settings:
        raise ProfileError("overlapprof.profile: pass a config or settings, not both")
    names = [f.name for f in setting_fields()]
    if unknown := [name for name in settings if name not in names]:
        raise ProfileError(f"overlapprof.profile: no setting {unknown[0]!r} (the settings: {', '.join(names)})")
    return config or ProfileConfig(**settings)


ProfileConfig.__doc__ = inspect.cleandoc(ProfileConfig.__doc__ or "") + "\n\nSettings:\n\n" + settings_help() + "\n"
