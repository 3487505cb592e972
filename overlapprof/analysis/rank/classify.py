"""Classes of events (OVERLAP.md version 3, section 1) and kinds of communication (section 3).

A *communication call* is a ``cpu_op`` named ``record_param_comms`` or ``c10d::*``; an event is
inside one when it is on the same pid and tid and its ``ts`` lies in [call.ts, call.ts + dur).

A rank's trace is read in **GPU mode** when it holds device kernels (``cat == "kernel"``):
communication is the kernels of a known family (:data:`COMM_KERNEL_FAMILIES`: NCCL/RCCL, NVSHMEM,
DeepEP, symmetric memory, custom all-reduces, ...; any case) or of a user pattern,
plus any GPU activity (kernel, memcpy, memset) whose runtime call (same correlation) is inside
a communication call; compute every other kernel; memory the other ``gpu_memcpy``/``gpu_memset``
events. Otherwise in **CPU mode**: communication is the ``c10d::*`` calls and the
``user_annotation`` spans named ``<backend>:<op>`` for the backends :data:`COMM_BACKENDS` plus
the user's (``gloo:all_reduce``, ``nccl:recv 0<-1``; ``fwd:attn`` is not); compute the ``cpu_op``
spans except communication calls, ``ProfilerStep#N`` step markers, and cpu_ops inside a
communication call. Device activity of any other category is not classified: an event of a
category Kineto's quirks do not know (``UNKNOWN``) is such activity when it runs in a process
that holds no host event (cpu_op, annotation, runtime call): a device's (the scan decides, and
the report warns).

Only complete events (``"ph": "X"``) have a duration and count. What the categories are called
(old Kineto versions' names, vendors' runtimes, torch's profiler before Kineto) and which are
device work is :mod:`overlapprof.trace.kineto`'s; its codes are re-exported here, where the
rank's pipeline reads them (``classify.KERNEL``).
"""

from __future__ import annotations

import re

from overlapprof.analysis.vocabulary import (  # noqa: F401 (re-exported: the kinds, for the rank's pipeline)
    ANONYMOUS as _ANONYMOUS, COMM_ANNOTATION, KIND_CODE, KINDS, NOT_ALNUM as _NOT_ALNUM, PARAM_COMMS, comm_kind)
from overlapprof.trace.kineto import (  # noqa: F401 (re-exported: the codes the classification reads)
    ANNOTATION, CATEGORIES, CATEGORY_CODES, CPU_OP, GPU_CATEGORIES, KERNEL, LEGACY_PROCESSES, MEMCPY, MEMSET,
    NOT_DEVICE_WORK, OTHER, RUNTIME, STREAM_WAIT, SYNC, UNKNOWN, category_code)

# The communication kernels OVERLAP.md (section 1) knows, by family: a name that contains one of
# these (searched, any case) is communication. A family's kernels launched from inside a c10d
# call are communication anyway; these are the ones a library launches on its own.
COMM_KERNEL_FAMILIES = {
    "NCCL, RCCL": r"nccl|rccl",
    "NVSHMEM": r"nvshmem",
    "DeepEP": r"deep_?ep::|dpsk::ep",
    "torch symmetric memory, vLLM multimem":
        r"multimem_|symmetric_memory::|one_?shot_?all_?reduce|two_?shot_?all_?reduce",
    "vLLM, SGLang and aiter custom all-reduce": r"cross_device_reduce",
    "TensorRT-LLM, FlashInfer all-reduce fusion": r"allreduce_fusion_kernel",
    "TransformerEngine userbuffers": r"userbuffers",
    "MSCCL++": r"mscclpp",
}
COMM_KERNEL = re.compile("|".join(f"(?:{p})" for p in COMM_KERNEL_FAMILIES.values()), re.IGNORECASE)
# A kernel name (before its template and call arguments, letters and digits only, lower case) that
# says communication: one outside the families above is warned about, not classified.
LOOKS_LIKE_COMM = re.compile(r"allreduce|allgather|reducescatter|alltoall|sendrecv|broadcast")
COMM_BACKENDS = ("gloo", "nccl", "mpi", "ucc", "xccl", "hccl")
STEP_NAME = re.compile(r"^ProfilerStep#(\d+)$")

def kernel_stem(name: str) -> str:
    """A demangled kernel name without its return type, anonymous namespaces, template and call
    arguments: ``void (anonymous namespace)::k<float>(int)`` -> ``k``."""
    stem = re.split(r"[<(]", name.replace(_ANONYMOUS + "::", "").replace(_ANONYMOUS, ""), maxsplit=1)[0].strip()
    return stem[5:] if stem.startswith("void ") else stem


