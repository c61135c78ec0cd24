"""The parameter-server baseline from seed article 000: everyone sends its whole buffer to rank 0, which
sums and sends the result back to each rank. Rank 0 moves 2(n-1) buffers while the others move 2: its
link is the bottleneck, and it grows with n, which is the point of showing it next to the ring."""

import torch
import torch.distributed as dist

from ringexp.comm.p2p import finish, global_rank, wait, work_copy


def all_reduce(tensor, group=None, timeout_s=None, **_options):
    n, r = dist.get_world_size(group), dist.get_rank(group)
    if n == 1 or tensor.numel() == 0:
        return tensor
    flat = work_copy(tensor)
    if r == 0:
        buf = torch.empty_like(flat)
        for src in range(1, n):
            wait(dist.irecv(buf, group=group, group_src=src), timeout_s,
                 f"naive all-reduce: step 1/2 (gather, {src}/{n - 1}): nothing from rank {global_rank(group, src)}")
            flat.add_(buf)
        sends = [(dst, dist.isend(flat, group=group, group_dst=dst)) for dst in range(1, n)]
        for dst, w in sends:
            wait(w, timeout_s, f"naive all-reduce: step 2/2 (send back, {dst}/{n - 1}): rank {global_rank(group, dst)} "
                               "did not take the result")
    else:
        wait(dist.isend(flat, group=group, group_dst=0), timeout_s,
             "naive all-reduce: step 1/2 (gather): rank 0 did not take our buffer")
        wait(dist.irecv(flat, group=group, group_src=0), timeout_s,
             "naive all-reduce: step 2/2 (send back): nothing from rank 0")
    return finish(tensor, flat)


def wire_bytes(nbytes: int, world_size: int, **_options) -> int:
    return (world_size - 1) * nbytes  # rank 0's share: the busiest link
