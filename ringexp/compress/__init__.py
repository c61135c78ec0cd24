"""Gradient compressors, one module each, registered by name, and how a compressed bucket crosses the wire.

A compressor module has `WIRE` (element-wise: usable on any segment, so inside the hand-written ring at every
hop), `sum_dtype(c)` (the payload, viewed as this dtype, can be summed across ranks; None if not),
`nbytes(numel, c, ctx)`, `encode(x, c, ctx) -> uint8 payload` and `decode(payload, numel, c, ctx) -> float32`.
`c` is the `compression` config, `ctx` the step, bucket, current ratio and the sizes of the parameters the
bucket holds (`layout`, None outside DDP), the same on every rank.

How a bucket travels, by compressor and algorithm, is `route`'s choice (a wire format inside the collective, a
summable payload, or an all-gather), and running it (`all_reduce`), counting its bytes (`wire_bytes`) and predicting
its time (`seconds`) all follow that one choice. Error feedback (`feedback.py`) wraps all three routes: it adds the
residual before encoding and keeps what the local encoding lost. PowerSGD is PyTorch's own hook, registered by
`parallel/ddp.py`.
"""

from functools import partial
from types import SimpleNamespace

import torch
import torch.distributed as dist

from ringexp import comm
from ringexp.cluster import costmodel, nccl
from ringexp.comm import two_phase
from ringexp.compress import cast, feedback, int8, phases, powersgd, randomk, sign, topk
from ringexp.config import CompressionConfig
from ringexp.timing import median_time

COMPRESSORS = {"none": None, "fp16": cast, "bf16": cast, "int8": int8, "topk": topk, "randomk": randomk,
               "sign": sign, "powersgd": powersgd}
SPARSIFIERS = ("topk", "randomk")
EF_DEFAULT = ("topk", "randomk", "sign", "powersgd")  # lossy enough that dropping the residual hurts


def error_feedback(c) -> bool:
    return c.name in EF_DEFAULT if c.error_feedback is None else bool(c.error_feedback)


MOMENTUM_RULE = ("compression.momentum_correction needs topk or randomk, error feedback and SGD (it moves SGD's "
                 "momentum before the compressor)")


def route(c, algorithm: str, world: int | None = None) -> str:
    """The path a bucket compressed by `c` (a compressor, not "none" nor PowerSGD, PyTorch's own hook) takes through
    all-reduce `algorithm` over `world` ranks (None: not known yet), one of four:
    - "wire": a WIRE compressor (fp16, bf16, int8) with a hand-written collective (ring, hierarchical, naive), which
      encodes each message itself and accumulates in float32 at every hop (`hierarchical` with scope=inter_node:
      only between nodes); builtin all-reduce can only sum what it is given;
    - "sum": the payload can be summed as it is (fp16/bf16 on builtin, random-k's shared indices): encode once,
      all-reduce the payload viewed as its `sum_dtype`, decode once;
    - "two_phase" (ringexp.comm.two_phase): chunks compressed, an all-to-all to their owners, the owner's sum
      compressed again, an all-gather; with hierarchical and scope=inter_node, between nodes only (ByteGrad's
      shape). compression.collective=two_phase asks for it (for anything but random-k, whose payloads are summed
      as they are); `auto` takes it from 3 ranks up, where an all-gather's (p-1) payloads per rank outgrow its
      2(p-1)/p;
    - "gather": otherwise (int8 on builtin, top-k, sign): every rank's payload is all-gathered and they are
      decoded and summed locally (and DGC's momentum correction, which masks this rank's own selection)."""
    m = COMPRESSORS[c.name]
    if c.collective == "two_phase" and (m.WIRE or m.sum_dtype(c) is None):
        return "two_phase"
    if m.WIRE and algorithm != "builtin":
        return "wire"
    if m.sum_dtype(c) is not None:
        return "sum"
    scale = c.scope == "inter_node" or (world or 0) >= 3
    return "two_phase" if c.collective == "auto" and scale and not c.momentum_correction else "gather"


