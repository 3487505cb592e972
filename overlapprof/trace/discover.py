"""Finding trace files: from run directories, folders and files to groups of files per rank.

- A **run directory** of ``overlapprof run`` has a ``run.json`` whose ``"traces"`` maps each rank
  to its trace files (``{"0": ["rank0.<ns>.pt.trace.json", ...]}``, relative to the directory;
  see ``overlapprof/rundir/run_record.py``). With ``--repeat`` a rank has several files, one per
  profiler cycle: they are one rank, analyzed together. While run.json lists none (a run cut
  short), the directory's ``rank<N>.*.pt.trace.json[.gz]`` files are grouped by rank instead.
- A **folder** is searched recursively (hidden entries skipped). A subfolder holding a
  ``run.json`` is a run directory, read as above and not searched; elsewhere every ``*.json`` and
  ``*.json.gz`` file is a trace (``run.json`` and saved overlapprof reports skipped).
- A **file** is taken as a trace whatever its name.

Run directories, given or found, must be one run: several runs (variants, repeats) are different
jobs, not ranks of one, so analyzing them together is refused with the list of them (analyze one,
or ``overlapprof compare`` them). The exception is the directories of one multi-node run on
filesystems that are not shared: one per node, each with its own ranks, same ``run_id`` and name.
A folder holding run directories and other trace files is refused too (which run would they be
part of?).

A folder may hold **execution traces** beside the Kineto traces (the Chakra / PARAM layout,
``*_et.json[.gz]``: an object with ``schema`` and ``nodes``, no ``traceEvents``): they are skipped with a
note (given by name, one is refused with a message saying what it is). **Profiler cycles of one
process**: TensorBoard-plugin names ``<worker>.<span>.pt.trace.json`` (``tensorboard_trace_handler``)
whose ``<worker>`` repeats (``host_41.1700000000001...`` and ``host_41.1700000090001...``: a
schedule with ``repeat`` > 1) are the cycles of one process, not two ranks: each worker's files,
in span order, are one rank (as a run directory's ``--repeat`` cycles); workers that saved
different numbers of cycles are refused. ``cycle`` (``--cycle N``) keeps each rank's N-th cycle
alone, of a run directory or of such a folder.

Each group of files becomes a :class:`TraceGroup`; its rank is settled later, from the traces'
``distributedInfo``, else the run.json, else the file name (``rank-3``, ``rank3``, ``rank_3``,
``sampled_rank-1``...), else the order of the inputs.
"""

from __future__ import annotations

import os
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from overlapprof.errors import InputError
from overlapprof.rundir import RUN_FILE
from overlapprof.trace import nsys
from overlapprof.trace.kineto import BOM, TRACE_EVENTS, WORKER_NAME

if TYPE_CHECKING:  # imported where a run directory is read: traces given alone do not need it
    from overlapprof.rundir import run_record

_RANK_IN_NAME = re.compile(r"(?:^|[^a-z])rank[-_]?(\d+)(?!\d)", re.IGNORECASE)
_SUFFIXES = (".json", ".json.gz", ".sqlite")
_ET_SNIFF = 1 << 16


@dataclass
class TraceGroup:
    """The trace files of one rank (several only for the profiler cycles of a run directory)."""

    files: list[Path]
    run_rank: int | None = None  # the rank run.json lists these files under

    @property
    def size(self) -> int:
        """The files' bytes (a rank of an Nsight Systems export: the export's)."""
        paths = [Path(nsys.split(f)[0]) for f in self.files]
        return sum(p.stat().st_size for p in paths if p.is_file())


@dataclass
class Inputs:
    """What the paths given to ``analyze`` amount to."""

    groups: list[TraceGroup] = field(default_factory=list)
    run: run_record.RunRecord | None = None  # the run.json of the run directory (or its node parts)
    notes: list[str] = field(default_factory=list)  # what was skipped, and why


def rank_from_name(name: str) -> int | None:
    """The rank a trace file's name gives (``rank-3.json`` -> 3), or None."""
    if nsys.is_member(name):  # one of several processes of an export: its name is the file's, not its own
        return None
    m = _RANK_IN_NAME.search(name)
    return int(m.group(1)) if m else None


def _head(path, size: int) -> bytes | None:
    """The first ``size`` bytes of the file at ``path``; None when it cannot be read."""
    try:
        with Path(path).open("rb") as f:
            return f.read(size)
    except OSError:
        return None


