"""fp16 / bf16: cast each element to 16 bits. Half the bytes; payloads of different ranks can be summed as they
are, and inside the hand-written collectives every hop accumulates in float32 (only the wire is 16-bit)."""

import torch

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
WIRE = True  # element-wise: usable on any segment, inside the ring


def sum_dtype(c):
    return DTYPES[c.name]


def nbytes(numel: int, c, ctx=None) -> int:
    return 2 * numel


def encode(x, c, ctx=None):
    # Out of range for fp16 becomes inf: visible in the loss, as with DDP's own fp16 hook, never clipped silently.
    return x.to(DTYPES[c.name]).view(torch.uint8)


def decode(payload, numel: int, c, ctx=None):
    return payload.view(DTYPES[c.name]).float()
