"""A Comparison as a plain-text table: one column per variant (the baseline first), one row per
number, then what the numbers mean and any warning.

Numbers as :mod:`overlapprof.renderers.format` writes them (times in ms with the unit in the row
name, ratios as percentages, factors as ``1.23x [1.10-1.35]``, a missing value as ``-``); plain
aligned text, like the analyze table.
"""

from __future__ import annotations

from overlapprof.report import BOOTSTRAP, CAUSES, CI_LEVEL, PER_STEP, Comparison
from overlapprof.renderers import workload_metrics
from overlapprof.renderers.base import Renderer
from overlapprof.renderers.format import PLACEHOLDER, factor, ms, percent, portion, saved_ms, text_table


def _cause(name: str):
    return lambda v: ms(getattr(v.exposure, f"{name}_us")) if v.exposure is not None else PLACEHOLDER


# (row name, cell of a variant); None rows are section headings. Per-step rows say "median".
def _rows(c: Comparison) -> list[tuple[str, object]]:
    med = "median " if c.basis == PER_STEP else ""
    per = "step" if c.basis == PER_STEP else "rank"
    rows = [
        ("step time, median ms", lambda v: ms(v.step_us)),
        ("step time, p90 ms", lambda v: ms(v.step_p90_us)),
        (f"communication, {med}ms", lambda v: ms(v.comm_us)),
        (f"exposed communication, {med}ms", lambda v: ms(v.exposed_comm_us)),
    ]
    if any(v.exposure is not None for v in c.variants):
        rows.append((f"why exposed, mean ms per {per}:", None))
        rows += [(f"  {name}", _cause(name)) for name in CAUSES]
    rows += [
        ("overlap ratio", lambda v: percent(v.overlap_ratio)),
        ("hidden of hideable (overlapped / min(comm, compute))", lambda v: percent(v.hidden_of_hideable)),
        (f"compute, {med}ms", lambda v: ms(v.compute_us)),
        ("comm-free bound (step - exposed), median ms", lambda v: ms(v.comm_free_bound_us)),
        ("comm-free ceiling (step / comm-free bound)", lambda v: factor(v.comm_free_speedup, v.comm_free_speedup_ci)),
        ("overlap bound, median ms", lambda v: ms(v.overlap_bound_us)),
        ("overlap ceiling (step / overlap bound)",
         lambda v: factor(v.overlap_bound_speedup, v.overlap_bound_speedup_ci)),
        (f"vs baseline {c.baseline}:", None),
        ("  step-time speedup", lambda v: judged(v, "speedup")),
        ("  exposed communication saved, ms", saved),
        ("  compute slowdown (compute / baseline's)", lambda v: judged(v, "compute_slowdown")),
    ]
    if c.variants[0].overlap_bound_us is not None:
        rows += [
            (f"  predicted: {c.baseline}'s overlap bound, ms", lambda v: ms(v.predicted_step_us)),
            ("  step / predicted", lambda v: judged(v, "step_vs_predicted")),
            ("  share of what overlap could buy", reached),
        ]
    if any(v.link for v in c.variants):
        rows.append(("link (one medium shared by all ranks)", lambda v: v.link or PLACEHOLDER))
    if any(v.host_step_us is not None for v in c.variants):
        rows += [
            ("host-measured step time (run.json):", None),
            ("  profiled steps, median ms", lambda v: ms(v.host_step_us)),
            ("  unprofiled steps, median ms", lambda v: ms(v.host_unprofiled_step_us)),
            ("  speedup (unprofiled steps)", lambda v: judged(v, "host_speedup")),
        ]
    if any(v.other_cpu is not None for v in c.variants):
        rows += [
            ("machine load (run.json):", None),
            ("  load average (1 min), start-end", lambda v: "-".join(f"{x:.2f}" for x in v.load_average)
             if v.load_average else PLACEHOLDER),
            ("  other processes' CPU, unprofiled steps", lambda v: share(v, "unprofiled")),
            ("  other processes' CPU, profiled steps", lambda v: share(v, "profiled")),
        ]
    rows += workload_metrics.compare_rows(c)
    rows.append(("ranks" if c.basis != PER_STEP else "samples (rank x step)", lambda v: str(v.samples)))
    return rows


NOT_TRUSTED = "not trusted (load)"


def judged(v, field: str, interval: bool = True) -> str:
    """A factor (``speedup``, ``host_speedup``, ``compute_slowdown``, ``step_vs_predicted``) with
    its interval, or :data:`NOT_TRUSTED` where the machine's load change explains it
    (``v.not_trusted``)."""
    if field in v.not_trusted:
        return NOT_TRUSTED
    return factor(getattr(v, field), getattr(v, f"{field}_ci") if interval else None)


def saved(v) -> str:
    """The exposed communication saved, or :data:`NOT_TRUSTED` (``v.not_trusted``)."""
    return NOT_TRUSTED if "exposed_saved_us" in v.not_trusted else saved_ms(v.exposed_saved_us, v.exposed_saved_frac)


# What a variant whose step is below a bound of the baseline changed (VariantStats.beyond_bound), and what
# the bound it went below holds fixed.
BEYOND = {"windows": ("overlap bound", "windows and compute"), "transfers": ("overlap bound", "transfers and compute"),
          "compute": ("comm-free bound", "compute and idle time")}


