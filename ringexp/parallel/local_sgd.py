"""Post-local SGD (parallel.strategy=local_sgd), and the strategy DiLoCo (diloco.py) shares with it.

Plain DDP for `parallel.warmup_steps` steps; then every rank steps on its own gradients (DDP's no_sync) and the
models are synchronised every `parallel.period` steps by an Averager (averager.py: the pseudo-gradient through
`parallel.averaging`'s collective and the `compression` group's compressor, then an outer SGD step; local SGD's
has rate 1 and no momentum, so the anchor becomes the ranks' average). With `parallel.within_node`, gradients are
still all-reduced inside each node every step (PyTorch's post_localSGD_hook on a subgroup per node: the
hierarchical form), and only the periodic synchronisation crosses nodes. docs/averaging.md.

Evaluation runs the anchors (the global model; every rank the same), and the last step synchronises every
fragment, so that the final model is the ranks' average. A checkpoint holds every rank's own weights and inner
optimizer (they differ between synchronisations) beside the global model.
"""

import os
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import PostLocalSGDState, post_localSGD_hook

from ringexp import comm, compress, records
from ringexp.cluster import costmodel
from ringexp.config import CompressionConfig, ParallelConfig, StrategyName
from ringexp.errors import ConfigError
from ringexp.models import build_model
from ringexp.parallel.averager import Averager
from ringexp.parallel.base import World, unwrap
from ringexp.parallel.ddp import DDPStrategy, comm_options


