"""The analysis, by stage: trace files in, a :class:`~overlapprof.report.Report` out. Never imports torch.

``analyze(paths, ...) -> Report`` (:mod:`.analyzer`, which only orchestrates) is the entry point;
:mod:`.options` defines what it may be asked (``AnalyzeOptions``).

- :mod:`.rank`: per rank, events -> classified intervals -> OVERLAP.md's metrics
- :mod:`.records`: communication records and logical operations (what matching needs)
- :mod:`.crossrank`: across ranks, matching, clocks, waits and bandwidth
- :mod:`.intervals`, :mod:`.columns`, :mod:`.stats`: generic helpers (interval unions, numpy
  columns of codes, median and percentile)
- :mod:`.like_hta`: the metrics as HolisticTraceAnalysis computes them (``--like-hta``)
"""


def __getattr__(name):
    # Lazy, so that importing a submodule (or overlapprof.report) does not import everything.
    if name == "analyze":
        from overlapprof.analysis.analyzer import analyze

        return analyze
    if name == "AnalyzeOptions":
        from overlapprof.analysis.options import AnalyzeOptions

        return AnalyzeOptions
    raise AttributeError(f"module 'overlapprof.analysis' has no attribute {name!r}")


__all__ = ["analyze", "AnalyzeOptions"]
