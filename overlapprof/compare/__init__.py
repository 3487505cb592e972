"""Comparing variants: what overlap buys (or costs) against a baseline run.

``compare(reports) -> Comparison`` takes Reports (one per variant; the first is the baseline) and
computes, per variant, the numbers that :mod:`overlapprof.report.comparison` defines (each with its
formula). ``overlapprof.compare.inputs.load_reports(paths)`` turns command-line inputs
(run directories, trace sets, saved reports or a saved comparison) into those Reports. A Comparison
saves to and loads from JSON, like a Report, and carries its Reports so that it is re-rendered
(table, CSV, HTML) without re-reading traces. No torch here.

**Basis.** When every variant's traces have ProfilerSteps, the values are *per-step*: each is
the median over the pooled (rank, step) pairs of that variant (``basis = "per-step median"``).
Otherwise every variant falls back to *whole-trace* values: the median over ranks of each
rank's totals (``basis = "whole trace"``), and step times, bound and speedup are None.

**Spread.** Every factor below (and the speedups of the bounds) has a ``*_ci`` = ``[low, high]``: the
central ``CI_LEVEL`` (95%) bootstrap interval of the factor, recomputed ``BOOTSTRAP`` (2000)
times on (rank, step) samples (host step times for ``host_speedup``) drawn with replacement,
each variant independently, with a fixed seed (``SEED``) so a comparison is repeatable. A
warning says when a speedup's or slowdown's interval includes 1x (not distinguishable from no
change), and when the profiled and unprofiled speedups' intervals do not overlap.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from overlapprof.analysis.stats import median, percentile
from overlapprof.errors import InputError
from overlapprof.report import CAUSES, FIRST_ORDER, Exposure, Report
from overlapprof.report.comparison import BOOTSTRAP, CI_LEVEL, PER_STEP, SEED, WHOLE_TRACE, Comparison, VariantStats
from overlapprof.rundir.run_record import (RunRecord, busiest, describe_link, described, explains, load_factor,
                                          run_from_builtins)

def _percentile(values, q: float) -> float | None:
    return percentile(values, q) if len(values) else None


def _median(values) -> float | None:
    return median(values) if len(values) else None


def _ratio(num: float | None, den: float | None) -> float | None:
    return None if num is None or not den else num / den


def _run(report: Report) -> RunRecord | None:
    """The report's run.json, typed; None when it has none (traces from elsewhere)."""
    return run_from_builtins(report.run)


def _host_step_times_us(report: Report, kind: str) -> list[float]:
    """Host-measured step times of ``kind`` (``profiled``/``unprofiled``) of every rank, µs."""
    run = _run(report)
    return [1000.0 * t for info in (run.ranks.values() if run else ())
            for t in info.step_times_ms.get(kind, ())]


def link_of(report: Report) -> str | None:
    """What the ranks talked over, from run.json: the ``--link-rate`` link (one medium shared by
    all ranks), "loopback (not paced)" for a single-node CPU run without one, else None."""
    run = _run(report)
    if run is None:
        return None
    if run.link is not None:
        return describe_link(run.link, run.world_size)
    if run.device == "cpu" and run.nnodes == 1:
        return "loopback (not paced)"
    return None


def label_of(report: Report) -> str:
    """A variant's name: run.json's ``variant``, else the name of its (first) input."""
    run = _run(report)
    if run is not None and run.variant:
        return run.variant
    first = Path(report.inputs[0]) if report.inputs else None
    return first.name.split(".")[0] if first else "run"


def _unique_labels(reports: list[Report], labels) -> list[str]:
    labels = list(labels) if labels else [label_of(r) for r in reports]
    if len(labels) != len(reports):
        raise InputError(f"{len(labels)} labels for {len(reports)} reports")
    if len(set(labels)) == len(labels):
        return labels
    # Same variant twice (e.g. two async runs): the run directory names tell them apart.
    names = [(_run(r).name if _run(r) else None) or (Path(r.inputs[0]).name if r.inputs else None)
             for r in reports]
    out = [f"{lab} ({name})" if name and labels.count(lab) > 1 else lab for lab, name in zip(labels, names)]
    return out if len(set(out)) == len(out) else [f"{lab} #{k + 1}" for k, lab in enumerate(labels)]


