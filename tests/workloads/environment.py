"""Test workload: records what the rank's process was started with (metrics): whether the
launcher's environment reached it (``marker``: OVERLAPPROF_TEST_MARKER is "launcher";
``nccl_debug``: NCCL_DEBUG is WARN, which the launcher sets only when it launches), whether the
fork server's own PYTHONUNBUFFERED did (``unbuffered``), ``rank_env`` (RANK is its rank),
``torch_threads`` (torch's intra-op threads) and ``parent_pid`` (the process that started it),
then all-reduces a small tensor."""

import os

import torch
import torch.distributed as dist

VARIANTS = {"sync": "record the environment, then all_reduce"}
OPTIONS = {}


def step(ctx, x):
    ctx.metric("marker", int(os.environ.get("OVERLAPPROF_TEST_MARKER") == "launcher"))
    ctx.metric("nccl_debug", int(os.environ.get("NCCL_DEBUG") == "WARN"))
    ctx.metric("unbuffered", int("PYTHONUNBUFFERED" in os.environ))
    ctx.metric("rank_env", int(os.environ.get("RANK") == str(ctx.rank)))
    ctx.metric("torch_threads", torch.get_num_threads())
    ctx.metric("parent_pid", os.getppid())
    with ctx.phase("comm"):
        dist.all_reduce(x)


def setup(ctx):
    return torch.ones(8, device=ctx.device)
