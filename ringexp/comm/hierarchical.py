"""Hierarchical all-reduce over nodes: fast links inside a node, a ring only between nodes.

Ranks are grouped into `nodes` nodes of m = world / nodes consecutive ranks (real nodes: the launcher's
local world size; or emulated on one machine with parallel.nodes=N). Two variants, to compare:

two_level (what NCCL and Horovod do): ring reduce-scatter inside the node, so each local rank holds the
  node's sum of one 1/m shard; ring all-reduce of that shard among the ranks with the same local rank on
  every node (m rings in parallel, each carrying 1/m of the data); ring all-gather inside the node.
leader (seed article 000's): gather and sum at the node's first rank, ring all-reduce among those leaders,
  send the result back inside the node. Simpler, but the leader's links carry everything and the others idle.

With a `wire` format (ringexp.compress), `scope="inter_node"` encodes only the traffic between nodes (the slow
links) and keeps the intra-node stages exact; `scope="all"` encodes the intra-node rings too (leader's
intra-node gather and send-back stay exact). `phases` (a ringexp.comm.two_phase codec, from ringexp.compress) runs
the stage between nodes as a two-phase compressed all-reduce instead of a ring (Bagua's ByteGrad: exact inside a
node, compressed payloads with error feedback between nodes); the node's stages stay exact.
"""

import os
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import torch.distributed as dist

from ringexp.cluster import costmodel
from ringexp.comm import naive, ring, two_phase
from ringexp.comm.p2p import finish, global_ranks, members_of, work_copy

VARIANTS = ("two_level", "leader")
# two_level's pipeline: pieces of at least PIECE_BYTES, at most PIECES of them (64 MB in 4 pieces of 16 MB)
PIECES, PIECE_BYTES = 4, 4 << 20
_local = threading.local()
# all_reduce's options (ringexp.comm refuses others)
OPTIONS = ("nodes", "variant", "segment_bytes", "timeout_s", "wire", "scope", "paired", "phases")


def node_rings(group, nodes: int) -> tuple:
    """(this rank's node, its inter-node ring): lists of ranks in `group`. Nodes are `nodes` runs of m consecutive
    ranks; the inter-node ring joins the ranks with the same local index on every node. Both are sub-rings whose
    messages travel on `group`: no process group is created, so any rank set may run this, any time."""
    ranks, me = members_of(group)
    n = len(ranks)
    if nodes < 1 or n % nodes:
        raise ValueError(f"nodes={nodes} must divide the {n} ranks into equal nodes")
    m = n // nodes
    k, i = divmod(me, m)
    return ranks[k * m:(k + 1) * m], ranks[i::m]