def text_head(path, size: int) -> bytes | None:
    """The first ``size`` bytes of the file's text: inflated when it is gzip, without a UTF-8
    byte-order mark; None when it cannot be read (a damaged gzip reads as far as it can)."""
    head = _head(path, size)
    if head is not None and head[:2] == b"\x1f\x8b":
        inflater = zlib.decompressobj(31)
        try:
            with Path(path).open("rb") as f:
                head = b""
                while len(head) < size and (piece := f.read(1 << 16)):
                    head += inflater.decompress(piece, size - len(head))
                    while inflater.unconsumed_tail and len(head) < size:
                        head += inflater.decompress(inflater.unconsumed_tail, size - len(head))
        except (OSError, zlib.error):
            pass
    return None if head is None else head[3:] if head[:3] == BOM else head


def is_trace_file(path: Path, sniff: int = 1 << 20) -> bool:
    """Is ``path`` an existing trace file (which an output must never overwrite)? Gzip, or
    ``"traceEvents"`` in its first ``sniff`` bytes."""
    head = _head(path, sniff)
    if head is None:
        return False
    return head[:2] == b"\x1f\x8b" or TRACE_EVENTS in head or head.startswith(nsys.SQLITE_MAGIC)


def is_saved_report(path: Path) -> bool:
    """Does the file start like a saved overlapprof Report (whose first key is ``schema``)?"""
    head = text_head(path, 64)
    if head is None:
        return False
    return head.lstrip().replace(b" ", b"").replace(b"\n", b"").startswith(b'{"schema":"overlapprof.report/')


def is_saved_comparison(path: Path) -> bool:
    """Does the file start like a saved Comparison (first key ``schema``)?"""
    head = text_head(path, 64)
    return head is not None and b"".join(head.split()).startswith(b'{"schema":"overlapprof.comparison/')


def is_exported_timeline(path: Path) -> bool:
    """Does the file start like ``overlapprof export``'s timeline (``otherData.producer`` first)?
    It is trace-event JSON, but of unions already measured, not of a profiler's events."""
    head = text_head(path, 256)
    return head is not None and b'"otherData":{"producer":"overlapprof' in b"".join(head.split())


def own_output_error(path: Path) -> str | None:
    """Why an output of overlapprof's is not a trace to analyze (None: it is not one)."""
    if is_saved_comparison(path):
        return (f"{path}: a saved comparison (overlapprof compare --json), not a trace: re-render it with "
                f"`overlapprof compare {path}` or `overlapprof report {path}`")
    if is_exported_timeline(path):
        return (f"{path}: a timeline written by `overlapprof export`, not a profiler trace: open it in Perfetto "
                "or chrome://tracing, and analyze the traces it was made from")
    return None


def is_execution_trace(path: Path, sniff: int = _ET_SNIFF) -> bool:
    """Is the file a Chakra / PARAM execution trace (an object with ``"schema"`` and ``"nodes"``
    in the first ``sniff`` bytes of its text, gzipped or not, and no ``"traceEvents"``)?"""
    head = text_head(path, sniff)
    if head is None:
        return False
    return (head.lstrip()[:1] == b"{" and b'"schema"' in head and b'"nodes"' in head
            and TRACE_EVENTS not in head and not is_saved_report(Path(path)))


def _cycles_of_each_process(groups: list[TraceGroup], base: Path | None, notes: list[str],
                            cycle: int | None = None) -> list[TraceGroup]:
    """The single-file traces named ``<worker>.<span>.pt.trace.json`` (``tensorboard_trace_handler``'s
    names) whose worker repeats are the profiler cycles of one process (``repeat`` > 1), not
    ranks: each worker's files, in the order of their spans, become one group (one rank, as the
    cycles of a run directory's rank do). InputError when the workers saved different numbers
    of cycles (a cycle would lack ranks): ``--cycle N`` picks one that every worker has."""
    by_worker: dict[str, list[tuple[int, TraceGroup]]] = {}
    for g in groups:
        if g.run_rank is None and len(g.files) == 1 and (m := WORKER_NAME.match(g.files[0].name)):
            by_worker.setdefault(m.group(1), []).append((int(m.group(2)), g))
    if not any(len(gs) > 1 for gs in by_worker.values()):
        return groups
    counts = {w: len(gs) for w, gs in by_worker.items()}
    if base is None and len(parents := {g.files[0].parent for gs in by_worker.values() for _, g in gs}) == 1:
        base = parents.pop()  # files given from one folder: named by it
    where = f"{base}:" if base else "given:"
    if len(set(counts.values())) > 1 and cycle is None:
        listed = ", ".join(f"{w} {n}" for w, n in list(counts.items())[:6]) + (" ..." if len(counts) > 6 else "")
        raise InputError(
            f"{where} the processes saved different numbers of profiler cycles ({listed}): a cycle would lack "
            f"ranks; analyze the cycle every process has with --cycle N (N up to {min(counts.values())})")
    low, high = min(counts.values()), max(counts.values())
    cycles = f"{low}" if low == high else f"{low}-{high}"
    what = f"cycle {cycle} of each analyzed (--cycle {cycle})" if cycle else (
        "each process's cycles are one rank (--cycle N for one cycle)")
    notes.append(f"{where} {cycles} profiler cycles of each of {len(counts)} process(es) (tensorboard_trace_handler "
                 f"files, repeat={cycles}): {what}")
    merged = {id(gs[0][1]): TraceGroup([g.files[0] for _, g in sorted(gs, key=lambda sg: sg[0])])
              for gs in by_worker.values()}
    kept = {id(g) for gs in by_worker.values() for _, g in gs}
    return [merged[id(g)] if id(g) in merged else g for g in groups if id(g) in merged or id(g) not in kept]


