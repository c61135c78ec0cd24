"""PyTorch DistributedDataParallel: with its builtin all-reduce (strategy ddp, the reference), or with one of
ringexp's collectives as its communication hook (ring, hierarchical, naive). DDP's own bucketing,
bucket_cap_mb and gradient_as_bucket_view work the same either way.

Compression: with the builtin all-reduce, PyTorch's own hooks where they exist (fp16/bf16 compress hooks,
PowerSGD); every other combination goes through ringexp's hook and ringexp.compress."""

import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from ringexp import compress, timing
from ringexp.parallel import hooks

TORCH_CAST_HOOKS = {"fp16": default_hooks.fp16_compress_hook, "bf16": default_hooks.bf16_compress_hook}

ALGORITHM = {"ddp": "builtin", "ring": "ring", "hierarchical": "hierarchical", "naive": "naive"}


def comm_options(p) -> dict:
    return {"segment_bytes": p.segment_kb and p.segment_kb * 1024, "timeout_s": p.timeout_s, "nodes": p.nodes,
            "variant": p.variant}


def apply(model, cfg, env, timer=None, example=None):
    p = cfg.parallel
    ddp = DDP(
        model.to(env.device),
        device_ids=[env.local_rank] if env.device.type == "cuda" else None,
        bucket_cap_mb=p.bucket_cap_mb,
        gradient_as_bucket_view=p.gradient_as_bucket_view,
        static_graph=p.static_graph,
        find_unused_parameters=p.find_unused_parameters,
    )
    if example is not None:
        settle_buckets(ddp, example)
    algorithm, c = ALGORITHM[p.strategy], cfg.compression
    if c.name == "powersgd":
        state, hook = compress.powersgd.hook(c, compress.error_feedback(c))
    elif algorithm == "builtin" and c.name in TORCH_CAST_HOOKS:
        state, hook = None, TORCH_CAST_HOOKS[c.name]
    elif algorithm != "builtin" or c.name != "none":
        compressor = None if c.name == "none" else compress.State(c, momentum=cfg.optim.momentum)
        state, hook = hooks.make_state(algorithm, comm_options(p) | {"scope": c.scope}, compressor), hooks.comm_hook
    elif timer is not None:  # what DDP's C++ reducer does by default, as a hook so that it can be timed
        state, hook = None, default_hooks.allreduce_hook
    else:
        return ddp
    ddp.comm_state = state
    ddp.register_comm_hook(state, hook if timer is None else timing.timed_hook(hook, timer))
    return ddp


def settle_buckets(ddp, example) -> None:
    """One throwaway backward, before any hook is registered, so that every real step runs on DDP's final buckets.

    DDP packs gradients into buckets in reverse parameter order, then re-packs them once, in the order the first
    backward made them ready. The bucket layout decides where the ring cuts its chunks and which elements a
    compressor sees together, so a run resumed from a checkpoint (whose first step would use the initial layout)
    would otherwise drift from the uninterrupted run. Eval mode and a zero batch: no batch-norm statistics, no
    dropout and no data are touched; torch's RNG is restored all the same."""
    rng = torch.get_rng_state()
    was_training = ddp.training
    ddp.eval()
    ddp(torch.zeros_like(example)).float().sum().backward()
    ddp.zero_grad(set_to_none=True)
    ddp.train(was_training)
    torch.set_rng_state(rng)


def wire_bytes(cfg, shapes: list, world_size: int) -> int:
    p = cfg.parallel
    numel = sum(s.numel() for s in shapes)
    return compress.wire_bytes(cfg.compression, ALGORITHM[p.strategy], numel, world_size, shapes, **comm_options(p))