def _sample_rows(report: Report, per_step: bool) -> list:
    """What a variant's medians are taken over: every (rank, step)'s StepMetrics, or each rank's Metrics."""
    return [s for r in report.ranks for s in r.steps] if per_step else [r.metrics for r in report.ranks]


def _overlap_bounds(report: Report) -> list[float] | None:
    """Every (rank, step)'s overlap bound, or None when a step has none."""
    values = [s.overlap_bound_us for r in report.ranks for s in r.steps]
    return None if not values or any(v is None for v in values) else values


def _samples(report: Report, per_step: bool) -> dict[str, np.ndarray]:
    """The per-sample values the factors' medians come from (µs): step, comm-free and overlap
    bounds, compute, host."""
    rows = _sample_rows(report, per_step)
    out = {"compute": np.array([s.compute_us for s in rows], dtype=float),
           "host": np.array(_host_step_times_us(report, "unprofiled"), dtype=float)}
    if per_step:
        out["step"] = np.array([s.step_us for s in rows], dtype=float)
        out["comm_free"] = out["step"] - np.array([s.exposed_comm_us for s in rows], dtype=float)
        if (bounds := _overlap_bounds(report)) is not None:
            out["overlap"] = np.array(bounds, dtype=float)
    return out


def _resampled_medians(values: np.ndarray, rng, paired: np.ndarray | None = None):
    """BOOTSTRAP medians of ``values`` resampled with replacement (and of ``paired``, resampled
    with the same indices)."""
    idx = rng.integers(0, values.size, size=(BOOTSTRAP, values.size))
    meds = np.median(values[idx], axis=1)
    return (meds, np.median(paired[idx], axis=1)) if paired is not None else meds


def _interval(num: np.ndarray, den: np.ndarray) -> tuple[float, float] | None:
    ok = den > 0
    if not ok.any():
        return None
    ratios = num[ok] / den[ok]
    tail = 100 * (1 - CI_LEVEL) / 2
    return float(np.percentile(ratios, tail)), float(np.percentile(ratios, 100 - tail))


def ratio_interval(num: np.ndarray, den: np.ndarray, seed: int = SEED) -> tuple[float, float] | None:
    """The bootstrap interval of median(num) / median(den), two independent samples."""
    if num.size == 0 or den.size == 0:
        return None
    rng = np.random.default_rng(seed)
    return _interval(_resampled_medians(num, rng), _resampled_medians(den, rng))


def _intervals(variants: list[VariantStats], samples: list[dict[str, np.ndarray]]) -> None:
    for v, smp in zip(variants, samples):
        if "step" in smp and smp["step"].size:
            steps, bounds = _resampled_medians(smp["step"], np.random.default_rng(SEED), smp["comm_free"])
            v.comm_free_speedup_ci = _interval(steps, bounds)
            if "overlap" in smp:
                steps, bounds = _resampled_medians(smp["step"], np.random.default_rng(SEED), smp["overlap"])
                v.overlap_bound_speedup_ci = _interval(steps, bounds)
    base = samples[0]
    for v, smp in zip(variants[1:], samples[1:]):
        if "step" in smp:
            v.speedup_ci = ratio_interval(base["step"], smp["step"])
            if "overlap" in base and smp["step"].size:
                v.step_vs_predicted_ci = ratio_interval(smp["step"], base["overlap"])
                v.bound_reached_ci = _reached_interval(base["step"], base["overlap"], smp["step"])
        v.host_speedup_ci = ratio_interval(base["host"], smp["host"])
        v.compute_slowdown_ci = ratio_interval(smp["compute"], base["compute"])


