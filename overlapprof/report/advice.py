"""What to change first and what it buys: the result of ``overlapprof advise`` (:class:`Advice`).

Plain typed data (msgspec Structs, no numpy), computed by :mod:`overlapprof.analysis.advise`
and read by :mod:`overlapprof.renderers.advice_text`; saves to and loads from JSON. Times are µs.

- ``traced_step_us``: the traced run's step, the median over its (rank, step) pairs (as
  ``whatif`` and ``compare`` take it).
- :class:`Item`, ranked: each a change the replay predicts will help. Savings are **joint**: item
  k is replayed with items 1..k applied together (``joint_change``, the whatif change string of
  all of them, joined by commas), so ``step_us`` is the predicted step after the first k changes,
  and ``saving_us`` = the step after the first k − 1 (the unchanged replay for the first) −
  ``step_us``: the saving *on top of* the items above, never counted twice. ``low_us``/``high_us``
  is the replay's interval of ``step_us`` (:mod:`overlapprof.report.whatif`). An
  item is listed only when ``saving_us`` is at least :data:`MIN_SAVING` of the traced step (twice
  that when the slowdown of the overlap it adds is neither measured nor charged: ``confidence``
  says so) and ``saving_low_us`` >= 0: the saving's interval is *paired*, the 2.5th-97.5th
  percentiles of the per-(rank, step) savings (each traced step replayed with and without the
  change), and none of it may reach a slower step.
- :class:`Hint`: a change that cannot be modelled from this trace (or a cause no change here
  removes), named with what to look at, and no number.
- ``verdict``: one line when there is nothing to advise (no communication, nothing exposed,
  nothing predicted to help).
- :class:`Verification` (``--verify``): per tried change set (:class:`TriedSet`), the predicted
  step with its interval, the realized step of a rerun with its interval, the realized speedup
  against the traced configuration's rerun with its bootstrap interval (as ``compare``), and
  whether the realized median lies in the predicted interval. ``note``: for a user's own job
  (not a run of ``overlapprof run``), the exact change to make and the command to check it after.
"""

from __future__ import annotations

import msgspec

from overlapprof.report.codec import decode, load, save, to_json

SCHEMA = "overlapprof.advice/1"
MIN_SAVING = 0.03  # an item must save at least this share of the traced step (the benchmark's "nothing better than 3%")


class Item(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One ranked change (see the module docstring).

    - ``rule``: which rule made it (``bucket_cap_mb``, ``prefetch``, ``async``, ``no_straggler``,
      ``bandwidth``, ...; docs/advise.md).
    - ``change``: its own whatif change string (``bucket_cap_mb=5``); ``joint_change``: this and
      every item above it, as one whatif change (``bucket_cap_mb=5,prefetch=2``).
    - ``action``: the change in the user's terms (``--opt bucket_cap_mb=5``, the DDP argument, the
      line of code to move); ``cause``: what it removes, with its traced µs a step.
    - ``confidence``: what the prediction assumed (the transfer model's source, what is not modelled).
    - ``tried``: every value of the rule's knob that was replayed -> its predicted step (µs) on top
      of the items above (the search the best was kept from).
    """

    rank: int
    rule: str
    change: str
    joint_change: str
    action: str
    cause: str
    step_us: float
    low_us: float
    high_us: float
    saving_us: float
    saving_low_us: float
    saving_high_us: float
    speedup: float | None = None  # traced step / step_us
    confidence: list[str] = []
    tried: dict[str, float] = {}


class Hint(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A change that cannot be modelled from this trace: what to do or look at, why, no number.
    ``change``: its whatif change string when it has one."""

    rule: str
    action: str
    why: str
    change: str | None = None


class Rejected(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A candidate the replay predicts will not help (not listed as advice): its best value's
    predicted step on top of the items above it, and why it was left out."""

    rule: str
    change: str
    step_us: float | None = None
    why: str


class TriedSet(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One set of changes rerun by ``--verify``: the predicted step (µs) with its interval, the
    realized step (median over the rerun's (rank, step) pairs) with its 2.5-97.5th percentiles,
    the realized speedup against the traced configuration's rerun (the set with no change: its
    step / realized step) with its bootstrap interval, and ``within``: the realized median lies in
    the predicted interval. ``run``: the rerun's run directory."""

    changes: list[str]
    predicted_step_us: float | None = None
    predicted_low_us: float | None = None
    predicted_high_us: float | None = None
    realized_step_us: float | None = None
    realized_low_us: float | None = None
    realized_high_us: float | None = None
    speedup: float | None = None
    speedup_low: float | None = None
    speedup_high: float | None = None
    within: bool | None = None
    run: str | None = None
    note: str | None = None  # what went wrong with this rerun, when it did


class Verification(msgspec.Struct, kw_only=True, omit_defaults=True):
    """``--verify``'s result: each tried change set (the top K one at a time, then together),
    and for a user's own job the ``note`` (the exact change to make and the command to check it)."""

    traced_step_us: float | None = None
    sets: list[TriedSet] = []
    note: str = ""


class Advice(msgspec.Struct, kw_only=True):
    """``overlapprof advise``'s result (see the module docstring)."""

    schema: str = SCHEMA
    version: str
    inputs: list[str]
    traced_step_us: float | None = None
    replayed_step_us: float | None = None
    items: list[Item] = []
    hints: list[Hint] = []
    rejected: list[Rejected] = []
    verdict: str | None = None
    workload: str | None = None  # the workload of an `overlapprof run` directory; None: a user's own job
    notes: list[str] = []
    verification: Verification | None = None

    def final_step_us(self) -> float | None:
        """The predicted step with every item applied (the last item's), or the traced step."""
        return self.items[-1].step_us if self.items else self.traced_step_us

    def changes(self) -> list[str]:
        """The items' whatif change strings, in rank order (what ``--verify`` reruns)."""
        return [i.change for i in self.items]

    to_json = to_json
    save = save
    load = classmethod(load)  # Advice.load(path): an advice saved with save (or --json FILE)

    @classmethod
    def from_json(cls, text: str | bytes, source: str = "advice") -> Advice:
        """An Advice from JSON text; ReportError (one line) when it is not one."""
        return decode(cls, text, source, SCHEMA, "advice")


__all__ = ["Advice", "Hint", "Item", "MIN_SAVING", "Rejected", "SCHEMA", "TriedSet", "Verification"]
