"""overlapprof: how much of a PyTorch distributed program's communication is hidden under compute.

Data flows one way::

    workload -> launcher -> per-rank harness -> trace files -> analyzer -> report -> renderers

``overlapprof.analyze(paths) -> Report`` is the library entry point of the analyzer (its options:
``overlapprof.AnalyzeOptions``, or the same fields as keywords), and
``overlapprof.profile(...)`` records your own training loop into a run directory it reads
(:mod:`overlapprof.launch.profiling`). Importing this package imports neither torch nor the analyzer:
names are resolved on first use, so the CLI's ``--help`` stays fast and analysis runs where
torch is not installed.
"""

__version__ = "0.1.0"

__all__ = ["analyze", "AnalyzeOptions", "profile", "ProfileConfig", "Report", "__version__"]


def __getattr__(name):
    if name == "analyze":
        from overlapprof.analysis import analyze

        return analyze
    if name == "AnalyzeOptions":
        from overlapprof.analysis.options import AnalyzeOptions

        return AnalyzeOptions
    if name == "Report":
        from overlapprof.report import Report

        return Report
    if name == "ProfileConfig":  # no torch: settings can be made (and read in help) without it
        from overlapprof.launch.profile_settings import ProfileConfig

        return ProfileConfig
    if name == "profile":
        from overlapprof.launch.profiling import profile

        return profile
    raise AttributeError(f"module 'overlapprof' has no attribute {name!r}")


def __dir__():
    """The public names (resolved on first use, so absent from the module until then) beside
    what the module holds."""
    return sorted(set(globals()) | set(__all__))
