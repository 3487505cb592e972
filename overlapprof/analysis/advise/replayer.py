"""The what-if replay, loaded once and asked many times: an adapter over
:mod:`overlapprof.analysis.replay` for the advice's search.

``whatif(paths, changes)`` reads the traces on every call; the search replays tens of change
sets of one run, so :class:`Replayer` reads them once and runs the same steps ``whatif`` runs per
change (:func:`~overlapprof.analysis.replay.changes.rewrite`, the slowdown charge where the replay has
it, then :func:`~overlapprof.analysis.replay.engine.replay`, the link floor, and the prediction
with its interval, all the replay's own functions; ``_load`` and ``_prediction`` are private to
:mod:`~overlapprof.analysis.replay.predict` and used as they are). It also keeps each prediction's per-(rank, step)
values, so that the saving of a change over another is *paired*: the same traced step replayed
both ways (:meth:`Replayer.saving`).
"""

from __future__ import annotations

from dataclasses import dataclass

from overlapprof.analysis.advise import names, onebucket
from overlapprof.analysis.exposure import resources
from overlapprof.analysis.replay import predict as _replay
from overlapprof.analysis.replay.changes import Context, Unmodelled, link_floor, parse, rewrite
from overlapprof.analysis.replay.engine import replay
from overlapprof.analysis.replay.timeline import traced as traced_of
from overlapprof.analysis.replay.transfer import fit, interference
from overlapprof.analysis.stats import median, percentile
from overlapprof.report.whatif import Prediction

try:  # the replay's charge for compute slowed beside communication, where the replay has it (whatif2)
    from overlapprof.analysis.replay.slowdown import rank_factors, slow
except ImportError:  # pragma: no cover - before it is merged
    rank_factors = slow = None


@dataclass
class Outcome:
    """One change set replayed: the Prediction (as ``whatif`` gives it) and its (rank, step
    index) -> replayed step (µs), floored by the link as the prediction is."""

    prediction: Prediction
    pairs: dict[tuple[int, int], float]


class Replayer:
    """The traced run of ``paths``, read once; :meth:`predict` replays a change set."""

    def __init__(self, paths: list[str], workers: int | None = None, reference_bandwidth: str | None = None,
                 analyzed=None):
        """``analyzed``: the run's :class:`~overlapprof.analysis.analyzer.Analyzed` when it was
        just analyzed (``overlapprof analyze``): the traces are not read again."""
        options = {"workers": workers} if workers else {}
        if reference_bandwidth is not None:
            options["reference_bandwidth"] = reference_bandwidth
        if analyzed is not None and any(r.steps for r in analyzed.report.ranks):
            self.analyzed = analyzed
            self.tr = traced_of({r.rank: r for r in analyzed.report.ranks}, analyzed.inputs, analyzed.matching)
        else:
            self.analyzed, self.tr = _replay._load(list(paths), **options)
        self.report = self.analyzed.report
        res, _, sharing = resources(self.report.run, None)
        ref = self.report.options.reference_bandwidth
        self.model = fit(self.tr, ref / 1e6 if ref else None, res.link_bytes_per_us, sharing)
        cpu = any(r.mode == "cpu" for r in self.report.ranks)
        cost, self.interference_notes = interference(self.tr, cpu)
        self.ctx = Context(self.model, res.link_bytes_per_us, cost)
        traced = [v for lane in self.tr.lanes.values() for v in lane.measured_steps]
        self.traced_step_us = median(traced) if traced else None
        self.factors = rank_factors(self.report) if rank_factors is not None else {}
        self._cache: dict[str, Outcome] = {}
        self._split = None  # DDP's single bucket split for the bucket_cap_mb rewrite (onebucket), once asked
        self.base = self.predict("")

    def one_bucket(self):
        """(Traced, Context) with DDP's single buckets split (:mod:`.onebucket`), or None where the
        trace has not one all_reduce a step or backward's start is not in it."""
        if self._split is None:
            self._split = False
            if onebucket.single(self.tr):
                shift = self.analyzed.matching.shift if self.analyzed.matching is not None else {}
                backward = {}
                for r in self.report.ranks:
                    if r.rank not in self.tr.lanes:
                        continue
                    evs, sh = names.events(r.files), float(shift.get(r.rank, 0.0))
                    at = [names.first_named(evs, onebucket.BACKWARD, s.start_us, s.start_us + s.step_us)
                          for s in r.steps]
                    backward[r.rank] = [a + sh if a is not None else -1.0 for a in at]
                self._split = onebucket.split(self.tr, self.ctx, backward) or False
        return self._split or None

    def predict(self, change: str) -> Outcome:
        """``change`` (whatif's ``name=value[,name=value]``; "" for nothing changed) replayed;
        InputError on a malformed change, an Outcome with ``modelled`` False when the trace
        cannot model it."""
        if change in self._cache:
            return self._cache[change]
        tr, ctx = self.tr, self.ctx
        if "bucket_cap_mb" in change and (one := self.one_bucket()) is not None:
            tr, ctx = one
        try:
            new = rewrite(tr, parse(change) if change else [], ctx)
        except Unmodelled as exc:
            out = Outcome(Prediction(change=change, modelled=False, reason=str(exc)), {})
        except (ValueError, IndexError, KeyError, StopIteration) as exc:  # the rewrites' own failures
            out = Outcome(Prediction(change=change, modelled=False,
                                     reason=f"{change}: the replay's rewrite failed on this trace ({type(exc).__name__}: "
                                            f"{str(exc).splitlines()[0] if str(exc) else 'no message'})"), {})
        else:
            if slow is not None and change:
                new.notes += slow(self.tr, new.traced, self.factors)  # as whatif does, so the numbers agree
            replayed = replay(new.traced)
            floor = link_floor(new.traced, new.link_bytes_per_us) if new.link_bytes_per_us else None
            p = _replay._prediction(change, replayed, new.traced, floor, self.traced_step_us, new.notes)
            pairs = {}
            for r, rs in replayed.ranks.items():
                for k, (number, us) in enumerate(zip(new.traced.lanes[r].steps, rs.step_us)):
                    pairs[(r, k)] = max(us, floor.get(number, 0.0) if floor else 0.0)
            out = Outcome(p, pairs)
        self._cache[change] = out
        return out

    def saving(self, before: Outcome, after: Outcome) -> tuple[float, float, float]:
        """The saving of ``after`` over ``before`` (µs): the difference of their medians, and the
        2.5th-97.5th percentiles of the paired per-(rank, step) savings (the same traced step
        replayed both ways)."""
        keys = [k for k in before.pairs if k in after.pairs]
        diffs = [before.pairs[k] - after.pairs[k] for k in keys]
        mid = before.prediction.step_us - after.prediction.step_us
        if not diffs:
            return mid, mid, mid
        return mid, percentile(diffs, 2.5), percentile(diffs, 97.5)
