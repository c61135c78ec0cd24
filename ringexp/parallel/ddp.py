"""PyTorch DistributedDataParallel with its builtin all-reduce (the reference every strategy is held to)."""

from torch.nn.parallel import DistributedDataParallel as DDP


def apply(model, cfg, env):
    p = cfg.parallel
    return DDP(
        model.to(env.device),
        device_ids=[env.local_rank] if env.device.type == "cuda" else None,
        bucket_cap_mb=p.bucket_cap_mb,
        gradient_as_bucket_view=p.gradient_as_bucket_view,
        static_graph=p.static_graph,
        find_unused_parameters=p.find_unused_parameters,
    )


def wire_bytes(grad_bytes: int, world_size: int) -> int:
    # A ring all-reduce (NCCL's and gloo's default) sends 2(n-1)/n of the buffer from every rank.
    return 2 * (world_size - 1) * grad_bytes // world_size
