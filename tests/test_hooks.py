"""DDP with ringexp's collectives as communication hooks: the same training as builtin DDP, and really
overlapped with backward."""

import time
from contextlib import nullcontext

import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

from ringexp import comm, parallel
from ringexp import dist as rdist
from ringexp.launch import elastic
from ringexp.loop import forward_backward
from ringexp.metrics import state_bytes
from ringexp.models import small_cnn
from ringexp.train import compose_config

HOOKED = ("ring", "hierarchical", "naive")


def strategy_cfg(strategy: str, world: int, **parallel_overrides):
    cfg = OmegaConf.to_container(compose_config([f"+parallel={strategy}", f"launcher.nproc_per_node={world}"]))
    cfg["parallel"] |= parallel_overrides
    return OmegaConf.create(cfg)


def train_steps(model, opt, rank: int, k: int, steps: int):
    """`steps` optimizer steps of k micro-batches of random data (per-rank, same for every strategy): the
    losses and the whole gradients (FSDP's shards gathered) of every step, and the bytes of parameters,
    gradients and optimizer state the rank held after the first."""
    losses, grads, state = [], [], None
    for step in range(steps):
        g = torch.Generator().manual_seed(100 * step + rank)
        micro = iter([(torch.randn(4, 3, 12, 12, generator=g), torch.randint(0, 2, (4, 5), generator=g).float())
                      for _ in range(k)])
        scaler = torch.amp.GradScaler("cpu", enabled=False)
        losses.append(float(forward_backward(model, micro, k, nullcontext, scaler)))
        grads.append(torch.cat([(p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).flatten()
                                for p in model.parameters()]))
        opt.step()
        state = state or state_bytes(model, opt)
        opt.zero_grad()
    return losses, grads, state["state_bytes"]


def equivalence_worker(k: int):
    env = rdist.init("cpu")
    out = {}
    for strategy in ("ddp", *HOOKED):
        # tiny buckets: several per step, so bucket order and overlap matter
        cfg = strategy_cfg(strategy, env.world_size, bucket_cap_mb=0.01, segment_kb=1)
        torch.manual_seed(0)
        model = parallel.apply(small_cnn(5, width=8), cfg, env)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        out[strategy] = train_steps(model, opt, env.rank, k, 3)[:2]
    rdist.cleanup()
    ref_losses, ref_grads = out["ddp"]
    return {s: (max(abs(a - b) for a, b in zip(losses, ref_losses, strict=True)),
                max(float((a - b).abs().max()) for a, b in zip(grads, ref_grads, strict=True)))
            for s, (losses, grads) in out.items() if s != "ddp"}


@pytest.mark.parametrize("world,k", [(2, 1), (2, 3), (4, 1), (4, 2)])
def test_hooked_ddp_trains_like_builtin_ddp(world, k):
    results = elastic(equivalence_worker, world, k)
    for rank, diffs in results.items():
        assert set(diffs) == set(HOOKED)
        for strategy, (loss_diff, grad_diff) in diffs.items():
            assert loss_diff < 1e-5 and grad_diff < 1e-5, (rank, strategy, loss_diff, grad_diff)


def overlap_worker():
    env = rdist.init("cpu")
    cfg = strategy_cfg("ring", env.world_size, bucket_cap_mb=1)
    torch.manual_seed(0)
    # Backward reaches the big last layer first: its gradient (a 16 MB bucket of its own) travels while
    # the many small layers below it are differentiated, each one a timestamp.
    # The layers below are made slow enough (about 100 ms of backward in all) that the hook thread gets
    # scheduled while they run even on a loaded 2-core machine.
    layers = [m for _ in range(40) for m in (nn.Linear(512, 512), nn.ReLU())]
    model = nn.Sequential(*layers, nn.Linear(512, 64), nn.Linear(64, 1 << 16))
    ddp = parallel.apply(model, cfg, env)
    # when each collective really ran, seen from the hook thread (the test's own instrumentation)
    events, all_reduce = [], comm.all_reduce

    def recorded(*args, **kwargs):
        start = time.perf_counter()
        out = all_reduce(*args, **kwargs)
        events.append((start, time.perf_counter()))
        return out
    comm.all_reduce = recorded
    grad_times = []
    for p in ddp.parameters():
        p.register_post_accumulate_grad_hook(lambda _p: grad_times.append(time.perf_counter()))
    x = torch.randn(128, 512)
    for _ in range(3):
        grad_times.clear()
        ddp(x).square().mean().backward()
    events = events[-len(events) // 3:]  # the last step's buckets
    rdist.cleanup()
    # gradients that became ready while some bucket's collective was in flight
    during = sum(any(start < t < end for start, end in events) for t in grad_times)
    return during, len(grad_times), [(round(s, 4), round(e - s, 4)) for s, e in events]


def test_hook_overlaps_communication_with_backward():
    results = elastic(overlap_worker, 2)
    for rank, (during, total, events) in results.items():
        assert during >= 1, (rank, during, total, events)