def refusal(c, algorithm: str, where: str):
    """Why compressor config `c` cannot run with all-reduce `algorithm` (builtin, ring, hierarchical, naive; any
    other name: not a DDP hook), in the words of `where` (what the user chose), or None if it can."""
    m = COMPRESSORS[c.name]
    ignored = unchosen(c, algorithm, where)
    if ignored or m is None:  # (nothing compressed: nothing else to refuse)
        return ignored
    if c.scope == "inter_node" and (algorithm != "hierarchical" or route(c, algorithm) not in ("wire", "two_phase")):
        return (f"compression.scope=inter_node needs hierarchical and fp16, bf16, int8, sign or topk (got {where}, "
                f"compression={c.name})")
    if c.momentum_correction and (c.name not in SPARSIFIERS or not error_feedback(c)):
        return MOMENTUM_RULE
    if c.momentum_correction and c.collective == "two_phase":
        return ("compression.momentum_correction masks what this rank itself selected: it needs "
                "compression.collective=all_gather or auto")
    # Error feedback keeps what this rank's own encoding lost. A cast summed in its own precision (PyTorch's cast
    # hooks, gloo) and a wire format inside the hand-written collectives re-encode partial sums on the way: that
    # error belongs to no rank, and a residual of the local encoding would correct one that never happened. The
    # two phases keep a residual on both sides.
    if error_feedback(c) and m.WIRE and route(c, algorithm) not in ("gather", "two_phase"):
        return (f"compression.error_feedback=true with {c.name} on {where}: the wire carries re-encoded partial "
                "sums, an error no rank's residual holds; use error_feedback=false, or collective=two_phase "
                "(a residual on both sides)")
    return None


def unchosen(c, algorithm: str, where: str):
    """Why compression.collective=two_phase would not be the path `c`'s buckets take with all-reduce `algorithm` (a
    choice the run would silently ignore), or None. Only the buckets ringexp's DDP hook compresses have a collective
    to choose: not FSDP's, not PowerSGD's, not uncompressed ones. `all_gather` only forbids two phases, which holds
    wherever buckets are never sent in two phases: the recorded sweeps set it for every preset, uncompressed ones
    included (docs/results/tune-story-sweep.json)."""
    if c.collective != "two_phase":
        return None
    m, key = COMPRESSORS[c.name], f"compression.collective={c.collective}"
    if m is None or m is powersgd or algorithm not in comm.ALGORITHMS:
        why = ("nothing is compressed" if m is None else "PowerSGD all-reduces its factors" if m is powersgd
               else f"{where} reduces gradients itself")
        return f"{key}: {why}, so there is no compressed collective to choose; use collective=auto"
    if route(c, algorithm) == "two_phase":
        return None
    return (f"{key}: {c.name} has no two-phase form (its payloads are summed as they are: every rank draws the same "
            "indices); use collective=auto")  # (random-k: the one payload summed that is no wire format)


def first_compressed_step(c) -> int:
    """The first step whose gradients go compressed (1 for every compressor but PowerSGD's warm-up): what a run
    shorter than that measures is the uncompressed all-reduce."""
    return powersgd.first_step(c) if c.name == "powersgd" else 1


def ratio_at(c, step: int) -> float:
    """Sparsity warm-up (Deep Gradient Compression): the ratio falls geometrically from warmup_ratio to ratio
    over the first warmup_steps steps, so early, large gradients are not cut to 1% at once."""
    if c.name not in SPARSIFIERS:
        return 1.0
    if step >= c.warmup_steps:
        return c.ratio
    return c.warmup_ratio * (c.ratio / c.warmup_ratio) ** (step / c.warmup_steps)


def context(c, step: int, bucket: int, layout=None):
    return SimpleNamespace(step=step, bucket=bucket, ratio=ratio_at(c, step), layout=layout)


def wire_codec(c, ctx):
    """What the collectives apply per message, or None for plain float: nbytes(numel), encode_into(x, out)
    (returns the payload, a prefix of `out`), add_into(payload, dst) and copy_into(payload, dst). A module
    may provide the last three itself to skip temporaries (the casts do: one pass each, no allocation)."""
    m = COMPRESSORS[c.name]
    if m is None or not m.WIRE:
        return None

    def encode_into(x, out):
        if hasattr(m, "encode_into"):
            return m.encode_into(x, out, c)
        payload = m.encode(x, c, ctx)
        return out[:payload.numel()].copy_(payload)

    def add_into(payload, dst):
        if hasattr(m, "add_into"):
            return m.add_into(payload, dst, c)
        return dst.add_(m.decode(payload, dst.numel(), c, ctx))

    def copy_into(payload, dst):
        if hasattr(m, "copy_into"):
            return m.copy_into(payload, dst, c)
        return dst.copy_(m.decode(payload, dst.numel(), c, ctx))

    return SimpleNamespace(nbytes=lambda n: m.nbytes(n, c, ctx), encode_into=encode_into, add_into=add_into,
                           copy_into=copy_into)


