"""Test workload: one rank stops making progress in its own code (sleeps in compute); its peers
wait for it in all_reduce. ``exit_s``: every rank also spends that long in a weakref finalizer
when its interpreter exits, where the launcher's SIGTERM (sent once the first rank failed) lands."""

import time
import weakref

import torch
import torch.distributed as dist

VARIANTS = {"sync": "matmul then all_reduce; rank `bad_rank` sleeps forever in compute at "
                    "ProfilerStep#`at_step`"}
OPTIONS = {"bad_rank": 1, "at_step": 0, "exit_s": 0.0}


def step(ctx, x):
    with ctx.phase("compute"):
        if (ctx.rank == ctx.opts.bad_rank and ctx.step_kind != "warmup"
                and ctx.step_index >= ctx.opts.at_step):
            time.sleep(3600)
        torch.matmul(x, x)
    with ctx.phase("comm"):
        dist.all_reduce(x)


def setup(ctx):
    x = torch.ones(64, 64, device=ctx.device)
    if ctx.opts.exit_s:
        weakref.finalize(x, time.sleep, ctx.opts.exit_s)  # run at exit: x lives as long as the run
    return x
