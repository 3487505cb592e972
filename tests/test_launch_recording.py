"""overlapprof/launch/recording.py's ``Profile``: a profiler whose start does not import
torch._inductor (and torch._dynamo) into a process that has not (1.2 s of CPU per rank: issue 36
item 5), and reads inductor's cudagraphs setting as torch does where it matters. In a fresh
interpreter: the test process may have imported either."""

import os
import subprocess
import sys

import pytest

from conftest import REPO

pytest.importorskip("torch")

SCRIPT = """
import os, sys
import torch
from overlapprof.launch import recording

with recording.Profile(activities=recording.activities(False)):
    torch.mm(torch.ones(4, 4), torch.ones(4, 4))
print("imported after a profile:", "torch._inductor" in sys.modules, "torch._dynamo" in sys.modules)
print("lazy again:", "_inductor" in torch._lazy_modules)

# TORCHINDUCTOR_CUDAGRAPHS=1 turns inductor's cudagraphs on: then it is imported and the setting read, as torch does
os.environ["TORCHINDUCTOR_CUDAGRAPHS"] = "1"
prof = recording.Profile(activities=recording.activities(False))
prof.prepare_trace()
print("cudagraphs read:", "torch._inductor" in sys.modules, prof.has_cudagraphs)
"""


def test_a_profile_leaves_inductor_unimported_unless_its_setting_matters():
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, cwd=REPO,
                          env={**{k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CUDAGRAPHS"},
                               "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0] == "imported after a profile: False False", proc.stdout
    assert lines[1] == "lazy again: True", proc.stdout  # torch's set as it was: a later torch._inductor imports it
    assert lines[2] == "cudagraphs read: True True", proc.stdout
