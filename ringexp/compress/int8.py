"""int8: one float32 scale per block of `compression.block` elements (max |x| / 127), one byte per element,
rounded to nearest or, with `compression.stochastic`, stochastically (unbiased). Payloads of different
ranks carry different scales, so they cannot be summed as bytes: the ring decodes, adds in float32 and
re-encodes at every hop; elsewhere payloads are all-gathered and summed locally. Never overflows: the sum
is never held in int8."""

import math

import torch

WIRE = True


def sum_dtype(c):
    return None


def nbytes(numel: int, c, ctx=None) -> int:
    return 4 * math.ceil(numel / c.block) + numel


def encode(x, c, ctx=None):
    n, b = x.numel(), c.block
    blocks = math.ceil(n / b)
    padded = torch.zeros(blocks * b, dtype=torch.float32, device=x.device)
    padded[:n] = x
    padded = padded.view(blocks, b)
    # nan_to_num only for the scale: a NaN element stays NaN below (and is encoded as such, see decode)
    scale = padded.abs().nan_to_num(0.0, posinf=0.0).amax(dim=1, keepdim=True) / 127
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = padded / scale
    if c.stochastic:
        q = torch.floor(q + torch.rand_like(q))
    else:
        q = torch.round(q)
    # -128, the one code a finite value never takes, marks NaN/inf so decode can restore NaN
    q = torch.where(torch.isfinite(q), q.clamp(-127, 127), -128.0)
    out = torch.empty(nbytes(n, c), dtype=torch.uint8, device=x.device)
    out[: 4 * blocks].view(torch.float32).copy_(scale.view(-1))
    out[4 * blocks:].view(torch.int8).copy_(q.view(-1)[:n].to(torch.int8))
    return out


def decode(payload, numel: int, c, ctx=None):
    blocks = math.ceil(numel / c.block)
    scale = payload[: 4 * blocks].view(torch.float32)
    q = payload[4 * blocks:].view(torch.int8).float()
    x = q * scale.repeat_interleave(c.block)[:numel]
    return torch.where(q == -128, torch.full_like(x, float("nan")), x)
