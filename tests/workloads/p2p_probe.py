"""Test workload (issue 39): an async send whose wait() comes long after its transfer ended.

Both ranks meet at a barrier; then rank 0 issues ``isend``, computes matmuls for ``compute_ms``,
then waits. Rank 1 receives with a blocking ``recv`` (variant ``recv``: its span ends when the
data has arrived), or with ``irecv``, the same matmuls, then ``wait()`` (variant ``irecv``: its
span ends at the wait, and nothing shows when the data arrived). gloo's ``gloo:send`` span on
rank 0 runs from the issue to the wait, about ``compute_ms``, either way.
"""

import time

import torch
import torch.distributed as dist

VARIANTS = {
    "recv": "rank 0: isend, compute_ms of matmuls, wait(); rank 1: blocking recv",
    "irecv": "rank 0: isend, compute_ms of matmuls, wait(); rank 1: irecv, the same, wait()",
}
OPTIONS = {
    "compute_ms": (40.0, "the matmuls between an isend or irecv and its wait()"),
    "elements": (262144, "float32 elements sent (1 MiB)"),
    "size": (128, "side of the square matmuls"),
}


def setup(ctx):
    if ctx.world_size != 2:
        raise ValueError("the probe needs 2 ranks (--nproc 2)")
    n = ctx.opts.size
    return torch.randn(n, n), torch.randn(ctx.opts.elements)


def compute(ctx, a):
    with ctx.phase("compute"):
        stop = time.perf_counter() + ctx.opts.compute_ms / 1e3
        while time.perf_counter() < stop:
            torch.matmul(a, a)


def step(ctx, state):
    a, buf = state
    with ctx.phase("meet"):
        dist.barrier()
    if ctx.rank == 1 and ctx.variant == "recv":
        with ctx.phase("comm"):
            dist.recv(buf, src=0)
        return
    with ctx.phase("comm"):
        work = dist.isend(buf, dst=1) if ctx.rank == 0 else dist.irecv(buf, src=0)
    compute(ctx, a)
    with ctx.phase("wait"):
        work.wait()
