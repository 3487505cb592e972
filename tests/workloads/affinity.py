"""Test workload: records the CPU cores its threads may run on (metrics ``first_cpu``, ``cpus``,
and ``threads_elsewhere``: threads, gloo's included, whose cores differ from the main thread's),
then all-reduces a small tensor."""

import os

import torch
import torch.distributed as dist

VARIANTS = {"sync": "record the threads' cores, then all_reduce"}
OPTIONS = {}


def step(ctx, x):
    mine = os.sched_getaffinity(0)
    ctx.metric("first_cpu", min(mine))
    ctx.metric("cpus", len(mine))
    ctx.metric("threads_elsewhere", sum(os.sched_getaffinity(int(t)) != mine for t in os.listdir("/proc/self/task")))
    with ctx.phase("comm"):
        dist.all_reduce(x)


def setup(ctx):
    return torch.ones(8, device=ctx.device)
