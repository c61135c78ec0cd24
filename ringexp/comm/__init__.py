"""Collectives usable on their own: `all_reduce(tensor, algorithm=..., group=None, **options)`.

Every algorithm sums `tensor` in place over `group` (default: the whole job) and returns it; it is a
collective, so every rank of the group calls it with a tensor of the same size and dtype. float16 and
bfloat16 inputs are summed in float32 and cast back once at the end.

    ring          reduce-scatter + all-gather from point-to-point ops, segmented and pipelined (ring.py)
    hierarchical  two levels of rings over (emulated) nodes, variant two_level or leader (hierarchical.py)
    naive         the parameter-server baseline: gather to rank 0, sum, send back (naive.py)
    builtin       torch.distributed.all_reduce, the reference

ring, hierarchical and naive also take `wire=` (from ringexp.compress): a low-precision format for every
message, with float32 sums at every hop.
"""

from ringexp.comm import builtin, hierarchical, naive, ring

ALGORITHMS = {"ring": ring, "hierarchical": hierarchical, "naive": naive, "builtin": builtin}


def all_reduce(tensor, algorithm: str = "ring", group=None, **options):
    try:
        impl = ALGORITHMS[algorithm]
    except KeyError:
        raise ValueError(f"unknown all-reduce algorithm {algorithm!r}; choose from {', '.join(ALGORITHMS)}") from None
    return impl.all_reduce(tensor, group=group, **options)


def wire_bytes(algorithm: str, nbytes: int, world_size: int, **options) -> int:
    """Bytes the busiest rank sends for one all-reduce of `nbytes` (the algorithm's own traffic pattern)."""
    return ALGORITHMS[algorithm].wire_bytes(nbytes, world_size, **options)


__all__ = ["ALGORITHMS", "all_reduce", "wire_bytes"]
