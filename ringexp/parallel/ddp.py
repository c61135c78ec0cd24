"""PyTorch DistributedDataParallel: with its builtin all-reduce (strategy ddp, the reference), or with one of
ringexp's collectives as its communication hook (ring, hierarchical, naive). DDP's own bucketing,
bucket_cap_mb and gradient_as_bucket_view work the same either way.

Compression: with the builtin all-reduce, PyTorch's own hooks where they exist (fp16/bf16 compress hooks, unless
compression.collective=two_phase; PowerSGD); every other combination goes through ringexp's hook and
ringexp.compress.
"""

import functools
from itertools import accumulate

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from ringexp import comm, compress, timing
from ringexp.cluster import costmodel, nccl
from ringexp.compress import powersgd
from ringexp.parallel import hooks
from ringexp.parallel.base import Strategy

TORCH_CAST_HOOKS = {"fp16": default_hooks.fp16_compress_hook, "bf16": default_hooks.bf16_compress_hook}

# DDP's gradient collective per strategy (local_sgd and diloco: their warm-up's; their averaging has its own)
ALGORITHM = {"ddp": "builtin", "ring": "ring", "hierarchical": "hierarchical", "naive": "naive",
             "local_sgd": "builtin", "diloco": "builtin"}


def comm_options(p) -> dict:
    return {"segment_bytes": p.segment_kb and p.segment_kb * 1024, "timeout_s": p.timeout_s, "nodes": p.nodes,
            "variant": p.variant}


class DDPStrategy(Strategy):
    forward_sync_buffers = True  # DDP's: rank 0's buffers (batch-norm statistics) sent at each synced forward

    def __init__(self, cfg, env):
        super().__init__(cfg, env)
        self.algorithm = ALGORITHM[cfg.parallel.strategy]
        self.hook_state = None  # ringexp's hook: a hooks.CommState (its thread, group and compressor)
        self.powersgd = None  # PyTorch's PowerSGD hook: its PowerSGDState

    def wrap(self, model, timer=None, example=None):
        """DDP around the model, with ringexp's or PyTorch's communication hook where the config asks for one.
        `timer`: every bucket's all-reduce is reported to it (builtin too, through the same hook DDP's C++
        reducer runs by default). `example`: a batch with which DDP settles its buckets (settle_buckets)."""
        p, env = self.cfg.parallel, self.env
        ddp = DDP(model.to(env.device), device_ids=[env.device] if env.device.type == "cuda" else None,
                  bucket_cap_mb=p.bucket_cap_mb, gradient_as_bucket_view=p.gradient_as_bucket_view,
                  static_graph=p.static_graph, find_unused_parameters=p.find_unused_parameters,
                  forward_sync_buffers=self.forward_sync_buffers)
        if example is not None:
            settle_buckets(ddp, example)
        state, hook = self.comm_hook()
        if hook is None and timer is not None:
            hook = default_hooks.allreduce_hook  # DDP's default, as a hook so that it can be timed
        if hook is not None:
            ddp.register_comm_hook(state, hook if timer is None else timing.timed_hook(hook, timer))
        return ddp

    def comm_hook(self):
        """(state, hook) for DDP's register_comm_hook, or (None, None) for DDP's own builtin all-reduce."""
        c = self.cfg.compression
        if c.name == "powersgd":
            self.powersgd, hook = powersgd.hook(c, compress.error_feedback(c))
            return self.powersgd, hook
        if self.algorithm == "builtin" and c.name in TORCH_CAST_HOOKS and compress.route(c, "builtin") == "sum":
            return None, TORCH_CAST_HOOKS[c.name]  # (collective=two_phase: ringexp's hook runs the two phases)
        if self.algorithm == "builtin" and c.name == "none":
            return None, None
        compressor = None if c.name == "none" else compress.State(c, momentum=self.cfg.optim.momentum)
        options = comm.options_for(self.algorithm, comm_options(self.cfg.parallel) | {"scope": c.scope})
        self.hook_state = hooks.CommState(self.algorithm, options, compressor)
        self.hook_state.start()  # here, on the main thread, before training: not inside the first backward
        return self.hook_state, hooks.comm_hook

    def no_sync(self, model, sync: bool):
        return super().no_sync(model, sync) if sync else model.no_sync()

    @staticmethod
    def traffic(cfg, world, shapes: list) -> int:
        numel = sum(s.numel() for s in shapes)
        options = comm_options(cfg.parallel)  # hierarchical: parallel.nodes where set (emulated), else the world's
        return compress.wire_bytes(cfg.compression, ALGORITHM[cfg.parallel.strategy], numel, world.ranks, shapes,
                                   **options | {"nodes": options["nodes"] or world.nodes})

    @staticmethod
    def step_cost(cl, cfg, shapes: list, compute: dict) -> dict:
        """DDP's buckets (bucket_shapes), each reduced as the strategy's all-reduce and compressor do it
        (ringexp.compress.seconds) once backward has produced its gradients, in proportion to the gradient bytes
        produced so far; with accumulation, micro_steps - 1 micro-steps without communication come first
        (no_sync), so communication per sample falls by micro_steps."""
        buckets = bucket_shapes(cfg, shapes)
        comm_s = bucket_seconds(cl, cfg, buckets)
        produced = list(accumulate(sum(s.numel() for s in b) for b in buckets))  # gradient elements, in order
        ready = [compute["backward_s"] * n / (produced[-1] or 1) for n in produced]  # (no buckets: none ready)
        _, exposed = costmodel.overlap(ready, comm_s, compute["backward_s"])
        # the reducer's work per bucket runs on the training thread, so nothing hides it; the last bucket waits for
        # the slowest rank's micro-steps
        lost = costmodel.slowed(cl, sum(comm_s), exposed) + len(buckets) * cl.bucket_s + \
            costmodel.straggle(cl, costmodel.work(compute, cfg.accumulation.steps))
        return costmodel.step(sum(comm_s), lost, compute, cfg.accumulation.steps)

    def state_dict(self):
        """ringexp's compressor (residuals, DGC momentum, step counts) or PyTorch's PowerSGD (error feedback and
        warm-start factors); None when neither is in use."""
        if self.powersgd is not None:
            return powersgd.state_dict(self.powersgd)
        if self.hook_state is not None and self.hook_state.compressor is not None:
            return self.hook_state.compressor.state_dict()
        return None

    def load_state_dict(self, state) -> None:
        """A state this run has no use for (none saved, or saved by another hook of the same compressor, such as
        the ring's fp16 resumed by DDP's cast hook) is left aside, as a run without it would."""
        if state is None:
            return
        if self.powersgd is not None:
            powersgd.load_state_dict(self.powersgd, state)
        elif self.hook_state is not None and self.hook_state.compressor is not None:
            self.hook_state.compressor.load_state_dict(state)

    def groups(self) -> list:
        """DDP's (the default group) and, once started, ringexp's hook's own."""
        hook = self.hook_state.group if self.hook_state is not None else None
        return [None] + ([hook] if hook is not None else [])

    def close(self) -> None:
        if self.hook_state is not None:
            self.hook_state.close()


