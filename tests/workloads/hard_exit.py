"""Test workload: one rank dies hard (os._exit, no Python exception) in its 4th step."""

import os

import torch
import torch.distributed as dist

VARIANTS = {"sync": "matmul then all_reduce; rank `bad_rank` calls os._exit(3) at step 4"}
OPTIONS = {"bad_rank": 1}
_steps = {"n": 0}


def step(ctx, x):
    _steps["n"] += 1
    with ctx.phase("compute"):
        if ctx.rank == ctx.opts.bad_rank and _steps["n"] == 4:
            os._exit(3)
        torch.matmul(x, x)
    with ctx.phase("comm"):
        dist.all_reduce(x)


def setup(ctx):
    return torch.ones(64, 64, device=ctx.device)
