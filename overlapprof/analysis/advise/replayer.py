"""The what-if replay, loaded once and asked many times: an adapter over
:mod:`overlapprof.analysis.replay` for the advice's search.

``whatif(paths, changes)`` reads the traces on every call; the search replays tens of change
sets of one run, so :class:`Replayer` reads them once and runs the same steps ``whatif`` runs per
change (:func:`~overlapprof.analysis.replay.changes.rewrite`, the slowdown charge where the replay has
it, then :func:`~overlapprof.analysis.replay.engine.replay`, the link floor, and the prediction
with its interval, all the replay's own functions; ``_load`` and ``_prediction`` are private to
:mod:`~overlapprof.analysis.replay.predict` and used as they are). It also keeps each prediction's per-(rank, step)
values, so that the saving of a change over another is *paired*: the same traced step replayed
both ways (:meth:`Replayer.saving`), and the compute a change moves beside communication on ranks
whose trace cannot measure what that costs (:attr:`Outcome.moved`, for :mod:`.assumed`'s rules).
"""

from __future__ import annotations

import functools
import statistics
from dataclasses import dataclass, field

from overlapprof.analysis.advise import names, onebucket
from overlapprof.analysis.advise.assumed import assumptions
from overlapprof.analysis.replay import predict as _replay
from overlapprof.analysis.replay.buckets import by_parameters
from overlapprof.analysis.replay.changes import Unmodelled, link_floor, parse, rewrite
from overlapprof.analysis.replay.slowdown import beside, slow
from overlapprof.analysis.replay.timeline import traced as traced_of
from overlapprof.analysis.stats import median, percentile
from overlapprof.report.whatif import Prediction

# the standard error of the difference of two runs' median steps (this one's and a rerun's, taken
# as noisy as it) per median absolute deviation and 1/sqrt(steps): sqrt(2) x sqrt(pi/2) x 1.4826
MEDIAN_SE = 2 ** 0.5 * 1.2533 * 1.4826
MOVED = 0.01  # compute moved beside communication, as a share of the rank's work a step, that counts


@dataclass
class Outcome:
    """One change set replayed: the Prediction (as ``whatif`` gives it) and its (rank, step
    index) -> replayed step (µs), floored by the link as the prediction is; ``moved``: per rank
    whose slowdown the trace does not measure (:mod:`.assumed`), the compute (µs, all steps) the
    change puts beside communication beyond the trace's, where that is at least :data:`MOVED` of
    its work."""

    prediction: Prediction
    pairs: dict[tuple[int, int], float]
    moved: dict[int, float] = field(default_factory=dict)


