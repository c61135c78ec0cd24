"""ringexp's collectives as a DDP communication hook, for ringexp's trainer and for anyone's own DDP code.

    state, hook = ringexp.ddp_comm_hook("ring", compression="fp16")
    model.register_comm_hook(state, hook)      # model: a torch.nn.parallel.DistributedDataParallel
    ...
    state.close()                              # after training: the hook's thread and process group

DDP calls the hook from the autograd engine as soon as a bucket's gradients are ready and expects a
future. gloo's futures do not cover send/recv, and running the ring inline would block backward until
the bucket is reduced. So the hook hands the bucket to one worker thread per rank and returns a future
that the thread completes: backward computes the next bucket while this one travels. On the default group the
thread runs collectives on a process group of its own (separate from the one the training loop uses for its
metrics), and a single thread keeps buckets in the same order on every rank, as collectives require.

The state needs no process group to be built (Lightning builds it before it creates one): its group and thread
are made by `start()`, which the first bucket calls if nobody did before, on every rank in the same order.
"""

from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import torch
import torch.distributed as dist

from ringexp import comm, compress
from ringexp import dist as rdist
from ringexp.comm.p2p import DEFAULT_TIMEOUT_S
from ringexp.config import CompressionConfig

COMPRESSIONS = tuple(n for n in compress.COMPRESSORS if n not in ("none", "powersgd"))  # what the hook takes


