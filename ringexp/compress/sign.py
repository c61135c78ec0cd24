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
    if n % 8:  # padded to whole bytes
        bits = torch.zeros(math.ceil(n / 8) * 8, dtype=torch.uint8, device=x.device)
        bits[:n] = x >= 0
    else:
        bits = torch.ge(x, 0).view(torch.uint8)
    # bit i of byte j is element 8j + i: eight shifts and ors over n/8 bytes (a multiply by the bit values and a
    # sum over rows of 8 took twice as long)
    bits, packed = bits.view(-1, 8), out[4 * len(sizes):]
    packed.copy_(bits[:, 0])
    for i in range(1, 8):
        packed.bitwise_or_(bits[:, i].bitwise_left_shift(i))
    return out


# the 8 signs (+1 / -1, bit i of the byte for element i) of every byte value: decoding is one gather of 8 floats per
# byte and one multiply by the scales (bit masks, a bool-to-float cast and a scale per element took 4x as long)
_SIGNS = ((torch.arange(256)[:, None] & _BITS.long()).ne(0).float() * 2 - 1)


def decode(payload, numel: int, c, ctx=None):
    sizes = _sizes(numel, ctx)
    scales = payload[: 4 * len(sizes)].view(torch.float32)
    out = _SIGNS.to(payload.device)[payload[4 * len(sizes):].long()].view(-1)[:numel]
    for part, scale in zip(out.split(sizes), scales, strict=True):  # (a 0-d tensor: no device sync per part)
        part.mul_(scale)
    return out
