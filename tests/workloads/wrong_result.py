"""Test workload: an async all_reduce whose result is wrong (divided twice), checked against the
sync variant's with ctx.check_result, as workloads/ddp.py checks its gradients."""

import torch
import torch.distributed as dist

VARIANTS = {"sync": "blocking all_reduce, averaged", "async": "all_reduce(async_op=True), averaged twice: wrong"}


def setup(ctx):
    x = torch.arange(1024, dtype=torch.float32, device=ctx.device) + ctx.rank
    reference = x.clone()
    dist.all_reduce(reference)
    return x, reference / ctx.world_size


def step_sync(ctx, state):
    x, reference = state
    total = x.clone()
    dist.all_reduce(total)
    ctx.check_result("total", total / ctx.world_size, reference)


def step_async(ctx, state):
    x, reference = state
    total = x.clone()
    dist.all_reduce(total, async_op=True).wait()
    ctx.check_result("total", total / ctx.world_size / ctx.world_size, reference)