class CommState:
    """What the hook carries: the algorithm and its options, a compressor (a ringexp.compress.State, holding
    error feedback) or None, and once started, its process group and worker thread."""

    def __init__(self, algorithm: str = "ring", options: dict | None = None, compressor=None, group=None):
        self.algorithm, self.options, self.compressor = algorithm, dict(options or {}), compressor
        self.parent = group  # the group DDP runs on; None: the whole job
        self.group = self.executor = None
        self.world = 0
        self.pending = []  # (the thread's future, DDP's future) of buckets handed over and not yet done
        self.failed = None  # the first bucket's error: the group is spent, later buckets fail at once
        self.buckets = 0  # buckets the hook was called for: is DDP calling it at all? (Lightning on CPU does not)
        self.streams = {}  # CUDA: the worker thread's side stream per device (ringexp.dist.on_device)

    def start(self) -> None:
        """Create the hook's process group and thread (collective over the parent group's ranks; idempotent).
        On the default group, a group of its own keeps the thread's messages apart from the training loop's
        collectives; on a group the user gave, the hook uses that one (creating a subgroup would need every
        rank of the job to take part)."""
        if self.executor is not None:
            return
        # (the collectives' own timeout: on NCCL a dead peer is caught by the group's, not by a wait's)
        timeout = timedelta(seconds=self.options.get("timeout_s") or DEFAULT_TIMEOUT_S)
        self.group = dist.new_group(backend=dist.get_backend(), timeout=timeout) if self.parent is None else \
            self.parent
        self.world = dist.get_world_size(self.group)
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"ringexp-{self.algorithm}")
        self.failed = None

    def close(self) -> None:
        """End the worker thread (buckets still queued fail) and destroy the group `start` created, unless a
        collective failed or still runs in it (the process is about to end); idempotent. The state can be
        started again afterwards."""
        if self.executor is not None:
            self.executor.shutdown(wait=False, cancel_futures=True)
        for job, fut in self.pending:
            if job.cancelled():
                fut.set_exception(RuntimeError("not reduced: the communication hook was closed"))
        quiet = self.failed is None and all(job.done() for job, _ in self.pending)
        if quiet and self.group is not None and self.parent is None and dist.is_initialized():
            dist.destroy_process_group(self.group)
        self.group = self.executor = None
        self.pending = []

    def state_dict(self) -> dict:
        """What a resumed run needs to continue bit-for-bit: the compressor's residuals, momentum and step counts
        (tensors and numbers only: loads with torch.load(weights_only=True))."""
        return {} if self.compressor is None else {"compressor": self.compressor.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if (self.compressor is None) != (state.get("compressor") is None):
            raise ValueError("this hook state " + ("has no compressor" if self.compressor is None else "compresses")
                             + ", the saved one " + ("did not" if self.compressor is not None else "did"))
        if self.compressor is not None:
            self.compressor.load_state_dict(state["compressor"])


def comm_hook(state: CommState, bucket) -> torch.futures.Future[torch.Tensor]:
    state.start()
    state.buckets += 1
    tensor, index = bucket.buffer(), bucket.index()
    fut, ready = rdist.future(tensor.device), rdist.handover(tensor.device)  # (CUDA: the bucket is written then)
    layout = [p.numel() for p in bucket.parameters()] if state.compressor is not None else None
    group, world = state.group, state.world  # as they are now, when DDP hands the bucket over

    def run():
        if state.failed is not None:  # its messages would meet the failed bucket's: fail at once instead
            fut.set_exception(RuntimeError(f"not reduced: an earlier bucket failed: {state.failed}"))
            return
        try:
            with rdist.on_device(tensor.device, ready, state.streams):
                reduce_bucket(state, tensor, index, group, world, layout)
                fut.set_result(tensor)  # (CUDA: marks the side stream; DDP's reducer waits for it on the device)
        except BaseException as e:  # the error reaches backward() through the future
            state.failed = f"{type(e).__name__}: {e}"
            fut.set_exception(e)

    state.pending = [(job, f) for job, f in state.pending if not job.done()]
    state.pending.append((state.executor.submit(run), fut))
    return fut


def reduce_bucket(state: CommState, tensor, index: int, group, world: int, layout) -> None:
    """Average `tensor` over the group's ranks with the state's algorithm and compressor, in place."""
    if state.compressor is None and state.algorithm == "ring":  # it divides the chunk it finishes
        comm.all_reduce(tensor, "ring", group, check=False, divisor=world, **state.options)
    elif state.compressor is None:
        tensor.div_(world)  # average, as DDP's own hook does (divide first: no overflow)
        comm.all_reduce(tensor, state.algorithm, group, check=False, **state.options)
    else:
        tensor.div_(world)
        compress.all_reduce(tensor, state.algorithm, state.compressor, index, group, layout, **state.options)


def ddp_comm_hook(algorithm: str = "ring", compression=None, group=None, **options) -> tuple:
    """(state, hook) for `model.register_comm_hook(state, hook)`: DDP's gradients reduced by ringexp's `algorithm`
    (ring, hierarchical, naive or builtin) with its options (segment_bytes, timeout_s; hierarchical: nodes, variant,
    scope), optionally through a compressor: a name (fp16, bf16, int8, topk, randomk, sign) or a dict of
    ringexp.config.CompressionConfig's fields, e.g. {"name": "topk", "ratio": 0.01}, plus "momentum" (your SGD
    momentum) for momentum_correction. `group`: the process group DDP runs on, if not the default.
    Raises ValueError or TypeError, at once, for anything it cannot do."""
    impl = comm.ALGORITHMS.get(algorithm)
    if impl is None:
        raise ValueError(f"unknown algorithm {algorithm!r}; choose from {', '.join(comm.ALGORITHMS)}")
    internal = ("wire", "divisor", "paired", "phases")  # the compressor's, the hook's own mean, the device's schedule
    unknown = sorted(o for o in options if o not in impl.OPTIONS or o in internal)
    if unknown:
        takes = ", ".join(o for o in impl.OPTIONS if o not in internal) or "none"
        raise TypeError(f"{algorithm}: no option {unknown[0]!r} (it takes {takes}; a wire format comes from "
                        "compression=, and the hook averages by itself)")
    state = compressor(compression, algorithm)
    if state is not None and state.c.scope != "all":
        options.setdefault("scope", str(state.c.scope))
    bad = comm.bad_option(options, None)
    if bad:
        raise ValueError(f"{algorithm}: {bad}")
    return CommState(algorithm, options, state, group), comm_hook


def all_reduce(tensor, algorithm: str = "ring", group=None, *, compression=None, check: bool = True, **options):
    """ringexp.all_reduce: ringexp.comm.all_reduce (`check`: every rank's input compared first), or, with
    `compression`, through that compressor as a DDP bucket would go (sign, topk and int8 on builtin: the two
    phases from 3 ranks up): a name, a dict of CompressionConfig fields, or a ringexp.compress.State made by
    `ringexp.parallel.hooks.compressor(compression, algorithm)` and passed again on every call, to keep its error
    feedback (one State per tensor you reduce).
    A floating-point tensor; summed in float32 and written back."""
    state = compression if isinstance(compression, compress.State) else \
        None if compression is None else compressor(compression, algorithm)
    if state is None:
        return comm.all_reduce(tensor, algorithm, group, check=check, **options)
    if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point():
        got = getattr(tensor, "dtype", type(tensor).__name__)
        raise TypeError(f"a compressed all-reduce takes a floating-point tensor (got {got})")
    t = tensor.detach()
    flat = t.to(torch.float32).contiguous().view(-1)
    compress.all_reduce(flat, algorithm, state, 0, group, **options)
    if flat.data_ptr() != t.data_ptr():
        t.copy_(flat.view(t.shape))
    return tensor


def compressor(compression, algorithm: str):
    """A ringexp.compress.State from a name, a dict of CompressionConfig fields (+ momentum) or a CompressionConfig;
    None for no compression."""
    if compression is None or isinstance(compression, str):
        fields = {"name": compression or "none"}
    else:
        fields = dict(vars(compression) if isinstance(compression, CompressionConfig) else compression)
    momentum = float(fields.pop("momentum", 0.0))
    c = CompressionConfig(**fields)
    if c.name not in compress.COMPRESSORS or c.name == "powersgd":
        names = ", ".join(COMPRESSIONS)
        raise ValueError("powersgd is PyTorch's own hook: register torch.distributed.algorithms.ddp_comm_hooks."
                         "powerSGD_hook.powerSGD_hook with its PowerSGDState instead" if c.name == "powersgd"
                         else f"unknown compression {c.name!r}; choose from {names}")
    if momentum and not c.momentum_correction:
        raise ValueError("momentum is for momentum_correction=True only (drop it, or turn that on)")
    problem = compress.refusal(c, algorithm, f"algorithm {algorithm}")
    if problem or (c.momentum_correction and not momentum):
        raise ValueError(problem or "momentum_correction applies your SGD momentum before compressing: pass "
                         "compression={..., 'momentum': <it>} and run SGD without momentum")
    return None if c.name == "none" else compress.State(c, momentum=momentum)
