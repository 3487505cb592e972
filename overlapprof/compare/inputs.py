"""Command-line inputs as Reports: a run directory or trace set is analyzed, a saved report is
loaded, a saved comparison gives back its reports. What ``compare``, ``report`` and ``export`` read.
No torch here."""

from __future__ import annotations

from pathlib import Path

from overlapprof.analysis.options import AnalyzeOptions
from overlapprof.errors import InputError
from overlapprof.report import Report
from overlapprof.report.comparison import Comparison


def load_reports(paths, options: AnalyzeOptions | None = None, progress=None,
                 advice: bool = False) -> tuple[list[Report], list[str] | None]:
    """The Reports of command-line inputs, one per path: a saved report is loaded, a saved
    comparison gives back its reports (and labels), anything else is analyzed as one run or
    trace set (with ``options``, see :func:`overlapprof.analyze`). ``progress(k, n, path)``
    is called before each input. ``advice``: each report of a run directory the replay reads
    leads with what to change first (``Report.advice``, :func:`overlapprof.analysis.advise.for_report`),
    made from the analysis just done (a saved report's run is read again). Returns (reports,
    labels or None)."""
    from overlapprof.trace.discover import is_saved_comparison, is_saved_report

    paths = [Path(p) for p in paths]
    if len(paths) == 1 and paths[0].is_file() and is_saved_comparison(paths[0]):
        saved = Comparison.load(paths[0])
        return [_advised(r, options) if advice else r for r in saved.reports], [v.label for v in saved.variants]
    for path in paths:
        if not path.exists():
            raise InputError(f"{path}: no such run directory or file")
    reports = []
    for k, path in enumerate(paths):
        if progress:
            progress(k, len(paths), str(path))
        if path.is_file() and is_saved_comparison(path):
            raise InputError(f"{path}: a saved comparison is re-rendered alone, not mixed with other inputs")
        if path.is_file() and is_saved_report(path):
            report = Report.load(path)
            reports.append(_advised(report, options) if advice else report)
        elif advice:
            from overlapprof.analysis.analyzer import analyze_with_inputs

            analyzed = analyze_with_inputs([str(path)], options)
            reports.append(_advised(analyzed.report, options, analyzed))
        else:
            from overlapprof.analysis import analyze

            reports.append(analyze([str(path)], options))
    return reports, None


def _advised(report: Report, options: AnalyzeOptions | None, analyzed=None) -> Report:
    """``report`` with its advice, where it has none yet and its run gives one."""
    from overlapprof.analysis.advise import for_report

    if report.advice is None:
        report.advice = for_report(report, workers=options.workers if options is not None else None,
                                   analyzed=analyzed)
    return report