def _beyond_bounds(variants: list[VariantStats], samples: list[dict[str, np.ndarray]]) -> None:
    """Set ``beyond_bound`` where a variant's step is below a bound of the baseline, so that no
    share of what overlap could buy above 100% is given (``bound_reached`` and its interval are
    then None). Beyond the spread (the interval of step / bound entirely below 1x, or the share's
    entirely above 100%): below its comm-free bound, the variant changed its compute or idle time
    (``compute``); else below its overlap bound, the windows (``windows``; a first-order bound:
    the transfers, ``transfers``), which the bound holds fixed. Within the spread (a share above
    100% whose interval does not lie above it): it reached the bound (``noise``)."""
    base, first = variants[0], samples[0]
    if base.overlap_bound_us is None or "step" not in first:
        return
    form = "transfers" if (base.overlap_bound_form or "").startswith(FIRST_ORDER) else "windows"
    for v, smp in zip(variants[1:], samples[1:]):
        if "step" not in smp or not smp["step"].size:
            continue
        free = ratio_interval(smp["step"], first["comm_free"])
        below = v.step_vs_predicted_ci is not None and v.step_vs_predicted_ci[1] < 1.0
        above = v.bound_reached_ci is not None and v.bound_reached_ci[0] > 1.0
        if free is not None and free[1] < 1.0:
            v.beyond_bound = "compute"
        elif below or above:
            v.beyond_bound = form
        elif v.bound_reached is not None and v.bound_reached > 1.0:
            v.beyond_bound = "noise"
        else:
            continue
        v.bound_reached = v.bound_reached_ci = None


def _reached_interval(base_step, base_bound, step) -> tuple[float, float] | None:
    """The bootstrap interval of (median(base_step) − median(step)) / (median(base_step) −
    median(base_bound)): the baseline's steps and bounds resampled together, the variant's apart."""
    rng = np.random.default_rng(SEED)
    b_steps, b_bounds = _resampled_medians(base_step, rng, base_bound)
    v_steps = _resampled_medians(step, rng)
    room = b_steps - b_bounds
    ok = room > 0
    if not ok.any():
        return None
    values = (b_steps[ok] - v_steps[ok]) / room[ok]
    tail = 100 * (1 - CI_LEVEL) / 2
    return float(np.percentile(values, tail)), float(np.percentile(values, 100 - tail))


def _fmt_ci(ci) -> str:
    return f"{ci[0]:.2f}-{ci[1]:.2f}x"


def noise_warnings(variants: list[VariantStats]) -> list[str]:
    """Factors whose interval includes 1x, and profiled vs unprofiled speedups that disagree."""
    out = []
    for v in variants[1:]:
        for field, name, _ in _JUDGED:
            value, ci = getattr(v, field), getattr(v, f"{field}_ci")
            if value is not None and ci is not None and ci[0] <= 1.0 <= ci[1] and field not in v.not_trusted:
                out.append(f"{v.label}: {name} {value:.2f}x is within noise "
                           f"({100 * CI_LEVEL:.0f}% interval {_fmt_ci(ci)} includes 1x)")
        a, b = v.speedup_ci, v.host_speedup_ci
        if a is not None and b is not None and (a[1] < b[0] or b[1] < a[0]) and not v.not_trusted:
            out.append(f"{v.label}: profiled steps say {v.speedup:.2f}x ({_fmt_ci(a)}) but unprofiled steps "
                       f"say {v.host_speedup:.2f}x ({_fmt_ci(b)}): the profiler changes this comparison")
    return out


def _machine(run: RunRecord | None) -> tuple[tuple[float, float] | None, dict[str, float] | None]:
    """(load average at the start and end, {kind: other processes' CPU share}) of a run, the
    busiest node's; (None, None) when run.json did not record them."""
    loads = [info.machine_load for info in (run.ranks.values() if run else ()) if info.machine_load]
    if not loads:
        return None, None
    averages = [m.load_average for m in loads if len(m.load_average) == 2]
    other = {k: busiest(loads, k) for k in ("unprofiled", "profiled") if busiest(loads, k) is not None}
    return (tuple(max(a[i] for a in averages) for i in (0, 1)) if averages else None), other


_JUDGED = (("speedup", "step-time speedup", "profiled"), ("host_speedup", "unprofiled-step speedup", "unprofiled"),
           ("compute_slowdown", "compute slowdown", "profiled"))
