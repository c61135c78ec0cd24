"""A DDP communication hook that runs a ringexp collective without stalling backward.

DDP calls the hook from the autograd engine as soon as a bucket's gradients are ready and expects a
future. gloo's futures do not cover send/recv, and running the ring inline would block backward until
the bucket is reduced. So the hook hands the bucket to one worker thread per rank and returns a future
that the thread completes: backward computes the next bucket while this one travels. The thread runs
collectives on a process group of its own (separate from the one the training loop uses for its
metrics), and a single thread keeps buckets in the same order on every rank, as collectives require.
"""

from concurrent.futures import ThreadPoolExecutor

import torch
import torch.distributed as dist

from ringexp import comm, compress


class CommState:
    def __init__(self, algorithm: str, group, options: dict, compressor=None):
        self.algorithm, self.group, self.options = algorithm, group, options
        self.compressor = compressor  # a ringexp.compress.State (error feedback lives there), or None
        self.world = dist.get_world_size(group)
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"ringexp-{algorithm}")

    def close(self) -> None:
        """Let the worker thread end (training has ended; after a failure, nothing queued still runs)."""
        self.executor.shutdown(wait=False, cancel_futures=True)


def comm_hook(state: CommState, bucket) -> torch.futures.Future[torch.Tensor]:
    fut = torch.futures.Future()
    tensor = bucket.buffer()
    index = bucket.index()
    layout = [p.numel() for p in bucket.parameters()] if state.compressor is not None else None

    def run():
        try:
            tensor.div_(state.world)  # average, as DDP's own hook does (divide first: no overflow)
            if state.compressor is None:
                comm.all_reduce(tensor, state.algorithm, group=state.group, **state.options)
            else:
                compress.all_reduce(tensor, state.algorithm, state.compressor, index, state.group, layout,
                                    **state.options)
            fut.set_result(tensor)
        except BaseException as e:  # the error reaches backward() through the future
            fut.set_exception(e)

    state.executor.submit(run)
    return fut


def make_state(algorithm: str, options: dict, compressor=None) -> CommState:
    # A group of its own: the hook thread's point-to-point traffic never interleaves with the main
    # thread's collectives (created on the main thread, collectively, before training starts).
    group = dist.new_group(backend=dist.get_backend())
    if algorithm == "hierarchical":
        nodes = options.get("nodes") or comm.hierarchical.default_nodes(dist.get_world_size(group))
        comm.hierarchical.node_groups(group, nodes)
    return CommState(algorithm, group, options, compressor)
