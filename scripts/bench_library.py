"""ringexp's hook in a user's own DDP loop on ResNet-18, against builtin DDP. A benchmark, not a test.

In one elastic job of 2 CPU workers (gloo, cores / 2 threads each), one DDP copy of torchvision's resnet18
(10 classes, no pretrained weights; about 45 MB of gradients in DDP's default 25 MB buckets) per mode, all from
the same weights, train alternately on the same random 3x64x64 batch: rounds in ABBA order, each a few warm-up
steps then `--steps` timed steps between two barriers. First every mode's gradients are checked against
builtin's. Printed: each round's steps/s, then per mode the median and range of its per-round throughput ratio
to builtin, and the CPU time per step of rank 0's process (insensitive to other load on the machine).

    python scripts/bench_library.py [--modes builtin,ring,ring+fp16] [--rounds 10] [--steps 10] [--batch 16]

A mode is `builtin` (DDP's own all-reduce) or ALGORITHM[+COMPRESSION] through ringexp.ddp_comm_hook.
"""

import argparse
import statistics
import time

import torch
import torch.distributed as dist
import torchvision
from torch.nn.parallel import DistributedDataParallel as DDP

import ringexp
from ringexp import dist as rdist
from ringexp.launch import elastic


def build(mode: str):
    torch.manual_seed(0)
    model = DDP(torchvision.models.resnet18(num_classes=10))  # bucket_cap_mb=25, DDP's default
    state = None
    if mode != "builtin":
        algorithm, _, compression = mode.partition("+")
        state, hook = ringexp.ddp_comm_hook(algorithm, compression=compression or None)
        model.register_comm_hook(state, hook)
    return model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9), state


def step(model, opt, x, y) -> None:
    opt.zero_grad(set_to_none=True)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()


def grad_errors(models: dict, x, y) -> dict:
    """Each mode's largest gradient difference from builtin's, relative to builtin's largest gradient."""
    grads = {}
    for mode, (model, opt, _) in models.items():
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        grads[mode] = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        opt.zero_grad(set_to_none=True)
    ref = grads["builtin"]
    return {m: float((g - ref).abs().max() / ref.abs().max()) for m, g in grads.items() if m != "builtin"}


def worker(modes: list, rounds: int, steps: int, warmup: int, batch: int) -> dict:
    env = rdist.init("cpu")
    models = {mode: build(mode) for mode in modes}
    g = torch.Generator().manual_seed(1234 + env.rank)
    x, y = torch.randn(batch, 3, 64, 64, generator=g), torch.randint(0, 10, (batch,), generator=g)
    errors = grad_errors(models, x, y)
    for model, opt, _ in models.values():  # DDP's bucket rebuild, allocator and caches, before any timing
        for _ in range(warmup + 2):
            step(model, opt, x, y)
    rates, cpu = {m: [] for m in modes}, {m: [] for m in modes}
    for r in range(rounds):
        for mode in modes if r % 2 == 0 else modes[::-1]:
            model, opt, _ = models[mode]
            for _ in range(warmup):
                step(model, opt, x, y)
            dist.barrier()
            t, c = time.perf_counter(), time.process_time()
            for _ in range(steps):
                step(model, opt, x, y)
            cpu[mode].append((time.process_time() - c) / steps)
            dist.barrier()
            rates[mode].append(steps / (time.perf_counter() - t))
        if env.rank == 0:
            print(f"round {r + 1:2d}: " + "  ".join(f"{m} {rates[m][-1]:.3f}" for m in modes) + " steps/s", flush=True)
    for _, _, state in models.values():
        if state is not None:
            state.close()
    rdist.cleanup()
    return {"errors": errors, "rates": rates, "cpu": cpu}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modes", default="builtin,ring")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batch", type=int, default=16)
    args = ap.parse_args()
    modes = args.modes.split(",")
    if modes[0] != "builtin":
        ap.error("--modes must start with builtin, the reference")
    out = elastic(worker, 2, modes, args.rounds, args.steps, args.warmup, args.batch)[0]
    rates = out["rates"]
    print(f"builtin: {statistics.median(rates['builtin']):.3f} steps/s, "
          f"CPU {1e3 * statistics.median(out['cpu']['builtin']):.0f} ms/step")
    for mode in modes[1:]:
        ratios = [a / b for a, b in zip(rates[mode], rates["builtin"], strict=True)]
        print(f"{mode}: {statistics.median(ratios):.3f} x builtin's throughput (rounds {min(ratios):.3f} - "
              f"{max(ratios):.3f}), CPU {1e3 * statistics.median(out['cpu'][mode]):.0f} ms/step, "
              f"gradients within {out['errors'][mode]:.1e} of builtin's")


if __name__ == "__main__":
    main()
