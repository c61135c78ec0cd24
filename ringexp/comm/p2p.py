"""What every hand-written algorithm shares: a float work copy, and point-to-point ops whose posting and waits
fail with a message naming the algorithm, the step and the peer (a wait after a timeout), so a dead peer is an
error, not a hang."""

from datetime import timedelta

import torch
import torch.distributed as dist

DEFAULT_TIMEOUT_S = 300.0


def work_copy(tensor):
    """A contiguous float32/float64 view of `tensor` to reduce in; low precision is summed in float32."""
    if tensor.is_contiguous() and tensor.dtype in (torch.float32, torch.float64):
        return tensor.view(-1)
    return tensor.detach().reshape(-1).to(torch.float64 if tensor.dtype == torch.float64 else torch.float32)


def finish(tensor, flat):
    if flat.data_ptr() != tensor.data_ptr() or flat.dtype != tensor.dtype:
        tensor.copy_(flat.view(tensor.shape))
    return tensor


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


def wait(work, timeout_s, what) -> None:
    try:
        work.wait(timedelta(seconds=timeout_s or DEFAULT_TIMEOUT_S))
    except Exception as e:  # gloo raises RuntimeError/DistBackendError on a timeout or a closed peer
        raise RuntimeError(f"{said(what)}: {type(e).__name__}: {one_line(e)}") from e
