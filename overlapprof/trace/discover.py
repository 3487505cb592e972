"""Finding trace files: from run directories, folders and files to groups of files per rank.

- A **run directory** of ``overlapprof run`` has a ``run.json`` whose ``"traces"`` maps each rank
  to its trace files (``{"0": ["rank0.<ns>.pt.trace.json", ...]}``, relative to the directory;
  see ``overlapprof/launch/rundir.py``). With ``--repeat`` a rank has several files, one per
  profiler cycle: they are one rank, analyzed together. While run.json lists none (a run cut
  short), the directory's ``rank<N>.*.pt.trace.json[.gz]`` files are grouped by rank instead.
- A **folder** is searched recursively for ``*.json`` and ``*.json.gz`` files; ``run.json`` and
  saved overlapprof reports are skipped.
- A **file** is taken as a trace whatever its name.

Each group of files becomes a :class:`TraceGroup`; its rank is settled later, from the traces'
``distributedInfo``, else the run.json, else the file name (``rank-3``, ``rank3``, ``rank_3``,
``sampled_rank-1``...), else the order of the inputs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from overlapprof.errors import InputError

RUN_FILE = "run.json"
_RANK_IN_NAME = re.compile(r"(?:^|[^a-z])rank[-_]?(\d+)(?!\d)", re.IGNORECASE)
_SUFFIXES = (".json", ".json.gz")


@dataclass
class TraceGroup:
    """The trace files of one rank (several only for the profiler cycles of a run directory)."""

    files: list[Path]
    run_rank: int | None = None  # the rank run.json lists these files under

    @property
    def size(self) -> int:
        return sum(f.stat().st_size for f in self.files if f.is_file())


@dataclass
class Inputs:
    """What the paths given to ``analyze`` amount to."""

    groups: list[TraceGroup] = field(default_factory=list)
    run: dict | None = None  # the run.json of a run directory, when exactly one was given


def rank_from_name(name: str) -> int | None:
    """The rank a trace file's name gives (``rank-3.json`` -> 3), or None."""
    m = _RANK_IN_NAME.search(name)
    return int(m.group(1)) if m else None


def is_saved_report(path: Path) -> bool:
    """Does the file start like a saved overlapprof Report (whose first key is ``schema``)?"""
    try:
        with path.open("rb") as f:
            head = f.read(64)
    except OSError:
        return False
    return head.lstrip().replace(b" ", b"").replace(b"\n", b"").startswith(b'{"schema":"overlapprof.report/')


def _read_run(run_dir: Path) -> dict:
    path = run_dir / RUN_FILE
    try:
        run = msgspec.json.decode(path.read_bytes())
    except (OSError, msgspec.DecodeError) as exc:
        raise InputError(f"{path}: unreadable run description ({exc})") from None
    if not isinstance(run, dict):
        raise InputError(f"{path}: not a run description (expected an object)")
    return run


def _run_groups(run_dir: Path, run: dict) -> list[TraceGroup] | None:
    """The groups run.json lists, or None when it lists none (then the folder is searched)."""
    traces = run.get("traces")
    if not traces:
        return None
    if not isinstance(traces, dict):
        raise InputError(f"{run_dir / RUN_FILE}: 'traces' is not an object of rank -> files")
    groups = []
    for rank, files in sorted(traces.items(), key=lambda kv: (len(str(kv[0])), str(kv[0]))):
        files = [files] if isinstance(files, str) else files
        try:
            rank = int(rank)
            paths = [run_dir / f for f in files]
        except (TypeError, ValueError):
            raise InputError(f"{run_dir / RUN_FILE}: bad 'traces' entry for rank {rank!r}") from None
        if paths:
            groups.append(TraceGroup(paths, run_rank=rank))
    return groups


def _run_dir_traces(run_dir: Path) -> list[TraceGroup]:
    """A run directory whose run.json lists no traces yet (a run still going, or cut short):
    its top-level ``*.pt.trace.json[.gz]`` files, grouped by the rank in their names."""
    by_rank: dict[int | None, list[Path]] = {}
    for f in sorted(run_dir.glob("*.pt.trace.json*")):
        if f.name.endswith(_SUFFIXES):
            by_rank.setdefault(rank_from_name(f.name), []).append(f)
    groups = [TraceGroup(files, run_rank=rank) for rank, files in by_rank.items() if rank is not None]
    return groups + [TraceGroup([f]) for f in by_rank.get(None, [])]


def _folder_files(folder: Path) -> list[Path]:
    found = [
        p
        for p in folder.rglob("*")
        if p.name.endswith(_SUFFIXES)
        and p.name != RUN_FILE
        and not any(part.startswith(".") for part in p.relative_to(folder).parts)
        and p.is_file()
        and not is_saved_report(p)
    ]
    return sorted(found)


def discover(paths) -> Inputs:
    """Expand files, folders and run directories into per-rank groups of trace files.

    Raises InputError when a path does not exist or nothing traceable is found.
    """
    if isinstance(paths, (str, Path)):
        paths = [paths]
    inputs = Inputs()
    runs = []
    for raw in paths:
        path = Path(raw)
        if not path.exists():
            raise InputError(f"{path}: no such file or directory")
        if path.is_dir():
            if (path / RUN_FILE).is_file():
                run = _read_run(path)
                runs.append(run)
                groups = _run_groups(path, run) or _run_dir_traces(path)
                if not groups:
                    raise InputError(f"{path}: run directory without traces (see its run.json and logs/)")
                inputs.groups.extend(groups)
                continue
            files = _folder_files(path)
            if not files:
                raise InputError(f"{path}: no trace files (*.json, *.json.gz) in this folder")
            inputs.groups.extend(TraceGroup([f]) for f in files)
        else:
            inputs.groups.append(TraceGroup([path]))
    if not inputs.groups:
        raise InputError("no trace files given")
    if len(runs) == 1:
        inputs.run = runs[0]
    seen: dict[Path, Path] = {}
    for group in inputs.groups:
        for f in group.files:
            key = f.resolve()
            if key in seen:
                raise InputError(f"{f}: given twice")
            seen[key] = f
    return inputs
