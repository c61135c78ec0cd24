"""Collectives usable on their own: `all_reduce(tensor, algorithm=..., group=None, **options)`.

Every algorithm sums `tensor` in place over `group` (default: the whole job) and returns it; it is a
collective, so every rank of the group calls it with a tensor of the same size and dtype. float16 and
bfloat16 are summed in float32 and integers in int64, each cast back once at the end (so integer sums are
exact, and narrow types wrap around as torch's own do); complex tensors are summed as their real pairs.
Strided views and leaves that require grad are reduced through a contiguous copy and written back.

    ring          reduce-scatter + all-gather from point-to-point ops, segmented and pipelined (ring.py)
    hierarchical  two levels of rings over (emulated) nodes, variant two_level or leader (hierarchical.py)
    naive         the parameter-server baseline: gather to rank 0, sum, send back (naive.py)
    builtin       torch.distributed.all_reduce, the reference

ring, hierarchical and naive also take `wire=` (from ringexp.compress): a low-precision format for every
message, with float32 sums at every hop.

Before any message is posted, every rank checks its input, and (check=True, the default) the ranks compare
what they were given in one small builtin all-gather, so a mistake on any rank raises the same ValueError on
all of them and leaves the group usable. check=False skips the comparison (DDP's hooks: DDP guarantees it).
A rank outside `group` returns its tensor untouched, as torch.distributed.all_reduce does.
"""

import torch
import torch.distributed as dist

from ringexp.comm import builtin, hierarchical, naive, ring
from ringexp.comm.p2p import one_line

ALGORITHMS = {"ring": ring, "hierarchical": hierarchical, "naive": naive, "builtin": builtin}
# what the comparison across ranks sends, as numbers: the dtype and the algorithm by index
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.complex64, torch.complex128,
          torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool)
PROBLEMS = {
    1: "bool tensors have no sum here: convert to an integer dtype",
    2: "its dtype is not supported: use a float, complex or integer dtype",
    3: "a wire format encodes floats: pass a floating-point tensor (or no wire)",
    4: "the tensor has elements that share memory (an expanded view): pass .contiguous()",
}


def all_reduce(tensor, algorithm: str = "ring", group=None, *, check: bool = True, **options):
    impl = _algorithm(algorithm)
    unknown = sorted(set(options) - set(impl.OPTIONS))
    if unknown:
        raise TypeError(f"{algorithm} all-reduce takes no option {unknown[0]!r} "
                        f"(it takes {', '.join(impl.OPTIONS) or 'none'})")
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{algorithm} all-reduce: expected a torch.Tensor, got {type(tensor).__name__}")
    if dist.get_rank(group) < 0:  # not a member of `group`
        return tensor
    problem = _problem(tensor, options.get("wire"))
    if check and dist.get_world_size(group) > 1:
        _agree(tensor, algorithm, group, problem)
    elif problem:
        raise ValueError(f"{algorithm} all-reduce: {PROBLEMS[problem]} (got {tensor.dtype})")
    target = torch.view_as_real(tensor.detach()) if tensor.is_complex() else tensor
    try:
        impl.all_reduce(target, group=group, **options)
    except Exception as e:
        if impl is builtin:
            raise
        raise RuntimeError(f"{e} (messages of this all-reduce may still be posted on this group: do not use the "
                           "group again; destroy it and create a new one)") from e
    return tensor


def _algorithm(name: str):
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise ValueError(f"unknown all-reduce algorithm {name!r}; choose from {', '.join(ALGORITHMS)}") from None


def _problem(tensor, wire) -> int:
    """What this rank's input cannot be reduced for (a PROBLEMS key), or 0."""
    if tensor.dtype == torch.bool:
        return 1
    if tensor.dtype not in DTYPES:
        return 2
    if wire is not None and not tensor.dtype.is_floating_point:
        return 3
    if any(st == 0 and sz > 1 for st, sz in zip(tensor.stride(), tensor.shape, strict=True)):
        return 4
    return 0


def _agree(tensor, algorithm: str, group, problem: int) -> None:
    """One all-gather of (problem, numel, dtype, algorithm) from every rank: raise the same error on all of them if
    any rank cannot go on or they disagree, before any message of the collective is posted."""
    device = "cpu" if "gloo" in str(dist.get_backend(group)) else tensor.device
    dtype = DTYPES.index(tensor.dtype) if tensor.dtype in DTYPES else -1
    mine = torch.tensor([problem, tensor.numel(), dtype, list(ALGORITHMS).index(algorithm)], device=device)
    everyone = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    try:
        dist.all_gather(everyone, mine, group=group)
    except Exception as e:  # a peer that died or hung: say which collective was about to start
        raise RuntimeError(f"{algorithm} all-reduce: before step 1, comparing every rank's input: "
                           f"{type(e).__name__}: {one_line(e)}") from e
    rows = [[int(v) for v in t.tolist()] for t in everyone]
    ranks = dist.get_process_group_ranks(group) if group is not None else list(range(len(rows)))
    for rank, (code, *_rest) in zip(ranks, rows, strict=True):
        if code:
            raise ValueError(f"{algorithm} all-reduce: rank {rank}: {PROBLEMS[code]}")
    if any(row[1:] != rows[0][1:] for row in rows):
        said = ", ".join(f"rank {rank}: {_described(row)}" for rank, row in zip(ranks, rows, strict=True))
        raise ValueError(f"{algorithm} all-reduce: every rank must pass the same size and dtype to the same "
                         f"algorithm; got {said}")


def _described(row) -> str:
    _, numel, dtype, algorithm = row
    return f"{list(ALGORITHMS)[algorithm]} of {numel} x {str(DTYPES[dtype]).removeprefix('torch.')}"


def options_for(algorithm: str, options: dict) -> dict:
    """The subset of `options` that `algorithm` takes (for callers holding options for every algorithm)."""
    return {k: v for k, v in options.items() if k in _algorithm(algorithm).OPTIONS}


def wire_bytes(algorithm: str, nbytes: int, world_size: int, **options) -> int:
    """Bytes the busiest rank sends for one all-reduce of `nbytes` (the algorithm's own traffic pattern)."""
    return ALGORITHMS[algorithm].wire_bytes(nbytes, world_size, **options)


__all__ = ["ALGORITHMS", "all_reduce", "options_for", "wire_bytes"]
