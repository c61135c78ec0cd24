"""How workers start: PyTorch's elastic launch on this machine, or in place when an external torchrun
(or a Slurm task) already made this process one rank of the job."""

import os
import tempfile
import uuid
from pathlib import Path


def under_external_launcher() -> bool:
    """True when this process is already a rank: torchrun (or anything torchrun-like) set RANK/WORLD_SIZE."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def slurm_task() -> bool:
    """True inside a task of a Slurm job that submitit started (hydra/launcher=slurm)."""
    return os.environ.get("SUBMITIT_EXECUTOR") == "slurm"


def elastic(fn, nproc: int, *args, log_dir=None) -> dict:
    """Run fn(*args) in `nproc` local workers through torch's elastic launch (the engine behind torchrun);
    returns {rank: return value}. fn must be importable (workers are spawned)."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=uuid.uuid4().hex[:12],
        # Port 0: the rendezvous store picks a free port, so consecutive or concurrent jobs never collide.
        rdzv_backend="c10d", rdzv_endpoint="localhost:0",
        start_method="spawn", max_restarts=0, monitor_interval=0.1,
        logs_specs=DefaultLogsSpecs(log_dir=str(log_dir or tempfile.mkdtemp(prefix="ringexp-"))),
    )
    return elastic_launch(config, fn)(*args)


def launch(cfg: dict, run_dir: Path, meta: dict):
    """Run the job; returns rank 0's summary."""
    from ringexp.loop import run_worker

    if slurm_task():
        from submitit.helpers import TorchDistributedEnvironment

        # One rank per Slurm task: rank, world size and master address from the job's environment (on any
        # number of nodes). CUDA_VISIBLE_DEVICES stays as Slurm set it: ringexp picks the GPU by LOCAL_RANK.
        TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)
        return run_worker(cfg, str(run_dir), meta)
    if under_external_launcher():
        return run_worker(cfg, str(run_dir), meta)
    return elastic(run_worker, cfg["launcher"]["nproc_per_node"], cfg, str(run_dir), meta,
                   log_dir=run_dir / "workers")[0]
