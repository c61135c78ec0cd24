"""Parallel strategies, registered by name: each is `apply(model, cfg, env) -> model` plus the bytes
one rank sends per optimizer step, so records can report traffic without instrumenting the backend."""

from contextlib import nullcontext

from ringexp.parallel import ddp, single

STRATEGIES = {"ddp": ddp, "ring": ddp, "hierarchical": ddp, "naive": ddp, "single": single}


def apply(model, cfg, env):
    return STRATEGIES[str(cfg.parallel.strategy)].apply(model, cfg, env)


def wire_bytes(cfg, shapes: list, world_size: int) -> int:
    """Bytes the busiest rank sends per optimizer step, for gradients of these parameter shapes."""
    return STRATEGIES[str(cfg.parallel.strategy)].wire_bytes(cfg, shapes, world_size)


def no_sync(model, sync: bool):
    """Skip gradient synchronisation on all but the last micro-batch of an accumulated step."""
    return nullcontext() if sync or not hasattr(model, "no_sync") else model.no_sync()
