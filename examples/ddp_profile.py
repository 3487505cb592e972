"""A DDP training loop as you would write it, recorded with ``overlapprof.profile``.

    python -m torch.distributed.run --nproc-per-node 2 examples/ddp_profile.py --run-id ddp
    python -m torch.distributed.run --nproc-per-node 2 examples/ddp_profile.py --run-id ddp-no-sync --no-sync
    overlapprof compare traces/ddp-no-sync traces/ddp

Default: DDP's bucketed all_reduce overlaps backward. ``--no-sync``: backward under
``model.no_sync()``, then one all_reduce of all gradients (nothing overlaps): the baseline.
On GPUs (one per rank) it uses NCCL and ``cuda:LOCAL_RANK``; elsewhere gloo on CPU.
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import overlapprof


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="traces")
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--no-sync", action="store_true", help="one all_reduce after backward")
    parser.add_argument("--bucket-cap-mb", type=float, default=2.0)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--active", type=int, default=16, help="profiled steps (overlapprof's default)")
    return parser.parse_args(argv)


def main():
    args = parse_args()

    cuda = torch.cuda.is_available() and torch.cuda.device_count() >= int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    if cuda:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")

    torch.manual_seed(0)
    layers = []
    for _ in range(args.layers):
        layers += [torch.nn.Linear(args.width, args.width), torch.nn.ReLU()]
    model = DDP(torch.nn.Sequential(*layers).to(device), bucket_cap_mb=args.bucket_cap_mb)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(args.batch, args.width, device=device)
    y = torch.randn(args.batch, args.width, device=device)

    options = {"no_sync": args.no_sync, "bucket_cap_mb": args.bucket_cap_mb}
    with overlapprof.profile(out=args.out, run_id=args.run_id, variant="no_sync" if args.no_sync else "ddp",
                             options=options, active=args.active) as prof:
        while not prof.done:  # or: for batch in loader: ... prof.step()
            optimizer.zero_grad(set_to_none=True)
            if args.no_sync:
                with model.no_sync():
                    torch.nn.functional.mse_loss(model(x), y).backward()
                grads = [p.grad for p in model.parameters()]
                flat = torch.cat([g.flatten() for g in grads]).div_(dist.get_world_size())
                dist.all_reduce(flat)
                offset = 0
                for g in grads:
                    g.copy_(flat[offset:offset + g.numel()].view_as(g))
                    offset += g.numel()
            else:
                torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
            prof.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
