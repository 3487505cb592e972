"""Message sizes (overlapprof.analysis.records.sizes) and nccl-tests bandwidths (crossrank.bandwidth)."""

from __future__ import annotations

import numpy as np
import pytest

from overlapprof.analysis.crossrank.bandwidth import bus_factor, gbps
from overlapprof.analysis.records.sizes import bytes_of, element_bytes, shape_bytes, total_bytes


def message_bytes(kind, group_size, dtype=None, in_nelems=None, out_nelems=None, input_dims=None, input_type=None):
    """S of one operation through the analyzer's own two steps: bytes_of per distinct field
    combination, then total_bytes on the columns once group sizes are known (0: unknown)."""
    nbytes, scaled = bytes_of(dtype, in_nelems, out_nelems, input_dims, input_type, kind)
    total = total_bytes(np.array([np.nan if nbytes is None else nbytes], dtype=np.float64), np.array([scaled]),
                        np.array([group_size or 0], dtype=np.int64))[0]
    return None if np.isnan(total) else int(total)


@pytest.mark.parametrize("name, size", [
    ("Float", 4), ("float", 4), ("c10::BFloat16", 2), ("BFloat16", 2), ("c10::Half", 2), ("Long", 8),
    ("long int", 8), ("unsigned char", 1), ("signed char", 1), ("Byte", 1), ("Double", 8), ("Bool", 1),
    ("c10::Float8_e4m3fn", 1), ("ComplexFloat", 8), ("Scalar", None), ("TensorList", None), ("", None), (None, None),
])
def test_element_bytes(name, size):
    assert element_bytes(name) == size


@pytest.mark.parametrize("kind, n, factor", [
    ("all_reduce", 8, 2 * 7 / 8), ("all_gather", 8, 7 / 8), ("reduce_scatter", 8, 7 / 8),
    ("all_to_all", 8, 7 / 8), ("broadcast", 8, 1.0), ("reduce", 8, 1.0), ("send_recv", 2, 1.0),
    ("all_reduce", 2, 1.0), ("barrier", 8, None), ("other", 8, None), ("all_reduce", None, None),
])
def test_bus_factors_are_nccl_tests(kind, n, factor):
    assert bus_factor(kind, n) == factor


def test_message_bytes_from_nelems_is_the_total_for_gather_and_scatter():
    # all_gather: Out msg nelems is n x In; reduce_scatter: In is n x Out. nccl-tests' S is the total.
    assert message_bytes("all_gather", 8, in_nelems=10, out_nelems=80, dtype="Float") == 320
    assert message_bytes("reduce_scatter", 8, in_nelems=80, out_nelems=10, dtype="BFloat16") == 160
    assert message_bytes("broadcast", 2, in_nelems=53, out_nelems=53, dtype="Long") == 424
    assert message_bytes("all_gather", None, in_nelems=10, out_nelems=80, dtype="Float") == 320  # counts need no n


def test_message_bytes_from_shapes():
    shaped = {"input_dims": [[16, 64], [], []], "input_type": ["c10::Half", "Scalar", ""]}
    assert message_bytes("all_reduce", 4, **shaped) == 16 * 64 * 2
    assert message_bytes("all_gather", 4, **shaped) == 16 * 64 * 2 * 4  # one rank's input x n
    assert message_bytes("all_gather", None, **shaped) is None  # x n with n unknown: unknown
    assert shape_bytes([[], [4]], ["float", "long"]) == 4 + 32  # [] is a 0-d tensor: one element
    # Old record_param_comms: a TensorList without shapes says nothing.
    assert message_bytes("all_reduce", 2, input_dims=[[], [], []], input_type=["TensorList", "Scalar", "Scalar"]) is None
    assert message_bytes("all_reduce", 2) is None
    assert message_bytes("all_reduce", 2, input_dims="junk", input_type=[1]) is None


def test_gbps():
    assert gbps(10**9, 1e6) == 1.0  # 1e9 bytes in one second
    assert gbps(None, 5.0) is None and gbps(100, 0.0) is None and gbps(100, None) is None
