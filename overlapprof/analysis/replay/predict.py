"""``whatif(paths, changes) -> WhatIf``: the traced run replayed unchanged and per change, and the
predictions checked against a run that made the change.

The step of a run is the median over its (rank, step) pairs (as ``compare`` takes it); a
prediction's interval is the 2.5th-97.5th percentile of its replayed (rank, step) values (the
traced steps' spread carried through the change), at least the traced steps' own 2.5th-97.5th
percentiles relative to their median, times the prediction; with a ``--link-rate`` link each replayed
step is at least its bytes' time on the link. What limits the step after a change is the
largest share of the replayed step: compute, the rest of the host's work (``other``), a late
rank, the exposed transfers, or the link's bytes when its floor sets the step.
"""

from __future__ import annotations

from dataclasses import dataclass

from overlapprof import __version__
from overlapprof.analysis.analyzer import analyze_with_inputs
from overlapprof.analysis.exposure import resources
from overlapprof.analysis.exposure.late import extra_work, late_steps, not_steady
from overlapprof.analysis.replay.changes import Context, Unmodelled, factor, link_floor, parse, rewrite
from overlapprof.analysis.replay.copying import loopback_latency
from overlapprof.analysis.replay.cores import loopback, measured, shares
from overlapprof.analysis.replay.engine import Replayed, replay
from overlapprof.analysis.replay.sharing import CoreSharing
from overlapprof.analysis.replay.slowdown import rank_factors, slow
from overlapprof.analysis.replay.stretch import Stretcher
from overlapprof.analysis.replay.timeline import Traced, traced
from overlapprof.analysis.replay.transfer import fit, interference
from overlapprof.analysis.stats import median, percentile
from overlapprof.errors import InputError
from overlapprof.report import Exposure, Report
from overlapprof.report.whatif import Beside, Check, Prediction, RankReplay, WhatIf
from overlapprof.rundir.run_record import describe_link
from overlapprof.trace.nsys import is_sqlite

CAUSES = ("late_peer", "queued", "no_window", "window_short")


def _pairs(out: Replayed, tr: Traced, floor: dict[int, float] | None) -> list[tuple[int, float, bool]]:
    """(rank, replayed step, set by the link floor) of every (rank, step)."""
    pairs = []
    for r, rs in out.ranks.items():
        for number, us in zip(tr.lanes[r].steps, rs.step_us):
            at = floor.get(number, 0.0) if floor else 0.0
            pairs.append((r, max(us, at), at > us))
    return pairs


def _limit(out: Replayed, pairs, exposure: Exposure, compute: float, other: float) -> str:
    step = median([p[1] for p in pairs])
    if sum(p[2] for p in pairs) * 2 > len(pairs):
        return "the shared link: its bytes at its rate set the step"
    transfers = exposure.queued_us + exposure.no_window_us + exposure.window_short_us
    shares = {"compute": compute, "other": other, "late": exposure.late_peer_us, "transfers": transfers}
    top = max(shares, key=shares.get)
    pct = f"{100 * shares[top] / step:.0f}% of the step" if step > 0 else ""
    if top == "compute":
        return f"compute ({pct})"
    if top == "other":
        return f"host work that is neither compute nor communication ({pct})"
    if top == "late":
        who = max(exposure.late_peer_by_rank, key=exposure.late_peer_by_rank.get) if exposure.late_peer_by_rank else "?"
        return f"a late rank: waiting for rank {who} ({pct})"
    return f"communication: exposed transfers ({pct})"


def _interval(values: list[float], step: float, traced: list[float]) -> tuple[float, float]:
    """The replayed steps' 2.5th-97.5th percentiles, widened to the traced steps' own spread
    around their median, scaled to the prediction (a link floor can make every replayed step
    equal; the run will still vary as the traced one did)."""
    low, high = percentile(values, 2.5), percentile(values, 97.5)
    mid = median(traced) if traced else 0.0
    if mid > 0:
        low = min(low, step * percentile(traced, 2.5) / mid)
        high = max(high, step * percentile(traced, 97.5) / mid)
    return low, high


