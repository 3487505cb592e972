"""Test workload: every step sleeps `step_s` seconds, so a run lasts long enough to show the
launcher's heartbeat and to be interrupted mid-run."""

import time

import torch
import torch.distributed as dist

VARIANTS = {"sync": "sleep step_s in compute, then all_reduce"}
OPTIONS = {"step_s": (0.5, "seconds each step sleeps")}


def step(ctx, x):
    with ctx.phase("compute"):
        time.sleep(ctx.opts.step_s)
    with ctx.phase("comm"):
        dist.all_reduce(x)


def setup(ctx):
    return torch.ones(8, device=ctx.device)
