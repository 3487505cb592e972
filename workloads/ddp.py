"""DDP: an MLP under DistributedDataParallel, its gradients averaged across ranks every step.

sync:  backward under ``model.no_sync()`` (no communication during backward), then one
       all_reduce of all gradients flattened together: nothing can overlap.
async: DDP's own bucketed all_reduce: a bucket of gradients (``bucket_cap_mb``) is reduced as
       soon as backward has produced it, while backward goes on with the layers before it. The
       last bucket (the first layers' gradients) is produced when backward ends, and DDP waits
       for it before backward returns: that communication stays exposed.

``--opt bucket_cap_mb=X`` sets the buckets' size (how many all_reduces a step makes, and how
early the first one can start); ``--opt gradient_as_bucket_view=true`` makes each gradient a view
into its bucket, so DDP copies no gradient into the bucket before reducing it (and holds one copy
of the gradients less).

Every rank keeps its own fixed batch and there is no optimizer step, so every step computes the
same gradients; each step checks them against the ones the sync way computed in setup
(``ctx.check_result``) and records their checksum (metric ``grads_checksum``). On CUDA the
model sits on ``cuda:LOCAL_RANK`` and DDP runs its all_reduce on NCCL's stream.
"""

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

VARIANTS = {
    "sync": "backward under no_sync(), then one all_reduce of all gradients",
    "async": "DDP's bucketed all_reduce, overlapping backward",
}
DEFAULT_VARIANT = "async"
OPTIONS = {
    "layers": (8, "Linear layers of the MLP"),
    "width": (512, "their width: a layer holds width^2 + width float32 parameters (1 MiB at 512)"),
    "batch": (256, "rows per rank per step"),
    "bucket_cap_mb": (2.0, "DDP's bucket size in MiB (torch's default is 25)"),
    "gradient_as_bucket_view": (False, "gradients are views into DDP's buckets: no copy into the bucket"),
    "compute_repeat": (1, "each layer (forward and backward, activation included) and the check done this many "
                          "times: the same step on a device this many times slower"),
}


class Layer(torch.nn.Linear):
    """Linear then ReLU. ``repeat`` > 1 runs the whole layer that many times, forward and backward
    (matmuls, bias, activation, autograd's own work), the extra results dropped: the same model on a
    device ``repeat`` times slower (``--opt compute_repeat``)."""

    def __init__(self, width, repeat):
        super().__init__(width, width)
        self.repeat = repeat

    def forward(self, x):
        z = super().forward(x)
        if self.repeat > 1:
            # the layer again on detached copies of its inputs (the same storage); z's gradient
            # runs their backward, into no parameter. z's, not the output's: FSDP's hook on the
            # output gathers the weights again first
            again = [torch.relu(torch.nn.functional.linear(*(t.detach().requires_grad_(t.requires_grad)
                                                             for t in (x, self.weight, self.bias))))
                     for _ in range(self.repeat - 1)]
            if z.requires_grad:
                z.register_hook(lambda grad: torch.autograd.backward(again, [grad] * len(again)))
        return torch.relu(z)


@dataclass
class State:
    model: DDP
    x: torch.Tensor
    target: torch.Tensor
    reference: torch.Tensor  # the gradients, flattened, as the sync variant computes them


def setup(ctx):
    torch.manual_seed(0)  # the same initial parameters on every rank (DDP broadcasts rank 0's anyway)
    o = ctx.opts
    module = torch.nn.Sequential(*[Layer(o.width, o.compute_repeat) for _ in range(o.layers)]).to(ctx.device)
    model = DDP(module, device_ids=[ctx.device.index] if ctx.is_cuda else None,
                bucket_cap_mb=o.bucket_cap_mb, gradient_as_bucket_view=o.gradient_as_bucket_view)
    data = torch.Generator().manual_seed(1000 + ctx.rank)  # each rank its own batch
    x = torch.randn(o.batch, o.width, generator=data).to(ctx.device)
    target = torch.randn(o.batch, o.width, generator=data).to(ctx.device)
    state = State(model=model, x=x, target=target, reference=torch.empty(0))
    step_sync(ctx, state, check=False)
    state.reference = flat_grads(model)
    return state


def flat_grads(model):
    return torch.cat([p.grad.flatten() for p in model.parameters()])


def forward_backward(ctx, s):
    s.model.zero_grad(set_to_none=True)
    with ctx.phase("forward"):
        loss = torch.nn.functional.mse_loss(s.model(s.x), s.target)
    with ctx.phase("backward"):
        loss.backward()


def step_sync(ctx, s, check=True):
    with s.model.no_sync():
        forward_backward(ctx, s)
    with ctx.phase("comm"):
        grads = flat_grads(s.model)
        grads.div_(ctx.world_size)  # DDP divides before it sums, too
        dist.all_reduce(grads)
        offset = 0
        for p in s.model.parameters():
            p.grad.copy_(grads[offset:offset + p.grad.numel()].view_as(p.grad))
            offset += p.grad.numel()
    if check:
        check_grads(ctx, s)


def step_async(ctx, s):
    forward_backward(ctx, s)  # DDP reduces the buckets during backward and waits for the last
    check_grads(ctx, s)


def check_grads(ctx, s):
    with ctx.phase("check"):
        for _ in range(ctx.opts.compute_repeat):  # compute too: a slower device checks slower
            ctx.check_result("grads", flat_grads(s.model), s.reference)