def _prediction(change: str, out: Replayed, tr: Traced, floor, traced_step: float | None, notes) -> Prediction:
    pairs = _pairs(out, tr, floor)
    if not pairs:
        return Prediction(change=change, modelled=False, reason=f"{change}: the trace has no ProfilerStep to replay")
    values = [p[1] for p in pairs]
    count = len(pairs)
    sums = {name: sum(sum(rs.parts[name]) for rs in out.ranks.values()) / count for name in ("compute", "other", *CAUSES)}
    late_by: dict[int, float] = {}
    for rs in out.ranks.values():
        for d in rs.late_by_rank:
            for who, us in d.items():
                late_by[who] = late_by.get(who, 0.0) + us / count
    sums = {k: float(v) for k, v in sums.items()}
    exposure = Exposure(late_peer_us=sums["late_peer"], queued_us=sums["queued"], no_window_us=sums["no_window"],
                        window_short_us=sums["window_short"],
                        late_peer_by_rank={int(k): float(v) for k, v in sorted(late_by.items())})
    step = median(values)
    traced = [v for lane in tr.lanes.values() for v in lane.measured_steps]
    low, high = _interval(values, step, traced)
    notes = notes + _unresolved(change, step, traced_step, traced)
    return Prediction(
        change=change, step_us=float(step), low_us=low, high_us=high,
        speedup=traced_step / step if traced_step and step > 0 else None,
        ranks={int(r): median(rs.step_us) for r, rs in out.ranks.items()}, compute_us=sums["compute"],
        other_us=sums["other"], exposure=exposure, limit=_limit(out, pairs, exposure, sums["compute"], sums["other"]),
        notes=notes + out.notes)


def _unresolved(change: str, step: float, traced_step: float | None, traced: list[float]) -> list[str]:
    """A note where the predicted step lies inside the traced steps' own 2.5th-97.5th
    percentiles: the change moves the step by less than one run's steps vary, so which way a
    run of it goes is not settled by this trace (the number is still the replay's)."""
    if not traced_step or len(traced) < 2 or abs(step / traced_step - 1) < 1e-9:
        return []
    low, high = percentile(traced, 2.5), percentile(traced, 97.5)
    if not low <= step <= high:
        return []
    return [f"{change}: the predicted change, {100 * (step / traced_step - 1):+.1f}%, is within the traced steps' own "
            f"spread ({100 * (low / traced_step - 1):+.1f}% to {100 * (high / traced_step - 1):+.1f}% of their median, "
            f"{len(traced)} (rank, step) pairs): whether a run of it is faster or slower is not settled by this trace"]


def _load(paths, **options):
    from pathlib import Path

    from overlapprof.trace.discover import is_saved_comparison, is_saved_report

    for p in map(Path, paths):
        if p.is_file() and (is_saved_report(p) or is_saved_comparison(p)):
            raise InputError(f"{p}: a saved report or comparison holds no operations to replay: give the run "
                             "directory or the traces it was made from")
    analyzed = analyze_with_inputs(paths, **options)
    reports = {r.rank: r for r in analyzed.report.ranks}
    if not any(r.steps for r in reports.values()):
        export = any(is_sqlite(f) for r in reports.values() for f in r.files)
        raise InputError(f"{paths[0]}: no ProfilerStep in the traces: the replay predicts steps, and there is none"
                         + (" (an Nsight Systems export: --step-range NAME names the NVTX range that marks a step)"
                            if export and "step_range" not in options else ""))
    return analyzed, traced(reports, analyzed.inputs, analyzed.matching)


