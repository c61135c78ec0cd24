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
message, with float32 sums at every hop. ring and hierarchical take `paired=`: each receive posted in one batch
with its send, the order NCCL needs (default: on CUDA tensors; gloo runs both).

Before any message is posted, every rank checks its input and options, and (check=True, the default) the ranks
compare what they were given in one small builtin all-gather, so a mistake on any rank raises on all of them (that
rank its own precise error, the others a ValueError naming it) and leaves the group usable. check=False skips the
comparison (DDP's hooks: DDP guarantees it), not the local checks.
A rank outside `group` returns its tensor untouched, as torch.distributed.all_reduce does.
"""

import torch
import torch.distributed as dist

from ringexp.cluster import costmodel
from ringexp.comm import builtin, hierarchical, naive, ring
from ringexp.comm.p2p import DEFAULT_TIMEOUT_S, global_ranks, one_line

ALGORITHMS = {"ring": ring, "hierarchical": hierarchical, "naive": naive, "builtin": builtin}
# what the comparison across ranks sends, as numbers: the dtype and the algorithm by index
SUPPORTED_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.complex64, torch.complex128,
                    torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool)
# a rank's mistake, as the other ranks hear of it (the rank itself raises its own, more precise, error)
PROBLEMS = ("", "bool tensors have no sum here: convert to an integer dtype",
            "its dtype is not supported: use a float, complex or integer dtype",
            "a wire format encodes floats: pass a floating-point tensor (or no wire)",
            "the tensor has elements that share memory (an expanded view): pass .contiguous()",
            "a sparse tensor: pass .to_dense()", "a conjugate view: pass .resolve_conj()",
            "it passed no tensor", "it asked for an unknown algorithm", "it passed an option its algorithm refuses",
            "a divisor needs a floating-point tensor")


def all_reduce(tensor, algorithm: str = "ring", group=None, *, check: bool = True, **options):
    if dist.get_rank(group) < 0:  # not a member of `group`, as torch.distributed.all_reduce
        return tensor
    code, error = _mistake(tensor, algorithm, options, group)
    if check and dist.get_world_size(group) > 1:
        _agree(tensor, algorithm, options, group, code, error)
    elif error is not None:
        raise error
    target = torch.view_as_real(tensor.detach()) if tensor.is_complex() else tensor
    try:
        ALGORITHMS[algorithm].all_reduce(target, group=group, **options)
    except Exception as e:
        if algorithm == "builtin":
            raise
        raise RuntimeError(f"{e} (messages of this all-reduce may still be posted on this group: do not use the "
                           "group again; destroy it and create a new one)") from e
    return tensor


def _mistake(tensor, algorithm: str, options: dict, group) -> tuple:
    """(PROBLEMS index, the exception this rank raises) for what this rank cannot reduce, or (0, None)."""
    if algorithm not in ALGORITHMS:
        return 8, ValueError(f"unknown all-reduce algorithm {algorithm!r}; choose from {', '.join(ALGORITHMS)}")
    impl = ALGORITHMS[algorithm]
    unknown = sorted(set(options) - set(impl.OPTIONS))
    if unknown:
        return 9, TypeError(f"{algorithm} all-reduce takes no option {unknown[0]!r} "
                            f"(it takes {', '.join(impl.OPTIONS) or 'none'})")
    bad = bad_option(options, dist.get_world_size(group))
    if bad:
        return 9, ValueError(f"{algorithm} all-reduce: {bad}")
    if not isinstance(tensor, torch.Tensor):
        return 7, TypeError(f"{algorithm} all-reduce: expected a torch.Tensor, got {type(tensor).__name__}")
    code = (1 if tensor.dtype == torch.bool else 2 if tensor.dtype not in SUPPORTED_DTYPES
            else 5 if tensor.layout != torch.strided else 6 if tensor.is_conj()
            else 3 if options.get("wire") is not None and not tensor.dtype.is_floating_point
            else 10 if options.get("divisor") is not None and not tensor.dtype.is_floating_point
            else 4 if any(st == 0 and sz > 1 for st, sz in zip(tensor.stride(), tensor.shape, strict=True)) else 0)
    return code, (ValueError(f"{algorithm} all-reduce: {PROBLEMS[code]} (got {tensor.dtype})") if code else None)


def bad_option(o: dict, world) -> str:
    """What is wrong with an option's value (the same on every rank that passes it), or ''. `world`: the ranks
    `nodes` must divide (None: not known yet)."""
    if o.get("segment_bytes") is not None and not (isinstance(o["segment_bytes"], int) and o["segment_bytes"] >= 1):
        return f"segment_bytes={o['segment_bytes']!r}: must be an integer >= 1 (or None: automatic)"
    if o.get("timeout_s") is not None and not (isinstance(o["timeout_s"], int | float) and o["timeout_s"] > 0):
        return f"timeout_s={o['timeout_s']!r}: must be > 0 seconds (or None: {DEFAULT_TIMEOUT_S:g})"
    nodes = o.get("nodes")
    if nodes is not None and not (isinstance(nodes, int) and nodes >= 1 and (world is None or world % nodes == 0)):
        return (f"nodes={nodes!r} must divide the {world} ranks into equal nodes" if world
                else f"nodes={nodes!r}: must be an integer >= 1")
    if o.get("divisor") is not None and not (isinstance(o["divisor"], int | float) and o["divisor"] != 0):
        return f"divisor={o['divisor']!r}: must be a nonzero number"
    if o.get("paired") not in (None, True, False):
        return f"paired={o['paired']!r}: must be true or false (or None: on CUDA tensors)"
    if "variant" in o and o["variant"] not in hierarchical.VARIANTS:
        return f"variant={o['variant']!r}: choose {' or '.join(hierarchical.VARIANTS)}"
    if "scope" in o and o["scope"] not in ("all", "inter_node"):
        return f"scope={o['scope']!r}: choose all or inter_node"
    return ""


def _agree(tensor, algorithm: str, options: dict, group, code: int, error) -> None:
    """One all-gather of what every rank was given: raise on all of them if any rank cannot go on or they
    disagree, before any message of the collective is posted."""
    row = _described(tensor, algorithm, options, group, code)
    # NCCL: on the tensor's own GPU (a thread's current device may be another one)
    device = "cpu" if "gloo" in str(dist.get_backend(group)) else tensor.device if tensor.is_cuda else \
        torch.device("cuda", torch.cuda.current_device())
    mine = torch.tensor(row, device=device)
    everyone = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    try:
        dist.all_gather(everyone, mine, group=group)
    except Exception as e:  # a peer that died or hung: say which collective was about to start
        raise RuntimeError(f"{algorithm} all-reduce: before step 1, comparing every rank's input: "
                           f"{type(e).__name__}: {one_line(e)}") from e
    rows = [[int(v) for v in t.tolist()] for t in everyone]
    if error is not None:
        raise error
    for rank, other in zip(global_ranks(group), rows, strict=True):
        if other[0]:
            raise ValueError(f"{algorithm} all-reduce: rank {rank}: {PROBLEMS[other[0]]}")
    if any(other[1:] != rows[0][1:] for other in rows):
        said = ", ".join(f"rank {rank}: {_said(other)}" for rank, other in zip(global_ranks(group), rows, strict=True))
        raise ValueError(f"{algorithm} all-reduce: every rank must pass the same size, dtype, algorithm and "
                         f"options; got {said}")


def _described(tensor, algorithm: str, options: dict, group, code: int) -> list:
    """(problem, numel, dtype, algorithm, nodes, variant, segment_bytes, wire bytes per 4096 floats) as integers."""
    if code in (7, 8, 9):
        return [code, -1, -1, -1, 0, 0, 0, 0]
    nodes = options.get("nodes") or (hierarchical.default_nodes(global_ranks(group)) if algorithm == "hierarchical"
                                     else 0)
    variant = hierarchical.VARIANTS.index(options.get("variant", "two_level")) if algorithm == "hierarchical" else 0
    wire = options.get("wire")
    return [code, tensor.numel(), SUPPORTED_DTYPES.index(tensor.dtype) if tensor.dtype in SUPPORTED_DTYPES else -1,
            list(ALGORITHMS).index(algorithm), nodes, variant, options.get("segment_bytes") or 0,
            wire.nbytes(4096) if wire is not None else 0]


def _said(row) -> str:
    _, numel, dtype, algorithm, nodes, variant, segment, wire = row
    if numel < 0:
        return "an invalid call"
    said = f"{list(ALGORITHMS)[algorithm]} of {numel} x {str(SUPPORTED_DTYPES[dtype]).removeprefix('torch.')}"
    extra = [f"nodes={nodes}" if nodes else "", f"variant={hierarchical.VARIANTS[variant]}" if variant else "",
             f"segment_bytes={segment}" if segment else "", "a wire format" if wire else ""]
    return " ".join([said, *[e for e in extra if e]])


def options_for(algorithm: str, options: dict) -> dict:
    """The subset of `options` that `algorithm` takes (for callers holding options for every algorithm)."""
    return {k: v for k, v in options.items() if k in ALGORITHMS[algorithm].OPTIONS}


def wire_bytes(algorithm: str, nbytes: int, world_size: int, **options) -> int:
    """Bytes the busiest rank sends for one all-reduce of `nbytes` (the algorithm's own traffic pattern)."""
    return ALGORITHMS[algorithm].wire_bytes(nbytes, world_size, **options)


def seconds(algorithm: str, cl, nbytes: float, wire=None, **options) -> float:
    """Predicted seconds of one all-reduce of `nbytes` float32 bytes over every rank of cluster `cl` (a
    ClusterConfig), each message in `wire` (a ringexp.cluster.costmodel.Wire: a compressor's format and codec costs;
    None: float32): the algorithm's own formula (the cost model's pieces), and the cluster's cost of one call."""
    return costmodel.call(cl, ALGORITHMS[algorithm].seconds(cl, nbytes, wire or costmodel.NONE, **options))


def parse(name: str) -> tuple:
    """(algorithm, options) of an all-reduce as named on a command line or a bench row: `builtin`, `ring`,
    `ring:KiB` (a segment size), `hierarchical` (two_level), `hierarchical:VARIANT`, `naive`; ValueError saying
    what is wrong otherwise."""
    base, colon, extra = name.partition(":")
    if base not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {name!r}; choose from {', '.join(ALGORITHMS)}, ring:KiB or "
                         f"{', '.join('hierarchical:' + v for v in hierarchical.VARIANTS)}")
    if not colon:
        return base, ({"variant": hierarchical.VARIANTS[0]} if base == "hierarchical" else {})
    if base == "ring" and extra.isdigit() and int(extra) > 0:
        return base, {"segment_bytes": int(extra) * 1024}
    if base == "hierarchical" and extra in hierarchical.VARIANTS:
        return base, {"variant": extra}
    raise ValueError(f"algorithm {name!r}: {base} takes " + ("a segment size in KiB (ring:256)" if base == "ring" else
                     f"a variant ({', '.join(hierarchical.VARIANTS)})" if base == "hierarchical" else "no option"))


__all__ = ["ALGORITHMS", "all_reduce", "bad_option", "options_for", "parse", "seconds", "wire_bytes"]
