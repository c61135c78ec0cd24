"""PyTorch FSDP2 (`fully_shard`): parameters, gradients and optimizer state sharded over the ranks.

Each block of the model (timm's blocks/stages/layers, the small CNN's stages) is sharded on its own, then
the root: a block's parameters are all-gathered just before it runs and freed after, and its gradients are
reduce-scattered as soon as backward has produced them. Mixed precision: parameters are gathered and used
in the `amp` dtype, gradients reduced in the dtype of a cast compressor (fp16/bf16) or float32.

On CPU the mesh must be a CPU mesh (a default one picks CUDA where a GPU exists, and gloo then crashes:
pytorch#132471), and gloo has no reduce-scatter of its own: it all-reduces the whole buffer and keeps its
slice (pytorch#118911), so FSDP sends about twice the gradient bytes it would on NCCL.

torch.distributed.fsdp and torch.distributed.checkpoint are imported where they are used: with the DTensor and
sympy they bring, about a second of CPU that every command would pay at start-up (the planner, compare and the
tune use this strategy's cost model; most runs are not FSDP).
"""

import torch
from torch import nn

from ringexp import dcp_safety
from ringexp.cluster import costmodel, nccl
from ringexp.comm import ring
from ringexp.compress.cast import WIRE_DTYPES
from ringexp.config import AMP_DTYPES, AmpMode
from ringexp.errors import ConfigError
from ringexp.parallel.base import Strategy


def moved(cfg, backend: str) -> tuple:
    """(bytes per parameter gathered, bytes per gradient reduced, all-gathers per step, reduce-scatter as halves
    of an all-reduce: 1 on NCCL, 2 on gloo, which has no reduce-scatter)."""
    param = 2 if cfg.amp.mode in AMP_DTYPES else 4
    reduce = 2 if cfg.compression.name in WIRE_DTYPES else 4
    gathers = cfg.accumulation.steps * (2 if cfg.parallel.reshard_after_forward else 1)
    return param, reduce, gathers, 1 if backend == "nccl" else 2


class FSDPStrategy(Strategy):
    sharded = True  # every rank saves and loads its own shards (torch.distributed.checkpoint)
    # FSDP issues its collectives on the training thread: exposed is the time spent inside calls that block it
    exposure = "blocking"

    @staticmethod
    def check(cfg, world_size: int) -> None:
        """FSDP reduces gradients itself: it takes a cast as its reduce dtype and nothing else of the DDP family's."""
        c, p = cfg.compression, cfg.parallel
        if c.name not in ("none", "fp16", "bf16"):
            raise ConfigError(f"compression={c.name} with +parallel=fsdp: FSDP reduces gradients itself and takes "
                              "only a cast (fp16 or bf16, its reduce dtype); use compression=none|fp16|bf16 or a DDP "
                              "strategy")
        if p.nodes is not None:
            raise ConfigError(f"parallel.nodes={p.nodes} with +parallel=fsdp: FSDP shards over all ranks (no hybrid "
                              "sharding here); drop parallel.nodes, or use +parallel=hierarchical")

    def wrap(self, model, timer=None, example=None):
        return shard(model, self.cfg, self.env.device, self.env.world_size, timer)

    def no_sync(self, model, sync: bool):
        model.set_requires_gradient_sync(sync)  # FSDP2's switch: reduce-scatter only on the last micro-batch
        return super().no_sync(model, sync)

    def grad_scaler(self):
        """With sharded gradients each rank sees only its shard's infs: the sharded scaler agrees on them across
        ranks (else ranks skip different steps and their scales drift apart)."""
        if self.cfg.amp.mode != AmpMode.fp16:
            return super().grad_scaler()
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        return ShardedGradScaler(self.env.device.type)

    @staticmethod
    def traffic(cfg, world, shapes: list) -> int:
        """Bytes one rank sends per optimizer step: an all-gather of the parameters per forward (and again per
        backward when they are resharded after forward), per micro-batch, and one reduce-scatter of the
        gradients, which gloo runs as a full all-reduce (2(n-1)/n of the buffer instead of (n-1)/n)."""
        n = world.ranks
        if n < 2:
            return 0
        numel = sum(s.numel() for s in shapes)
        param, reduce, gathers, scatter = moved(cfg, world.backend)
        return int(numel * (gathers * param + scatter * reduce) * (n - 1) / n)

    @staticmethod
    def step_cost(cl, cfg, shapes: list, compute: dict) -> dict:
        """Every all-gather of the parameters round a ring of every rank, in the param dtype, and the gradients'
        reduce-scatter (half a ring; gloo: a whole all-reduce) in the reduce dtype [ZeRO-3: Rajbhandari et al.,
        "ZeRO", SC 2020], all exposed: the model leaves out FSDP's one-block prefetch."""
        p, numel = costmodel.ranks(cl), sum(s.numel() for s in shapes)
        param, reduce, gathers, scatter = moved(cfg, cl.backend)
        wait = cfg.accumulation.steps * costmodel.straggle(cl, costmodel.work(compute))  # (each micro-step's first
        # all-gather waits for the slowest rank)
        if cl.backend == "nccl":  # NCCL's own all-gather and reduce-scatter (ringexp.cluster.nccl)
            gather = nccl.seconds(cl, "allgather", param * numel)
            comm_s = gathers * costmodel.call(cl, gather) + costmodel.call(cl, nccl.seconds(cl, "reducescatter",
                                                                                              reduce * numel))
            return costmodel.step(comm_s, comm_s + wait, compute, cfg.accumulation.steps)
        gather = (p - 1) * costmodel.slowest_hop(cl, param * numel / p)
        wire = costmodel.NONE if reduce == 4 else costmodel.Wire(reduce / 4, 0.0, cl.add_s_per_byte)
        ring_s = costmodel.ring_s(cl, 4 * numel, p, lambda b: costmodel.slowest_hop(cl, b), wire,
                                  segments=ring.segments(4 * numel / p))
        comm_s = gathers * costmodel.call(cl, gather) + costmodel.call(cl, ring_s * scatter / 2)
        return costmodel.step(comm_s, comm_s + wait, compute, cfg.accumulation.steps)

    def wire_note(self) -> str:
        return ("nccl: all-gather and reduce-scatter" if self.env.backend == "nccl"
                else "gloo: reduce-scatter sent as a full all-reduce (about 2x NCCL's gradient traffic)")

    @staticmethod
    def tips(cfg) -> str:
        p, k = cfg.parallel, cfg.accumulation.steps
        tips = ["parallel.reshard_after_forward=false"] if p.reshard_after_forward else []
        tips += ["parallel.forward_prefetch=1"] if not p.forward_prefetch else []
        tips += ["amp=bf16"] if cfg.amp.mode == AmpMode.off else []
        tips.append(f"accumulation.steps={2 * k} (now {k})")
        return ", ".join(tips[:-1]) + " or " + tips[-1] if len(tips) > 1 else tips[0]

    def save(self, path, model, opt) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        msd, osd = get_state_dict(model, opt)
        dcp.save({"model": msd, "optimizer": osd}, checkpoint_id=path)

    @staticmethod
    def verify(path) -> str | None:
        """What DCP would run or read that it must not, found before it reads anything (ringexp.dcp_safety)."""
        return dcp_safety.problem(path)

    def load(self, path, model, opt) -> None:
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        msd, osd = get_state_dict(model, opt)
        state = {"model": msd, "optimizer": osd}
        dcp_safety.load(state, path)
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optimizer"])


