"""Kineto's quirks, in one place: what the PyTorch profiler's traces call things, across torch
versions, vendors and writers. Everything else reads traces through these names.

- **Categories.** An event's ``cat`` is read as one of a few codes (small ints, so that the
  classification is a numpy array). Old Kineto versions' names (``Kernel``, ``Memcpy``,
  ``Memset``, ``Runtime``, ``Operator``) are today's; any vendor's ``*_runtime``/``*_driver`` is
  a runtime call; events of torch's autograd profiler before Kineto (2020) have no category:
  their process is named ``CPU functions`` or ``CUDA functions`` (:data:`LEGACY_PROCESSES`).
- **Device categories.** Device work is kernels, copies and memsets (:data:`GPU_CATEGORIES`).
  A category not known here (:data:`UNKNOWN`: MTIA's ``mtia_ccp_events``, a bare
  ``privateuse1``, IBM Spyre's ``aiu*``, ``cuda_profiler_range``) is device activity when it
  runs in a process that holds no host event; the known categories that are not device work,
  though some sit on a device's lanes, are :data:`NOT_DEVICE_WORK`.
- **Args keys.** The keys of an event's ``args`` that overlapprof reads (``correlation``,
  ``External id``, ``record_param_comms``' ``Collective name``, ``Process Group Ranks``, ...)
  are named here; the decoder's structs and the records' search read these names.
- **Layouts.** Kineto writes every event of ``traceEvents`` on a new line indented by two
  spaces (:data:`EVENT_START`: the reader cuts the text there); other writers put the file on
  one line, or write the trace-event format's "JSON Array Format" (the events alone, as torch's
  autograd profiler did: :func:`is_array_layout`), some after a UTF-8 byte-order mark
  (:data:`BOM`). ``tensorboard_trace_handler`` names files ``<worker>.<span>.pt.trace.json[.gz]``
  (:data:`WORKER_NAME`).
- **Time units.** ``ts`` and ``dur`` are microseconds (int or float) on the trace's own clock;
  ``baseTimeNanoseconds`` (nanoseconds, when present) puts them on the host's clock
  (:func:`base_us`). Without it, only Unix-epoch timestamps (:data:`EPOCH_MIN_US`) are absolute.
"""

from __future__ import annotations

import re

# Category codes. UNKNOWN: a category this module does not know (or none): device work left out
# when it runs in a device's process.
OTHER, KERNEL, MEMCPY, MEMSET, RUNTIME, CPU_OP, ANNOTATION, UNKNOWN, SYNC = range(9)
CATEGORIES = 9  # how many codes
GPU_CATEGORIES = (KERNEL, MEMCPY, MEMSET)
CATEGORY_CODES = {
    "kernel": KERNEL,
    "Kernel": KERNEL,
    "gpu_memcpy": MEMCPY,
    "Memcpy": MEMCPY,
    "gpu_memset": MEMSET,
    "Memset": MEMSET,
    "cuda_runtime": RUNTIME,
    "cuda_driver": RUNTIME,
    "Runtime": RUNTIME,
    "cpu_op": CPU_OP,
    "Operator": CPU_OP,
    "user_annotation": ANNOTATION,
    "cuda_sync": SYNC,
}
# Kineto's categories that are not device work, though some sit on a device's lanes: the GPU's
# copy of the user's annotations, its synchronization records, the trace's span markers, and the
# host's Python frames (many: known here so that the scan never looks at their processes).
NOT_DEVICE_WORK = frozenset({"gpu_user_annotation", "cuda_sync", "Trace", "python_function"})
LEGACY_PROCESSES = {"CPU functions": CPU_OP, "CUDA functions": KERNEL}
STREAM_WAIT = "Stream Wait Event"  # a cuda_sync event: a stream waits for another stream's event


def category_code(cat: str) -> int:
    """The category code of an event's ``cat`` (runtime covers ``*_runtime`` of any vendor)."""
    code = CATEGORY_CODES.get(cat)
    if code is not None:
        return code
    if cat.endswith("_runtime") or cat.endswith("_driver"):
        return RUNTIME
    return OTHER if cat in NOT_DEVICE_WORK else UNKNOWN


# The keys of an event's ``args`` that overlapprof reads. Every event: ``correlation`` pairs a
# GPU event with its runtime call; a cuda_sync event's WAIT_CORRELATION names the
# ``cudaEventRecord`` call whose event its stream waits for. Then ``record_param_comms``'
# collective parameters (some traces write ``seq``, not ``Seq``), and the shapes and dtypes of
# ``record_shapes``; c10d::send/recv_'s peers.
CORRELATION = "correlation"
WAIT_CORRELATION = "wait_on_cuda_event_record_corr_id"
EXTERNAL_ID = "External id"
STREAM = "stream"
DEVICE = "device"
COLLECTIVE_NAME = "Collective name"
IN_NELEMS = "In msg nelems"
OUT_NELEMS = "Out msg nelems"
DTYPE = "dtype"
GROUP_SIZE = "Group size"
PG_NAME = "Process Group Name"
PG_DESC = "Process Group Description"
PG_RANKS = "Process Group Ranks"
SEQ = "Seq"
SEQ_LOWER = "seq"
INPUT_DIMS = "Input Dims"
INPUT_TYPE = "Input type"
SRC_RANK = "Src Rank"
DST_RANK = "Dst Rank"
CONCRETE_INPUTS = "Concrete Inputs"

EVENT_START = b"\n  {"  # where each event of Kineto's traceEvents starts
TRACE_EVENTS = b'"traceEvents"'  # the key of the events, in a trace's text
BOM = b"\xef\xbb\xbf"  # UTF-8's byte-order mark: Windows tools write it; JSON decoders refuse it
WORKER_NAME = re.compile(r"^(.+)\.(\d+)\.pt\.trace\.json(?:\.gz)?$")  # worker, span


def without_bom(data):
    """``data`` (bytes-like) without a leading UTF-8 byte-order mark (a view, not a copy)."""
    return memoryview(data)[len(BOM):] if data[: len(BOM)] == BOM else data


def is_array_layout(data) -> bool:
    """Does the text start (after a BOM and whitespace) with ``[``: the Chrome trace-event format's
    "JSON Array Format", the events alone, as torch's autograd profiler wrote them before
    Kineto (2020)?"""
    return bytes(without_bom(data[:4096])).lstrip()[:1] == b"["


EPOCH_MIN_US = 1e15  # 1e15 µs after the Unix epoch is in 2001: a smaller ts is on a trace's own clock


def base_us(base_ns: int | None) -> float:
    """``baseTimeNanoseconds`` in µs, what ``ts`` adds to be on its host's clock (0 without one)."""
    return base_ns / 1000 if base_ns else 0.0