def looks_like_comm(name: str) -> bool:
    """Whether a kernel's name says communication (:data:`LOOKS_LIKE_COMM`), its template and
    call arguments left out (``at::native::Kernel<...Broadcast...>`` does not)."""
    return LOOKS_LIKE_COMM.search(_NOT_ALNUM.sub("", kernel_stem(name).lower())) is not None


def compile_comm_kernels(patterns) -> re.Pattern:
    """One regex for the comm kernels: the families of :data:`COMM_KERNEL_FAMILIES` plus the
    user's patterns (each a regex)."""
    extra = [p if isinstance(p, str) else p.pattern for p in patterns or ()]
    if not extra:
        return COMM_KERNEL
    return re.compile("|".join([COMM_KERNEL.pattern, *(f"(?:{p})" for p in extra)]), re.IGNORECASE)


def compile_comm_annotations(backends=()) -> re.Pattern:
    """CPU-mode communication annotations: ``<backend>:<op>`` for :data:`COMM_BACKENDS` plus
    the user's ``backends`` (names, matched exactly, any case)."""
    names = sorted({b.lower() for b in (*COMM_BACKENDS, *(backends or ()))})
    alternatives = "|".join(re.escape(n) for n in names)
    return re.compile(rf"^(?:{alternatives}):[A-Za-z0-9_]+(?:\s.*)?$", re.DOTALL | re.IGNORECASE)


def is_comm_wrapper(name: str) -> bool:
    """A ``c10d::*`` op: the call of a collective or point-to-point operation (CPU mode:
    communication)."""
    return name.startswith("c10d::")


def is_comm_call(name: str) -> bool:
    """A communication call: ``record_param_comms`` or ``c10d::*``."""
    return name == PARAM_COMMS or name.startswith("c10d::")


def is_cpu_compute(name: str) -> bool:
    """CPU-mode compute by name: a cpu_op that is not a communication call or a step marker
    (cpu_ops inside a communication call are taken out by time, in events.py)."""
    return not (is_comm_call(name) or name.startswith("ProfilerStep#"))


# Calls that block the calling host thread until device work (or every rank) is done: the
# host_blocked cause of exposed communication (OVERLAP.md section 6.3). Runtime calls of CUDA
# and HIP, and the cpu_ops that make them.
HOST_SYNC_RUNTIME = frozenset(
    f"{api}{call}" for api in ("cuda", "hip")
    for call in ("StreamSynchronize", "DeviceSynchronize", "EventSynchronize", "Memcpy", "Memcpy2D", "Memcpy3D")
)
HOST_SYNC_OPS = frozenset({"aten::item", "aten::_local_scalar_dense", "c10d::barrier", "c10d::monitored_barrier_"})


def is_host_sync(name: str) -> bool:
    """A host synchronization: a blocking CUDA/HIP runtime call (``cudaStreamSynchronize``,
    ``cudaDeviceSynchronize``, ``cudaEventSynchronize``, a synchronous ``cudaMemcpy``), reading a
    device value on the host (``aten::item``, ``aten::_local_scalar_dense``) or a barrier."""
    return name in HOST_SYNC_RUNTIME or name in HOST_SYNC_OPS


def lookalikes_warning(per_rank: list[dict[str, int]], shown: int = 3) -> str | None:
    """One warning line for the compute kernels whose names look like communication
    (:func:`looks_like_comm`; ``per_rank``: each rank's name -> count): a library's collective
    outside :data:`COMM_KERNEL_FAMILIES` is compute unless the user names it. The most frequent
    ``shown`` names (:func:`kernel_stem`), how many kernels on how many ranks, and the
    ``--comm-kernel`` that would count the first; None when there are none."""
    counts: dict[str, int] = {}
    ranks: dict[str, set[int]] = {}
    for k, names in enumerate(per_rank):
        for name, n in names.items():
            stem = kernel_stem(name)
            counts[stem] = counts.get(stem, 0) + n
            ranks.setdefault(stem, set()).add(k)
    if not counts:
        return None
    top = sorted(counts, key=lambda s: (-counts[s], s))
    named = ", ".join(f"{s} ({counts[s]} kernels on {len(ranks[s])} rank{'s' if len(ranks[s]) != 1 else ''})"
                      for s in top[:shown])
    more = f" and {len(top) - shown} more" if len(top) > shown else ""
    example = re.escape(top[0].rsplit("::", 1)[-1])
    return (f"kernels named like communication are counted as compute (not of a communication family OVERLAP.md "
            f"knows): {named}{more}; if they communicate, name them: --comm-kernel '{example}'")
