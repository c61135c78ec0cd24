"""Gradient accumulation on real 2-process gloo DDP: k micro-steps, synchronised on the last, equal one
step on the k-times batch; and DDP communicates once per optimizer step, not once per micro-step."""

import copy
from contextlib import nullcontext

import pytest
import torch
from helpers.processes import workers
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel as DDP

from ringexp import dist as rdist
from ringexp.trainer import forward_backward


def counting_allreduce(state, bucket):
    state["calls"] += 1
    return allreduce_hook(None, bucket)


def grads_after(model, x, y, k):
    ddp = DDP(copy.deepcopy(model))
    calls = {"calls": 0}
    ddp.register_comm_hook(calls, counting_allreduce)
    micro = iter(zip(x.chunk(k), y.chunk(k), strict=True))
    loss = forward_backward(ddp, micro, k, nullcontext, torch.amp.GradScaler("cpu", enabled=False),
                            lambda sync: nullcontext() if sync else ddp.no_sync())
    return [p.grad.clone() for p in ddp.parameters()], float(loss), calls["calls"]


def accumulation_worker(k):
    env = rdist.init("cpu")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 5))
    g = torch.Generator().manual_seed(100 + env.rank)  # each rank its own data
    x = torch.randn(4 * k, 3, 9, 9, generator=g)
    y = torch.randint(0, 2, (4 * k, 5), generator=g).float()
    acc, acc_loss, acc_calls = grads_after(model, x, y, k)
    one, one_loss, one_calls = grads_after(model, x, y, 1)
    rdist.cleanup()
    max_diff = max((a - b).abs().max().item() for a, b in zip(acc, one, strict=True))
    return max_diff, abs(acc_loss - one_loss), acc_calls, one_calls


@pytest.mark.parametrize("k", [2, 4])
def test_accumulated_step_equals_big_batch_step(k):
    results = workers(accumulation_worker, 2, k)
    for max_diff, loss_diff, acc_calls, one_calls in results.values():
        assert max_diff < 1e-6 and loss_diff < 1e-6
        # no_sync on the first k-1 micro-steps: as many collectives as a single step, not k times as many
        assert acc_calls == one_calls >= 1
