"""The analyzer's median and percentile are numpy's, float for float (they avoid importing numpy.ma)."""

import sys
import subprocess

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from overlapprof.analysis.stats import median, percentile

VALUES = st.lists(st.floats(allow_nan=False, allow_infinity=False, min_value=-1e12, max_value=1e12), min_size=1,
                  max_size=40) | st.lists(st.integers(0, 10**9), min_size=1, max_size=40)


@settings(max_examples=400, deadline=None)
@given(values=VALUES, q=st.sampled_from([0, 10, 25, 50, 75, 90, 99, 100]) | st.floats(0, 100))
def test_same_as_numpy(values, q):
    assert median(values) == float(np.median(values))
    assert percentile(values, q) == float(np.percentile(values, q))


def test_analysis_does_not_import_numpy_ma(tmp_path):
    code = ("import sys, overlapprof; overlapprof.analyze('tests/data/trace_filter', workers=1)\n"
            "print('numpy.ma' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=__file__.rsplit("/tests/", 1)[0])
    assert out.stdout.strip() == "False"
