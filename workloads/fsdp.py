"""FSDP2: an MLP whose layers are each sharded with ``fully_shard``; a layer's parameters are
all-gathered before its forward and again before its backward, and its gradients
reduce-scattered after its backward.

sync:  each layer's all-gather is issued when the layer starts and waited at once, in forward and
       in backward: nothing overlaps it.
async: the next layer's all-gather is prefetched under the current layer's compute
       (``set_modules_to_forward_prefetch``; in backward ``set_modules_to_backward_prefetch``,
       which is what FSDP2 does by default there). ``--opt prefetch=N`` prefetches the next N
       layers' all-gathers instead (0: none), in forward and in backward: issued earlier, each
       has more compute to hide under, and N more layers' parameters are held unsharded at once.

``--opt reshard_after_forward=false`` (both variants) keeps each layer's parameters unsharded
from its forward to its backward (``fully_shard(reshard_after_forward=False)``, ZeRO-2 style):
the backward all-gathers go, at the cost of holding every layer's full parameters.

How the sync variant turns prefetching off: ``_set_unshard_async_op(True)`` (private FSDP2 API,
torch >= 2.6) issues each all-gather where it is needed instead of on FSDP2's own all-gather
streams, which on CUDA prefetch implicitly; and each layer's backward prefetch list names the
layer itself, which is all-gathered by then, so FSDP2's default backward prefetching is off.
The reduce-scatters are the same in both variants: issued without waiting, they run under the
next layer's backward (on CUDA on FSDP2's reduce-scatter stream).

Runs on CPU/gloo too: in torch 2.13 ``fully_shard`` works over gloo (all_gather_into_tensor,
reduce_scatter_tensor), so the suite runs it on 2 CPU ranks.

Every rank keeps its own fixed batch and there is no optimizer step, so every step computes the
same gradient shards; each step checks them against the ones the sync way computed in setup
(``ctx.check_result``) and records their checksum (metric ``grad_shards_checksum``).
"""

from dataclasses import dataclass

import torch
from torch.distributed.fsdp import fully_shard

VARIANTS = {
    "sync": "each layer's all-gather issued when the layer starts, waited at once (no prefetching)",
    "async": "the next layer's all-gather prefetched under the current layer's compute",
}
DEFAULT_VARIANT = "async"
OPTIONS = {
    "layers": (8, "Linear layers, each its own fully_shard unit"),
    "width": (512, "their width: a layer holds width^2 + width float32 parameters (1 MiB at 512)"),
    "batch": (256, "rows per rank per step"),
    "prefetch": (1, "async: layers ahead whose all-gathers are issued (forward and backward; 0: none)"),
    "reshard_after_forward": (True, "free each layer's gathered parameters after its forward (false: keep "
                                    "them for the backward, which then all-gathers nothing)"),
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
    model: torch.nn.Module
    x: torch.Tensor
    target: torch.Tensor
    reference: torch.Tensor  # this rank's gradient shards, flattened, as the sync variant computes them


def setup(ctx):
    torch.manual_seed(0)  # the same parameters on every rank before they are sharded
    o = ctx.opts
    if o.prefetch < 0:
        raise ValueError(f"prefetch must be 0 or more layers, not {o.prefetch}")
    blocks = [Layer(o.width, o.compute_repeat) for _ in range(o.layers)]
    model = torch.nn.Sequential(*blocks).to(ctx.device)
    for block in blocks:
        fully_shard(block, reshard_after_forward=o.reshard_after_forward)
    fully_shard(model)
    if not hasattr(model, "_set_unshard_async_op"):
        raise RuntimeError(f"torch {torch.__version__}: FSDP2 has no _set_unshard_async_op (torch >= 2.6 has)")
    model._set_unshard_async_op(True)  # all-gathers issued and waited where they are needed
    for block in blocks:
        block.set_modules_to_backward_prefetch([block])  # itself: nothing to prefetch
    data = torch.Generator().manual_seed(1000 + ctx.rank)  # each rank its own batch
    x = torch.randn(o.batch, o.width, generator=data).to(ctx.device)
    target = torch.randn(o.batch, o.width, generator=data).to(ctx.device)
    state = State(model=model, x=x, target=target, reference=torch.empty(0))
    step(ctx, state, check=False)  # the reference, computed the sync way
    state.reference = grad_shards(model)
    if ctx.variant == "async" and o.prefetch:
        for i, block in enumerate(blocks):
            block.set_modules_to_forward_prefetch(blocks[i + 1:i + 1 + o.prefetch])
            if i:  # backward runs the layers last to first: the ones before this, nearest first
                block.set_modules_to_backward_prefetch(blocks[max(0, i - o.prefetch):i][::-1])
    return state


def grad_shards(model):
    return torch.cat([p.grad.to_local().flatten() for p in model.parameters()])


def step(ctx, s, check=True):  # both variants: they differ in what setup configured
    s.model.zero_grad(set_to_none=True)
    with ctx.phase("forward"):
        loss = torch.nn.functional.mse_loss(s.model(s.x), s.target)
    with ctx.phase("backward"):
        loss.backward()
    if check:
        with ctx.phase("check"):
            for _ in range(ctx.opts.compute_repeat):  # compute too: a slower device checks slower
                ctx.check_result("grad_shards", grad_shards(s.model), s.reference)
