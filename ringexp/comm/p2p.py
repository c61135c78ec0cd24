"""What every hand-written algorithm shares: a float work copy, and waits that time out with a message
naming the algorithm, the step and the peer, so a dead peer is an error, not a hang."""

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


def wait(work, timeout_s, what: str) -> None:
    try:
        work.wait(timedelta(seconds=timeout_s or DEFAULT_TIMEOUT_S))
    except Exception as e:  # gloo raises RuntimeError/DistBackendError on a timeout or a closed peer
        raise RuntimeError(f"{what}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else e}") from e