class State:
    """Per-rank compressor state: the step count per bucket, error-feedback residuals (this rank's own; and the
    owner's of its chunk, in the two phases) and DGC momentum. `state_dict()` holds everything a resumed run needs
    to continue bit-for-bit."""

    def __init__(self, c, momentum: float = 0.0):
        self.c, self.momentum = c, momentum
        self.ef = error_feedback(c)
        self.steps, self.residual, self.velocity, self.owner = {}, {}, {}, {}

    def state_dict(self) -> dict:
        return {"steps": dict(self.steps), "residual": dict(self.residual), "velocity": dict(self.velocity),
                "owner": dict(self.owner)}

    def load_state_dict(self, d: dict) -> None:
        self.steps, self.residual, self.velocity = dict(d["steps"]), dict(d["residual"]), dict(d["velocity"])
        self.owner = dict(d.get("owner", {}))  # (checkpoints from before the two phases have none)


def all_reduce(tensor, algorithm: str, state: State, bucket: int = 0, group=None, layout=None, **options):
    """Sum `tensor` (float32, contiguous) over `group` through compressor `state.c`; in place, returns it.
    `layout`: sizes of the parameters packed in `tensor` (a DDP bucket), for per-parameter scales."""
    c = state.c
    m = COMPRESSORS[c.name]
    step = state.steps.get(bucket, 0)
    state.steps[bucket] = step + 1
    ctx = context(c, step, bucket, layout)
    way = route(c, algorithm, dist.get_world_size(group))
    if way == "two_phase":
        return _two_phase(tensor, algorithm, state, bucket, group, ctx, options)
    options = comm.options_for(algorithm, options)
    flat = tensor.view(-1)
    x = feedback.before(flat, state, bucket)
    payload = m.encode(x, c, ctx) if state.ef or way != "wire" else None  # ("wire": the collective encodes)
    sent = m.decode(payload, flat.numel(), c, ctx) if state.ef else None  # before the collective reuses payload
    if way == "wire":
        flat.copy_(x)
        comm.all_reduce(flat, algorithm, group=group, check=False, wire=wire_codec(c, ctx), **options)
    elif way == "sum":
        summed = comm.all_reduce(payload.view(m.sum_dtype(c)), algorithm, group=group, check=False, **options)
        if hasattr(m, "agreed"):  # random-k: every rank drew the same indices
            m.agreed(summed, ctx, dist.get_world_size(group))
        flat.copy_(m.decode(summed.view(torch.uint8), flat.numel(), c, ctx))
    else:
        gathered = all_gather(payload, algorithm, group, options.get("timeout_s"))
        if hasattr(m, "add_into"):  # each payload added in place: no dense decode per rank
            flat.zero_()
            for p in gathered:  # same order on every rank
                m.add_into(p, flat, c)
        else:
            flat.copy_(sum(m.decode(p, flat.numel(), c, ctx) for p in gathered))
    if state.ef:
        feedback.after(x, sent, state, bucket)
    return tensor


def _two_phase(tensor, algorithm: str, state: State, bucket: int, group, ctx, options: dict):
    """The two phases (ringexp.comm.two_phase) with both error feedbacks: over every rank, or with hierarchical and
    scope=inter_node between nodes only, the node's stages exact."""
    codec = phases.codec(COMPRESSORS[state.c.name], state.c, ctx, state, bucket)
    if algorithm == "hierarchical" and state.c.scope == "inter_node":
        options = comm.options_for(algorithm, options) | {"scope": "inter_node"}
        return comm.all_reduce(tensor, algorithm, group, check=False, phases=codec, **options)
    return two_phase.all_reduce(tensor, group, codec, timeout_s=options.get("timeout_s"))


