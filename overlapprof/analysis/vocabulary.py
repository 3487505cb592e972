"""The words the rank's classification and the communication records share (OVERLAP.md version 3,
section 3): the kinds of communication, how a name says its kind, and the names of the calls that
carry a collective's parameters. Its own module, so that :mod:`overlapprof.analysis.records` and
:mod:`overlapprof.analysis.rank` both import it and not each other."""

from __future__ import annotations

import functools
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
KIND_CODE = {kind: i for i, kind in enumerate(KINDS)}  # a kind's code: its index in KINDS

COMM_ANNOTATION = re.compile(r"^[A-Za-z0-9_]+:[A-Za-z0-9_]+(?:\s.*)?$", re.DOTALL)  # any `a:b` (records)
PARAM_COMMS = "record_param_comms"

# Ordered: the first match wins ("allreduce" before "reduce", "reducescatter" before "reduce").
_KIND_PATTERNS = (
    ("all_to_all", ("alltoall", "deepep", "dpskep")),  # DeepEP's dispatch and combine: an all-to-all
    ("all_reduce", ("allreduce", "crossdevicereduce")),
    ("all_gather", ("allgather",)),
    ("reduce_scatter", ("reducescatter",)),
    ("broadcast", ("broadcast", "bcast")),
    ("send_recv", ("sendrecv", "send", "recv")),
    ("barrier", ("barrier",)),
    ("reduce", ("reduce",)),
)
NOT_ALNUM = re.compile(r"[^a-z0-9]")
ANONYMOUS = "(anonymous namespace)"  # in a demangled name: not where its arguments start


@functools.lru_cache(maxsize=1 << 16)  # names recur: per property, per rank
def comm_kind(name: str) -> str:
    """The kind of a communication kernel or annotation, from its name.

    ``ncclKernel_AllReduce_RING_LL_Sum_float(...)`` -> all_reduce,
    ``ncclDevKernel_SendRecv`` -> send_recv, ``nccl:_allgather_base`` -> all_gather,
    ``nccl:reduce_scatter_tensor_coalesced`` -> reduce_scatter, ``gloo:recv`` -> send_recv.
    Kernel arguments (after ``(``) are ignored.
    """
    key = NOT_ALNUM.sub("", name.replace(ANONYMOUS, "").split("(", 1)[0].lower())
    for kind, needles in _KIND_PATTERNS:
        if any(n in key for n in needles):
            return kind
    return "other"
