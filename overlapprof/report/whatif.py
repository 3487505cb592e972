"""What a change would buy: the result of ``overlapprof whatif`` (:class:`WhatIf`).

Plain typed data (msgspec Structs, no numpy), computed by :mod:`overlapprof.analysis.replay`
and read by :mod:`overlapprof.renderers.whatif_table`; saves to and loads from JSON. Times are µs.

- ``traced_step_us``: the traced run's step, the median over its (rank, step) pairs;
  ``replayed_step_us`` the same of the replay with nothing changed, ``replay_error`` =
  ``replayed / traced − 1`` (per rank in ``RankReplay``).
- A :class:`Prediction` per change: ``step_us`` the median over the (rank, step) pairs of the
  replayed steps; ``low_us``/``high_us`` their 2.5th and 97.5th percentiles, at least the traced
  steps' own relative spread around their median times ``step_us`` (the spread of the
  traced steps carried through the change); ``speedup`` = ``traced_step_us / step_us``;
  ``exposure`` the replay's blocked time per (rank, step), mean, by cause; ``limit``
  what then sets the step. A change the trace cannot model has ``modelled`` False, a
  ``reason``, and no number.
- :class:`Check`: the prediction against the run that made the change (``--check``):
  ``error`` = ``predicted / measured − 1``; ``within`` whether the measured median lies in
  ``[low_us, high_us]``; ``compute_ratio`` = the run's median compute a (rank, step) / the
  traced run's, divided by the change's own compute factor (``compute=xF``: F; ``no_straggler``
  and ``micro_batches``: the rewritten steps' median compute over the traced ones',
  ``Prediction.compute_factor``):
  far from 1, the machine (load, clocks) or the change's interference moved the run's compute,
  which the replay does not model.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from overlapprof.report.exposure import Exposure


class TransferFit(msgspec.Struct, kw_only=True, omit_defaults=True):
    """``transfer = latency_us + bus bytes / bandwidth`` for one kind and group size.
    ``source``: ``fit`` (least squares on ``sizes`` distinct sizes), ``reference``
    (``--reference-bandwidth``), ``link`` (the run's link shared by its ranks) or ``none``.
    Residuals are ``|x − model| / x``, as fractions."""

    kind: str
    group_size: int
    operations: int
    sizes: int
    source: str
    latency_us: float | None = None
    bandwidth_gbps: float | None = None  # GB/s, GB = 1e9 bytes
    median_abs_residual: float | None = None
    max_abs_residual: float | None = None
    note: str | None = None


class RankReplay(msgspec.Struct, kw_only=True):
    """One rank's traced and replayed step (medians over its steps), ``error`` = replayed / traced − 1."""

    rank: int
    traced_step_us: float
    replayed_step_us: float
    error: float


class Check(msgspec.Struct, kw_only=True):
    """A prediction against the run that made the change (see the module docstring)."""

    run: str
    measured_step_us: float
    measured_low_us: float
    measured_high_us: float
    error: float
    within: bool
    compute_ratio: float | None = None  # the run's median compute a step / the traced run's (× the change's factor)


class Prediction(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One change (or combination) replayed; see the module docstring."""

    change: str
    modelled: bool = True
    reason: str | None = None
    step_us: float | None = None
    low_us: float | None = None
    high_us: float | None = None
    speedup: float | None = None
    ranks: dict[int, float] = {}  # rank -> its median replayed step
    compute_us: float | None = None
    other_us: float | None = None
    compute_factor: float | None = None  # the change's factor on the median compute a (rank, step), where not 1
    exposure: Exposure | None = None
    limit: str | None = None
    notes: list[str] = []
    check: Check | None = None


class Beside(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A saved prediction next to a measured variant of ``compare``/``report --prediction``:
    ``error`` = ``step_us / measured_step_us − 1`` (the measured step: the variant's median over
    its (rank, step) pairs, as ``--check`` takes it); ``within`` whether it lies in the
    prediction's ``[low_us, high_us]``."""

    change: str
    traced: list[str]  # the traced run the prediction was made from
    variant: str  # the compared variant's label
    step_us: float
    low_us: float
    high_us: float
    measured_step_us: float
    error: float
    within: bool


class WhatIf(msgspec.Struct, kw_only=True):
    """``overlapprof whatif``'s result (see the module docstring)."""

    version: str
    inputs: list[str]
    traced_step_us: float | None
    replayed_step_us: float | None
    replay_error: float | None
    ranks: list[RankReplay]
    link: str | None = None
    transfer: list[TransferFit] = []
    predictions: list[Prediction] = []
    notes: list[str] = []
    traced_compute_us: float | None = None  # the traced run's median compute a (rank, step), for a later check

    def to_json(self, indent: int = 2) -> str:
        return msgspec.json.format(msgspec.json.encode(self), indent=indent).decode()

    def save(self, path) -> None:
        Path(path).write_text(self.to_json() + "\n")

    @classmethod
    def from_json(cls, text: str | bytes) -> WhatIf:
        return msgspec.json.decode(text, type=cls)

    @classmethod
    def load(cls, path) -> WhatIf:
        return cls.from_json(Path(path).read_bytes())


__all__ = ["Beside", "Check", "Prediction", "RankReplay", "TransferFit", "WhatIf"]