def default_nodes(ranks) -> int:
    """Real nodes among global `ranks`: the launcher's LOCAL_WORLD_SIZE ranks per node, numbered in blocks (as
    torchrun and Slurm do); 1 if that is unknown or `ranks` do not span the nodes evenly in order."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", 0))
    node = [r // local for r in ranks] if local > 0 else [0]
    counts = Counter(node)
    return len(counts) if node == sorted(node) and len(set(counts.values())) == 1 else 1


def all_reduce(tensor, group=None, nodes=None, variant: str = "two_level",
               segment_bytes=None, timeout_s=None, wire=None, scope: str = "all", paired=None, phases=None,
               **_options):
    if dist.get_world_size(group) == 1 or tensor.numel() == 0:
        return tensor
    if variant not in VARIANTS:
        raise ValueError(f"hierarchical variant {variant!r}: choose {' or '.join(VARIANTS)}")
    node, inter = node_rings(group, nodes or default_nodes(global_ranks(group)))
    flat = work_copy(tensor)
    where = f"node of ranks {node[0]}-{node[-1]}" if group is None else f"node of group ranks {node[0]}-{node[-1]}"

    def step(i, what, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as e:  # say which stage of which node failed, around the inner message
            raise RuntimeError(f"hierarchical all-reduce ({variant}): step {i}/3, {what} ({where}): {e}") from e

    local = wire if scope == "all" and phases is None else None
    opts = {"segment_bytes": segment_bytes, "timeout_s": timeout_s, "paired": paired}
    between = ring.all_reduce if phases is None else lambda x, g, wire, members, timeout_s, **_: \
        two_phase.all_reduce(x, g, two_phase.shifted(phases, x.storage_offset() - flat.storage_offset()),
                             members=members, timeout_s=timeout_s)
    if variant == "two_level":
        two_level(flat, group, node, inter, wire, local, opts, step, between, phases is None)
    else:  # the leader is the node's first rank
        step(1, "reduce to the node's leader", naive.gather_sum, flat, group, node, timeout_s, name="reduce")
        if dist.get_rank(group) == node[0] and len(inter) > 1:  # a leader: its inter-node ring is the leaders'
            step(2, "among leaders", between, flat, group, wire=wire, members=inter, **opts)
        step(3, "send back from the leader", naive.send_back, flat, group, node, timeout_s, name="send back")
    return finish(tensor, flat)


def two_level(flat, group, node, inter, wire, local, opts, step, between=ring.all_reduce, pipelined=True) -> None:
    """Reduce-scatter in the node, all-reduce of this rank's shard between nodes, all-gather in the node; in
    pieces, pipelined: while a background thread runs a piece's inter-node ring (the slow link: waiting), this
    thread runs the node's stages of the pieces before and after it (CPU work). The two threads talk to disjoint
    peers (the node's ranks, the other nodes' ranks at the same local index), so on gloo their messages never
    mix; on GPUs one thread posts everything (NCCL's order, see below) and the device overlaps the stages.
    `between`: the stage between nodes (two phases instead of the ring: one piece, so that each rank's residual
    is its one shard's)."""
    m = len(node)
    cut = pipelined and m > 1 and len(inter) > 1
    pieces = piece_bounds(flat, m, opts["segment_bytes"]) if cut else [(0, flat.numel())]

    def inter_ring(shard):
        step(2, "between nodes", between, shard, group, wire=wire, members=inter, **opts)

    # On GPUs the pieces run on this thread: NCCL runs a group's operations in the order posted, and two threads
    # posting on one group would interleave them differently on different ranks (a hang); the device overlaps
    # the queued kernels anyway.
    pool, pending = helper() if len(pieces) > 1 and not flat.is_cuda else None, []
    for b, e in pieces:
        piece = flat[b:e]
        owned = step(1, "intra-node reduce-scatter", ring.reduce_scatter, piece, group, wire=local, members=node,
                     **opts) if m > 1 else 0
        lo, hi = ring.chunk_bounds(piece.numel(), m)[owned]
        if hi > lo and len(inter) > 1:
            pending.append(pool.submit(inter_ring, piece[lo:hi]) if pool else inter_ring(piece[lo:hi]))
        else:
            pending.append(None)
    for (b, e), shard_done in zip(pieces, pending, strict=True):
        if shard_done is not None:
            shard_done.result()
        if m > 1:
            step(3, "intra-node all-gather", ring.all_gather, flat[b:e], group, wire=local, members=node, **opts)


def helper() -> ThreadPoolExecutor:
    """The calling thread's helper thread for two_level's inter-node rings. Kept for the process's life: the ring's
    buffers are per thread, and a fresh thread per call would fault in fresh ones every time (a 64 MB all-reduce
    was 30% slower). One per calling thread, so that two threads' all-reduces never queue behind each other."""
    if getattr(_local, "pid", None) != os.getpid():  # none yet in this thread, or inherited through a fork
        _local.pool, _local.pid = ThreadPoolExecutor(1, thread_name_prefix="ringexp-inter-node"), os.getpid()
    return _local.pool


def piece_bounds(flat, m: int, segment_bytes) -> list:
    """Up to PIECES pieces for two_level's pipeline, each at least PIECE_BYTES (or, with an explicit segment
    size, m x 4 segments: every rank's shard of a piece still fills a few of the ring's segments)."""
    least = PIECE_BYTES if segment_bytes is None else 4 * m * segment_bytes
    k = max(1, min(PIECES, flat.numel() * flat.element_size() // max(1, least)))
    return ring.chunk_bounds(flat.numel(), k)


def wire_bytes(nbytes: int, world_size: int, nodes=None, variant: str = "two_level", wire_ratio: float = 1.0,
               scope: str = "all", between=None, **_options) -> int:
    """`between(nbytes, members)`: the bytes of the stage between nodes where it is not a ring (the two phases)."""
    k = nodes or default_nodes(range(world_size))
    m = world_size // k
    shard = nbytes // m if variant == "two_level" else nbytes
    inter = ring.wire_bytes(shard, k, wire_ratio) if between is None else between(shard, k)
    if variant == "two_level":
        inside = wire_ratio if scope == "all" and between is None else 1.0
        return ring.wire_bytes(nbytes, m, inside) + inter
    return inter + (m - 1) * nbytes  # the leader: ring traffic plus sending the result to m - 1 ranks


def seconds(cl, nbytes: float, wire=costmodel.NONE, variant: str = "two_level", scope: str = "all",
            phases: bool = False, **_options) -> float:
    """Predicted time of one all-reduce of `nbytes` float32 bytes on cluster `cl` (its real nodes), `wire` between
    nodes (and inside them too with scope=all). two_level [NCCL's and Horovod's; S in ringexp.cluster.costmodel]: a ring
    reduce-scatter inside the node (k ranks), k rings between nodes each on n/k bytes (together n bytes through
    each node's link), an all-gather inside. leader (seed article 000): gather to the node's first rank (k-1
    whole buffers in turn, each summed), a ring of the N leaders on n bytes, the result sent back in turn.
    `phases`: the stage between nodes is the two phases (ringexp.comm.two_phase), the node's stages exact."""
    nodes, k = cl.nodes, cl.ranks_per_node
    inside = costmodel.NONE if scope == "inter_node" or phases else wire
    if variant == "two_level" and (nodes == 1 or k == 1) and not phases:
        return ring.seconds(cl, nbytes, wire if nodes > 1 else inside)

    def between(reduced=None):
        step = lambda b: costmodel.hop(cl.inter, b)  # noqa: E731 (the hop of a node's link)
        if phases:  # k ranks' all-to-alls among the nodes share each node's link
            return two_phase.seconds(cl, nbytes if reduced is None else reduced, nodes,
                                     lambda b: (nodes - 1) * costmodel.crossing(cl.inter, b), wire, through=nbytes)
        return costmodel.ring_s(cl, nbytes, nodes, step, wire, reduced, ring.segments(nbytes / nodes))

    if variant == "two_level":
        intra = costmodel.ring_s(cl, nbytes, k, lambda b: costmodel.hop(cl.intra, b), inside,
                                 segments=ring.segments(nbytes / k))
        return intra + between(reduced=nbytes / k)
    add = cl.add_s_per_byte if inside is costmodel.NONE else inside.decode + inside.encode / (k or 1)
    gather = (k - 1) * (costmodel.hop(cl.intra, inside.ratio * nbytes) + nbytes * add)
    back = (k - 1) * costmodel.hop(cl.intra, inside.ratio * nbytes)
    return gather + between() + back