def bucket_seconds(cl, cfg, buckets: list) -> list:
    """compress.seconds of every bucket, each shape of bucket reckoned once and its NCCL choices recorded again
    for every bucket of that shape: a published case's 10^12 `params`, in 4M pieces, make 119,210 buckets of
    three shapes (6 s a prediction, reckoned one by one)."""
    algorithm, options = ALGORITHM[cfg.parallel.strategy], {"variant": cfg.parallel.variant}
    once, out = {}, []
    for b in buckets:
        if b not in once:
            with nccl.recording() as chose:
                once[b] = compress.seconds(cl, cfg.compression, algorithm, b, **options), chose
        seconds, chose = once[b]
        nccl.record(chose)
        out.append(seconds)
    return out


def bucket_shapes(cfg, shapes: list) -> tuple:
    """DDP's buckets as tuples of parameter shapes, in the order they fill: torch's own assignment function, as
    DDP's reducer calls it when it rebuilds its buckets after the first step (parameters in the order backward
    produced their gradients, about the reverse of the model's; every bucket capped at bucket_cap_mb, the first
    one too, since ringexp always passes bucket_cap_mb)."""
    return buckets_of(tuple(shapes), int(cfg.parallel.bucket_cap_mb * (1 << 20)))


@functools.lru_cache(maxsize=8)
def buckets_of(shapes: tuple, cap: int) -> tuple:
    """bucket_shapes', once for the shapes and cap that a prediction under every cluster and rule shares (10^12
    parameters in 4M pieces take 1.5 s to assign)."""
    params = [torch.empty(s, device="meta") for s in reversed(shapes)]
    groups, _ = dist._compute_bucket_assignment_by_size(params, [cap])
    return tuple(tuple(params[i].shape for i in g) for g in groups)


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
