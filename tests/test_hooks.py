"""DDP with ringexp's collectives as communication hooks: the same training as builtin DDP, and really
overlapped with backward."""

import threading
import time
from functools import partial

import pytest
import torch
from helpers.processes import workers
from helpers.runs import strategy_cfg, train_steps
from torch import nn

from ringexp import comm, parallel
from ringexp import dist as rdist
from ringexp.models import small_cnn

HOOKED = ("ring", "hierarchical", "naive")


def equivalence_worker(k: int):
    env = rdist.init("cpu")
    out = {}
    for strategy in ("ddp", *HOOKED):
        # tiny buckets: several per step, so bucket order and overlap matter
        cfg = strategy_cfg(strategy, env.world_size, bucket_cap_mb=0.01, segment_kb=1)
        torch.manual_seed(0)
        strat = parallel.build(cfg, env)
        model = strat.wrap(small_cnn(5, width=8))
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        out[strategy] = train_steps(model, opt, env.rank, k, 3, partial(strat.no_sync, model))[:2]
        strat.close()
    rdist.cleanup()
    ref_losses, ref_grads = out["ddp"]
    return {s: (max(abs(a - b) for a, b in zip(losses, ref_losses, strict=True)),
                max(float((a - b).abs().max()) for a, b in zip(grads, ref_grads, strict=True)))
            for s, (losses, grads) in out.items() if s != "ddp"}


@pytest.mark.parametrize("world,k", [(2, 1), (2, 3), pytest.param(4, 1, marks=pytest.mark.slow),
                                     pytest.param(4, 2, marks=pytest.mark.slow)])
def test_hooked_ddp_trains_like_builtin_ddp(world, k):
    results = workers(equivalence_worker, world, k)
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
    ddp = parallel.build(cfg, env).wrap(model)
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
    steps = []  # per step after the first (which DDP spends on its bucket layout): its collectives and gradients
    for step in range(5):
        grad_times.clear()
        del events[:]
        ddp(x).square().mean().backward()
        if step:
            steps.append((list(events), list(grad_times)))
    rdist.cleanup()
    # gradients that became ready while one of the same step's collectives was in flight, in the best step (a
    # loaded machine may not schedule the hook thread during every backward; a hook that blocked backward would
    # never let a gradient become ready while its collective runs)
    during = max(sum(any(start < t < end for start, end in ev) for t in grads) for ev, grads in steps)
    ev, grads = steps[-1]
    return during, len(grads), [(round(s, 4), round(e - s, 4)) for s, e in ev]


def test_hook_overlaps_communication_with_backward():
    results = workers(overlap_worker, 2)
    for rank, (during, total, events) in results.items():
        assert during >= 1, (rank, during, total, events)


def closing_worker():
    env = rdist.init("cpu")
    strat = parallel.build(strategy_cfg("ring", env.world_size), env)
    model = strat.wrap(small_cnn(5, width=8))
    train_steps(model, torch.optim.SGD(model.parameters(), lr=0.1), env.rank, 1, 2,
                partial(strat.no_sync, model))
    threads = [t for t in threading.enumerate() if t.name.startswith("ringexp-ring")]
    strat.close()
    for t in threads:
        t.join(timeout=10)
    rdist.cleanup()
    return len(threads), [t.name for t in threads if t.is_alive()]


def test_the_hook_thread_ends_when_the_strategy_closes():
    for rank, (started, alive) in workers(closing_worker, 2).items():
        assert started == 1 and alive == [], (rank, started, alive)


def device_worker():
    env = rdist.init("cpu")
    seen, on_device = [], rdist.on_device

    def spy(device, ready=None, streams=None):  # the hook reaches it through the module: this sees every call
        seen.append((threading.current_thread().name, device))
        return on_device(device, ready, streams)
    rdist.on_device = spy
    strat = parallel.build(strategy_cfg("ring", env.world_size, bucket_cap_mb=0.01), env)
    model = strat.wrap(small_cnn(5, width=8))
    train_steps(model, torch.optim.SGD(model.parameters(), lr=0.1), env.rank, 1, 2, partial(strat.no_sync, model))
    buckets = strat.hook_state.buckets
    strat.close()
    rdist.cleanup()
    return seen, buckets


def test_the_hook_thread_works_on_the_bucket_s_device_named_explicitly():
    """Every bucket's collective runs inside ringexp.dist.on_device for the bucket's own device, on the hook's
    worker thread: on CUDA that sets the thread's device and side stream (a new thread's device is cuda:0)."""
    for rank, (seen, buckets) in workers(device_worker, 2).items():
        assert len(seen) >= 2 and all(name.startswith("ringexp-ring") and device == torch.device("cpu")
                                      for name, device in seen), (rank, seen)
        assert len(seen) == buckets, (rank, len(seen), buckets)
