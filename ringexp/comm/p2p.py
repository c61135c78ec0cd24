"""What every hand-written algorithm shares: a work copy to sum in, the ring of ranks it runs over, and
point-to-point ops whose posting and waits fail with a message naming the algorithm, the step and the peer (a
wait after a timeout), so a dead peer is an error, not a hang."""

from datetime import timedelta

import torch
import torch.distributed as dist

DEFAULT_TIMEOUT_S = 300.0


def sum_dtype(dtype):
    """What `dtype` is summed in: float32 for low precision (rounded once at the end), int64 for every integer
    type (exact; cast back, a narrow type wraps around as torch's own sum does), else itself."""
    if dtype == torch.float64 or dtype == torch.int64:
        return dtype
    return torch.float32 if dtype.is_floating_point else torch.int64


def work_copy(tensor):
    """A contiguous 1-D tensor in sum_dtype to reduce in: `tensor` itself where it already is one, else a copy
    (strided views, low precision, narrow integers). Detached: the sum is data, not part of autograd's graph,
    so a leaf that requires grad is reduced as torch.distributed.all_reduce reduces it."""
    t = tensor.detach()
    if t.is_complex() or t.dtype == torch.bool:  # ringexp.comm.all_reduce refuses or reshapes these first
        raise TypeError(f"no sum for {t.dtype} here: call ringexp.comm.all_reduce")
    if t.is_contiguous() and t.dtype == sum_dtype(t.dtype):
        return t.view(-1)
    return t.to(sum_dtype(t.dtype)).contiguous().view(-1)  # .to keeps a view's strides; contiguous copies


def finish(tensor, flat):
    """Write the sum back into `tensor` where `flat` was a copy."""
    t = tensor.detach()
    if flat.data_ptr() != t.data_ptr() or flat.dtype != t.dtype:
        t.copy_(flat.view(t.shape))
    return tensor


def members_of(group, members=None) -> tuple:
    """(the ring's ranks in `group`, in ring order; this rank's position in it). `members` picks a sub-ring of
    `group` (hierarchical's node rings): its messages travel on `group` itself, so a sub-ring needs no process
    group of its own, and nothing has to be created collectively."""
    members = list(range(dist.get_world_size(group))) if members is None else list(members)
    return members, members.index(dist.get_rank(group))


def global_ranks(group) -> list:
    return dist.get_process_group_ranks(group) if group is not None else list(range(dist.get_world_size()))


def global_rank(group, group_rank: int) -> int:
    return group_rank if group is None else dist.get_global_rank(group, group_rank)


def isend(tensor, group, dst: int, what):
    """dist.isend to group rank `dst`; posting to a peer already gone raises at once, in `what`'s words too."""
    try:
        return dist.isend(tensor, group=group, group_dst=dst)
    except Exception as e:
        raise RuntimeError(f"{said(what)}: {type(e).__name__}: {one_line(e)}") from e


def irecv(tensor, group, src: int, what):
    try:
        return dist.irecv(tensor, group=group, group_src=src)
    except Exception as e:
        raise RuntimeError(f"{said(what)}: {type(e).__name__}: {one_line(e)}") from e


def said(what) -> str:
    """`what` is the message, or a function that makes it (only when something failed: hot loops post many ops)."""
    return what() if callable(what) else what


def one_line(e) -> str:
    return str(e).splitlines()[0] if str(e) else repr(e)


def exchange(send, recv, group, what) -> tuple:
    """`send` (tensor, group rank) and `recv` (tensor, group rank), either None, posted as one batch; returns
    (works to wait for the send, works to wait for the receive), each to be waited for once (gloo's wait counts
    completions: a second wait waits for a second message). NCCL runs a rank's point-to-point operations one
    after another on one stream, in the order posted: a receive posted alone waits for a peer whose send sits
    behind that peer's own receive, and a ring of such ranks never moves. Posted together, they run at once."""
    sent, received = batch([send] if send else [], [recv] if recv else [], group, what)
    return sent, received


def batch(sends: list, recvs: list, group, what) -> tuple:
    """Every (tensor, group rank) of `sends` and `recvs` posted as one batch (see exchange); returns (works for the
    sends, works for the receives): on gloo one per operation, in order; on NCCL one for the whole batch, waited
    for with the receives (or with the sends where there are none)."""
    # receives first: gloo moves a message to a peer and one from it in turn when the send is posted first (4 MB
    # each way between two ranks over a 100 Mbit/s link: 670 ms sends first, 377 ms receives first, 351 ms one
    # way; docs/results/compression-scaling.md); NCCL runs a batch as one group, in any order
    ops = [dist.P2POp(dist.irecv, t, group=group, group_peer=peer) for t, peer in recvs] + \
        [dist.P2POp(dist.isend, t, group=group, group_peer=peer) for t, peer in sends]
    try:
        works = dist.batch_isend_irecv(ops) if ops else []
    except Exception as e:
        raise RuntimeError(f"{said(what)}: {type(e).__name__}: {one_line(e)}") from e
    if len(works) == len(ops):  # one work per operation (gloo)
        return works[len(recvs):], works[:len(recvs)]
    return ([], works) if recvs else (works, [])


def wait(work, timeout_s, what, cuda: bool = False) -> None:
    """Wait for `work`; a timeout or a closed peer becomes an error in `what`'s words. `cuda`: its tensors are on
    a GPU, where NCCL's wait with a timeout would block the host until the device is done; without one the
    current stream waits, the host goes on, and a dead peer is left to the process group's own timeout (set
    from the same parallel.timeout_s)."""
    try:
        work.wait() if cuda else work.wait(timedelta(seconds=timeout_s or DEFAULT_TIMEOUT_S))
    except Exception as e:  # gloo raises RuntimeError/DistBackendError on a timeout or a closed peer
        raise RuntimeError(f"{said(what)}: {type(e).__name__}: {one_line(e)}") from e