class Replayer:
    """The traced run of ``paths``, read once; :meth:`predict` replays a change set."""

    def __init__(self, paths: list[str], workers: int | None = None, reference_bandwidth: str | None = None,
                 analyzed=None, reading: dict | None = None):
        """``analyzed``: the run's :class:`~overlapprof.analysis.analyzer.Analyzed` when it was
        just analyzed (``overlapprof analyze``): the traces are not read again; ``reading``: more
        options of ``analyze`` (an Nsight Systems export's ``step_range``, ``rank_map``)."""
        options = {"workers": workers} if workers else {}
        if reference_bandwidth is not None:
            options["reference_bandwidth"] = reference_bandwidth
        options.update(reading or {})
        if analyzed is not None and any(r.steps for r in analyzed.report.ranks):
            self.analyzed = analyzed
            self.tr = traced_of({r.rank: r for r in analyzed.report.ranks}, analyzed.inputs, analyzed.matching)
        else:
            self.analyzed, self.tr = _replay._load(list(paths), **options)
        self.report = self.analyzed.report
        prepared = _replay.prepare(self.report, self.tr, self.analyzed.op_shapes,  # as whatif does: the same numbers
                                   self.analyzed.matching.shift if self.analyzed.matching is not None else None)
        self.model, self.ctx, self.longer, self.sharing = prepared.model, prepared.ctx, prepared.longer, prepared.sharing
        self.interference_notes = prepared.interference_notes
        traced = [v for lane in self.tr.lanes.values() for v in lane.measured_steps]
        self.traced_step_us = median(traced) if traced else None
        # the traced steps' own spread: their median absolute deviation from the median step
        self.spread_us = median([abs(v - self.traced_step_us) for v in traced]) if traced else 0.0
        self.factors, self.crowded = prepared.factors, prepared.crowded
        self.assumptions = assumptions(self.report, self.crowded)
        self._beside: dict[int, float] | None = None  # rank -> the trace's compute beside communication (µs)
        self._cache: dict[str, Outcome] = {}
        self._split = None  # DDP's single bucket split for the bucket_cap_mb rewrite (onebucket), once asked
        self.base = self.predict("")

    def one_bucket(self):
        """(Traced, Context) with DDP's single buckets split (:mod:`.onebucket`), or None where the
        trace has not one all_reduce a step or backward's start is not in it."""
        if self._split is None:
            self._split = False
            # where the trace says when each gradient was accumulated, the rewrite places the new
            # buckets by it: no split needed
            if onebucket.single(self.tr) and not self._by_gradients:
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

    @functools.cached_property
    def _by_gradients(self) -> bool:
        """Whether the trace's gradients (their shapes and times) place every step's new buckets."""
        return by_parameters(self.tr, self.ctx.gradients())

    def one_bucket_placed(self) -> str | None:
        """How the replay places smaller buckets where the trace has one a step (what advise
        assumes, in words), or None where it cannot: by when each gradient was accumulated
        (the trace's shapes and times), else by the split of :meth:`one_bucket`."""
        if self._by_gradients:
            return ("one traced bucket: each smaller one issued where its last gradient was accumulated "
                    "(the trace's AccumulateGrad)")
        if self.one_bucket() is not None:
            return ("one traced bucket: gradients taken as produced evenly over backward, from its first autograd "
                    "function to the bucket's issue (advise's adapter: `whatif --set` of this change does not split "
                    "the bucket, and predicts otherwise)")
        return None

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
            moved = self._moved(new.traced) if change else {}
            if change:
                # as whatif does, so the numbers agree
                new.notes += slow(self.tr, new.traced, self.factors, self.crowded, new.compute_factor)
                new.notes += self.longer(new.traced, parse(change), new.link_bytes_per_us)
            replayed, shared = self.sharing(new.traced)  # nothing changed: the traced shares, no note
            new.notes += shared
            floor = link_floor(new.traced, new.link_bytes_per_us) if new.link_bytes_per_us else None
            p = _replay._prediction(change, replayed, new.traced, floor, self.traced_step_us, new.notes)
            pairs = {}
            for r, rs in replayed.ranks.items():
                for k, (number, us) in enumerate(zip(new.traced.lanes[r].steps, rs.step_us)):
                    pairs[(r, k)] = max(us, floor.get(number, 0.0) if floor else 0.0)
            out = Outcome(p, pairs, moved)
        self._cache[change] = out
        return out

    def _moved(self, new) -> dict[int, float]:
        """Per rank with an assumption (:mod:`.assumed`) on which ``new`` (a rewritten Traced)
        puts more compute beside communication than the trace has, by at least :data:`MOVED` of
        the rank's work: how much more (µs, all steps)."""
        if self._beside is None:  # the trace's own, once
            self._beside = {r: sum(beside(self.tr, self.tr.lanes[r])) for r in self.assumptions if r in self.tr.lanes}
        out = {}
        for r, traced in self._beside.items():
            lane = new.lanes.get(r)
            if lane is None:
                continue
            more = sum(beside(new, lane)) - traced
            if more > MOVED * sum(self.tr.lanes[r].work) and more > 0:
                out[r] = more
        return out

    def unmeasured(self, before: Outcome, after: Outcome) -> list[int]:
        """The ranks with an assumption (:mod:`.assumed`) on which ``after`` puts more compute
        beside communication than ``before``, by at least :data:`MOVED` of the rank's work: its
        saving over ``before`` rests on an interference this trace does not measure."""
        return [r for r, more in after.moved.items()
                if more - before.moved.get(r, 0.0) > MOVED * sum(self.tr.lanes[r].work)]

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

    def noise(self, o: Outcome) -> tuple[float, float, bool]:
        """(standard error, spread, drift) of a saving from ``o``'s median step (µs): the spread the
        median absolute deviation of its (rank, step) steps each from its rank's median (a rank the
        change leaves longer than the others every step is not noise), the error the difference of
        two medians of that spread would have (``MEDIAN_SE`` times it over the square root of the
        steps of one rank: its ranks run in lock-step, so their steps are not more samples), or
        the error :func:`batch_error` reads from how the steps drift, when larger (``drift``
        True). The traced steps for the run unchanged; after a change, the replayed ones: a
        straggler's jitter goes with the straggler."""
        by: dict[int, list[float]] = {}
        for (rank, _), v in sorted(o.pairs.items()):
            by.setdefault(rank, []).append(v)
        if not by:
            return self.spread_us, self.spread_us, False
        spread = median([abs(v - median(vs)) for vs in by.values() for v in vs])
        per_rank = len(o.pairs) / len(by)
        independent, drift = MEDIAN_SE * spread / max(per_rank, 1.0) ** 0.5, batch_error(list(by.values()))
        return max(independent, drift), spread, drift > independent


def batch_error(ranks: list[list[float]]) -> float:
    """The standard error of the difference of two runs' median steps, read from how one run's
    steps drift (batch means): each rank's steps, in order, cut into ``floor(sqrt(n))``
    consecutive batches (n the fewest steps a rank has), the median of each batch over all the
    ranks, and sqrt(2) x their standard deviation over sqrt(batches). Steps that come in runs of
    slow and fast ones (another process's load arriving, the machine changing mode) make the
    median of a whole run move by more than their spread over the square root of their number
    says (that takes them as independent); the batches' medians show how much. 0 with fewer
    than 2 batches."""
    n = min(len(vs) for vs in ranks) if ranks else 0
    batches = int(n ** 0.5)
    if batches < 2:
        return 0.0
    medians = [median([v for vs in ranks for v in vs[j * n // batches:(j + 1) * n // batches]])
               for j in range(batches)]
    return 2 ** 0.5 * statistics.stdev(medians) / batches ** 0.5
