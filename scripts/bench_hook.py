"""What the Python hook through which ringexp times builtin DDP costs a step. A benchmark, not a test.

In one elastic job of 2 CPU workers, three DDP copies of the default small CNN train alternately (rounds in
ABBA order): DDP's own C++ all-reduce, PyTorch's `allreduce_hook` registered as a Python hook, and that hook
wrapped by ringexp.timing.timed_hook (what `+parallel=ddp` runs). Printed: the median step time of each and
the ratios to plain DDP.

    python scripts/bench_hook.py [--rounds 8] [--steps 30]
"""

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from ringexp import dist as rdist
from ringexp import timing
from ringexp.launch import elastic
from ringexp.models import small_cnn

KINDS = ("C++ all-reduce", "Python hook", "timed Python hook")


def make(kind: str, timer):
    torch.manual_seed(0)
    model = DDP(small_cnn(8, 16))
    if kind == KINDS[1]:
        model.register_comm_hook(None, default_hooks.allreduce_hook)
    elif kind == KINDS[2]:
        model.register_comm_hook(None, timing.timed_hook(default_hooks.allreduce_hook, timer))
    return model, torch.optim.AdamW(model.parameters())


def worker(rounds: int, steps: int) -> dict:
    env = rdist.init("cpu")
    timer = timing.CommTimer(timing.Clock(env.device))
    models = {kind: make(kind, timer) for kind in KINDS}
    x, y = torch.randn(64, 3, 32, 32), (torch.rand(64, 8) > 0.5).float()
    medians = {kind: [] for kind in KINDS}
    for r in range(rounds):
        for kind in KINDS if r % 2 == 0 else KINDS[::-1]:
            model, opt = models[kind]
            times = []
            for _ in range(steps):
                t = time.perf_counter()
                timer.reset()
                F.binary_cross_entropy_with_logits(model(x), y).backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                times.append(time.perf_counter() - t)
            medians[kind].append(statistics.median(times[5:]))
    rdist.cleanup()
    return {kind: statistics.median(v) for kind, v in medians.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--steps", type=int, default=30)
    args = ap.parse_args()
    result = elastic(worker, 2, args.rounds, args.steps)[0]
    base = result[KINDS[0]]
    for kind, t in result.items():
        print(f"{kind:>18}: {1e3 * t:6.1f} ms/step   throughput vs C++ all-reduce {base / t:.3f}")


if __name__ == "__main__":
    main()