# Numbers derived from the same profiled step timings as the step-time speedup: not trusted when it is not.
DERIVED = {"speedup": ("exposed_saved_us", "step_vs_predicted", "bound_reached")}
_DERIVED_WORDS = "with the exposed communication saved, step / predicted and the share of what overlap could buy"


def trust_warnings(variants: list[VariantStats]) -> list[str]:
    """Mark the factors the machine's load change explains (``not_trusted``) and say so, with
    the numbers (see :mod:`overlapprof.launch.machine`)."""
    base, out = variants[0], []
    for v in variants[1:]:
        for field, name, kind in _JUDGED:
            a, b = (x.other_cpu.get(kind) if x.other_cpu else None for x in (base, v))
            value, ci = getattr(v, field), getattr(v, f"{field}_ci")
            if explains(load_factor(a, b), value, ci):
                v.not_trusted += [field, *DERIVED.get(field, ())]
                name += f" ({_DERIVED_WORDS}, from the same steps)" if field in DERIVED else ""
                out.append(f"{v.label}: {name} not trusted: "
                           f"{described(a, b, f'{base.label} {kind} steps', f'{v.label} ones', value)}; "
                           "rerun the comparison when the machine is quieter")
    return out


def _stats(report: Report, label: str, per_step: bool) -> VariantStats:
    samples = _sample_rows(report, per_step)
    comm = sum(s.comm_us for s in samples)
    host = _host_step_times_us(report, "profiled")
    run = _run(report)
    stats = VariantStats(
        label=label,
        inputs=list(report.inputs),
        workload=run.workload.name or None if run else None,
        world_size=(run.world_size if run else None)
        or next((r.world_size for r in report.ranks if r.world_size), None),
        ranks=len(report.ranks),
        device=run.device if run else None,
        backend=(run.backend if run else None) or next((r.backend for r in report.ranks if r.backend), None),
        link=link_of(report),
        options=run.options if run else None,
        samples=len(samples),
        comm_us=_median([s.comm_us for s in samples]) or 0.0,
        overlapped_us=_median([s.overlapped_us for s in samples]) or 0.0,
        exposed_comm_us=_median([s.exposed_comm_us for s in samples]) or 0.0,
        compute_us=_median([s.compute_us for s in samples]) or 0.0,
        overlap_ratio=sum(s.overlapped_us for s in samples) / comm if comm > 0 else None,
        host_step_us=_median(host),
        host_step_p90_us=_percentile(host, 90),
        host_unprofiled_step_us=_median(_host_step_times_us(report, "unprofiled")),
        workload_metrics={m.name: m.median for m in report.workload_metrics},
    )
    hideable = sum(min(s.comm_us, s.compute_us) for s in samples)
    stats.hidden_of_hideable = sum(s.overlapped_us for s in samples) / hideable if hideable > 0 else None
    stats.exposure = _mean_exposure([s.exposure for s in (samples if per_step else report.ranks)])
    if report.ranks and report.summary.most_exposed_rank is not None:
        stats.verdict = report.rank(report.summary.most_exposed_rank).verdict
    stats.load_average, stats.other_cpu = _machine(run)
    if per_step:
        stats.step_us = _median([s.step_us for s in samples])
        stats.step_p90_us = _percentile([s.step_us for s in samples], 90)
        stats.comm_free_bound_us = _median([s.step_us - s.exposed_comm_us for s in samples])
        stats.comm_free_speedup = _ratio(stats.step_us, stats.comm_free_bound_us)
        if (bounds := _overlap_bounds(report)) is not None:
            stats.overlap_bound_us = _median(bounds)
            stats.overlap_bound_speedup = _ratio(stats.step_us, stats.overlap_bound_us)
            stats.overlap_bound_form = report.ranks[0].overlap_bound_form
    return stats


