"""PyTorch DistributedDataParallel: with its builtin all-reduce (strategy ddp, the reference), or with one of
ringexp's collectives as its communication hook (ring, hierarchical, naive). DDP's own bucketing,
bucket_cap_mb and gradient_as_bucket_view work the same either way."""

from torch.nn.parallel import DistributedDataParallel as DDP

from ringexp import comm
from ringexp.parallel import hooks

ALGORITHM = {"ddp": "builtin", "ring": "ring", "hierarchical": "hierarchical", "naive": "naive"}


def comm_options(p) -> dict:
    return {"segment_bytes": p.segment_kb * 1024, "timeout_s": p.timeout_s, "nodes": p.nodes,
            "variant": p.variant}


def apply(model, cfg, env):
    p = cfg.parallel
    ddp = DDP(
        model.to(env.device),
        device_ids=[env.local_rank] if env.device.type == "cuda" else None,
        bucket_cap_mb=p.bucket_cap_mb,
        gradient_as_bucket_view=p.gradient_as_bucket_view,
        static_graph=p.static_graph,
        find_unused_parameters=p.find_unused_parameters,
    )
    algorithm = ALGORITHM[p.strategy]
    if algorithm != "builtin":
        ddp.comm_state = hooks.register(ddp, algorithm, comm_options(p))
    return ddp


def wire_bytes(cfg, grad_bytes: int, world_size: int) -> int:
    p = cfg.parallel
    return comm.wire_bytes(ALGORITHM[p.strategy], grad_bytes, world_size, **comm_options(p))
