"""The parameter-server baseline from seed article 000: everyone sends its whole buffer to rank 0, which
sums and sends the result back to each rank. Rank 0 moves 2(n-1) buffers while the others move 2: its
link is the bottleneck, and it grows with n, which is the point of showing it next to the ring.

With a `wire` format (ringexp.compress), workers send encoded buffers, rank 0 decodes and sums in float32 and
sends the sum back encoded once (keeping the decoded value itself, so every rank ends with the same numbers).
The two halves, gather_sum and send_back, are also hierarchical's leader variant inside a node."""

import torch
import torch.distributed as dist

from ringexp.cluster import costmodel
from ringexp.comm.p2p import finish, global_rank, irecv, isend, members_of, wait, work_copy

OPTIONS = ("timeout_s", "wire")  # all_reduce's options (ringexp.comm refuses others)


def _recv_error(name: str, step: str, src: int, group) -> str:
    return f"{name}: {step}: nothing from rank {global_rank(group, src)}"


def _send_error(name: str, step: str, dst: int, group) -> str:
    return f"{name}: {step}: rank {global_rank(group, dst)} did not take our data"


def gather_sum(flat, group, members=None, timeout_s=None, wire=None, name="naive all-reduce") -> None:
    """The first member (the root) adds every other member's `flat` into its own; the others send theirs."""
    ring, me = members_of(group, members)
    root, n = ring[0], len(ring)
    if me == 0:
        buf = torch.empty_like(flat) if wire is None else torch.empty(wire.nbytes(flat.numel()), dtype=torch.uint8,
                                                                      device=flat.device)
        for k, src in enumerate(ring[1:], 1):
            what = _recv_error(name, f"step 1/2 (gather, {k}/{n - 1})", src, group)
            wait(irecv(buf, group, src, what), timeout_s, what, flat.is_cuda)
            flat.add_(buf) if wire is None else wire.add_into(buf, flat)
    else:
        payload = flat if wire is None else wire.encode_into(flat, torch.empty(
            wire.nbytes(flat.numel()), dtype=torch.uint8, device=flat.device))
        what = _send_error(name, "step 1/2 (gather)", root, group)
        wait(isend(payload, group, root, what), timeout_s, what, flat.is_cuda)


def send_back(flat, group, members=None, timeout_s=None, wire=None, name="naive all-reduce") -> None:
    """The root sends its `flat` (the sum) to every other member, encoded once; everyone ends with the same."""
    ring, me = members_of(group, members)
    root, n = ring[0], len(ring)
    if me == 0:
        payload = flat
        if wire is not None:
            payload = wire.encode_into(flat, torch.empty(wire.nbytes(flat.numel()), dtype=torch.uint8,
                                                         device=flat.device))
            wire.copy_into(payload, flat)  # keep what the workers will decode
        whats = {dst: _send_error(name, f"step 2/2 (send back, {k}/{n - 1})", dst, group)
                 for k, dst in enumerate(ring[1:], 1)}
        sends = [(dst, isend(payload, group, dst, whats[dst])) for dst in ring[1:]]
        for dst, w in sends:
            wait(w, timeout_s, whats[dst], flat.is_cuda)
    else:
        buf = flat if wire is None else torch.empty(wire.nbytes(flat.numel()), dtype=torch.uint8, device=flat.device)
        what = _recv_error(name, "step 2/2 (send back)", root, group)
        wait(irecv(buf, group, root, what), timeout_s, what, flat.is_cuda)
        if wire is not None:
            wire.copy_into(buf, flat)


def all_reduce(tensor, group=None, timeout_s=None, wire=None, **_options):
    if dist.get_world_size(group) == 1 or tensor.numel() == 0:
        return tensor
    flat = work_copy(tensor)
    gather_sum(flat, group, None, timeout_s, wire)
    send_back(flat, group, None, timeout_s, wire)
    return finish(tensor, flat)


def all_gather(payload, buf, stride: int, group=None, timeout_s=None) -> list:
    """Every rank's `payload` in rank order, through rank 0 (a parameter server that forwards): `buf` holds n
    slots of `stride` bytes; returns the slots."""
    ring, r = members_of(group)
    slots = [buf[q * stride:(q + 1) * stride] for q in ring]
    slots[r][:payload.numel()] = payload
    name = "naive all-gather"
    if r == 0:
        for src in ring[1:]:
            what = _recv_error(name, f"step 1/2 ({src}/{len(ring) - 1})", src, group)
            wait(irecv(slots[src], group, src, what), timeout_s, what, buf.is_cuda)
    else:
        what = _send_error(name, "step 1/2", 0, group)
        wait(isend(slots[r], group, 0, what), timeout_s, what, buf.is_cuda)
    send_back(buf, group, None, timeout_s, name=name)
    return slots


def wire_bytes(nbytes: int, world_size: int, wire_ratio: float = 1.0, **_options) -> int:
    return int((world_size - 1) * nbytes * wire_ratio)  # rank 0's share: the busiest link


def seconds(cl, nbytes: float, wire=costmodel.NONE, **_options) -> float:
    """Predicted time on cluster `cl`: rank 0 receives p-1 whole buffers in turn (the other nodes' through its
    node link), sums, and sends p-1 back."""
    far, k = (cl.nodes - 1) * cl.ranks_per_node, cl.ranks_per_node
    sent = wire.ratio * nbytes
    one_way = (k - 1) * costmodel.hop(cl.intra, sent) + far * costmodel.hop(cl.inter, sent)
    plain = wire is costmodel.NONE
    compute = (costmodel.ranks(cl) - 1) * nbytes * (cl.add_s_per_byte if plain else wire.decode)
    if plain:  # the adds wait for each buffer; the next one is on its way meanwhile only with a codec
        return 2 * one_way + compute
    return costmodel.together(cl, one_way, compute + nbytes * wire.encode) + one_way
