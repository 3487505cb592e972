"""The overlap metrics as TensorBoard scalars, written next to a run's traces.

A run directory is a TensorBoard logdir: torch-tb-profiler reads its ``rank{N}.<span>.pt.trace.json``
files (one worker per rank), and this module adds, per rank, an event file of scalars that the
Scalars dashboard shows without any plugin::

    <run_dir>/scalars/rank{N}/events.out.tfevents.<...>.overlapprof

A folder of traces outside a run directory (``tensorboard_trace_handler``'s, one file per process
and profiler cycle) gets the same ``<folder>/scalars/``, its files analyzed as one job.

TensorBoard names that run ``scalars/rank{N}`` (``<run_dir name>/scalars/rank{N}`` when the logdir
is the folder above), so one chart of a tag overlays the ranks, and the variants when several run
directories are viewed together.

Tags (one point per ProfilerStep, at step = N of ``ProfilerStep#N``; a trace without steps gets
one point at step 0 with the whole-trace values). Values are rank-0 ``DT_FLOAT`` tensors, the one
tensor type both of TensorBoard's loaders read as a scalar: the Python loader (``--load_fast
false``) reads any numeric dtype, but the default fast loader (rustboard, the
``tensorboard-data-server`` binary) turns only ``DT_FLOAT`` rank-0 tensors (and TF1
``simple_value``) into scalars and drops every other point as data loss, so float64 points left
plain ``tensorboard --logdir`` with no tags at all. A value is therefore the Report's number
rounded to float32 (24-bit mantissa: 7 significant digits, e.g. 0.06 µs at 1 s); the report's JSON
keeps the exact numbers:

    overlap/ratio            overlapped_us / comm_us (no point when the step has no communication)
    overlap/exposed_comm_us  |U(comm) \\ U(compute)|, µs
    overlap/overlapped_us    |U(comm) ∩ U(compute)|, µs
    overlap/comm_us          |U(comm)|, µs
    overlap/compute_us       |U(compute)|, µs
    overlap/step_us          the step's wall span, µs
    overlap/exposed_share    exposed_comm_us / step_us

Uses TensorBoard's own event-file writer and protos (the ``tensorboard`` extra), never torch.
The scalars are written into a temporary folder that is renamed into place, so ``scalars/`` is
either complete or absent; an existing one is never overwritten.
"""

from __future__ import annotations

import os
import shutil
import struct
import time
from pathlib import Path

from overlapprof.errors import OverlapprofError
from overlapprof.report import StepMetrics
from overlapprof.report.exposure import CAUSES
from overlapprof.report.labels import Label, labelled, of_rows

SCALAR_DIR = "scalars"


def tags(labels: tuple[Label, ...] | None = None) -> dict[str, tuple[str, str]]:
    """{tag: (field, description)}: a step's labelled fields (``labels``; default StepMetrics',
    :mod:`overlapprof.report.labels`) under ``overlap/``, then the partition, the causes and the
    bounds."""
    labels = labelled(StepMetrics) if labels is None else labels
    return {**{f"overlap/{label.tag}": (label.name, f"{label.description}, {label.unit}") for label in labels},
            **_MORE_TAGS}


def report_tags(report) -> dict[str, tuple[str, str]]:
    """The :func:`tags` of ``report``'s steps (StepMetrics, or a subclass with more labelled fields)."""
    return tags(of_rows([s for r in report.ranks for s in r.steps], StepMetrics))


_MORE_TAGS = {
    # The step partition (report.Partition): the four parts sum to the step time.
    "partition/compute_us": ("partition.compute_us", "|U(compute) ∩ step|, µs"),
    "partition/exposed_comm_us": ("partition.exposed_comm_us", "|U(comm) \\ U(compute) ∩ step|, µs"),
    "partition/exposed_memory_us": ("partition.exposed_memory_us", "memory under neither compute nor comm, µs"),
    "partition/idle_us": ("partition.idle_us", "step time with none of them, µs"),
    # Why communication is exposed (report.Exposure): the five causes sum to overlap/exposed_comm_us.
    **{f"why/{c}_us": (f"exposure.{c}_us", f"exposed communication caused by {c}, µs") for c in CAUSES},
    # What overlap could buy (OVERLAP.md section 6.2).
    "bounds/comm_free_bound_us": ("comm_free_bound_us", "step − exposed communication, µs"),
    "bounds/overlap_bound_us": ("overlap_bound_us", "the shortest step overlap could give, µs"),
}
TAGS = tags()


def _value(m, attr: str):
    """``m.attr``, following dots (``partition.idle_us``); None where a link is missing."""
    for name in attr.split("."):
        m = getattr(m, name, None)
    return m


