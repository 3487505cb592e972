"""The library's exceptions. The CLI prints ``Error: <message>`` and exits 2 for any of them.

Messages are one line and name the file and the problem, so they read well on a terminal.
"""


class OverlapprofError(Exception):
    """Base class of every error the library raises on bad input."""


class TraceError(OverlapprofError):
    """A trace file is unreadable or not a PyTorch profiler trace."""

    def __init__(self, path, problem):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")

    def __reduce__(self):  # picklable across worker processes
        return (type(self), (self.path, self.problem))


class InputError(OverlapprofError):
    """The set of inputs does not make sense together (no traces, duplicate or mixed ranks...)."""


class ReportError(OverlapprofError):
    """A saved report cannot be loaded."""


class WorkloadError(OverlapprofError):
    """A workload file cannot be loaded, or a variant or option it does not declare was asked for."""


class RunDirError(OverlapprofError):
    """A run directory exists and may not be written to, or is not a run directory."""


class LaunchError(OverlapprofError):
    """The launch flags cannot work on this machine (e.g. --device cuda without a GPU)."""


class OutputError(OverlapprofError):
    """An output file may not be written there (over a run's data, a folder, a missing folder)."""


class ClusterError(OverlapprofError):
    """Work sent to a Dask cluster failed there (its workers kept dying, or a task raised): the
    work failed, not the input, so a command ends with exit code 1."""

    exit_code = 1


class SpillError(OverlapprofError):
    """A rank measured with its events on disk (past the memory budget) cannot keep its files
    (no such ``$TMPDIR``, a full disk): the machine, not the trace, so no ``--allow-partial``
    skips a rank for it, and a command ends with exit code 1."""

    exit_code = 1


class ProfileError(OverlapprofError):
    """``overlapprof.profile`` cannot record here: a bad setting, or a multi-rank launch whose
    process group is not initialized yet."""
