"""random-k: k = ceil(ratio x numel) elements at indices drawn from a seed every rank shares (step and bucket),
so only the float32 values travel and payloads of different ranks can be summed like a dense tensor. Without
error feedback the dropped 1 - ratio of the gradient is lost; with it (the default) it is sent later."""

import torch

from ringexp.compress.topk import k_of

WIRE = False


def sum_dtype(c):
    return torch.float32


def nbytes(numel: int, c, ctx) -> int:
    return 4 * k_of(numel, ctx)


def indices(numel: int, ctx, device):
    """Drawn on `device` (the same kind on every rank of a job), so that a GPU neither waits for the CPU's
    permutation nor copies it over."""
    g = torch.Generator(device).manual_seed(1_000_003 * ctx.step + ctx.bucket)  # same on every rank
    return torch.randperm(numel, generator=g, device=device)[: k_of(numel, ctx)]


def encode(x, c, ctx):
    return x[indices(x.numel(), ctx, x.device)].contiguous().view(torch.uint8)


def decode(payload, numel: int, c, ctx):
    x = torch.zeros(numel, dtype=torch.float32, device=payload.device)
    x[indices(numel, ctx, payload.device)] = payload.view(torch.float32)
    return x
