"""Recipe: ringexp's ring all-reduce (optionally with a compressed wire format) inside your own DDP training loop.

    torchrun --standalone --nproc-per-node 2 examples/ddp_hook.py --algorithm ring --compression fp16

Everything here is a plain PyTorch DDP script; the three lines marked `ringexp` are all it takes. Without
--algorithm, DDP's builtin all-reduce runs (to compare). --out saves the final parameters (rank 0).
"""

import argparse

import torch
import torch.distributed as dist
import torchvision
from torch.nn.parallel import DistributedDataParallel as DDP

import ringexp


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--algorithm", default=None, help="ring, hierarchical, naive (default: DDP's builtin)")
    ap.add_argument("--compression", default=None, help="fp16, bf16, int8, topk, randomk, sign")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    dist.init_process_group("gloo")  # "nccl" on GPUs; the hook is the same
    rank = dist.get_rank()
    torch.manual_seed(0)  # the same initial model everywhere (DDP broadcasts rank 0's anyway)
    model = DDP(torchvision.models.resnet18(num_classes=10))
    if args.algorithm:  # ringexp
        state, hook = ringexp.ddp_comm_hook(args.algorithm, compression=args.compression)  # ringexp
        model.register_comm_hook(state, hook)  # ringexp
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    data = torch.Generator().manual_seed(rank)  # each rank its own batches
    for step in range(args.steps):
        x, y = torch.randn(8, 3, 32, 32, generator=data), torch.randint(0, 10, (8,), generator=data)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == 0:
            print(f"step {step}: loss {loss.item():.4f}", flush=True)
    if args.algorithm:
        print(f"rank {rank}: the hook reduced {state.buckets} buckets", flush=True)
        state.close()  # its thread and process group
    if args.out and rank == 0:
        torch.save({k: v.detach().clone() for k, v in model.module.state_dict().items()}, args.out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
