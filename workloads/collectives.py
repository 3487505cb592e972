"""The communication patterns of torch.distributed, one per variant, each followed by a matmul.

sync:          blocking send/recv between rank pairs (0-1, 2-3, ...); the host time of every
               recv is recorded: on NCCL the first recv blocks the host while the communicator is
               built, later ones only until the recv is queued (metric recv_host_ms)
async:         isend/irecv posted before the matmul, wait() after it
broadcast:     rank 0's tensor copied to every rank
all_reduce:    tensors summed across ranks, the result on every rank
scatter:       rank 0 sends one chunk to each rank; its scatter_list stays allocated until it is
               dropped (metrics scatter_src_held_bytes, and scatter_src_kept_bytes which grows
               each step with --opt keep_scatter_list=true)
wait_vs_sync:  all_reduce(async_op=True), matmul, then work.wait() and torch.cuda.synchronize()
               timed on the host: on CUDA wait() only makes the stream wait, synchronize() blocks
               the host until the GPU is done (metrics wait_host_ms, synchronize_host_ms)

broadcast, all_reduce and scatter block by default; --opt overlap=true issues them with
async_op=True before the matmul and waits after it.
"""

import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

VARIANTS = {
    "sync": "blocking send/recv between rank pairs, then the matmul",
    "async": "isend/irecv between rank pairs posted before the matmul, waited after",
    "broadcast": "broadcast from rank 0, then the matmul",
    "all_reduce": "all_reduce (sum), then the matmul",
    "scatter": "scatter from rank 0 (measures what the source keeps allocated)",
    "wait_vs_sync": "async all_reduce + matmul; host time of wait() vs cuda.synchronize()",
}
DEFAULT_VARIANT = "sync"
OPTIONS = {
    "size": (512, "side of the square matmul"),
    "numel": (16384, "float32 elements communicated per rank"),
    "overlap": (False, "broadcast/all_reduce/scatter: async_op=True around the matmul"),
    "keep_scatter_list": (False, "scatter: rank 0 keeps every step's scatter_list (a leak)"),
}


@dataclass
class State:
    a: torch.Tensor
    b: torch.Tensor
    out: torch.Tensor
    send: torch.Tensor
    recv: torch.Tensor
    kept: list = field(default_factory=list)  # scatter lists kept with keep_scatter_list


def setup(ctx):
    n, numel, device = ctx.opts.size, ctx.opts.numel, ctx.device
    return State(a=torch.randn(n, n, device=device), b=torch.randn(n, n, device=device),
                 out=torch.empty(n, n, device=device),
                 send=torch.full((numel,), float(ctx.rank + 1), device=device),
                 recv=torch.zeros(numel, device=device))


def matmul(ctx, s):
    with ctx.phase("compute"):
        torch.matmul(s.a, s.b, out=s.out)


def peer(ctx):
    """The other rank of this rank's pair, or None for the last rank of an odd world."""
    other = ctx.rank ^ 1
    return other if other < ctx.world_size else None


def step_sync(ctx, s):
    other = peer(ctx)
    with ctx.phase("comm"):
        if other is not None and ctx.rank % 2 == 0:
            dist.send(s.send, dst=other)
            timed_recv(ctx, s, other)
        elif other is not None:
            timed_recv(ctx, s, other)
            dist.send(s.send, dst=other)
    matmul(ctx, s)


def timed_recv(ctx, s, src):
    start = time.perf_counter()
    dist.recv(s.recv, src=src)
    ctx.metric("recv_host_ms", (time.perf_counter() - start) * 1000)


def step_async(ctx, s):
    other = peer(ctx)
    works = []
    with ctx.phase("comm"), ctx.on_comm_stream():
        if other is not None:
            works = [dist.isend(s.send, dst=other), dist.irecv(s.recv, src=other)]
    matmul(ctx, s)
    with ctx.phase("wait"):
        for work in works:
            work.wait()


def collective(ctx, s, issue):
    """Run ``issue(async_op)`` blocking then the matmul, or with --opt overlap=true async around
    the matmul."""
    if not ctx.opts.overlap:
        with ctx.phase("comm"):
            issue(False)
        matmul(ctx, s)
        return
    with ctx.phase("comm"), ctx.on_comm_stream():
        work = issue(True)
    matmul(ctx, s)
    with ctx.phase("wait"):
        work.wait()


def step_broadcast(ctx, s):
    collective(ctx, s, lambda async_op: dist.broadcast(s.send, src=0, async_op=async_op))


def step_all_reduce(ctx, s):
    collective(ctx, s, lambda async_op: dist.all_reduce(s.recv, async_op=async_op))


def step_scatter(ctx, s):
    chunks = None
    if ctx.rank == 0:
        with ctx.phase("prepare"):
            chunks = [torch.full_like(s.recv, float(r)) for r in range(ctx.world_size)]
    collective(ctx, s, lambda async_op: dist.scatter(s.recv, scatter_list=chunks, src=0,
                                                      async_op=async_op))
    if ctx.rank == 0:
        # scatter() returned, yet every chunk is still allocated on the source until dropped.
        ctx.metric("scatter_src_held_bytes", sum(c.numel() * c.element_size() for c in chunks))
        if ctx.opts.keep_scatter_list:
            s.kept.append(chunks)
        del chunks
        ctx.metric("scatter_src_kept_bytes", sum(c.numel() * c.element_size()
                                                 for kept in s.kept for c in kept))
        if ctx.is_cuda:
            ctx.metric("cuda_memory_allocated_bytes", torch.cuda.memory_allocated(ctx.device))


def step_wait_vs_sync(ctx, s):
    with ctx.phase("comm"), ctx.on_comm_stream():
        work = dist.all_reduce(s.recv, async_op=True)
    matmul(ctx, s)
    with ctx.phase("wait"):
        start = time.perf_counter()
        work.wait()
        ctx.metric("wait_host_ms", (time.perf_counter() - start) * 1000)
    with ctx.phase("synchronize"):
        start = time.perf_counter()
        ctx.synchronize()
        ctx.metric("synchronize_host_ms", (time.perf_counter() - start) * 1000)
