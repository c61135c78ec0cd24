"""torch.distributed.all_reduce: the reference every hand-written algorithm is checked and timed against."""

import torch.distributed as dist

from ringexp.cluster import costmodel, nccl
from ringexp.comm import ring

OPTIONS = ()  # all_reduce's options (ringexp.comm refuses others)


def all_reduce(tensor, group=None, **_options):
    if dist.get_world_size(group) > 1 and tensor.numel():
        t = tensor.detach()
        flat = t if t.is_contiguous() else t.contiguous()  # gloo sums a strided view's storage, not the view
        dist.all_reduce(flat, group=group)
        if flat is not t:
            t.copy_(flat)
    return tensor


def wire_bytes(nbytes: int, world_size: int, **_options) -> int:
    # gloo's and NCCL's large-message algorithm is a ring: 2(n-1)/n of the buffer from every rank.
    return 2 * (world_size - 1) * nbytes // world_size if world_size > 1 else 0


def seconds(cl, nbytes: float, wire=costmodel.NONE, **_options) -> float:
    """gloo's all-reduce, as the cost model has it: a ring over every rank, as ringexp's is; NCCL's: the algorithm
    and protocol NCCL would pick (ringexp.cluster.nccl). (A compressor on builtin shrinks the payload it is given
    before it gets here: ringexp.compress.seconds; no wire format reaches it.)"""
    if cl.backend == "nccl":
        return nccl.seconds(cl, "allreduce", nbytes)
    return ring.seconds(cl, nbytes, wire)