def blocks(model: nn.Module) -> list:
    """The units sharded one at a time: a transformer's blocks, a CNN's stages or layers; else the top-level
    children that hold parameters."""
    for name in ("blocks", "stages", "layers"):
        seq = getattr(model, name, None)
        if isinstance(seq, (nn.Sequential, nn.ModuleList)) and len(seq) > 1:
            return list(seq)
    resnet = [m for n, m in model.named_children() if n.startswith("layer") and n[5:].isdigit()]
    return resnet or [m for m in model.children() if any(p.requires_grad for p in m.parameters())]


def shard(model, cfg, device, world_size: int, timer=None):
    """fully_shard every block (and every batch norm, under mixed precision), then the root; returns the root."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather, DefaultReduceScatter

    p = cfg.parallel
    model = model.to(device)
    mesh = init_device_mesh(device.type, (world_size,))
    param_dtype = AMP_DTYPES.get(cfg.amp.mode)
    # float32 unless a cast compressor says otherwise (FSDP2 would reduce in the parameter dtype)
    reduce_dtype = WIRE_DTYPES.get(cfg.compression.name, torch.float32)
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    units = []
    if param_dtype is not None:
        # BatchNorm keeps float32 parameters (its running statistics are float32 and the kernels need them to
        # match); its inputs are cast up and its outputs back down, as FSDP1's mixed precision did.
        norm = MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=reduce_dtype, output_dtype=param_dtype)
        for m in model.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                units.append(fully_shard(m, mesh=mesh, mp_policy=norm, reshard_after_forward=p.reshard_after_forward))
    block_units = [fully_shard(b, mesh=mesh, mp_policy=policy, reshard_after_forward=p.reshard_after_forward)
                   for b in blocks(model)]
    units += block_units
    root = fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=p.reshard_after_forward)
    for i, b in enumerate(block_units):
        if p.forward_prefetch:
            b.set_modules_to_forward_prefetch(block_units[i + 1:i + 1 + p.forward_prefetch])
        if p.backward_prefetch > 1:  # 1 is FSDP2's own implicit prefetch of the previous block
            b.set_modules_to_backward_prefetch(block_units[max(0, i - p.backward_prefetch):i][::-1])
    if timer is not None:
        for unit in [*units, root]:  # (a unit without parameters of its own has no collectives to wrap)
            unit.set_custom_all_gather(Timed(timer, DefaultAllGather()))
            unit.set_custom_reduce_scatter(Timed(timer, DefaultReduceScatter()))
    return root


class Timed:
    """FSDP's own all-gather or reduce-scatter (`comm`), reported to the step's CommTimer (blocking when FSDP waits
    for it in place). FSDP calls it with keywords and asks it for its buffers (`allocate`)."""

    def __init__(self, timer, comm):
        self.timer, self.comm = timer, comm

    def allocate(self, *args, **kwargs):
        return self.comm.allocate(*args, **kwargs)

    def __call__(self, **kwargs):
        span = self.timer.start()
        work = self.comm(**kwargs)
        if work is None:
            self.timer.end(span, blocking=True)
        else:
            work.get_future().then(lambda _: self.timer.end(span))
        return work