def _by_turns(report: Report, tr: Traced, pairs, traced_step: float | None, traced: list[float]) -> list[str]:
    """A note for each ``no_straggler=R`` whose rank is not late step after step
    (:func:`~overlapprof.analysis.exposure.late.not_steady`, ``traced`` the traced steps whose
    spread it is judged against, ``tr`` their lanes, whose work per step it compares): the
    prediction then removes noise, not a straggler."""
    asked = [int(value) for name, value in pairs if name == "no_straggler"]
    if not asked or not traced_step:
        return []
    mean, nets = late_steps(report.ranks)
    spread = median([abs(v - traced_step) for v in traced]) if traced else 0.0
    extra = extra_work({r: dict(zip(lane.steps, lane.step_work())) for r, lane in tr.lanes.items()})
    out = []
    for rank in asked:
        why = not_steady(nets.get(rank, []), traced_step, spread, extra.get(rank))
        if why is not None:
            out.append(f"no_straggler={rank}: rank {rank} is not late step after step (the others wait "
                       f"{mean.get(rank, 0.0) / 1000:.3f} ms a step for it on average, {why}): ranks late by "
                       "turns, as a loaded host makes them; this predicts the run without that noise, not "
                       "without a straggler")
    return out


def run_steps(report: Report) -> list[float]:
    """Every (rank, step)'s step_us of a report."""
    return [s.step_us for r in report.ranks for s in r.steps]


@dataclass
class Prepared:
    """What every change of one trace is replayed with (``whatif`` and advise's replayer alike,
    so that their numbers agree): the transfer model, the rewrites' context, the stretch, the
    measured slowdown factors and the crowded cores' shares; ``latency_notes``: what the loopback
    latency said, ``interference_notes``: what the interference fit said."""

    model: object
    ctx: Context
    longer: Stretcher
    factors: dict
    crowded: dict
    latency_notes: list
    interference_notes: list
    sharing: CoreSharing


def prepare(report: Report, tr: Traced, op_shapes: dict | None = None, shift: dict | None = None) -> Prepared:
    """``op_shapes``: the analysis's :attr:`~overlapprof.analysis.analyzer.Analyzed.op_shapes`
    (what ``micro_batches`` reads of the ops; none: the compute kept); ``shift``: rank -> µs from
    its trace's clock to the common one (the matching's; what ``bucket_cap_mb`` places the
    gradients read from the files by)."""
    res, _, sharing = resources(report.run, None)
    ref = report.options.reference_bandwidth
    model = fit(tr, ref / 1e6 if ref else None, res.link_bytes_per_us, sharing)
    over_loopback = loopback(report)
    latency = loopback_latency(tr, model) if over_loopback else []
    cost, words = interference(tr, any(r.mode == "cpu" for r in report.ranks))
    return Prepared(model, Context(model, res.link_bytes_per_us, cost, op_shapes=dict(op_shapes or {}),
                                       files={r.rank: list(r.files) for r in report.ranks}, shift=dict(shift or {}),
                                       per_operation=over_loopback),
                    Stretcher(tr, cost, res.link_bytes_per_us), rank_factors(report), shares(report, tr, model),
                    latency, words, CoreSharing(tr, res.hosts))


