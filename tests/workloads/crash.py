"""Test workload: one rank raises in the middle of the profiled steps; the others wait for it."""

import torch
import torch.distributed as dist

VARIANTS = {"sync": "all_reduce then matmul; rank `bad_rank` raises at profiled step `at_step`"}
OPTIONS = {"bad_rank": 1, "at_step": 1, "in_setup": False}


def step(ctx, x):
    with ctx.phase("compute"):
        if ctx.rank == ctx.opts.bad_rank and ctx.step_kind == "profiled" \
                and ctx.step_index >= ctx.opts.at_step:
            raise ValueError(f"boom on rank {ctx.rank}")
        torch.matmul(x, x)
    with ctx.phase("comm"):
        dist.all_reduce(x)


def setup(ctx):
    if ctx.opts.in_setup and ctx.rank == ctx.opts.bad_rank:
        raise RuntimeError(f"setup failed on rank {ctx.rank}")
    return torch.ones(64, 64, device=ctx.device)
