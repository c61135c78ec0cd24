"""random-k: k = ceil(ratio x numel) elements at indices drawn from a seed every rank shares (step and bucket),
so only the float32 values travel and payloads of different ranks can be summed like a dense tensor: an
all-reduce of k values, no gather, whatever the number of ranks. Without error feedback the dropped 1 - ratio of
the gradient is lost; with it (the default) it is sent later.

Ranks that disagree on the seed (a step count or a bucket order that differs, e.g. a resume that restored the
compressor on some ranks only) would sum values of different elements without a word: each payload ends with a
tag of the seed, which sums to world x tag only where every rank used the same one (`agreed`). A disagreement is
an error, unless the ranks' tags happen to average to the same value."""

import torch

from ringexp.compress.topk import k_of

WIRE = False
TAGS = 16381  # a tag is at most this: the sum of 1,024 tags stays exact in float32 (< 2^24)


def sum_dtype(c):
    return torch.float32


def nbytes(numel: int, c, ctx) -> int:
    return 4 * (k_of(numel, ctx) + 1)


def seed(ctx) -> int:
    return 1_000_003 * ctx.step + ctx.bucket  # the same on every rank


def indices(numel: int, ctx, device):
    """Drawn on `device` (the same kind on every rank of a job), so that a GPU neither waits for the CPU's
    permutation nor copies it over."""
    g = torch.Generator(device).manual_seed(seed(ctx))
    return torch.randperm(numel, generator=g, device=device)[: k_of(numel, ctx)]


def encode(x, c, ctx):
    out = torch.empty(k_of(x.numel(), ctx) + 1, dtype=torch.float32, device=x.device)
    out[:-1] = x[indices(x.numel(), ctx, x.device)]
    out[-1] = seed(ctx) % TAGS + 1
    return out.view(torch.uint8)


def decode(payload, numel: int, c, ctx):
    x = torch.zeros(numel, dtype=torch.float32, device=payload.device)
    x[indices(numel, ctx, payload.device)] = payload.view(torch.float32)[:-1]
    return x


def agreed(summed, ctx, world: int) -> None:
    """Raise if the summed payload's tag says the ranks did not all draw this step's indices."""
    tag, want = float(summed.view(torch.float32)[-1]), world * (seed(ctx) % TAGS + 1)
    if tag != want:
        raise RuntimeError(f"random-k: the ranks disagree on the shared seed of step {ctx.step}, bucket "
                           f"{ctx.bucket} (tags sum to {tag:g}, not {want:g}): their step counts or bucket order "
                           "differ, so their values belong to different elements; resume every rank from one "
                           "checkpoint")
