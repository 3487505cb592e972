"""The metrics of OVERLAP.md: classification, interval arithmetic, per-rank/step/kind metrics.

``analyze(paths, ...) -> Report`` is the entry point. Never imports torch.
"""


def __getattr__(name):
    # Lazy, so that importing a submodule (or overlapprof.report) does not import everything.
    if name == "analyze":
        from overlapprof.analysis.analyzer import analyze

        return analyze
    raise AttributeError(f"module 'overlapprof.analysis' has no attribute {name!r}")


__all__ = ["analyze"]