def _one_cycle(groups: list[TraceGroup], cycle: int) -> list[TraceGroup]:
    """Each rank's ``cycle``-th profiler cycle (1: the first); InputError when a rank has fewer."""
    short = next((g for g in groups if len(g.files) < cycle), None)
    if short is not None:
        rank = "" if short.run_rank is None else f"rank {short.run_rank}: "
        raise InputError(f"--cycle {cycle}: {rank}{short.files[0]} is one of {len(short.files)} profiler cycle(s) "
                         f"of its rank; give --cycle 1 to {max(1, min(len(g.files) for g in groups))}")
    return [TraceGroup([g.files[cycle - 1]], run_rank=g.run_rank) for g in groups]


def _read_run(run_dir: Path) -> run_record.RunRecord:
    from overlapprof.rundir.run_record import decode_run

    path = run_dir / RUN_FILE
    try:
        return decode_run(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: unreadable run description ({exc})") from None


def _run_groups(run_dir: Path, run: run_record.RunRecord) -> list[TraceGroup] | None:
    """The groups run.json lists, or None when it lists none (then the folder is searched)."""
    traces = run.traces
    if not traces:
        return None
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


def _is_trace_name(name: str) -> bool:
    return name.endswith(_SUFFIXES) and name != RUN_FILE and not name.startswith(".")


def search(folder: str | Path) -> tuple[list[Path], list[Path]]:
    """(run directories, other trace files) at or below ``folder``, sorted. Hidden entries are
    skipped; a run directory (a folder holding run.json) is not searched further."""
    runs, files = [], []
    for root, dirs, names in os.walk(folder):
        root = Path(root)
        if RUN_FILE in names:
            runs.append(root)
            dirs[:] = []
            continue
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        files += [root / n for n in names if _is_trace_name(n)]
    files = [f for f in files if f.is_file() and not is_saved_report(f) and own_output_error(f) is None]
    return sorted(runs), sorted(files)


def _job(run_dir: Path, run: run_record.RunRecord):
    """What identifies the job of a run directory: the parts of a multi-node run share it."""
    if run.run_id and run.nnodes > 1:
        return ("run_id", run.run_id, run_dir.name)
    return ("dir", run_dir.resolve())


def _one_job(runs: list[tuple[Path, run_record.RunRecord]], base: Path | None = None) -> None:
    """InputError unless the run directories are (the node parts of) one run; ``base``: the
    folder they were found in (they are named relative to it)."""
    jobs = {}
    for run_dir, run in runs:
        jobs.setdefault(_job(run_dir, run), (run_dir, run))
    if len(jobs) < 2:
        return
    # In the order they ran: the suggested compare takes the first as its baseline (sync before async).
    firsts = sorted(jobs.values(), key=lambda dr: (dr[1].created is None, dr[1].created or 0.0))
    dirs = [run_dir for run_dir, _ in firsts]
    names = [str(d.relative_to(base)) if base else str(d) for d in dirs]
    listed = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
    what = f"{base}: holds {len(dirs)} different runs" if base else f"{len(dirs)} different runs given"
    raise InputError(
        f"{what} ({listed}), not ranks of one job: analyze one of them (overlapprof analyze {dirs[0]}) "
        f"or compare them (overlapprof compare {dirs[0]} {dirs[1]}{' ...' if len(dirs) > 2 else ''})"
    )


def _merged_run(runs: list[tuple[Path, run_record.RunRecord]]) -> run_record.RunRecord:
    """run.json of one run; for the node parts of a multi-node run, theirs with the per-node and
    per-rank records (nodes, ranks, traces) merged and the missing ranks recomputed."""
    from overlapprof.rundir.run_record import missing_ranks

    run = runs[0][1]
    if len(runs) > 1:
        merged = {key: {k: v for _, part in runs for k, v in getattr(part, key).items()}
                  for key in ("nodes", "ranks", "traces")}
        run = msgspec.structs.replace(
            run, **merged, missing_ranks=missing_ranks(run.world_size, merged["ranks"]))
    return run


def _file_groups(path: Path, notes: list[str]) -> list[TraceGroup]:
    """A trace file's groups: itself, or one per rank of an Nsight Systems export. A report
    (``.nsys-rep``) is exported first when ``nsys`` is on PATH (:func:`overlapprof.trace.nsys.export`),
    else refused with the command that exports it."""
    if nsys.is_report(path):
        path = nsys.export(path, notes)
    if nsys.is_sqlite(path):
        return [TraceGroup([Path(name)]) for name in nsys.ranks_of(path)]
    return [TraceGroup([path])]


def discover(paths, cycle: int | None = None) -> Inputs:
    """Expand files, folders and run directories into per-rank groups of trace files; ``cycle``:
    only each rank's ``cycle``-th profiler cycle (1: the first).

    Raises InputError when a path does not exist, nothing traceable is found, or the inputs
    hold several runs (see the module docstring).
    """
    if isinstance(paths, (str, Path)):
        paths = [paths]
    inputs = Inputs()
    runs: list[tuple[Path, dict]] = []
    for raw in paths:
        path = Path(raw)
        if not path.exists():
            raise InputError(f"{path}: no such file or directory")
        if not path.is_dir():
            if (why := own_output_error(path)) is not None:
                raise InputError(why)
            if is_execution_trace(path):
                raise InputError(f"{path}: an execution trace (Chakra/PARAM 'schema'/'nodes'), not a PyTorch "
                                 "profiler trace: give the Kineto trace (*.pt.trace.json) recorded beside it")
            inputs.groups.extend(_file_groups(path, inputs.notes))
        elif (path / RUN_FILE).is_file():
            runs.append((path, _read_run(path)))
        else:
            found, files = search(path)
            if found and files:
                raise InputError(
                    f"{path}: holds run directories ({found[0]}{' ...' if len(found) > 1 else ''}) and other trace "
                    f"files ({files[0]}{' ...' if len(files) > 1 else ''}): name the run or the traces to analyze"
                )
            et = [f for f in files if is_execution_trace(f)]
            if et:
                files = [f for f in files if f not in et]
                shown = ", ".join(str(f.relative_to(path)) for f in et[:3]) + (" ..." if len(et) > 3 else "")
                inputs.notes.append(f"{path}: skipped {len(et)} execution trace(s) (Chakra/PARAM 'schema'/'nodes', "
                                    f"not a profiler trace): {shown}")
            if not found and not files:
                what = "only execution traces (Chakra/PARAM), no" if et else "no"
                raise InputError(f"{path}: {what} trace files (*.json, *.json.gz, *.sqlite) in this folder")
            found = [(d, _read_run(d)) for d in found]
            _one_job(found, path)
            runs += found
            groups = [g for f in files for g in _file_groups(f, inputs.notes)]
            inputs.groups.extend(_cycles_of_each_process(groups, path, inputs.notes, cycle))
    _one_job(runs)
    for run_dir, run in runs:
        groups = _run_groups(run_dir, run) or _run_dir_traces(run_dir)
        if not groups:
            from overlapprof.rundir.blame import incomplete_rank

            if short := incomplete_rank(run):
                raise InputError(f"{run_dir}: no traces: run.json says the run is incomplete (rank {short[0]}: "
                                 f"{short[1]})")
            raise InputError(f"{run_dir}: run directory without traces (see its run.json and logs/)")
        inputs.groups.extend(groups)
    if not inputs.groups:
        raise InputError("no trace files given")
    inputs.groups = _cycles_of_each_process(inputs.groups, None, inputs.notes, cycle)
    if cycle is not None:
        inputs.groups = _one_cycle(inputs.groups, cycle)
    if runs:
        from overlapprof.rundir.blame import status_note

        inputs.run = _merged_run(runs)
        if note := status_note(inputs.run):
            inputs.notes.append(note)
    seen: dict[Path, Path] = {}
    for group in inputs.groups:
        for f in group.files:
            key = f.resolve()
            if key in seen:
                raise InputError(f"{f}: given twice")
            seen[key] = f
    return inputs
