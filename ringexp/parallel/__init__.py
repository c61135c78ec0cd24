"""Parallel strategies, one module each, behind one interface (`base.Strategy`): how the model is wrapped,
no_sync, the grad scaler, how exposed communication is measured, bytes on the wire, how the model and the
communication state are saved and loaded. Registered by `parallel.strategy` name.

    single        base.py   one process
    ddp           ddp.py    DDP with its builtin all-reduce (the reference)
    ring, hierarchical, naive   ddp.py + hooks.py: DDP with a ringexp collective (ringexp.comm) as its hook
    fsdp          fsdp.py   PyTorch FSDP2
"""

from ringexp.config import StrategyName
from ringexp.parallel.base import Single, Strategy
from ringexp.parallel.ddp import DDPStrategy
from ringexp.parallel.fsdp import FSDPStrategy

STRATEGIES = {StrategyName.single: Single, StrategyName.ddp: DDPStrategy, StrategyName.ring: DDPStrategy,
              StrategyName.hierarchical: DDPStrategy, StrategyName.naive: DDPStrategy, StrategyName.fsdp: FSDPStrategy}


def build(cfg, env) -> Strategy:
    """This worker's strategy for `cfg` (a TrainConfig) in process environment `env` (ringexp.dist.Env)."""
    return STRATEGIES[cfg.parallel.strategy](cfg, env)


def check(cfg, world_size: int) -> None:
    """The strategy's own refusals (ConfigError), before any worker starts."""
    STRATEGIES[cfg.parallel.strategy].check(cfg, world_size)


__all__ = ["STRATEGIES", "Strategy", "build", "check"]