def reached(v) -> str:
    """The share of what overlap could buy, never above 100%: where the variant went below the
    baseline's bound, what it changed (or that it reached the bound, within noise);
    :data:`NOT_TRUSTED` where the load explains it."""
    if "bound_reached" in v.not_trusted:
        return NOT_TRUSTED
    if v.beyond_bound == "noise":
        return "at the bound (within noise)"
    if v.beyond_bound is not None:
        return f"beyond the bound: changed its {v.beyond_bound}"
    return portion(v.bound_reached, v.bound_reached_ci)


def share(v, kind: str) -> str:
    """The share of the CPU other processes took over a variant's steps of ``kind`` (run.json)."""
    share = (v.other_cpu or {}).get(kind)
    return PLACEHOLDER if share is None else percent(share)


def notes(c: Comparison, report_warnings: bool = True) -> list[str]:
    """What the numbers are, and the comparison's warnings (without those it repeats from its
    reports when ``report_warnings`` is False: they were shown with each report's table)."""
    repeated = set() if report_warnings else {
        f"{v.label}: {w}" for v, rep in zip(c.variants, c.reports) for w in rep.warnings}
    if c.basis == PER_STEP:
        basis = ("per-step values: medians over every (rank, ProfilerStep) pair of a variant;\n"
                 "  overlap ratio = sum overlapped / sum comm over those steps")
    else:
        basis = ("whole-trace values (not every variant has ProfilerSteps): medians over ranks of\n"
                 "  each rank's totals; no step time, bound or speedup")
    return [
        basis,
        "comm-free bound = the step if communication cost nothing (the ceiling of any communication fix);",
        "  overlap bound = the shortest step overlap could give (OVERLAP.md section 6: windows, lock-step, link, cores);",
        "  both hold the run's compute fixed, the overlap bound its windows (first-order: its transfers) too:",
        "  a variant that changes them can go below them",
        *_predictions(c),
        *(f"verdict {v.label}: {v.verdict}" for v in c.variants if v.verdict),
        f"[low-high] = {100 * CI_LEVEL:.0f}% bootstrap interval over the samples (seeded, {BOOTSTRAP} resamples)",
        "compute slowdown > 1x: the same compute took longer (contention for cores, SMs, memory bandwidth)",
        *(["others' CPU: the share of the machine's CPU processes outside the run took during its unprofiled /\n"
           "  profiled steps (run.json; the busiest node)"] if any(v.other_cpu for v in c.variants) else []),
        *(["not trusted (load): other processes' share of the CPU moved between the two variants' steps enough to\n"
           "  explain the difference (load factor F = free CPU a / free CPU b; ranks that meet can differ by F^2):\n"
           "  rerun when the machine is quieter"]
          if any(v.not_trusted for v in c.variants) else []),
        *(f"warning: {w}" for w in c.warnings if w not in repeated),
    ]


def _predictions(c: Comparison) -> list[str]:
    """Predict, then check: each variant's step against the baseline's overlap bound."""
    base, out = c.variants[0], []
    if base.overlap_bound_us is None:
        return out
    for v in c.variants[1:]:
        if v.step_us is None or v.step_vs_predicted is None:
            continue
        against = f"step {ms(v.step_us)} ms vs {base.label}'s overlap bound {ms(base.overlap_bound_us)} ms"
        if "bound_reached" in v.not_trusted:
            out.append(f"predicted: {v.label} {NOT_TRUSTED} ({against}; the load explains the difference)")
        elif v.beyond_bound == "noise":
            out.append(f"predicted: {v.label} reached {base.label}'s overlap bound, within the spread ({against}: "
                       f"{factor(v.step_vs_predicted, v.step_vs_predicted_ci)}): no share above 100% is given")
        elif v.beyond_bound is not None:
            bound, fixed = BEYOND[v.beyond_bound]
            at = base.comm_free_bound_us if v.beyond_bound == "compute" else base.overlap_bound_us
            also = (f" (compute {judged(v, 'compute_slowdown')} {base.label}'s)"
                    if v.beyond_bound == "compute" and v.compute_slowdown is not None else "")
            out.append(f"predicted: {v.label}'s step {ms(v.step_us)} ms is below {base.label}'s {bound} {ms(at)} ms "
                       f"beyond the spread: the bound holds {base.label}'s {fixed} fixed, so {v.label} changed its "
                       f"{v.beyond_bound}{also}: not a share of what overlap could buy")
        else:
            reached_ = (f"{v.label} reached {portion(v.bound_reached, v.bound_reached_ci)} of what overlap could buy"
                        if v.bound_reached is not None else f"{base.label} is at its overlap bound already")
            out.append(f"predicted: {reached_} ({against}: {factor(v.step_vs_predicted, v.step_vs_predicted_ci)})")
    return out


def render(c: Comparison, report_warnings: bool = True) -> str:
    """The comparison as a plain-text table followed by notes; ``report_warnings=False`` leaves
    out the warnings of its reports (for output that already showed each report's table)."""
    header = ["", *(v.label + (" (baseline)" if k == 0 else "") for k, v in enumerate(c.variants))]
    body = [[name, *(("" if cell is None else cell(v)) for v in c.variants)] for name, cell in _rows(c)]
    return "\n".join([text_table(header, body), "", *notes(c, report_warnings)]) + "\n"


class ComparisonTableRenderer(Renderer):
    """A plain-text table: one column per variant, one row per number, then the notes."""

    name = "table"
    subject = "comparison"
    extensions = ("txt",)
    shows_warnings = True

    def __init__(self, report_warnings: bool = True):
        self.report_warnings = report_warnings

    def render(self, c: Comparison) -> str:
        return render(c, self.report_warnings)
