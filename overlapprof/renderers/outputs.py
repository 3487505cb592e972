"""Writing an output file (a saved report or comparison, a CSV, an HTML page, a plot) without
ever losing what is already written.

:func:`write_output` is the one writer every command uses. It first :func:`check_output`, then
writes the bytes to a temporary file in the destination's folder and renames it over the
destination (``os.replace``), so a reader never sees half a file and a failed write leaves the
old file as it was.

Refused, with one line (``OutputError``):

- a path inside a **run directory** (a folder holding ``run.json``, at any depth below it). The
  files there are the run's own data and nothing else: ``run.json``, the traces, ``logs/``,
  ``ranks/`` and ``nodes/`` (written by ``overlapprof run``) and ``scalars/`` (the TensorBoard
  scalars, written by ``run`` and ``view`` themselves, never through this writer). No output of
  ``analyze``, ``compare``, ``report`` or ``plot`` belongs there, so none is written there;
- a **trace** (a name ending ``.pt.trace.json[.gz]``, or an existing file that is gzip or holds
  ``"traceEvents"``, but a timeline ``overlapprof export`` wrote, which exporting again replaces)
  or a file named ``run.json``, anywhere;
- a folder, or a path whose folder does not exist;
- an existing file when the user did not name the output (a default name such as
  ``./report.html``).

No torch or numpy here.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from overlapprof.errors import OutputError
from overlapprof.rundir.directory import RUN_FILE

TRACE_SUFFIXES = (".pt.trace.json", ".pt.trace.json.gz")


def run_dir_above(path: Path) -> Path | None:
    """The nearest folder at or above ``path``'s folder that holds a ``run.json``, or None."""
    folder = path.parent.resolve()
    for candidate in (folder, *folder.parents):
        if (candidate / RUN_FILE).is_file():
            return candidate
    return None


def _is_trace(path: Path) -> bool:
    """A profiler's trace (never overwritten), not a timeline ``overlapprof export`` wrote (which an
    export to the same path replaces)."""
    if path.name.endswith(TRACE_SUFFIXES):
        return True
    if not path.is_file():
        return False
    from overlapprof.trace.discover import is_exported_timeline, is_trace_file

    return is_trace_file(path) and not is_exported_timeline(path)


def check_output(dest: str | Path, what: str, named: bool = True) -> Path:
    """Raise OutputError (one line) when ``what`` (e.g. "report", "json") may not be written to
    ``dest``; see the module docstring for the rules. ``named``: the user gave the path (an
    existing file is then replaced). Returns ``dest`` as a Path."""
    dest = Path(dest)
    real = dest.resolve()  # a link is judged by what it points to
    for path in dict.fromkeys((dest, real)):
        if path.name == RUN_FILE:
            raise OutputError(f"refusing to write the {what} over {dest}, which holds a run's data")
        if _is_trace(path):
            raise OutputError(f"refusing to write the {what} over {dest}, which is a trace")
    run_dir = run_dir_above(dest) or run_dir_above(real)
    if run_dir is not None:
        raise OutputError(f"refusing to write the {what} to {dest}: it is inside run directory {run_dir}, "
                          "whose files are the run's data; write it outside the run directory")
    if dest.is_dir():
        example = dest / ("report.html" if what == "report" else "timeline.png" if what == "plot" else f"out.{what}")
        raise OutputError(f"{dest} is a folder; name the {what} file, e.g. {example}")
    if not named and dest.exists():
        raise OutputError(f"{dest} exists; name the output with -o to replace it")
    if not dest.parent.is_dir():
        raise OutputError(f"cannot write {dest}: folder {dest.parent} does not exist")
    return dest


def _mode_for(dest: Path) -> int:
    """The permissions of the file being replaced, else those a new file gets (0o666 less umask)."""
    try:
        return dest.stat().st_mode & 0o7777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def write_output(dest: str | Path, data: str | bytes, what: str, named: bool = True) -> Path:
    """Write ``data`` (text is UTF-8 encoded) to ``dest`` after :func:`check_output`, through a
    temporary file in the same folder renamed over it. Raises OutputError (one line)."""
    dest = check_output(dest, what, named)
    payload = data.encode() if isinstance(data, str) else data
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
        os.chmod(tmp, _mode_for(dest))
        os.replace(tmp, dest)
    except OSError as exc:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        raise OutputError(f"cannot write {dest}: {exc.strerror or exc}") from None
    return dest
