"""Test workload: every rank receives from its neighbour and nobody sends, so all ranks hang."""

import torch
import torch.distributed as dist

VARIANTS = {"sync": "recv with no matching send"}


def setup(ctx):
    return torch.empty(16, device=ctx.device)


def step(ctx, buf):
    with ctx.phase("comm"):
        dist.recv(buf, src=(ctx.rank + 1) % ctx.world_size)