def all_gather(payload, algorithm: str, group=None, timeout_s=None) -> list:
    """Every rank's payload (same size on all), in rank order. builtin: torch's all_gather; naive: through
    rank 0, as a parameter server would; ring and hierarchical: the hand-written ring's all-gather."""
    n, r = dist.get_world_size(group), dist.get_rank(group)
    if n == 1:
        return [payload]
    size = payload.numel()
    if algorithm == "builtin":
        out = [torch.empty_like(payload) for _ in range(n)]
        dist.all_gather(out, payload, group=group)
        return out
    stride = -(-size // 8) * 8  # slots 8-byte aligned, so decode can view their bytes as float32 / int32
    buf = torch.zeros(n * stride, dtype=torch.uint8, device=payload.device)
    if algorithm == "naive":
        slots = comm.naive.all_gather(payload, buf, stride, group, timeout_s)
    else:  # the ring's all-gather starts with each rank holding chunk r + 1 (where its reduce-scatter leaves it)
        buf[(r + 1) % n * stride:][:size] = payload
        comm.ring.all_gather(buf, group, timeout_s=timeout_s)
        slots = [buf[(q + 1) % n * stride:][:stride] for q in range(n)]
    return [s[:size] for s in slots]


def roundtrip(x, c, ctx=None):
    """decode(encode(x)): what one rank's contribution becomes on the wire."""
    m = COMPRESSORS[c.name]
    ctx = ctx or context(c, 0, 0)
    return m.decode(m.encode(x.float().reshape(-1), c, ctx), x.numel(), c, ctx)


def reference(xs: list, c):
    """What the two phases (no error feedback) return for every rank's float32 input `xs`, in rank order."""
    return phases.reference(xs, COMPRESSORS[c.name], c, context(c, 0, 0))


def tolerance(c, ref, n: int):
    """How far a compressed all-reduce may be from the builtin sum of every rank's roundtrip(x): the ring
    and the parameter server re-encode partial sums (at most n times per element); elsewhere it is exact
    up to float32 summation order."""
    m = COMPRESSORS[c.name]
    big = ref.abs().float().max() if ref.numel() else torch.zeros(())
    if m is int8:
        return 2 * (n + 1) * big / 127 + 1e-6  # half a step per re-encoding, steps of max/127, 2x margin
    if m is cast:
        eps = torch.finfo(cast.WIRE_DTYPES[c.name]).eps
        return 2 * (n + 1) * eps * (ref.abs().float() + big) + 1e-6
    return 1e-5 * (ref.abs().float() + 1)


def codec_seconds(c, x, iters: int, sync=lambda: None) -> tuple:
    """(encode s, decode s, payload bytes) of compressor config `c` on float32 `x`, medians of `iters` calls.
    Decode is decode and add, as the collectives do it: add_into where the codec has it, else decode, then add
    (timing the decode alone left sign's all-gather 21-27% fast on the local cluster: its add is a memory pass
    per payload)."""
    m, ctx, into = COMPRESSORS[c.name], context(c, 10**9, 0), torch.zeros_like(x)
    payload = m.encode(x, c, ctx)
    if hasattr(m, "add_into"):
        decode = partial(m.add_into, payload, into, c)
    else:
        def decode():
            return into.add_(m.decode(payload, x.numel(), c, ctx))
    return (median_time(partial(m.encode, x, c, ctx), iters, sync), median_time(decode, iters, sync),
            payload.numel())


def payload_bytes(c, numel: int, layout=None) -> int:
    """Bytes one rank's encoded gradient of `numel` elements takes, once warm-up is over."""
    m = COMPRESSORS[c.name]
    return 4 * numel if m is None else m.nbytes(numel, c, context(c, 1 << 30, 0, layout))


def wire_bytes(c, algorithm: str, numel: int, world_size: int, shapes=(), **options) -> int:
    """Bytes the busiest rank sends per step for gradients of `numel` float32 elements."""
    n = world_size
    if n == 1:
        return 0
    m = COMPRESSORS[c.name]
    if m is None:
        return comm.wire_bytes(algorithm, 4 * numel, n, **options)
    if m is powersgd:
        return comm.wire_bytes("builtin", 4 * powersgd.wire_numel(shapes, c), n)
    way = route(c, algorithm, n)
    if way == "two_phase":
        return _two_phase_bytes(c, algorithm, numel, n, [s.numel() for s in shapes] or None, options)
    if way == "wire":
        return comm.wire_bytes(algorithm, 4 * numel, n, wire_ratio=payload_bytes(c, numel) / (4 * numel),
                               scope=c.scope, **options)
    if way == "sum":
        return comm.wire_bytes(algorithm, payload_bytes(c, numel), n, **options)
    per_rank = payload_bytes(c, numel, [s.numel() for s in shapes] or None)
    # an all-gather: ring-like ones send n - 1 payloads; rank 0 of the naive one sends n payloads to n - 1 ranks
    return (n - 1) * n * per_rank if algorithm == "naive" else (n - 1) * per_rank


def _two_phase_bytes(c, algorithm: str, numel: int, n: int, layout, options: dict) -> int:
    """wire_bytes of the two phases: each chunk's payload as it is sent (sign: a scale per parameter in the chunk)."""
    m = COMPRESSORS[c.name]

    def chunks(count: int, members: int, layout=None) -> list:
        return [m.nbytes(e - b, c, context(c, 1 << 30, 0, phases.clipped(layout, b, e)))
                for b, e in comm.ring.chunk_bounds(count, members)]

    if algorithm == "hierarchical" and c.scope == "inter_node":
        options = comm.options_for(algorithm, options) | {"scope": "inter_node"}
        return comm.wire_bytes(algorithm, 4 * numel, n, between=lambda b, k: two_phase.wire_bytes(chunks(b // 4, k)),
                               **options)
    return two_phase.wire_bytes(chunks(numel, n, layout))


def wire_of(cl, c, numel: int, layout=None) -> costmodel.Wire:
    """Compressor config `c` as the cost model's Wire: its payload size once warm, its codec costs on cluster `cl`
    (seconds per float32 byte: its file's, else a GPU generation's, costmodel.codec)."""
    ratio = payload_bytes(c, numel, layout) / (4 * numel) if numel else 1.0
    return costmodel.Wire(ratio, *costmodel.codec(cl, c.name))


def seconds(cl, c, algorithm: str, shapes, **options) -> float:
    """Predicted seconds of one all-reduce of gradients of `shapes` (a bucket) on cluster `cl` through compressor
    config `c`, along the path `all_reduce` takes (`route`; PowerSGD: its own, powersgd.seconds)."""
    m, numel = COMPRESSORS[c.name], sum(s.numel() for s in shapes)
    n, options = 4 * numel, comm.options_for(algorithm, options)
    if m is None:
        return comm.seconds(algorithm, cl, n, **options)
    if m is powersgd:
        return powersgd.seconds(cl, c, shapes)
    wire, way = wire_of(cl, c, numel, [s.numel() for s in shapes]), route(c, algorithm, costmodel.ranks(cl))
    if way == "two_phase" and algorithm == "hierarchical" and c.scope == "inter_node":
        return comm.seconds(algorithm, cl, n, wire, **options | {"scope": "inter_node", "phases": True})
    if way == "two_phase":
        phase = partial(costmodel.all_to_all_s, cl)
        return costmodel.call(cl, two_phase.seconds(cl, n, costmodel.ranks(cl), phase, wire))
    if way == "wire":
        return comm.seconds(algorithm, cl, n, wire, **options | {"scope": c.scope})
    if way == "sum":
        return n * (wire.encode + wire.decode) + comm.seconds(algorithm, cl, wire.ratio * n, **options)
    if cl.backend == "nccl" and algorithm == "builtin":  # NCCL's all-gather, as NCCL would run it
        p = costmodel.ranks(cl)
        return costmodel.call(cl, nccl.seconds(cl, "allgather", p * wire.ratio * n) + p * n * wire.decode +
                              n * wire.encode)
    if algorithm == "naive":
        return costmodel.call(cl, costmodel.root_gather_s(cl, wire.ratio * n, n, wire))
    share = cl.inter.all_gather_efficiency if algorithm == "builtin" else None  # (ringexp's ring: the ring's)
    return costmodel.call(cl, costmodel.ring_gather_s(cl, wire.ratio * n, n, wire, share))


WHERE = {"inter": {"scope": "inter_node"}, "two_phase": {"collective": "two_phase"},
         "all_gather": {"collective": "all_gather"}}  # a bench row's COMPRESSOR:WHERE


def parse(name: str, **fields) -> tuple:
    """(algorithm, options, compression config or None) of a bench row's name: ALGORITHM (ringexp.comm.parse's)
    alone, or ALGORITHM+COMPRESSOR, COMPRESSOR:inter being a wire format between nodes only (hierarchical) and
    COMPRESSOR:two_phase / COMPRESSOR:all_gather its collective (compression.collective; default auto);
    `fields`: the compression config's other values (ratio=...). ValueError saying what is wrong otherwise.
    PowerSGD is a DDP hook, not an all-reduce: not benchmarked."""
    algo_name, plus, comp = name.partition("+")
    algorithm, options = comm.parse(algo_name)
    if not plus:
        return algorithm, options, None
    cname, colon, where = comp.partition(":")
    if cname not in COMPRESSORS or cname in ("none", "powersgd") or (colon and where not in WHERE):
        raise ValueError(f"compressor {comp!r}: choose from "
                         f"{', '.join(c for c in COMPRESSORS if c not in ('none', 'powersgd'))}, or NAME:"
                         + " NAME:".join(WHERE))
    if where == "inter" and (algorithm != "hierarchical" or not COMPRESSORS[cname].WIRE):
        raise ValueError(f"{name!r}: COMPRESSOR:inter is fp16, bf16 or int8 between nodes, on hierarchical only")
    c = CompressionConfig(name=cname, error_feedback=False, **WHERE.get(where, {}), **fields)
    problem = refusal(c, algorithm, f"bench row {name!r}")
    if problem:
        raise ValueError(problem)
    return algorithm, options, c


__all__ = ["COMPRESSORS", "State", "all_reduce", "all_gather", "parse", "payload_bytes", "route", "seconds",
           "wire_bytes"]
