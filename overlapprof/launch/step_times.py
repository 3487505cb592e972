"""The line a finished run prints about its step times (``step_summary``): medians over ranks of
the first warm-up step, an unprofiled and a profiled step, and their ratio (the profiler's
overhead) with its bootstrap interval, or why it is not trusted (the machine's load,
:class:`~overlapprof.rundir.run_record.MachineLoad`). Read from run.json's ranks; shared by the
launcher's end of a run and ``overlapprof.profile``'s."""

import statistics

from overlapprof.rundir import run_record


def step_summary(run):
    """One line of step times, medians over ranks: first warm-up step, unprofiled, profiled,
    and their ratio (the profiler's overhead) with its spread."""
    def median_of(kind, pick=statistics.median):
        values = [pick(info.step_times_ms[kind]) for info in run.ranks.values()
                  if info.step_times_ms.get(kind)]
        return statistics.median(values) if values else None

    first = median_of("warmup", pick=lambda v: v[0])
    unprofiled, profiled = median_of("unprofiled"), median_of("profiled")
    parts = []
    if first is not None:  # NCCL's first recv blocks the host while it connects: it shows here
        slower = f" ({first / unprofiled:.1f}x an unprofiled step)" if unprofiled else ""
        parts.append(f"first warm-up step {first:.1f} ms{slower}")
    if unprofiled is not None:
        parts.append(f"unprofiled step {unprofiled:.2f} ms")
    if profiled is not None:
        parts.append(f"profiled step {profiled:.2f} ms")
    if unprofiled and profiled:
        parts.append(_overhead(profiled / unprofiled, _overhead_spread(run),
                               [i.machine_load for i in run.ranks.values() if i.machine_load]))
    return ", ".join(parts) if parts else "no step completed"


SPREAD_RESAMPLES = 1000  # a 95% interval, seeded: the same run.json gives the same line...
SPREAD_BUDGET = 4_000_000  # ...fewer (not under 100) past this many resampled steps: a second at most


def _overhead_spread(run) -> tuple[float, float]:
    """The central 95% interval of profiled / unprofiled step (each the median over ranks of a
    rank's median), every rank's steps of each kind resampled with replacement."""
    import numpy as np  # only here: the launching side needs it for this line alone

    rng = np.random.default_rng(0)
    steps = sum(len(info.step_times_ms.get(k) or ()) for info in run.ranks.values() for k in ("unprofiled", "profiled"))
    resamples = max(100, min(SPREAD_RESAMPLES, SPREAD_BUDGET // max(steps, 1)))

    def resampled(kind):
        medians = []
        for info in run.ranks.values():
            times = np.asarray(info.step_times_ms.get(kind) or (), dtype=float)
            if times.size:
                medians.append(np.median(times[rng.integers(0, times.size, (resamples, times.size))], axis=1))
        return np.median(np.stack(medians), axis=0)

    ratios = resampled("profiled") / resampled("unprofiled")
    return float(np.percentile(ratios, 2.5)), float(np.percentile(ratios, 97.5))


def _overhead(ratio, spread, loads):
    """The profiler's overhead (profiled / unprofiled step) with its interval ``spread``, unless
    the machine's load moved enough between the two kinds of steps to explain it
    (run_record.MachineLoad). Never below 1x: where the interval includes 1x the overhead is
    within noise, and only its upper end is said; where it lies below 1x the profiled steps were
    faster, which no profiler causes."""
    a, b = run_record.busiest(loads, "unprofiled"), run_record.busiest(loads, "profiled")
    low, high = spread
    if run_record.explains(run_record.load_factor(a, b), ratio):
        return (f"profiler overhead not trusted: {run_record.described(a, b, 'the unprofiled steps', 'the profiled ones', ratio)}; "
                "rerun when the machine is quieter")
    if high < 1:
        return (f"profiler overhead not measured: the profiled steps ran {1 / ratio:.2f}x faster than the unprofiled "
                "ones, which a profiler cannot cause (the steps' own spread, or the machine's load); rerun when the "
                "machine is quieter")
    if low <= 1:
        return (f"profiler overhead within noise: at most x{high:.2f} (profiled / unprofiled steps, 95% interval "
                f"{low:.2f}-{high:.2f}x, includes 1x)")
    return f"profiler overhead x{ratio:.2f} [{low:.2f}-{high:.2f}]"