def whatif(paths, changes: list[str], reference_bandwidth: str | None = None, check: str | None = None,
           workers: int | None = None, reading: dict | None = None) -> WhatIf:
    """Replay the traced run of ``paths`` unchanged and with each of ``changes`` (``name=value``,
    several joined by commas); ``check``: a run that made the (one) change, to compare with;
    ``reading``: more options of ``analyze`` (an Nsight Systems export's ``step_range``,
    ``rank_map``), the checked run read with them too."""
    parsed = [parse(c) for c in changes]
    if check is not None and len(changes) != 1:
        raise InputError("--check compares one change with the run that made it: give exactly one --set")
    options = {"workers": workers} if workers else {}
    if reference_bandwidth is not None:
        options["reference_bandwidth"] = reference_bandwidth
    options.update(reading or {})
    if any(name == "micro_batches" for pairs in parsed for name, _ in pairs):
        options["op_shapes"] = True  # the ops' shapes, from the one read (replay/percall.py)
    analyzed, tr = _load(list(paths), **options)
    report = analyzed.report
    prepared = prepare(report, tr, analyzed.op_shapes, analyzed.matching.shift if analyzed.matching is not None else None)
    model = prepared.model
    model.notes += prepared.latency_notes
    base = replay(tr)
    traced_values = [v for r in tr.lanes.values() for v in r.measured_steps]
    traced_step = median(traced_values) if traced_values else None
    replayed = [v for rs in base.ranks.values() for v in rs.step_us]
    ranks = [RankReplay(rank=r, traced_step_us=median(tr.lanes[r].measured_steps),
                        replayed_step_us=median(rs.step_us),
                        error=median(rs.step_us) / median(tr.lanes[r].measured_steps) - 1)
             for r, rs in base.ranks.items()]
    result = WhatIf(version=__version__, inputs=[str(p) for p in paths], traced_step_us=traced_step,
                    replayed_step_us=median(replayed) if replayed else None,
                    replay_error=median(replayed) / traced_step - 1 if replayed and traced_step else None,
                    ranks=ranks, link=describe_link((report.run or {}).get("link")), transfer=model.fits,
                    notes=model.notes + base.notes)
    if prepared.sharing.hosts:
        hosts = "; ".join(f"{len(ranks)} ranks on {cores} cores" for cores, ranks in prepared.sharing.hosts)
        result.notes.append(f"ranks share host cores: {hosts}: a change that makes more of them compute at once "
                            "divides the cores between them, each rank's compute taking the core-time it took in "
                            "the trace at the share it then gets")
    elif any(r.mode == "cpu" for r in report.ranks) and len(report.ranks) > 1:
        result.notes.append("ranks share host cores: the replay keeps each rank's traced compute times, so a change "
                            "that moves compute beside other ranks' compute is not slowed for it")
    result.notes += prepared.interference_notes
    ctx, longer, factors, crowded = prepared.ctx, prepared.longer, prepared.factors, prepared.crowded
    before = _lane_compute(tr)
    for text, pairs in zip(changes, parsed):
        try:
            _hand_overs_beside_compute(report, pairs, crowded)
            new = rewrite(tr, pairs, ctx)
        except Unmodelled as exc:
            result.predictions.append(Prediction(change=text, modelled=False, reason=str(exc)))
            continue
        moved = _lane_compute(new.traced) / before \
            if before > 0 and any(n in ("no_straggler", "micro_batches") for n, _ in pairs) else None
        new.notes += slow(tr, new.traced, factors, crowded, new.compute_factor)
        new.notes += longer(new.traced, pairs, new.link_bytes_per_us)
        out, shared = prepared.sharing(new.traced)
        new.notes += shared
        if shared and before > 0:  # the compute it predicts, as a run of it would measure it
            moved = _lane_compute(new.traced) / before
        floor = link_floor(new.traced, new.link_bytes_per_us) if new.link_bytes_per_us else None
        result.predictions.append(_prediction(text, out, new.traced, floor, traced_step, new.notes))
        if moved is not None:
            result.predictions[-1].compute_factor = moved  # the lanes carry a compute=xF of the same change too
        result.predictions[-1].notes += _by_turns(report, tr, pairs, traced_step, traced_values)
    result.traced_compute_us = _compute(report)
    if check is not None and result.predictions and result.predictions[0].modelled:
        check_saved(result, check, workers, reading)
    return result


def _hand_overs_beside_compute(report: Report, pairs, crowded) -> None:
    """Unmodelled: ``async=send_recv`` over loopback where every rank's node has fewer cores than
    its ranks and their backend threads and no rank's trace has compute beside communication.
    Made asynchronous, a hand-over completes only when the backend threads of both its ranks get
    a core that a rank's compute now holds, and the peer's next compute waits for it; the sync
    trace measured each hand-over with its rank's core free (its lane blocked in the call), so
    it says nothing of that wait (the saved grid's pipeline: 102 µs blocking, 1178 µs made async,
    medians)."""
    if not any(n == "async" and v.split("@")[0] == "send_recv" for n, v in pairs) or not loopback(report):
        return
    ranks = {r.rank for r in report.ranks}
    if not ranks or not ranks <= set(crowded) or ranks & measured(report):
        return
    c = crowded[min(ranks)]
    raise Unmodelled(f"async=send_recv: over loopback {c.ranks} ranks and their backend threads ({2 * c.ranks}) "
                     f"share {c.cores} cores and the trace has no compute beside communication: how long a "
                     "hand-over takes once compute holds the core its backend thread needs is not measured")


