"""Message sizes of communication operations, as nccl-tests defines them.

NVIDIA/nccl-tests ``doc/PERFORMANCE.md``: S is the operation's size in bytes; for all_gather the
*total* gathered size (``sendcount × sizeof(type) × n``), for reduce_scatter the total input
(``recvcount × sizeof(type) × n``), for all_to_all the total a rank sends (``count × n ×
sizeof(type)``), otherwise the buffer size. The bandwidths computed from S are in
:mod:`overlapprof.analysis.crossrank.bandwidth`.

Where the bytes come from, in order: the collective's ``In msg nelems``/``Out msg nelems`` and
``dtype`` (record_param_comms or the kernel's args; S = max(in, out) × element size, which is the
total for all_gather and reduce_scatter alike), else the recorded ``Input Dims`` × ``Input type``
(``record_shapes``; all_gather's input is one rank's share, so × n). No sizes: None ("unknown"),
never 0.
"""

from __future__ import annotations

import math

import numpy as np

# Element sizes, by torch ScalarType name (record_param_comms "dtype") and by the C++ type name
# the profiler writes in "Input type"; keys are lower case, without "c10::".
_ELEMENT_BYTES = {
    "float": 4, "float32": 4, "double": 8, "float64": 8, "half": 2, "float16": 2,
    "bfloat16": 2, "long": 8, "long int": 8, "int64": 8, "int64_t": 8, "int": 4, "int32": 4,
    "short": 2, "int16": 2, "char": 1, "signed char": 1, "int8": 1, "byte": 1, "unsigned char": 1,
    "uint8": 1, "bool": 1, "uint16": 2, "uint32": 4, "uint64": 8, "unsigned short": 2,
    "unsigned int": 4, "unsigned long": 8, "complexhalf": 4, "complexfloat": 8,
    "complexdouble": 16, "complex<float>": 8, "complex<double>": 16, "complex<c10::half>": 4,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1,
}

_SEEN: dict[str, int | None] = {}


def element_bytes(dtype) -> int | None:
    """Bytes per element of a dtype name (``Float``, ``c10::BFloat16``, ``unsigned char``)."""
    if not isinstance(dtype, str):
        return None
    size = _SEEN.get(dtype, -1)
    if size == -1:
        size = _SEEN[dtype] = _ELEMENT_BYTES.get(dtype.strip().lower().replace("c10::", ""))
    return size


def _numel(dims) -> int | None:
    """Elements of one recorded shape ([] is a 0-d tensor: 1 element)."""
    if not isinstance(dims, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in dims):
        return None
    return math.prod(dims)


def shape_bytes(dims, types) -> int | None:
    """Σ numel × element size over the tensor inputs of recorded ``Input Dims``/``Input type``.

    Entries whose type is not a tensor dtype (``Scalar``, ``''``, ``TensorList`` without shapes)
    are skipped; None when no tensor entry has a known size.
    """
    if not isinstance(dims, list) or not isinstance(types, list):
        return None
    total, found = 0, False
    for d, t in zip(dims, types):
        size, n = element_bytes(t), _numel(d)
        if size is not None and n is not None:
            total, found = total + n * size, True
    return total if found else None


def bytes_of(dtype, in_nelems, out_nelems, input_dims, input_type, kind: str) -> tuple[int | None, bool]:
    """(bytes, scaled): S of nccl-tests when the counts say it; else the recorded shapes' bytes
    and whether they are one rank's share that S is n times of (all_gather)."""
    size = element_bytes(dtype)
    counts = [c for c in (in_nelems, out_nelems) if isinstance(c, int) and c >= 0]
    if size is not None and counts:
        return max(counts) * size, False
    shaped = shape_bytes(input_dims, input_type)
    return shaped, shaped is not None and kind == "all_gather"


def total_bytes(nbytes: np.ndarray, scaled: np.ndarray, group_size: np.ndarray) -> np.ndarray:
    """S per operation from :func:`bytes_of`'s columns: ``nbytes``, × ``group_size`` where
    ``scaled`` (one rank's share); NaN where unknown, or scaled with an unknown (0) group size."""
    return nbytes * np.where(scaled, np.where(group_size > 0, group_size, np.nan), 1.0)
