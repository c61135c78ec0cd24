"""The interface every strategy implements, with what one process needs: nothing to communicate.

A strategy is built once per worker from the config and the process environment and answers every question
the trainer and the checkpoints ask about parallelism; nothing outside ringexp/parallel/ asks which strategy
is running. Subclasses (ddp.py, fsdp.py) override what they do differently.
"""

from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch

from ringexp import records
from ringexp.cluster import costmodel
from ringexp.config import AmpMode
from ringexp.errors import ConfigError


@dataclass(frozen=True)
class World:
    """Where a strategy runs, as far as what it sends and what its step costs depend on it: the ranks, the nodes
    they are grouped into (the hierarchical all-reduce's) and the backend (gloo or nccl)."""
    ranks: int
    nodes: int
    backend: str

    @staticmethod
    def of_cluster(cl) -> "World":
        return World(costmodel.ranks(cl), cl.nodes, cl.backend)


class Strategy:
    sharded = False  # each rank holds a shard of the model and optimizer (checkpoints per rank) or all of it
    exposure = "handover"  # how ringexp.timing.CommTimer measures exposed communication: handover or blocking
    exact = True  # every step's gradients are summed over all ranks: DDP's arithmetic up to the order of a sum

    def __init__(self, cfg, env):
        self.cfg, self.env = cfg, env

    @staticmethod
    def check(cfg, world_size: int) -> None:
        """Refuse, with a ConfigError, what this strategy cannot run (before any worker starts)."""

    def wrap(self, model, timer=None, example=None):
        """The model on this rank's device, wrapped for the strategy; its collectives report to `timer` (a
        ringexp.timing.CommTimer). `example` is a batch of the input's shape, for strategies that need one."""
        return model.to(self.env.device)

    def no_sync(self, model, sync: bool):
        """Context for one micro-batch's backward: gradients are synchronised only when `sync`."""
        return nullcontext()

    def after_step(self, step: int) -> None:
        """After optimizer step `step` (1, 2, ...; a resumed run continues the count): what a strategy does between
        steps (local_sgd, diloco: synchronise the models when due)."""

    def evaluating(self, model):
        """Context in which `model` is evaluated: the model every rank agrees on (local_sgd, diloco: the last
        synchronisation's)."""
        return nullcontext()

    def synchronizations(self) -> dict | None:
        """How often the models were synchronised and the bytes of one, for strategies that do so periodically."""
        return None

    def grad_scaler(self):
        """fp16 loss scaling (disabled unless amp=fp16)."""
        return torch.amp.GradScaler(self.env.device.type, enabled=self.cfg.amp.mode == AmpMode.fp16)

    def world(self) -> World:
        """This run's World: its ranks, its backend, and the nodes the config or the launcher groups them into."""
        env, nodes = self.env, self.cfg.parallel.nodes
        if nodes is None:
            local = env.local_world_size
            nodes = env.world_size // local if local and env.world_size % local == 0 else 1
        return World(env.world_size, nodes, env.backend)

    def wire_bytes(self, shapes: list) -> int:
        """Bytes the busiest rank sends per optimizer step, for gradients of these parameter shapes."""
        return self.traffic(self.cfg, self.world(), shapes)

    @staticmethod
    def traffic(cfg, world: World, shapes: list) -> int:
        """Bytes the busiest rank sends per optimizer step of training config `cfg` in `world`, for gradients of
        parameter `shapes`: what a run records (wire_bytes) and what the planner predicts, without a process
        group."""
        return 0

    @staticmethod
    def samples_per_update(cfg, world_size: int) -> int:
        """Samples behind one optimizer update of one model replica: every rank's micro-batches of the step, since
        the gradients are averaged over all ranks before each update. optim.lr_rule scales the learning rate by this
        against plain DDP's (world_size x data.batch_size). Periodic-averaging strategies override it: their
        replicas update on fewer ranks' samples between averagings."""
        return world_size * cfg.data.batch_size * cfg.accumulation.steps

    @staticmethod
    def step_cost(cl, cfg, shapes: list, compute: dict) -> dict:
        """{comm_s, exposed_s, step_s} of one optimizer step of `cfg` on cluster `cl` (a ClusterConfig), for a model
        of parameter `shapes` whose one rank takes `compute` (forward_s, backward_s, optimizer_s)."""
        return costmodel.step(0.0, 0.0, compute, cfg.accumulation.steps)

    def wire_note(self) -> str:
        """What the bytes-on-wire figure counts."""
        return "bytes each rank sends with the chosen algorithm"

    @staticmethod
    def tips(cfg) -> str:
        """What to try when communication is exposed (the time verdict), from what this run used."""
        p, c, k = cfg.parallel, cfg.compression, cfg.accumulation.steps
        tips = [f"parallel.bucket_cap_mb (now {p.bucket_cap_mb:g})"]
        if p.strategy == "naive":
            tips.append("+parallel=ring (rank 0 of the parameter server carries every buffer)")
        elif p.strategy == "ring":
            tips.append("+parallel=hierarchical where ranks span several nodes")
        if c.name == "none":
            tips.append("compression=fp16 or bf16")
        elif c.name in ("fp16", "bf16"):
            tips.append("compression=int8 or topk")
        tips.append(f"accumulation.steps={2 * k} (now {k})")
        return ", ".join(tips[:-1]) + " or " + tips[-1]

    def save(self, path, model, opt) -> None:
        """Write model and optimizer into checkpoint directory `path` (collective: every rank calls it). Every rank
        holds the same: rank 0 writes them."""
        if self.env.rank == 0:
            state = {"model": unwrap(model).state_dict(), "optimizer": opt.state_dict()}
            records.save_tensors(path / "model.pt", state)

    @staticmethod
    def verify(path) -> str | None:
        """What is wrong with the model's files in checkpoint `path`, as 'file: why', or None. Called before
        anything is loaded, once every file was found intact against meta.json (ringexp.checkpoint.damage)."""
        return None if (Path(path) / "model.pt").is_file() else "model.pt is missing"

    def load(self, path, model, opt) -> None:
        """Read what `save` wrote into the wrapped model and its optimizer, on every rank."""
        saved = records.load_tensors(path / "model.pt")
        unwrap(model).load_state_dict(saved["model"])
        opt.load_state_dict(saved["optimizer"])

    def state_dict(self):
        """The communication state a resumed run needs (compressor residuals, PowerSGD's factors), or None."""
        return None

    def load_state_dict(self, state) -> None:
        pass

    def groups(self) -> list:
        """The process groups this strategy's collectives run on (None: the default group)."""
        return [None]

    def close(self) -> None:
        """Release what `wrap` started (threads, groups)."""


class Single(Strategy):
    """One process, no gradient communication: the baseline that scaling is measured against."""

    def groups(self) -> list:
        return []

    @staticmethod
    def check(cfg, world_size: int) -> None:
        if world_size != 1:
            raise ConfigError(f"parallel.strategy=single runs one process, but launcher.nproc_per_node={world_size}; "
                              "drop the override or use +parallel=ddp")
        if cfg.compression.name != "none":
            raise ConfigError(f"compression={cfg.compression.name} with parallel.strategy=single: one process sends "
                              "nothing; use compression=none or a multi-process strategy")


def unwrap(model):
    """The user's model inside a DDP wrapper (FSDP2 modifies the model in place and has no wrapper)."""
    return getattr(model, "module", model)
