"""sign (EF-signSGD, Karimireddy et al. 2019): one bit per element plus a float32 scale, the mean |x|, per
parameter tensor (per bucket outside DDP), so each layer's update keeps its own l1 norm: one scale for a
whole bucket moves layers with small gradients by the step of those with large ones. Error feedback is on
by default: plain signSGD does not converge in general; with it, it does."""

import math

import torch

WIRE = False
_BITS = torch.tensor([1, 2, 4, 8, 16, 32, 64, 128], dtype=torch.uint8)


def sum_dtype(c):
    return None


def _sizes(numel: int, ctx) -> list:
    layout = getattr(ctx, "layout", None)
    return list(layout) if layout and sum(layout) == numel else [numel]


def nbytes(numel: int, c, ctx=None) -> int:
    return 4 * len(_sizes(numel, ctx)) + math.ceil(numel / 8)


def encode(x, c, ctx=None):
    n, sizes = x.numel(), _sizes(x.numel(), ctx)
    out = torch.empty(nbytes(n, c, ctx), dtype=torch.uint8, device=x.device)
    # a NaN makes its tensor's scale NaN: that whole tensor decodes to NaN, visibly
    scales = torch.stack([part.abs().mean() if part.numel() else torch.zeros((), device=x.device)
                          for part in x.split(sizes)])
    out[: 4 * len(sizes)].view(torch.float32).copy_(scales)
    bits = torch.zeros(math.ceil(n / 8) * 8, dtype=torch.uint8, device=x.device)
    bits[:n] = x >= 0
    out[4 * len(sizes):] = (bits.view(-1, 8) * _BITS.to(x.device)).sum(dim=1, dtype=torch.uint8)
    return out


def decode(payload, numel: int, c, ctx=None):
    sizes = _sizes(numel, ctx)
    scales = payload[: 4 * len(sizes)].view(torch.float32)
    bits = (payload[4 * len(sizes):, None] & _BITS.to(payload.device)).ne(0).view(-1)[:numel]
    per_element = scales.repeat_interleave(torch.tensor(sizes, device=payload.device), output_size=numel)
    return (bits.float() * 2 - 1) * per_element
