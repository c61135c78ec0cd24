"""top-k: the k = ceil(ratio x numel) largest magnitudes, as float32 values + int32 indices (8 bytes each).
Payloads cannot be summed (each rank picks its own indices): they are all-gathered and summed locally. With
error feedback (on by default) what was not sent is added to the next step's gradient."""

import math

import torch

from ringexp.comm.buffers import scratch

WIRE = False
SAMPLE = 1 << 14  # elements in the sample that sets the selection threshold


def sum_dtype(c):
    return None


def k_of(numel: int, ctx) -> int:
    return min(numel, max(1, math.ceil(ctx.ratio * numel))) if numel else 0


def nbytes(numel: int, c, ctx) -> int:
    return 8 * k_of(numel, ctx)


def encode(x, c, ctx):
    k = k_of(x.numel(), ctx)
    idx = select(x, k)
    out = torch.empty(8 * k, dtype=torch.uint8, device=x.device)
    out[: 4 * k].view(torch.float32).copy_(x[idx])
    out[4 * k:].view(torch.int32).copy_(idx)
    return out


def select(x, k: int):
    """Indices of the k largest |x|, exactly (ties aside). A full top-k of a large tensor is a partial sort (465 ms
    for 16M elements on one core); instead, as DGC does, a threshold from a strided sample keeps a few more than
    k candidates in three passes, and the top-k runs on those. Should the sample mislead (fewer than k pass), the
    full top-k: the sample decides the speed, never the result. NaN counts as the largest magnitude, so a NaN
    gradient is sent (and seen), never dropped. From 4 samples' worth of elements up (64k): the two phases' chunks
    are 1/p of a bucket, and a full top-k of a 512k chunk took 3.7x the sampled one on one core."""
    n = x.numel()
    if n >= 4 * SAMPLE and k < n // 8:
        magnitude = torch.abs(x, out=scratch("topk-magnitude", n, x.dtype, x.device))
        sample = magnitude[:: n // SAMPLE].nan_to_num(nan=float("inf"))
        # about 1.5 k of the n elements are at least this large (the sample's top 1.5 k / n)
        threshold = float(sample.topk(min(sample.numel(), max(2, math.ceil(1.5 * k * sample.numel() / n))))
                          .values[-1])
        # below the threshold 0, at or above it (or NaN, which is not below) -1: two in-place float passes and one
        # narrowing to bool, where a comparison with a bool result took 3-4x as long on CPU
        mask = scratch("topk-mask", n, torch.bool, x.device).copy_(magnitude.lt_(threshold).sub_(1))
        candidates = mask.nonzero().view(-1)
        if k <= candidates.numel() <= n // 8:
            return candidates[x[candidates].abs().nan_to_num_(nan=float("inf")).topk(k, sorted=False).indices]
    return x.abs().nan_to_num_(nan=float("inf")).topk(k, sorted=False).indices


def add_into(payload, dst, c):
    """dst += this payload (its k values at their indices): summing the all-gathered payloads needs no dense
    decode per rank."""
    k = payload.numel() // 8
    return dst.index_add_(0, payload[4 * k:].view(torch.int32).long(), payload[: 4 * k].view(torch.float32))


def copy_into(payload, dst, c):
    """dst = this payload, in place: one pass zeroing dst and its k values put at their indices (decode then copy
    allocated and zeroed a buffer and copied it: 6.9 ms where this takes about 2 for a 16 MB bucket's two chunks
    on one core)."""
    k = payload.numel() // 8
    return dst.zero_().index_copy_(0, payload[4 * k:].view(torch.int32).long(), payload[: 4 * k].view(torch.float32))


def decode(payload, numel: int, c, ctx):
    k = k_of(numel, ctx)
    x = torch.zeros(numel, dtype=torch.float32, device=payload.device)
    x[payload[4 * k:].view(torch.int32).long()] = payload[: 4 * k].view(torch.float32)
    return x
