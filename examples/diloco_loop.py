"""Recipe: DiLoCo (or local SGD) in your own training loop, with ringexp's Averager.

    torchrun --standalone --nproc-per-node 2 examples/diloco_loop.py [--period 8] [--compression int8]

No DDP: every rank trains its own copy on its own data; every `period` steps the ranks average their
pseudo-gradients (the last synchronisation's weights minus their own) through ringexp's ring, compressed to int8
with error feedback here, and take an outer Nesterov step (DiLoCo's 0.7 and 0.9). outer_lr=1.0 and
outer_momentum=0.0 make it local SGD. The last step synchronises every fragment, so every rank ends with the same
model. Checkpoint `averager.state_dict()` beside your model and optimizer to resume bit for bit.
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import ringexp


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--period", type=int, default=8)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--compression", default="int8")
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)  # the same initial weights on every rank
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    averager = ringexp.Averager(model, args.period, outer_lr=0.7, outer_momentum=0.9, algorithm="ring",
                                compression=args.compression, last_step=args.steps)
    g = torch.Generator().manual_seed(rank)  # each rank its own data
    w = torch.randn(16, 4, generator=torch.Generator().manual_seed(99))  # one task for all
    losses = []
    for step in range(1, args.steps + 1):
        x = torch.randn(32, 16, generator=g)
        loss = F.mse_loss(model(x), x @ w)
        loss.backward()
        opt.step()
        opt.zero_grad()
        averager.step(step)
        losses.append(loss.item())
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    everyone = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, flat)
    agree = all(torch.equal(flat, other) for other in everyone)
    print(f"rank {rank}: {averager.syncs} synchronisations, models agree: {agree}, "
          f"loss {losses[0]:.3f} -> {losses[-1]:.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
