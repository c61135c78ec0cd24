"""The parameter-server baseline from seed article 000: everyone sends its whole buffer to rank 0, which
sums and sends the result back to each rank. Rank 0 moves 2(n-1) buffers while the others move 2: its
link is the bottleneck, and it grows with n, which is the point of showing it next to the ring.

With a `wire` format (ringexp.compress), workers send encoded buffers, rank 0 decodes and sums in float32 and
sends the sum back encoded once (keeping the decoded value itself, so every rank ends with the same numbers)."""

import torch
import torch.distributed as dist

from ringexp.comm.p2p import finish, global_rank, irecv, isend, wait, work_copy


def _recv_error(step: str, src: int, group) -> str:
    return f"naive all-reduce: {step}: nothing from rank {global_rank(group, src)}"


def _send_error(step: str, dst: int, group) -> str:
    return f"naive all-reduce: {step}: rank {global_rank(group, dst)} did not take our data"


def all_reduce(tensor, group=None, timeout_s=None, wire=None, **_options):
    n, r = dist.get_world_size(group), dist.get_rank(group)
    if n == 1 or tensor.numel() == 0:
        return tensor
    flat = work_copy(tensor)
    if wire is None:
        buf = torch.empty_like(flat) if r == 0 else flat  # workers receive the sum straight into place
        encode, add_into, copy_into = (lambda: flat), (lambda p: flat.add_(p)), (lambda p: None)
    else:
        buf = torch.empty(wire.nbytes(flat.numel()), dtype=torch.uint8, device=flat.device)
        encode = lambda: wire.encode_into(flat, torch.empty_like(buf))  # noqa: E731
        add_into, copy_into = (lambda p: wire.add_into(p, flat)), (lambda p: wire.copy_into(p, flat))
    if r == 0:
        for src in range(1, n):
            what = _recv_error(f"step 1/2 (gather, {src}/{n - 1})", src, group)
            wait(irecv(buf, group, src, what), timeout_s, what)
            add_into(buf)
        payload = encode()
        copy_into(payload)  # keep what the workers will decode
        whats = {dst: _send_error(f"step 2/2 (send back, {dst}/{n - 1})", dst, group) for dst in range(1, n)}
        sends = [(dst, isend(payload, group, dst, whats[dst])) for dst in range(1, n)]
        for dst, w in sends:
            wait(w, timeout_s, whats[dst])
    else:
        what = _send_error("step 1/2 (gather)", 0, group)
        wait(isend(encode(), group, 0, what), timeout_s, what)
        what = _recv_error("step 2/2 (send back)", 0, group)
        wait(irecv(buf, group, 0, what), timeout_s, what)
        copy_into(buf)
    return finish(tensor, flat)


def all_gather(payload, buf, stride: int, group=None, timeout_s=None) -> list:
    """Every rank's `payload` in rank order, through rank 0 (a parameter server that forwards): `buf` holds n
    slots of `stride` bytes; returns the slots."""
    n, r = dist.get_world_size(group), dist.get_rank(group)
    slots = [buf[q * stride:(q + 1) * stride] for q in range(n)]
    slots[r][:payload.numel()] = payload
    if r == 0:
        for src in range(1, n):
            what = _recv_error(f"all-gather step 1/2 ({src}/{n - 1})", src, group)
            wait(irecv(slots[src], group, src, what), timeout_s, what)
        whats = {dst: _send_error(f"all-gather step 2/2 ({dst}/{n - 1})", dst, group) for dst in range(1, n)}
        sends = [(dst, isend(buf, group, dst, whats[dst])) for dst in range(1, n)]
        for dst, w in sends:
            wait(w, timeout_s, whats[dst])
    else:
        what = _send_error("all-gather step 1/2", 0, group)
        wait(isend(slots[r], group, 0, what), timeout_s, what)
        what = _recv_error("all-gather step 2/2", 0, group)
        wait(irecv(buf, group, 0, what), timeout_s, what)
    return slots


def wire_bytes(nbytes: int, world_size: int, wire_ratio: float = 1.0, **_options) -> int:
    return int((world_size - 1) * nbytes * wire_ratio)  # rank 0's share: the busiest link