def _mean_exposure(parts: list) -> Exposure | None:
    """The mean of each cause over the samples (None when a sample has none)."""
    if not parts or any(p is None for p in parts):
        return None
    n = len(parts)
    out = Exposure(**{f"{c}_us": sum(getattr(p, f"{c}_us") for p in parts) / n for c in CAUSES})
    for name in ("late_peer_by_rank", "late_peer_activity"):
        total: dict = {}
        for p in parts:
            for k, us in getattr(p, name).items():
                total[k] = total.get(k, 0.0) + us / n
        setattr(out, name, dict(sorted(total.items())))
    slow = [p.slow_transfer_us for p in parts]
    out.slow_transfer_us = None if any(s is None for s in slow) else sum(slow) / n
    return out


def _against(v: VariantStats, base: VariantStats) -> None:
    v.speedup = _ratio(base.step_us, v.step_us)
    v.host_speedup = _ratio(base.host_unprofiled_step_us, v.host_unprofiled_step_us)
    v.exposed_saved_us = base.exposed_comm_us - v.exposed_comm_us
    v.exposed_saved_frac = _ratio(v.exposed_saved_us, base.exposed_comm_us)
    v.compute_slowdown = _ratio(v.compute_us, base.compute_us)
    v.predicted_step_us = base.overlap_bound_us
    v.step_vs_predicted = _ratio(v.step_us, v.predicted_step_us)
    if None not in (base.step_us, v.step_us, base.overlap_bound_us) and base.step_us > base.overlap_bound_us:
        v.bound_reached = (base.step_us - v.step_us) / (base.step_us - base.overlap_bound_us)


def _mismatch_warnings(variants: list[VariantStats]) -> list[str]:
    """Different workloads, world sizes, devices or options: allowed, but said."""
    base, warnings = variants[0], []
    for field, what in (("workload", "workload"), ("world_size", "world size"), ("device", "device"),
                        ("backend", "backend"), ("link", "link")):
        values = [getattr(v, field) for v in variants]
        if any(x is not None for x in values) and len(set(values)) > 1:
            listed = ", ".join(f"{v.label}: {'?' if x is None else x}" for v, x in zip(variants, values))
            warnings.append(f"comparing runs of different {what}s ({listed})")
    for v in variants[1:]:
        same_workload = base.workload == v.workload and None not in (base.options, v.options)
        if same_workload and base.options != v.options:
            diff = sorted(k for k in set(base.options) | set(v.options) if base.options.get(k) != v.options.get(k))
            shown = "; ".join(f"{k}: {v.label} {v.options.get(k)!r}, {base.label} {base.options.get(k)!r}" for k in diff)
            warnings.append(f"{v.label} ran with other workload options than {base.label} ({shown})")
    return warnings


def compare(reports: list[Report], labels: list[str] | None = None) -> Comparison:
    """Compare Reports, the first as baseline; see the module docstring for every number.

    ``labels`` name the variants (default: run.json's variant, else the input's name; made
    unique). Raises InputError when there is no report.
    """
    from overlapprof import __version__

    if not reports:
        raise InputError("nothing to compare")
    names = _unique_labels(reports, labels)
    per_step = all(any(r.steps for r in rep.ranks) for rep in reports)
    warnings = []
    if not per_step and any(any(r.steps for r in rep.ranks) for rep in reports):
        without = [n for n, rep in zip(names, reports) if not any(r.steps for r in rep.ranks)]
        warnings.append(f"no ProfilerSteps in {', '.join(without)}: every variant is compared on whole-trace values")
    variants = [_stats(rep, name, per_step) for rep, name in zip(reports, names)]
    for v in variants[1:]:
        _against(v, variants[0])
    samples = [_samples(rep, per_step) for rep in reports]
    _intervals(variants, samples)
    _beyond_bounds(variants, samples)
    warnings += _mismatch_warnings(variants)
    warnings += trust_warnings(variants)
    warnings += noise_warnings(variants)
    warnings += [f"{name}: {w}" for name, rep in zip(names, reports) for w in rep.warnings]
    return Comparison(
        version=__version__,
        baseline=names[0],
        basis=PER_STEP if per_step else WHOLE_TRACE,
        variants=variants,
        warnings=warnings,
        reports=list(reports),
    )
