"""All-reduce: a DDP-like step. The backward pass produces gradient buckets one after another
(last layer first); each bucket is all-reduced across ranks, as DistributedDataParallel does.

sync:  each bucket is reduced with a blocking all_reduce as soon as it is produced, so the
       backward pass stops while it is reduced.
async: each bucket's all_reduce(async_op=True) is launched as soon as it is produced and all are
       waited for before the step ends, so reducing bucket i overlaps computing bucket i+1.

--opt extra_numel=N issues one more all_reduce, of N float32 values, on the same group just before
the first bucket's (blocking in sync, async in async, waited with the buckets): the buckets'
all-reduces queue behind it (gloo runs a group's collectives on its worker threads, two by
default, in order). analyze names that time queued.

Two planted mistakes of the async variant (benchmarks/advise_bench.py plants them):
--opt wait_early=true waits for each bucket's all_reduce right after issuing it, before the next
bucket's compute: nothing overlaps it (analyze names that time no_window), as if async_op=True had
not been asked for. --opt host_sync=true puts a host synchronization right after each issue,
inside the window (CUDA: torch.cuda.synchronize(); CPU: dist.barrier(), which gloo runs after
the group's pending all_reduces, so the host waits for them): analyze names it host_blocked.

A bucket is the weight gradient of one layer, dY^T @ X: (width x width) floats, computed with
2 * batch * width^2 flops. On CUDA the all_reduce is issued from ctx.comm_stream after it has
waited for the compute stream (the bucket is written), and `work.wait()` makes the compute stream
wait before the next step overwrites the buckets. The buckets live in State for the whole run, so
no tensor is freed while ProcessGroupNCCL's stream may still read it.
"""

from dataclasses import dataclass

import torch
import torch.distributed as dist

VARIANTS = {
    "sync": "blocking all_reduce of each bucket as soon as it is produced",
    "async": "all_reduce(async_op=True) per bucket as produced, all waited before the step ends",
}
DEFAULT_VARIANT = "async"
OPTIONS = {
    "buckets": (4, "gradient buckets (layers) per step"),
    "width": (128, "layer width: a bucket holds width^2 float32 values"),
    "batch": (4096, "rows of the activations: compute per bucket is 2*batch*width^2 flops"),
    "extra_numel": (0, "an extra all_reduce of this many float32 just before the first bucket's (0: none)"),
    "wait_early": (False, "async: wait for each bucket's all_reduce right after issuing it (nothing overlaps)"),
    "host_sync": (False, "async: a host synchronization right after each issue, in the window (CUDA "
                         "torch.cuda.synchronize(), CPU dist.barrier())"),
    "compute_repeat": (1, "each bucket's matmul done this many times: the same step on a device this many times slower"),
}


@dataclass
class State:
    x: torch.Tensor  # input activations, (batch, width)
    dys: list  # output gradients per layer, (batch, width)
    grads: list  # weight gradients per layer = the buckets, (width, width)
    extra: torch.Tensor  # the extra all_reduce's tensor (--opt extra_numel)


def setup(ctx):
    batch, width, device = ctx.opts.batch, ctx.opts.width, ctx.device
    return State(x=torch.randn(batch, width, device=device),
                 dys=[torch.randn(batch, width, device=device) for _ in range(ctx.opts.buckets)],
                 grads=[torch.empty(width, width, device=device)
                        for _ in range(ctx.opts.buckets)],
                 extra=torch.ones(ctx.opts.extra_numel, device=device))


def backward(ctx, s, layer):
    with ctx.phase("compute"):
        for _ in range(ctx.opts.compute_repeat):
            torch.matmul(s.dys[layer].t(), s.x, out=s.grads[layer])


def step_sync(ctx, s):
    for layer in reversed(range(ctx.opts.buckets)):
        backward(ctx, s, layer)
        with ctx.phase("comm"):
            if s.extra.numel() and layer == ctx.opts.buckets - 1:
                dist.all_reduce(s.extra)
            dist.all_reduce(s.grads[layer])


def step_async(ctx, s):
    works = []
    for layer in reversed(range(ctx.opts.buckets)):
        backward(ctx, s, layer)
        with ctx.phase("comm"), ctx.on_comm_stream():
            if s.extra.numel() and layer == ctx.opts.buckets - 1:
                works.append(dist.all_reduce(s.extra, async_op=True))
            works.append(dist.all_reduce(s.grads[layer], async_op=True))
        if ctx.opts.wait_early:
            with ctx.phase("wait"):
                for work in works:
                    work.wait()
            works = []
        elif ctx.opts.host_sync:
            with ctx.phase("host_sync"):
                torch.cuda.synchronize(ctx.device) if ctx.is_cuda else dist.barrier()
    with ctx.phase("wait"):
        for work in works:
            work.wait()  # CUDA: the compute stream waits for the reductions; CPU: the host blocks