class TensorBoardMissing(OverlapprofError):
    """TensorBoard (the ``tensorboard`` extra) is not installed."""


def has_scalars(run_dir: str | Path) -> bool:
    return (Path(run_dir) / SCALAR_DIR).is_dir()


def as_float32(value: float) -> float:
    """``value`` rounded to the nearest float32, as TensorBoard stores and serves it."""
    return struct.unpack("<f", struct.pack("<f", value))[0]


def scalar_points(report) -> dict[int, list[tuple[int, dict[str, float]]]]:
    """{rank: [(step, {tag: value})]}: what :func:`write_scalars` writes, each value the report's
    rounded to float32 (what TensorBoard serves back)."""
    points, shown = {}, report_tags(report)
    for r in report.ranks:
        rows = [(s.step, s) for s in r.steps] or [(0, r.metrics)]
        points[r.rank] = [
            (step, {tag: as_float32(float(v)) for tag, (attr, _) in shown.items() if (v := _value(m, attr)) is not None})
            for step, m in rows
        ]
    return points


def _proto():
    try:
        from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2
        from tensorboard.plugins.scalar import metadata
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
    except ImportError:
        raise TensorBoardMissing("TensorBoard is not installed: pip install 'overlapprof[tensorboard]'") from None
    return event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2, metadata, EventFileWriter


def write_scalars(report, run_dir: str | Path) -> Path | None:
    """Write the report's per-step metrics as scalars into ``<run_dir>/scalars/rank{N}/``.

    Returns the scalars folder, or None when it already exists (never overwritten)."""
    event_pb2, summary_pb2, tensor_pb2, shape_pb2, types_pb2, metadata, EventFileWriter = _proto()
    final = Path(run_dir) / SCALAR_DIR
    if final.exists():
        return None
    tmp = Path(run_dir) / f".{SCALAR_DIR}.{os.getpid()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    scalar_shape = shape_pb2.TensorShapeProto()
    metas = {tag: metadata.create_summary_metadata(display_name=tag, description=desc)
             for tag, (_, desc) in report_tags(report).items()}
    wall = time.time()
    try:
        for rank, rows in scalar_points(report).items():
            writer = EventFileWriter(str(tmp / f"rank{rank}"), filename_suffix=".overlapprof")
            for step, values in rows:
                summary = summary_pb2.Summary(value=[
                    summary_pb2.Summary.Value(
                        tag=tag, metadata=metas[tag],
                        tensor=tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT, tensor_shape=scalar_shape,
                                                      float_val=[value]))
                    for tag, value in values.items()
                ])
                writer.add_event(event_pb2.Event(wall_time=wall, step=step, summary=summary))
            writer.close()
        tmp.rename(final)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise OverlapprofError(f"{run_dir}: cannot write TensorBoard scalars ({exc.strerror or exc})") from None
    return final


def run_dirs_under(path: str | Path) -> list[Path]:
    """``overlapprof run`` directories (holding a run.json) at or below ``path`` (hidden folders
    skipped)."""
    from overlapprof.rundir import RUN_FILE
    from overlapprof.trace.discover import search

    path = Path(path)
    return [path] if (path / RUN_FILE).is_file() else search(path)[0]


def trace_folders_under(path: str | Path) -> dict[Path, list[Path]]:
    """{folder: its trace files} of the folders at or below ``path`` that hold traces outside a
    run directory (a ``tensorboard_trace_handler`` folder: one file per process and cycle)."""
    from overlapprof.rundir import RUN_FILE
    from overlapprof.trace.discover import search

    path = Path(path)
    if (path / RUN_FILE).is_file():
        return {}
    folders: dict[Path, list[Path]] = {}
    for f in search(path)[1]:
        folders.setdefault(f.parent, []).append(f)
    return folders


def ensure_scalars(path: str | Path, log=None) -> list[Path]:
    """Write the missing scalars of every run directory, and of every other folder of traces
    (its files as one job: a ``tensorboard_trace_handler`` folder, its cycles included), at or
    below ``path``; returns the folders written. One that cannot be analyzed is reported through
    ``log(line)``, with the reason, and skipped."""
    from overlapprof.analysis import analyze

    todo = [(run_dir, [str(run_dir)]) for run_dir in run_dirs_under(path)]
    todo += [(folder, [str(f) for f in files]) for folder, files in trace_folders_under(path).items()]
    written = []
    for folder, inputs in todo:
        if has_scalars(folder):
            continue
        try:
            if write_scalars(analyze(inputs), folder):
                written.append(folder)
        except TensorBoardMissing:
            raise
        except OverlapprofError as exc:
            if log:
                log(f"no scalars for {folder}: {exc}")
    return written
