"""Pipeline: an MLP cut into two stages on two ranks, a batch split into micro-batches (GPipe):
stage 0 runs every micro-batch's forward and sends the activations to stage 1, which runs the
rest of the forward and the loss; then stage 1 runs the backwards in reverse order and sends the
activations' gradients back to stage 0, which finishes the backward.

sync:  blocking send/recv of each micro-batch: a stage computes or communicates, never both.
async: micro-batch overlap: a stage sends micro-batch i with isend and computes micro-batch i+1
       while it goes; the receiving stage posts every irecv up front and waits for one just before
       it computes on it, so the next ones arrive while it computes.

Ranks pair up as stage 0 and stage 1 (0-1, 2-3, ...; an even number of ranks), every pair
running the same pipeline. The send order is the same in both variants and the same as the
receive order on the other stage, so NCCL's in-order point-to-point streams cannot deadlock. On
CUDA the sends and receives are issued from ctx.comm_stream and `work.wait()` makes the compute
stream wait; every tensor they use is held until the end of the step, after its wait.

Each stage's inputs are fixed and there is no optimizer step, so every step computes the same
gradients; each step checks the stage's gradients against the ones the sync way computed in
setup (``ctx.check_result``) and records their checksum (metric ``stage_grads_checksum``).
"""

from dataclasses import dataclass

import torch
import torch.distributed as dist

VARIANTS = {
    "sync": "blocking send/recv of each micro-batch",
    "async": "isend/irecv: micro-batch i moves while micro-batch i+1 is computed",
}
DEFAULT_VARIANT = "async"
OPTIONS = {
    "layers": (4, "Linear layers per stage"),
    "width": (512, "their width"),
    "batch": (512, "rows per step, split into micro-batches"),
    "micro_batches": (8, "micro-batches per step"),
}


@dataclass
class State:
    stage: int  # 0 or 1
    peer: int
    model: torch.nn.Module
    inputs: list  # stage 0: the micro-batches; stage 1: their targets
    reference: torch.Tensor  # this stage's gradients, flattened, as the sync variant computes them


def setup(ctx):
    if ctx.world_size % 2:
        raise ValueError(f"the pipeline needs an even number of ranks (stage 0 and 1 pairs), not {ctx.world_size}")
    o = ctx.opts
    if o.batch % o.micro_batches:
        raise ValueError(f"batch {o.batch} does not split into {o.micro_batches} micro-batches")
    stage = ctx.rank % 2
    torch.manual_seed(stage)  # each stage its own layers, the same in every pair
    layers = []
    for _ in range(o.layers):
        layers += [torch.nn.Linear(o.width, o.width), torch.nn.ReLU()]
    data = torch.Generator().manual_seed(1000 + stage)
    rows = o.batch // o.micro_batches
    inputs = [torch.randn(rows, o.width, generator=data).to(ctx.device) for _ in range(o.micro_batches)]
    state = State(stage=stage, peer=ctx.rank ^ 1, model=torch.nn.Sequential(*layers).to(ctx.device),
                  inputs=inputs, reference=torch.empty(0))
    step_sync(ctx, state, check=False)
    state.reference = flat_grads(state.model)
    return state


def flat_grads(model):
    return torch.cat([p.grad.flatten() for p in model.parameters()])


def loss_of(s, i, activation):
    """Stage 1: the rest of the forward and the loss of micro-batch i (averaged over the batch)."""
    return torch.nn.functional.mse_loss(s.model(activation), s.inputs[i]) / len(s.inputs)


def step_sync(ctx, s, check=True):
    s.model.zero_grad(set_to_none=True)
    micro_batches = range(len(s.inputs))
    if s.stage == 0:
        outputs = []
        for i in micro_batches:
            with ctx.phase("forward"):
                outputs.append(s.model(s.inputs[i]))
            with ctx.phase("send"):
                dist.send(outputs[i].detach(), s.peer)
        for i in reversed(micro_batches):
            grad = torch.empty_like(outputs[i])
            with ctx.phase("recv"):
                dist.recv(grad, s.peer)
            with ctx.phase("backward"):
                outputs[i].backward(grad)
    else:
        received, losses = [], []
        for i in micro_batches:
            activation = torch.empty_like(s.inputs[i])
            with ctx.phase("recv"):
                dist.recv(activation, s.peer)
            received.append(activation.requires_grad_())
            with ctx.phase("forward"):
                losses.append(loss_of(s, i, activation))
        for i in reversed(micro_batches):
            with ctx.phase("backward"):
                losses[i].backward()
            with ctx.phase("send"):
                dist.send(received[i].grad, s.peer)
    if check:
        check_stage(ctx, s)


def step_async(ctx, s):
    s.model.zero_grad(set_to_none=True)
    micro_batches = range(len(s.inputs))
    held, works = [], []  # every tensor a send or receive uses, kept until the step's end
    if s.stage == 0:
        outputs = []
        for i in micro_batches:
            with ctx.phase("forward"):
                outputs.append(s.model(s.inputs[i]))
            with ctx.phase("send"), ctx.on_comm_stream():
                held.append(outputs[i].detach())
                works.append(dist.isend(held[-1], s.peer))
        grads = {i: torch.empty_like(outputs[i]) for i in reversed(micro_batches)}
        with ctx.phase("recv"), ctx.on_comm_stream():
            recvs = {i: dist.irecv(grads[i], s.peer) for i in reversed(micro_batches)}
        for i in reversed(micro_batches):
            with ctx.phase("wait"):
                recvs[i].wait()
            with ctx.phase("backward"):
                outputs[i].backward(grads[i])
    else:
        activations = [torch.empty_like(x) for x in s.inputs]
        with ctx.phase("recv"), ctx.on_comm_stream():
            recvs = [dist.irecv(a, s.peer) for a in activations]
        losses = []
        for i in micro_batches:
            with ctx.phase("wait"):
                recvs[i].wait()
            with ctx.phase("forward"):
                losses.append(loss_of(s, i, activations[i].requires_grad_()))
        for i in reversed(micro_batches):
            with ctx.phase("backward"):
                losses[i].backward()
            with ctx.phase("send"), ctx.on_comm_stream():
                held.append(activations[i].grad)
                works.append(dist.isend(held[-1], s.peer))
    with ctx.phase("wait"):
        for work in works:
            work.wait()
    check_stage(ctx, s)


def check_stage(ctx, s):
    with ctx.phase("check"):
        ctx.check_result("stage_grads", flat_grads(s.model), s.reference)