def _lane_compute(tr) -> float:
    """The median over the lanes' (rank, step) pairs of the compute in the step (µs): what a
    removed straggler's extra compute changes (the others' steps keep theirs)."""
    values = [c for lane in tr.lanes.values() for c in lane.per_step(lane.compute)]
    return median(values) if values else 0.0




def _compute_factor(change: str) -> float:
    f = 1.0
    for name, value in parse(change):
        if name == "compute":
            f *= factor(name, value)
    return f


def check_saved(result: WhatIf, path: str, workers: int | None = None, reading: dict | None = None) -> Check:
    """The first prediction of ``result`` (a WhatIf, made now or loaded) against the run at
    ``path``, as ``--check`` makes it (``reading``: more options of ``analyze``, such as an
    export's ``step_range``); set on the prediction and returned. InputError when it has no
    modelled prediction."""
    p = result.predictions[0] if result.predictions else None
    if p is None or not p.modelled:
        raise InputError(f"no prediction to check against {path}: " + (p.reason if p is not None else "none was made"))
    compute = result.traced_compute_us
    f = p.compute_factor if p.compute_factor is not None else _compute_factor(p.change)
    p.check = checked(p, path, compute * f if compute else None, workers, reading)
    return p.check


def load_prediction(path) -> WhatIf:
    """A prediction saved by ``overlapprof whatif --json FILE``; InputError (one line) otherwise."""
    import msgspec

    try:
        return WhatIf.load(path)
    except OSError as exc:
        raise InputError(f"--prediction {path}: cannot read it ({exc.strerror or exc})") from None
    except (msgspec.DecodeError, msgspec.ValidationError):
        raise InputError(f"--prediction {path}: not a prediction saved by `overlapprof whatif --json FILE`") from None


def beside(result: WhatIf, variants) -> list[Beside]:
    """Each modelled prediction of ``result`` next to each of ``variants`` (a comparison's
    VariantStats with a step) that is not the traced run itself (see :class:`Beside`)."""
    from pathlib import Path

    traced = {Path(p).resolve() for p in result.inputs}
    out = []
    for v in variants:
        if v.step_us is None or v.step_us <= 0 or {Path(p).resolve() for p in v.inputs} & traced:
            continue
        for p in result.predictions:
            if p.modelled:
                out.append(Beside(change=p.change, traced=list(result.inputs), variant=v.label, step_us=p.step_us,
                                  low_us=p.low_us, high_us=p.high_us, measured_step_us=v.step_us,
                                  error=p.step_us / v.step_us - 1, within=p.low_us <= v.step_us <= p.high_us))
    return out


def _compute(report: Report) -> float | None:
    values = [s.compute_us for r in report.ranks for s in r.steps]
    return median(values) if values else None


def checked(p: Prediction, path: str, traced_compute: float | None = None, workers: int | None = None,
            reading: dict | None = None) -> Check:
    """The prediction ``p`` against the run at ``path``; ``traced_compute``: the traced run's
    median compute a step, times the change's compute factor; ``reading``: more options of ``analyze``."""
    from overlapprof.analysis.analyzer import analyze

    options = {**(reading or {}), **({"workers": workers} if workers else {})}
    report = analyze([path], comms=False, **options)
    measured = run_steps(report)
    if not measured:
        raise InputError(f"{path}: no ProfilerStep in the traces to check the prediction against")
    m = median(measured)
    compute = _compute(report)
    return Check(run=str(path), measured_step_us=m, measured_low_us=percentile(measured, 2.5),
                 measured_high_us=percentile(measured, 97.5), error=p.step_us / m - 1,
                 within=p.low_us <= m <= p.high_us,
                 compute_ratio=compute / traced_compute if compute and traced_compute else None)
