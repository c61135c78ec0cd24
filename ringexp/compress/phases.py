"""A compressor as ringexp.comm.two_phase's codec: its format on any slice of a bucket, and error feedback on both
sides of the two phases (DeepSpeed's worker_error and server_error).

The worker's residual (what this rank's own encoding of its chunks lost) is kept per bucket in `state.residual`,
as on the all-gather path; the owner's (what re-encoding the sum of its chunk lost) in `state.owner`. Both are in
the compressor's state_dict, so a resumed run continues bit for bit. In hierarchical's inter-node stage the worker
encodes its node's sum of one shard, not its own gradient: its residual is that shard's.
"""

from types import SimpleNamespace

import torch

from ringexp.comm.ring import chunk_bounds

ROLES = ("worker", "owner")


def clipped(layout, lo: int, hi: int):
    """The sizes of the parameters of `layout` (sizes packed from 0) that fall in [lo, hi), each cut to it; None
    without a layout."""
    if not layout:
        return None
    sizes, start = [], 0
    for size in layout:
        a, b = max(start, lo), min(start + size, hi)
        if b > a:
            sizes.append(b - a)
        start += size
    return sizes


def codec(m, c, ctx, state, bucket: int):
    """Compressor module `m` with config `c` at step context `ctx` (ringexp.compress.context), bucket `bucket`, its
    residuals in `state` (a ringexp.compress.State; with error feedback off it keeps none)."""

    def part(lo: int, hi: int):
        at = SimpleNamespace(**{**vars(ctx), "layout": clipped(ctx.layout, lo, hi)})

        def add_into(payload, dst):
            return m.add_into(payload, dst, c) if hasattr(m, "add_into") else dst.add_(m.decode(payload, dst.numel(),
                                                                                              c, at))

        def copy_into(payload, dst):
            return m.copy_into(payload, dst, c) if hasattr(m, "copy_into") else dst.copy_(m.decode(payload,
                                                                                                dst.numel(), c, at))

        return SimpleNamespace(nbytes=lambda numel: m.nbytes(numel, c, at), encode=lambda x: m.encode(x, c, at),
                               add_into=add_into, copy_into=copy_into)

    def store(role: str) -> dict:
        return state.residual if role == "worker" else state.owner

    def residual(role: str, x):
        r = store(role).get(bucket) if state.ef else None
        return x if r is None else x + r

    def keep(role: str, x, sent) -> None:
        # step 0: DDP may still rebuild its buckets (ringexp.compress.feedback), so no residual is kept from it
        if not state.ef or ctx.step == 0:
            store(role).pop(bucket, None)
        else:
            store(role)[bucket] = x - sent

    return SimpleNamespace(part=part, residual=residual, keep=keep, feedback=state.ef)


def reference(xs: list, m, c, ctx):
    """What the two phases return without error feedback for every rank's input `xs` (in rank order), computed on
    one rank after an all-gather: the bench's check of the collective against torch's own."""
    one, out = codec(m, c, ctx, SimpleNamespace(ef=False, residual={}, owner={}), 0), torch.empty_like(xs[0])
    for b, e in chunk_bounds(xs[0].numel(), len(xs)):
        part, total = one.part(b, e), torch.zeros(e - b, dtype=torch.float32, device=xs[0].device)
        for x in xs:
            part.add_into(part.encode(x[b:e].float()), total)
        part.copy_into(part.encode(total), out[b:e])
    return out
