"""What follows ``overlapprof run``: analyze each finished run, write its TensorBoard scalars,
and compare the variants when there are several (the first as baseline).

:func:`analyze_runs` does the work and returns an :class:`AfterRun`; the CLI renders it. It
calls ``on_report(variant, run_dir, report)`` as each run is analyzed, so a caller can show
each table while the next run is read. A run that cannot be analyzed, and scalars that cannot
be written, are notes (``log(line)`` and ``AfterRun.notes``), not errors: the run itself is
already on disk. No torch here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from overlapprof.errors import OverlapprofError


@dataclass
class AnalyzedRun:
    """One finished run directory and its Report."""

    variant: str
    run_dir: Path
    report: object  # overlapprof.report.Report


@dataclass
class AfterRun:
    """The analyzed runs (those that could be), their comparison (None with fewer than two),
    and the notes of what could not be done."""

    runs: list[AnalyzedRun] = field(default_factory=list)
    comparison: object | None = None  # overlapprof.compare.Comparison
    notes: list[str] = field(default_factory=list)


def analyze_runs(runs, on_report=None, log=None, scalars: bool = True) -> AfterRun:
    """Analyze each ``(variant, run_dir)`` of ``runs``, write its scalars (``scalars``: unless
    TensorBoard is missing, which is noted once) and compare the variants."""
    from overlapprof.analysis import analyze
    from overlapprof.compare import compare
    from overlapprof.renderers.tensorboard import TensorBoardMissing, write_scalars

    result = AfterRun()

    def note(line: str) -> None:
        result.notes.append(line)
        if log:
            log(line)

    for variant, run_dir in runs:
        try:
            report = analyze([str(run_dir)])
        except OverlapprofError as exc:
            note(f"no analysis of {run_dir}: {exc}")
            continue
        result.runs.append(AnalyzedRun(variant, Path(run_dir), report))
        if on_report:
            on_report(variant, run_dir, report)
        if not scalars:
            continue
        try:
            write_scalars(report, run_dir)
        except TensorBoardMissing as exc:
            note(f"no TensorBoard scalars: {exc}")
            scalars = False
        except OverlapprofError as exc:
            note(str(exc))
    if len(result.runs) > 1:
        result.comparison = compare([r.report for r in result.runs], [r.variant for r in result.runs])
    return result