class LocalSGDStrategy(DDPStrategy):
    exact = False  # the ranks' models drift apart between synchronisations: quality needs a verdict
    forward_sync_buffers = False  # buffers are averaged at a synchronisation, not broadcast at every synced forward

    def __init__(self, cfg, env):
        super().__init__(cfg, env)
        self.averager = None  # made by wrap
        self.local = None  # within_node: PostLocalSGDState of the gradient hook

    def outer_settings(self) -> tuple:
        """(learning rate, momentum) of the outer SGD step. Local SGD: the anchor moves to the average."""
        return 1.0, 0.0

    @staticmethod
    def check(cfg, world_size: int) -> None:
        check_averaging(cfg, world_size)

    def comm_hook(self):
        """Inside each node every step (within_node, after the warm-up), else DDP's own all-reduce (the warm-up's;
        local steps run under no_sync)."""
        if not self.cfg.parallel.within_node:
            return None, None
        subgroup = node_group(self.world(), self.env.rank)
        self.local = PostLocalSGDState(None, subgroup, self.cfg.parallel.warmup_steps)
        return self.local, post_localSGD_hook

    def wrap(self, model, timer=None, example=None):
        ddp = super().wrap(model, timer, example)
        c, p = self.cfg.compression, self.cfg.parallel
        lr, momentum = self.outer_settings()
        self.averager = Averager(ddp, p.period, warmup_steps=p.warmup_steps, fragments=p.fragments, outer_lr=lr,
                                 outer_momentum=momentum, algorithm=str(p.averaging),
                                 compression=None if c.name == "none" else compress.State(c),
                                 last_step=self.cfg.steps, timer=timer, **comm_options(p) | {"scope": c.scope})
        return ddp

    def no_sync(self, model, sync: bool):
        local = self.averager.local and not self.cfg.parallel.within_node
        return model.no_sync() if local else super().no_sync(model, sync)

    def after_step(self, step: int) -> None:
        if self.local is not None:
            self.local.iter = step  # (the hook's own counter is replaced by the trainer's)
        self.averager.step(step)

    def evaluating(self, model):
        return self.averager.global_model()

    def groups(self) -> list:
        """DDP's (the synchronization's too) and, with within_node, this rank's node group."""
        return super().groups() + ([self.local.subgroup] if self.local is not None else [])

    def save(self, path, model, opt) -> None:
        """model.pt: the global model (the anchors), from rank 0; local-rank<R>.pt: every rank's own weights and
        inner optimizer, which differ between synchronisations."""
        if self.env.rank == 0:
            with self.averager.global_model():
                records.save_tensors(path / "model.pt", {"model": unwrap(model).state_dict()})
        records.save_tensors(path / f"local-rank{self.env.rank}.pt",
                             {"model": unwrap(model).state_dict(), "optimizer": opt.state_dict()})

    @staticmethod
    def verify(path) -> str | None:
        """model.pt and every rank's local-rank<R>.pt (meta.json, checked intact before, says how many ranks)."""
        path = Path(path)
        ranks = records.read_json(path / "meta.json").get("world_size", 1) if (path / "meta.json").is_file() else 1
        missing = [n for n in ["model.pt", *(f"local-rank{r}.pt" for r in range(ranks))] if not (path / n).is_file()]
        return f"{missing[0]} is missing" if missing else None

    def load(self, path, model, opt) -> None:
        own = records.load_tensors(path / f"local-rank{self.env.rank}.pt")
        unwrap(model).load_state_dict(own["model"])
        opt.load_state_dict(own["optimizer"])

    def state_dict(self):
        """The averager's (its clock, anchors, outer optimizers, buffers, residuals)."""
        return self.averager.state_dict()

    def load_state_dict(self, state) -> None:
        if state is not None:
            self.averager.load_state_dict(state)
            if self.local is not None:
                self.local.iter = self.averager.done

    def synchronizations(self) -> dict:
        """What the records say of the averaging: how often, how many times, the bytes of one."""
        p = self.cfg.parallel
        shapes = [q.shape for f in self.averager.fragments for q in f.params]
        return {"period": p.period, "warmup_steps": p.warmup_steps, "fragments": p.fragments,
                "count": self.averager.syncs,
                "bytes_per_sync": sync_bytes(self.cfg, self.world(), shapes) // p.fragments,
                "within_node": p.within_node}

    def wire_note(self) -> str:
        return ("bytes each rank sends per local step: one synchronisation's pseudo-gradient over parallel.period "
                "steps" + (", and the gradients' all-reduce inside its node" if self.cfg.parallel.within_node else ""))

    @staticmethod
    def traffic(cfg, world: World, shapes: list) -> int:
        """Per optimizer step of the local phase: a synchronisation's bytes over the period, and with within_node
        the gradients' builtin all-reduce inside a node (warm-up steps send DDP's, which this leaves out)."""
        inside = comm.wire_bytes("builtin", 4 * sum(s.numel() for s in shapes), world.ranks // world.nodes) \
            if cfg.parallel.within_node else 0
        return sync_bytes(cfg, world, shapes) // cfg.parallel.period + inside

    @staticmethod
    def step_cost(cl, cfg, shapes: list, compute: dict) -> dict:
        """A local step: compute (with within_node, DDP's buckets on one node's links), plus one synchronisation
        of the whole model every period steps, after the optimizer and blocking it: all exposed."""
        p = cfg.parallel
        sync_s = compress.seconds(cl, cfg.compression, str(p.averaging), tuple(shapes), variant=p.variant)
        # then the buffers' builtin all-reduce (a few kB: latency, 2(p-1) steps across the slow link), after waiting
        # for the slowest rank's local steps
        buffers = model_counts(cfg)[1]
        sync_s += (comm.seconds("builtin", cl, 4 * buffers) if buffers else 0.0) + \
            costmodel.straggle(cl, p.period * costmodel.work(compute, cfg.accumulation.steps))
        inside = {"comm_s": 0.0, "exposed_s": 0.0}
        if p.within_node and cl.ranks_per_node > 1:
            node = replace(cl, nodes=1)
            inside = DDPStrategy.step_cost(node, plain_ddp(cfg), shapes, compute)
        return costmodel.step(inside["comm_s"] + sync_s / p.period, inside["exposed_s"] + sync_s / p.period,
                              compute, cfg.accumulation.steps)

    @staticmethod
    def samples_per_update(cfg, world_size: int) -> int:
        """One replica's update: its own samples, or its node's with within_node."""
        per_node = world_size // cfg.parallel.nodes if cfg.parallel.nodes else \
            int(os.environ.get("LOCAL_WORLD_SIZE", world_size))  # (the launcher's ranks on this node)
        ranks = per_node if cfg.parallel.within_node else 1
        return ranks * cfg.data.batch_size * cfg.accumulation.steps


def check_averaging(cfg, world_size: int) -> None:
    """What periodic averaging cannot run, refused before launch."""
    p, c = cfg.parallel, cfg.compression
    if c.name == "powersgd":
        raise ConfigError(f"compression=powersgd with +parallel={p.strategy}: PowerSGD is DDP's gradient hook; "
                          "compress the averaging with fp16, bf16, int8, sign, topk or randomk")
    if p.period > cfg.steps - p.warmup_steps:
        raise ConfigError(f"parallel.period={p.period} is longer than the {cfg.steps - p.warmup_steps} local steps "
                          f"of this run (steps={cfg.steps}, parallel.warmup_steps={p.warmup_steps}); lower the "
                          "period or raise steps")
    tensors = model_counts(cfg)[0]
    if p.fragments > tensors:
        raise ConfigError(f"parallel.fragments={p.fragments}: the model has {tensors} trainable tensors to split; "
                          f"use at most {tensors}")
    if p.strategy == "local_sgd" and (p.outer_lr, p.outer_momentum) != (ParallelConfig.outer_lr,
                                                                      ParallelConfig.outer_momentum):
        raise ConfigError("parallel.outer_lr and outer_momentum are DiLoCo's: local SGD's outer step moves the "
                          "anchor to the average; use +parallel=diloco, or drop them")
    if p.within_node and p.averaging == "hierarchical":
        raise ConfigError("parallel.within_node=true with parallel.averaging=hierarchical: the node's models are "
                          "already equal, so the hierarchy has nothing to add; use averaging=builtin or ring")


_COUNTS: dict = {}  # (model config, labels) -> model_counts(): step_cost asks for every prediction the tune makes


def model_counts(cfg) -> tuple:
    """(trainable tensors, floating-point buffer elements: the batch-norm statistics every synchronisation
    averages) of the config's model, built once per model config on the meta device (shapes only)."""
    key = (str(cfg.model), cfg.data.num_labels)
    if key not in _COUNTS:
        with torch.device("meta"):
            model = build_model(cfg.model, cfg.data.num_labels)
        _COUNTS[key] = (sum(1 for q in model.parameters() if q.requires_grad),
                        sum(b.numel() for b in model.buffers() if b.is_floating_point()))
    return _COUNTS[key]


def sync_bytes(cfg, world: World, shapes: list) -> int:
    """Bytes the busiest rank sends for one synchronisation of every fragment (the pseudo-gradient through the
    averaging's collective and compressor; buffers left out: batch-norm statistics are a few kB)."""
    p = cfg.parallel
    options = comm_options(p)
    return compress.wire_bytes(cfg.compression, str(p.averaging), sum(s.numel() for s in shapes), world.ranks,
                               shapes, **options | {"nodes": options["nodes"] or world.nodes})


def plain_ddp(cfg):
    """`cfg` as the gradients inside a node see it: DDP's builtin all-reduce, uncompressed."""
    return replace(cfg, parallel=replace(cfg.parallel, strategy=StrategyName.ddp), compression=CompressionConfig())


def node_group(world: World, rank: int):
    """This rank's node as a process group (every rank creates every node's group, as new_group requires)."""
    per = world.ranks // world.nodes
    mine, _ = dist.new_subgroups_by_enumeration([list(range(n * per, (n + 1) * per)) for n in range(world.nodes)])
    return mine
