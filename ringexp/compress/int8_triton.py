"""int8's round-to-nearest encode of a CUDA tensor in one pass over memory (a Triton kernel, one program per block).

Eager PyTorch takes four passes and a host sync (amax, amin, the scaling add, the narrowing copy, then `any` of
the non-finite rows), which held int8 at 10% of an H200's memory bandwidth where a cast reaches 72%
(docs/results/gpu.md). Here each program loads its block once, finds the largest finite magnitude and whether
the block holds NaN or inf, and writes the codes and the scale: the format of ringexp/compress/int8.py exactly
(its MAGIC rounding, -128 for a non-finite element, the scale negated for such a block), so either device decodes
what the other encoded.

Triton is imported here, at the top: CPU-only builds of torch come without it, and then `available` is False.
With TRITON_INTERPRET=1 (set before the import) the kernel runs on CPU tensors: the tests check it there.
"""

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # a CPU-only torch: int8 encodes eagerly
    triton = None

MAX_BLOCK = 1 << 16  # one program holds a block in registers: longer blocks encode eagerly


def available(length: int) -> bool:
    return triton is not None and length <= MAX_BLOCK


if triton is not None:

    @triton.jit
    def _encode(x_ptr, scale_ptr, q_ptr, length, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        offs = tl.arange(0, BLOCK)
        inside = offs < length
        x = tl.load(x_ptr + row * length + offs, mask=inside, other=0.0)
        finite = tl.abs(x) < float("inf")  # False for NaN and +-inf
        amax = tl.max(tl.where(finite, tl.abs(x), 0.0), axis=0)
        bad = tl.max(tl.where(finite, 0, 1), axis=0)
        # IEEE division, as the CPU divides (Triton's `/` on float32 is approximate)
        s = tl.where(amax > 0, tl.div_rn(amax, 127.0), 1.0)
        wide = x * tl.div_rn(1.0, s) + 12582912.0  # int8.MAGIC: the rounded code in the low byte
        codes = tl.where(finite, wide.to(tl.int32, bitcast=True).to(tl.int8), -128)
        tl.store(q_ptr + row * length + offs, codes, mask=inside)
        tl.store(scale_ptr + row, tl.where(bad > 0, -s, s))


def encode_rows(x: torch.Tensor, scale: torch.Tensor, q: torch.Tensor) -> None:
    """Encode the rows of `x` (rows x length, float32, contiguous) into `scale` (rows) and `q` (rows x length,
    int8), as int8.encode_rows does without stochastic rounding."""
    rows, length = x.shape
    block = triton.next_power_of_2(length)
    _encode[(rows,)](x, scale, q, length, BLOCK=block, num_warps=min(16, max(4, block // 1024)))
