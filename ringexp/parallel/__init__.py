"""Parallel strategies, registered by name: each is `apply(model, cfg, env) -> model` plus the bytes
one rank sends per optimizer step, so records can report traffic without instrumenting the backend."""

from contextlib import nullcontext

import torch

from ringexp.parallel import ddp, fsdp, single

STRATEGIES = {"ddp": ddp, "ring": ddp, "hierarchical": ddp, "naive": ddp, "fsdp": fsdp, "single": single}


def apply(model, cfg, env, timer=None, example=None):
    """The model wrapped by the strategy; its collectives report to `timer` (a ringexp.timing.CommTimer).
    `example`: an input batch of the right shape, with which DDP settles its buckets (see ddp.settle_buckets)."""
    return STRATEGIES[str(cfg.parallel.strategy)].apply(model, cfg, env, timer, example)


def wire_note(cfg) -> str:
    """What the bytes-on-wire figure counts, where the backend changes it."""
    note = getattr(STRATEGIES[str(cfg.parallel.strategy)], "wire_note", None)
    return note(cfg) if note else "bytes each rank sends with the chosen algorithm"


def exposure(cfg) -> str:
    """How exposed communication is measured (ringexp.timing.CommTimer)."""
    return "blocking" if cfg.parallel.strategy == "fsdp" else "handover"


def grad_scaler(cfg, device):
    """fp16 loss scaling. With sharded gradients each rank sees only its shard's infs, so FSDP needs the
    scaler that agrees on them across ranks (else ranks skip different steps and their scales drift apart)."""
    enabled = cfg.amp.mode == "fp16"
    if cfg.parallel.strategy == "fsdp" and enabled:
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        return ShardedGradScaler(device.type)
    return torch.amp.GradScaler(device.type, enabled=enabled)


def wire_bytes(cfg, shapes: list, world_size: int) -> int:
    """Bytes the busiest rank sends per optimizer step, for gradients of these parameter shapes."""
    return STRATEGIES[str(cfg.parallel.strategy)].wire_bytes(cfg, shapes, world_size)


def no_sync(model, sync: bool):
    """Skip gradient synchronisation on all but the last micro-batch of an accumulated step (DDP's no_sync,
    FSDP2's switch)."""
    if hasattr(model, "set_requires_gradient_sync"):
        model.set_requires_gradient_sync(sync)
        return nullcontext()
    return nullcontext() if sync or not hasattr(model, "no_sync") else model.no_sync()
