"""Process-group set-up for one worker. All device-specific choices live here and in launch.py."""

import os
import random
from dataclasses import dataclass
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist


@dataclass
class Env:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    device: torch.device
    backend: str

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init(device: str, threads_per_worker: int = 0, timeout_s: float = 300.0) -> Env:
    """Join the process group described by the torchrun-style environment (RANK, WORLD_SIZE, MASTER_*)."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if device == "cuda":
        torch.cuda.set_device(local_rank)
        dev, backend = torch.device("cuda", local_rank), "nccl"
    else:
        # Workers on one node share its cores; oversubscribed intra-op threads make every rank slower.
        n = threads_per_worker or max(1, (os.cpu_count() or 1) // local_world)
        torch.set_num_threads(n)
        dev, backend = torch.device("cpu"), "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend, rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s),
                                device_id=dev if backend == "nccl" else None)
    return Env(rank, world, local_rank, local_world, dev, backend)


def topology(env: Env) -> dict:
    """Where the job runs: nodes and ranks per node as the launcher said (torchrun, the elastic launch and
    submitit set LOCAL_WORLD_SIZE), and the link between nodes as scripts/cluster_local.sh shaped it."""
    local = env.local_world_size
    return {"nodes": max(1, env.world_size // local), "ranks_per_node": local,
            "link": os.environ.get("RINGEXP_CLUSTER_LINK", "loopback") if env.world_size > local else "loopback"}


def seed_everything(seed: int, rank: int) -> None:
    """Per-rank seeds for dropout/augmentation; model init is made identical by DDP's broadcast."""
    s = seed * 1000 + rank
    random.seed(s)
    np.random.seed(s % 2**32)
    torch.manual_seed(s)


def cleanup() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
