"""Classes of events (OVERLAP.md section 1) and kinds of communication (section 3).

A rank's trace is read in **GPU mode** when it holds device kernels (``cat == "kernel"``):
communication is the kernels whose name matches ``nccl``/``rccl`` (any case) or a user pattern,
compute every other kernel, memory the ``gpu_memcpy``/``gpu_memset`` events. Otherwise in
**CPU mode**: communication is the ``user_annotation`` spans named ``<backend>:<op>``
(``gloo:all_reduce``, ``nccl:recv 0<-1``), compute the ``cpu_op`` spans except the
communication wrappers (``c10d::*``, ``record_param_comms``) and the ``ProfilerStep#N`` step
markers that old traces record as ``cpu_op``.

Only complete events (``"ph": "X"``) have a duration and count. Category names of old Kineto
versions (``Kernel``, ``Memcpy``, ``Memset``, ``Runtime``, ``Operator``) are read as today's.
"""

from __future__ import annotations

import re

KINDS = (
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "broadcast",
    "reduce",
    "all_to_all",
    "send_recv",
    "barrier",
    "other",
)

# Category codes (small ints so the classification is a numpy array).
OTHER, KERNEL, MEMCPY, MEMSET, RUNTIME, CPU_OP, ANNOTATION = range(7)
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
}

COMM_KERNEL = re.compile(r"nccl|rccl", re.IGNORECASE)
COMM_ANNOTATION = re.compile(r"^[A-Za-z0-9_]+:[A-Za-z0-9_]+(?:\s.*)?$", re.DOTALL)
STEP_NAME = re.compile(r"^ProfilerStep#(\d+)$")
PARAM_COMMS = "record_param_comms"

# Ordered: the first match wins ("allreduce" before "reduce", "reducescatter" before "reduce").
_KIND_PATTERNS = (
    ("all_to_all", ("alltoall",)),
    ("all_reduce", ("allreduce",)),
    ("all_gather", ("allgather",)),
    ("reduce_scatter", ("reducescatter",)),
    ("broadcast", ("broadcast", "bcast")),
    ("send_recv", ("sendrecv", "send", "recv")),
    ("barrier", ("barrier",)),
    ("reduce", ("reduce",)),
)
_NOT_ALNUM = re.compile(r"[^a-z0-9]")


def category_code(cat: str) -> int:
    """The category code of an event's ``cat`` (runtime covers ``*_runtime`` of any vendor)."""
    code = CATEGORY_CODES.get(cat)
    if code is not None:
        return code
    return RUNTIME if cat.endswith("_runtime") or cat.endswith("_driver") else OTHER


def comm_kind(name: str) -> str:
    """The kind of a communication kernel or annotation, from its name.

    ``ncclKernel_AllReduce_RING_LL_Sum_float(...)`` -> all_reduce,
    ``ncclDevKernel_SendRecv`` -> send_recv, ``nccl:_allgather_base`` -> all_gather,
    ``nccl:reduce_scatter_tensor_coalesced`` -> reduce_scatter, ``gloo:recv`` -> send_recv.
    Kernel arguments (after ``(``) are ignored.
    """
    key = _NOT_ALNUM.sub("", name.split("(", 1)[0].lower())
    for kind, needles in _KIND_PATTERNS:
        if any(n in key for n in needles):
            return kind
    return "other"


def compile_comm_kernels(patterns) -> re.Pattern:
    """One regex for the comm kernels: nccl/rccl plus the user's patterns (each a regex)."""
    extra = [p if isinstance(p, str) else p.pattern for p in patterns or ()]
    if not extra:
        return COMM_KERNEL
    return re.compile("|".join([COMM_KERNEL.pattern, *(f"(?:{p})" for p in extra)]), re.IGNORECASE)


def is_comm_wrapper(name: str) -> bool:
    """A ``c10d::*`` op: the call of a collective or point-to-point operation (CPU mode: neither
    communication nor compute; see :attr:`overlapprof.report.RankReport.uncounted_wrapper_us`)."""
    return name.startswith("c10d::")


def is_cpu_compute(name: str) -> bool:
    """CPU-mode compute: a cpu_op that is not a c10d wrapper, record_param_comms or a step marker."""
    return not (is_comm_wrapper(name) or name == PARAM_COMMS or name.startswith("ProfilerStep#"))
