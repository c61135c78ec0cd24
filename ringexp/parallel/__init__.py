"""Parallel strategies, one module each, behind one interface (`base.Strategy`): how the model is wrapped,
no_sync, the grad scaler, how exposed communication is measured, bytes on the wire, how the model and the
communication state are saved and loaded. Registered by `parallel.strategy` name.

    single        base.py   one process
    ddp           ddp.py    DDP with its builtin all-reduce (the reference)
    ring, hierarchical, naive   ddp.py + hooks.py: DDP with a ringexp collective (ringexp.comm) as its hook
    fsdp          fsdp.py   PyTorch FSDP2
    local_sgd     local_sgd.py   post-local SGD: DDP's warm-up, then models averaged every parallel.period steps
    diloco        diloco.py      DiLoCo: inner steps, an outer Nesterov step on the averaged pseudo-gradient

Each also answers, without a process group, what it sends per step (`traffic`) and what its step costs on a
cluster model (`step_cost`): the run's bytes on the wire and ringexp.plan's predictions are the same code.
"""

import dataclasses

from ringexp import compress
from ringexp.cluster import nccl
from ringexp.config import AVERAGING, AVERAGING_KEYS, CompressionConfig, ParallelConfig, StrategyName
from ringexp.errors import ConfigError
from ringexp.parallel.base import Single, Strategy, World
from ringexp.parallel.ddp import DDPStrategy
from ringexp.parallel.diloco import DiLoCoStrategy
from ringexp.parallel.fsdp import FSDPStrategy
from ringexp.parallel.local_sgd import LocalSGDStrategy, plain_ddp

STRATEGIES = {StrategyName.single: Single, StrategyName.ddp: DDPStrategy, StrategyName.ring: DDPStrategy,
              StrategyName.hierarchical: DDPStrategy, StrategyName.naive: DDPStrategy, StrategyName.fsdp: FSDPStrategy,
              StrategyName.local_sgd: LocalSGDStrategy, StrategyName.diloco: DiLoCoStrategy}


def build(cfg, env) -> Strategy:
    """This worker's strategy for `cfg` (a TrainConfig) in process environment `env` (ringexp.dist.Env)."""
    return STRATEGIES[cfg.parallel.strategy](cfg, env)


def check(cfg, world_size: int) -> None:
    """The strategy's own refusals (ConfigError), before any worker starts; the averaging's settings on a strategy
    that does not average."""
    p = cfg.parallel
    if p.strategy not in AVERAGING:
        changed = [k for k in AVERAGING_KEYS if getattr(p, k) != getattr(ParallelConfig, k)]
        if changed:
            raise ConfigError(f"parallel.{changed[0]}={getattr(p, changed[0])} with parallel.strategy={p.strategy}: "
                              "only local_sgd and diloco synchronise models periodically; use +parallel=local_sgd "
                              "or diloco, or drop the override")
    STRATEGIES[p.strategy].check(cfg, world_size)


def traffic(cfg, world: World, shapes: list) -> int:
    """Bytes the busiest rank sends per optimizer step of `cfg` in `world`, as its strategy counts them."""
    return STRATEGIES[cfg.parallel.strategy].traffic(cfg, world, shapes)


def samples_per_update(cfg, world_size: int) -> int:
    """Samples behind one optimizer update of one model replica of `cfg` on `world_size` ranks, as its strategy
    counts them (what optim.lr_rule scales the learning rate by)."""
    return STRATEGIES[cfg.parallel.strategy].samples_per_update(cfg, world_size)


def step_cost(cl, cfg, shapes: list, compute: dict) -> dict:
    """The strategy's predicted step of `cfg` on cluster `cl` (comm_s, exposed_s, step_s), the samples/s of every
    rank together that follows, and NCCL's algorithms and protocols in it (`nccl`: '' on gloo). The run's
    NCCL_ALGO / NCCL_PROTO (backend.env) narrow NCCL's choice as they would NCCL's; its NCCL_SOCKET_NTHREADS,
    NCCL_NSOCKS_PERTHREAD and channel counts set a socket link's streams and threads (nccl.socket_streams,
    socket_threads)."""
    env = cfg.backend.env
    if "NCCL_ALGO" in env or "NCCL_PROTO" in env:  # (the planner and the tune call this for every candidate)
        cl = dataclasses.replace(cl, nccl_algo=env.get("NCCL_ALGO", cl.nccl_algo),
                                 nccl_proto=env.get("NCCL_PROTO", cl.nccl_proto))
    if cl.backend == "nccl" and (streams := nccl.socket_streams(env, cl.inter.streams)) != cl.inter.streams:
        cl = dataclasses.replace(cl, inter=dataclasses.replace(
            cl.inter, streams=streams, socket_threads=nccl.socket_threads(env, cl.inter.socket_threads)))
    with nccl.recording() as chose:
        out = STRATEGIES[cfg.parallel.strategy].step_cost(cl, cfg, shapes, compute)
    return out | {"samples_s": World.of_cluster(cl).ranks * cfg.accumulation.steps * cfg.data.batch_size
                  / out["step_s"], "nccl": nccl.summary(chose)}


def first_steady(cfg) -> tuple:
    """(the first step of `cfg`'s steady phase, the config the steps before it run as): local_sgd and diloco warm up
    as DDP; a compressor that starts late (PowerSGD's start_step) runs uncompressed until then."""
    if cfg.parallel.strategy in AVERAGING:
        return cfg.parallel.warmup_steps + 1, plain_ddp(cfg)
    return compress.first_compressed_step(cfg.compression), dataclasses.replace(cfg, compression=CompressionConfig())


__all__ = ["STRATEGIES", "Strategy", "World", "build", "check", "first_steady", "samples_per_update",
           "step_cost", "traffic"]
