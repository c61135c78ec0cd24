"""int8: one float32 scale per block of `compression.block` elements (max |x| / 127), one byte per element,
rounded to nearest or, with `compression.stochastic`, stochastically (unbiased). Payloads of different
ranks carry different scales, so they cannot be summed as bytes: the ring decodes, adds in float32 and
re-encodes at every hop; elsewhere payloads are all-gathered and summed locally. Never overflows: the sum
is never held in int8.

Payload: the block scales, then the bytes. A block holding NaN or inf has its scale stored negated, and those
elements the code -128 (which a finite value never takes): decode restores them as NaN, so a bad gradient is
seen, never hidden. On a GPU, round-to-nearest encodes in one pass (int8_triton.py). Elsewhere finite blocks, the
ones that matter for speed, take four passes to encode (amax, amin, one addcmul that scales and rounds, one
narrowing copy) and two to decode (measured against a float32-to-fp16 cast by `python -m ringexp.bench
codec=true`: encode 0.47x, decode 0.96x of its speed)."""

import math

import torch

from ringexp.comm.buffers import scratch
from ringexp.compress import int8_triton

WIRE = True
# Added to a value of magnitude below 2^22, this leaves round-to-nearest(value) in the low bits of the float's
# mantissa: the int32 view's low byte is the rounded int8, so rounding and narrowing cost no passes of their own.
MAGIC = 1.5 * 2 ** 23


def sum_dtype(c):
    return None


def nbytes(numel: int, c, ctx=None) -> int:
    return 4 * math.ceil(numel / c.block) + numel


def blocks(numel: int, b: int) -> list:
    """(first element, rows, row length) of the whole blocks and of the short last one: each part a 2-D view."""
    full, tail = divmod(numel, b)
    return [p for p in ((0, full, b), (full * b, 1, tail)) if p[1] and p[2]]


def parts(payload, numel: int, c):
    """(scale, int8 codes) views of a payload of `numel` elements."""
    nblocks = math.ceil(numel / c.block)
    return payload[: 4 * nblocks].view(torch.float32), payload[4 * nblocks: 4 * nblocks + numel].view(torch.int8)


def encode_into(x, out, c):
    x = x.reshape(-1).float()
    scale, q = parts(out, x.numel(), c)
    for first, rows, length in blocks(x.numel(), c.block):
        n = rows * length
        encode_rows(x[first:first + n].view(rows, length), scale[first // c.block:][:rows],
                    q[first:first + n].view(rows, length), c)
    return out[: nbytes(x.numel(), c)]


def encode_rows(x, scale, q, c) -> None:
    if x.is_cuda and not c.stochastic and int8_triton.available(x.shape[1]):
        return int8_triton.encode_rows(x, scale, q)  # one pass, no host sync: the same bytes
    # amax and amin: vectorised reductions, no |x| temporary (abs().amax() and aminmax were 3-4x slower on CPU)
    amax = torch.maximum(x.amax(dim=1), x.amin(dim=1).neg_())  # NaN where a row holds NaN, inf where inf
    bad = ~torch.isfinite(amax)
    any_bad = bool(bad.any())  # (one device sync per message on a GPU)
    if any_bad:  # those rows: the largest finite magnitude
        amax = torch.where(bad, x.nan_to_num(0.0, posinf=0.0, neginf=0.0).abs().amax(dim=1), amax)
    s = torch.where(amax > 0, amax / 127, torch.ones_like(amax)).unsqueeze(1)
    wide = scratch("int8-wide", x.numel(), torch.float32, x.device).view_as(x)
    if c.stochastic:
        torch.div(x, s, out=wide).add_(torch.rand_like(wide)).floor_().clamp_(-127, 127)
        q.copy_(wide)
    else:
        magic = scratch("int8-magic", 1, torch.float32, x.device).fill_(MAGIC)
        torch.addcmul(magic, x, 1 / s, out=wide)
        q.copy_(wide.view(torch.int32))  # the low byte (see MAGIC)
    if any_bad:
        q[bad] = torch.where(torch.isfinite(x[bad]), q[bad], -128).to(torch.int8)
        s[bad] = -s[bad]
    scale.copy_(s.view(-1))


def copy_into(payload, dst, c):
    return _decode(payload, dst, c, add=False)


def add_into(payload, dst, c):
    return _decode(payload, dst, c, add=True)


def _decode(payload, dst, c, add: bool):
    flat = dst.view(-1)
    scale, q = parts(payload, flat.numel(), c)
    for first, rows, length in blocks(flat.numel(), c.block):
        n = rows * length
        s = scale[first // c.block:][:rows].unsqueeze(1)
        codes, into = q[first:first + n].view(rows, length), flat[first:first + n].view(rows, length)
        if add:  # widen into a reused scratch, then one fused multiply-add
            wide = scratch("int8-wide", n, torch.float32, dst.device).view(rows, length).copy_(codes)
            into.addcmul_(wide, s.abs())
        else:
            into.copy_(codes).mul_(s.abs())
        bad = (s < 0).view(-1)
        if bad.any():  # blocks that held NaN or inf: their marked elements become NaN
            into[bad] = torch.where(codes[bad] == -128, float("nan"), into[bad])
    return dst


def encode(x, c, ctx=None):
    out = torch.empty(nbytes(x.numel(), c), dtype=torch.uint8, device=x.device)
    return encode_into(x, out, c)


def decode(payload, numel: int, c, ctx=None):
    return copy_into(payload, torch.empty(numel, dtype=torch.float32, device=payload.device), c)
