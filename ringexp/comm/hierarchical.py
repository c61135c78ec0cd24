"""Hierarchical all-reduce over nodes: fast links inside a node, a ring only between nodes.

Ranks are grouped into `nodes` nodes of m = world / nodes consecutive ranks (real nodes: the launcher's
local world size; or emulated on one machine with parallel.nodes=N). Two variants, to compare:

two_level (what NCCL and Horovod do): ring reduce-scatter inside the node, so each local rank holds the
  node's sum of one 1/m shard; ring all-reduce of that shard among the ranks with the same local rank on
  every node (m rings in parallel, each carrying 1/m of the data); ring all-gather inside the node.
leader (seed article 000's): reduce to the node's first rank, ring all-reduce among those leaders,
  broadcast inside the node. Simpler, but the leader's links carry everything and the others idle.

With a `wire` format (ringexp.compress), `scope="inter_node"` encodes only the traffic between nodes (the slow
links) and keeps the intra-node stages exact; `scope="all"` encodes the intra-node rings too (leader's
intra-node reduce and broadcast are torch's and stay float32).
"""

import os
import threading

import torch.distributed as dist

from ringexp.comm import ring
from ringexp.comm.p2p import finish, work_copy

VARIANTS = ("two_level", "leader")
_groups, _lock = {}, threading.Lock()


def node_groups(group, nodes: int):
    """(intra-node group, inter-node group) of this rank, created once per (group, nodes).

    Creating groups is collective over the whole job: every rank must reach the first call with the same
    `nodes` (the DDP strategy does it at set-up, on the main thread)."""
    ranks = dist.get_process_group_ranks(group) if group is not None else list(range(dist.get_world_size()))
    n = len(ranks)
    if nodes < 1 or n % nodes:
        raise ValueError(f"nodes={nodes} must divide the {n} ranks into equal nodes")
    key = (tuple(ranks), nodes)
    with _lock:
        if key not in _groups:
            m, me = n // nodes, ranks.index(dist.get_rank())
            intra = [dist.new_group(ranks[k * m:(k + 1) * m]) for k in range(nodes)]
            inter = [dist.new_group(ranks[i::m]) for i in range(m)]
            _groups[key] = (intra[me // m], inter[me % m])
        return _groups[key]


def default_nodes(world_size: int) -> int:
    """Real nodes: the launcher's local world size is the number of ranks per node."""
    return max(1, world_size // int(os.environ.get("LOCAL_WORLD_SIZE", world_size)))


def all_reduce(tensor, group=None, nodes=None, variant: str = "two_level",
               segment_bytes=None, timeout_s=None, wire=None, scope: str = "all", **_options):
    if dist.get_world_size(group) == 1 or tensor.numel() == 0:
        return tensor
    if variant not in VARIANTS:
        raise ValueError(f"hierarchical variant {variant!r}: choose {' or '.join(VARIANTS)}")
    intra, inter = node_groups(group, nodes or default_nodes(dist.get_world_size(group)))
    flat = work_copy(tensor)
    node = dist.get_process_group_ranks(intra)
    where = f"node of ranks {node[0]}-{node[-1]}"

    def step(i, what, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as e:  # say which stage of which node failed, around the inner message
            raise RuntimeError(f"hierarchical all-reduce ({variant}): step {i}/3, {what} ({where}): {e}") from e

    local = wire if scope == "all" else None
    if variant == "two_level":
        m = dist.get_world_size(intra)
        owned = step(1, "intra-node reduce-scatter", ring.reduce_scatter, flat, intra, segment_bytes,
                     timeout_s, local) if m > 1 else 0
        b, e = ring.chunk_bounds(flat.numel(), m)[owned]
        if e > b and dist.get_world_size(inter) > 1:
            step(2, "inter-node ring", ring.all_reduce, flat[b:e], inter, segment_bytes, timeout_s, wire)
        if m > 1:
            step(3, "intra-node all-gather", ring.all_gather, flat, intra, segment_bytes, timeout_s, local)
    else:
        step(1, "reduce to the node's leader", dist.reduce, flat, group=intra, group_dst=0)
        if dist.get_rank(intra) == 0:
            step(2, "ring among leaders", ring.all_reduce, flat, inter, segment_bytes, timeout_s, wire)
        step(3, "broadcast from the leader", dist.broadcast, flat, group=intra, group_src=0)
    return finish(tensor, flat)


def wire_bytes(nbytes: int, world_size: int, nodes=None, variant: str = "two_level", wire_ratio: float = 1.0,
               scope: str = "all", **_options) -> int:
    k = nodes or default_nodes(world_size)
    m = world_size // k
    inter = ring.wire_bytes(nbytes // m if variant == "two_level" else nbytes, k, wire_ratio)
    if variant == "two_level":
        return ring.wire_bytes(nbytes, m, wire_ratio if scope == "all" else 1.0) + inter
    return inter + (m - 1) * nbytes  # the leader: ring traffic plus sending the result to m - 1 ranks
