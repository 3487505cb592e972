"""Ring: each rank sends a chunk to rank+1 and receives one from rank-1, K times per step,
interleaved with matmuls. The received chunk is passed on in the next round.

sync:  blocking send/recv (even ranks send first, odd ranks receive first, so the ring cannot
       deadlock), then the matmul. Nothing can overlap.
async: isend/irecv posted before the matmul and waited after it (on NCCL as one
       batch_isend_irecv), so the transfer runs while the matmul does.

--opt host_sync=true puts a host synchronization inside the async window, before the matmul
(CUDA: torch.cuda.synchronize(), which waits for the transfer; CPU: dist.barrier(), the host sync
gloo has: on CPU every op has finished when it returns, so .item() would block on nothing). The
matmul then starts only once the transfer is done: analyze names the lost time host_blocked.

On CUDA the communication is issued from ctx.comm_stream, which first waits for the compute
stream (so the chunk to send has been written), and `work.wait()` makes the compute stream wait
for the transfer before the received chunk is used. The buffers live in State for the whole run,
so no tensor is freed while another stream may still use it (a tensor made fresh each step
would need `tensor.record_stream(ctx.comm_stream)`, or a reference held until the wait).
"""

from dataclasses import dataclass

import torch
import torch.distributed as dist

VARIANTS = {
    "sync": "blocking send/recv, then the matmul: no overlap possible",
    "async": "isend/irecv posted before the matmul, waited after it",
}
DEFAULT_VARIANT = "async"
OPTIONS = {
    # 640: on 2 CPU cores over --link-rate 2gbit, 4 ranks' matmuls about fill a round's link time
    # without saturating the cores, where async gains most (benchmarks/bound_bench.py, RESULTS.md)
    "size": (640, "side of the square matmul (scale up on GPUs, e.g. 8192)"),
    "chunk": (131072, "float32 elements sent to the next rank per round (512 KiB: 4 ranks' round "
                      "takes ~8 ms over --link-rate 2gbit, the order of 4 ranks' matmuls on 2 cores)"),
    "rounds": (4, "send/recv + matmul rounds per step (K)"),
    "host_sync": (False, "async: a host synchronization in the window, before the matmul (CUDA "
                         "torch.cuda.synchronize(), CPU dist.barrier())"),
    "compute_repeat": (1, "each matmul done this many times: the same step on a device this many times slower"),
}


@dataclass
class State:
    a: torch.Tensor
    b: torch.Tensor
    out: torch.Tensor
    send: torch.Tensor
    recv: torch.Tensor


def setup(ctx):
    if ctx.world_size < 2:
        raise ValueError("the ring needs at least 2 ranks (--nproc 2)")
    n, chunk, device = ctx.opts.size, ctx.opts.chunk, ctx.device
    return State(a=torch.randn(n, n, device=device), b=torch.randn(n, n, device=device),
                 out=torch.empty(n, n, device=device), send=torch.randn(chunk, device=device),
                 recv=torch.empty(chunk, device=device))


def neighbours(ctx):
    return (ctx.rank + 1) % ctx.world_size, (ctx.rank - 1) % ctx.world_size


def matmul(ctx, s):
    with ctx.phase("compute"):
        for _ in range(ctx.opts.compute_repeat):
            torch.matmul(s.a, s.b, out=s.out)


def step_sync(ctx, s):
    next_rank, prev_rank = neighbours(ctx)
    for _ in range(ctx.opts.rounds):
        with ctx.phase("comm"):
            if ctx.rank % 2 == 0:
                dist.send(s.send, dst=next_rank)
                dist.recv(s.recv, src=prev_rank)
            else:
                dist.recv(s.recv, src=prev_rank)
                dist.send(s.send, dst=next_rank)
        matmul(ctx, s)
        s.send, s.recv = s.recv, s.send


def step_async(ctx, s):
    next_rank, prev_rank = neighbours(ctx)
    for _ in range(ctx.opts.rounds):
        with ctx.phase("comm"), ctx.on_comm_stream():
            if ctx.backend == "nccl":  # one NCCL group call: sends and recvs cannot block each other
                works = dist.batch_isend_irecv([dist.P2POp(dist.isend, s.send, next_rank),
                                                dist.P2POp(dist.irecv, s.recv, prev_rank)])
            else:
                works = [dist.isend(s.send, dst=next_rank), dist.irecv(s.recv, src=prev_rank)]
        if ctx.opts.host_sync:
            with ctx.phase("host_sync"):
                torch.cuda.synchronize(ctx.device) if ctx.is_cuda else dist.barrier()
        matmul(ctx, s)
        with ctx.phase("wait"):
            for work in works:
                work.wait()  # CUDA: the current (compute) stream waits; CPU: the host blocks
        s.send, s.recv = s.recv, s.send
