"""PowerSGD (Vogels et al. 2019), rank r: PyTorch's own DDP hook, not a rewrite. Its P and Q factors are
all-reduced with the builtin collective, so it composes with strategy ddp only (validated before launch).
Before `start_step` (>= 2, as torch requires for error feedback to warm up) it all-reduces uncompressed."""

import dataclasses

import numpy as np
import torch
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

from ringexp import comm
from ringexp.cluster import costmodel
from ringexp.timing import median_time

WIRE = False


def sum_dtype(c):
    return None


def first_step(c) -> int:
    """The first step PowerSGD compresses (torch's start_powerSGD_iter: it needs >= 2)."""
    return max(2, c.start_step)


def hook(c, error_feedback: bool):
    """(state, hook) for DDP's register_comm_hook: PyTorch's own PowerSGD."""
    state = powerSGD_hook.PowerSGDState(
        process_group=None, matrix_approximation_rank=c.rank, start_powerSGD_iter=first_step(c),
        use_error_feedback=error_feedback, warm_start=True)
    return state, in_order(powerSGD_hook.powerSGD_hook)


def in_order(hook):
    """`hook`, each bucket started once the previous bucket's future is done. torch's PowerSGD hook chains a
    bucket's three all-reduces (uncompressed tensors, P, Q) with Future.then; on gloo those callbacks run on the
    thread that finished the previous all-reduce, so one rank may post bucket 1's first all-reduce before bucket
    0's P while another posts them the other way round: a collective mismatch (seen on the local cluster with
    ResNet-18's two buckets, "Received data size doesn't match expected size", and a crash). With NCCL the
    callbacks run as the work is enqueued, in order: there torch's hook runs as it is. (Chaining there would be
    wrong twice over: a CUDA future's callbacks run on a pool stream that has not waited for the next bucket's
    gradients, and a plain future's result would reach DDP without the device having finished.)"""
    last = [None]

    def ordered(state, bucket):
        if bucket.buffer().is_cuda:
            return hook(state, bucket)
        out = torch.futures.Future()

        def start(_=None):
            try:
                hook(state, bucket).add_done_callback(lambda f: relay(f, out))
            except Exception as e:  # reported through the future DDP waits on, as the hook's own errors are
                out.set_exception(e)

        prev, last[0] = last[0], out
        if prev is None:
            start()
        else:
            prev.add_done_callback(start)  # at once if prev is done already
        return out
    return ordered


def relay(fut, out) -> None:
    try:
        out.set_result(fut.value())
    except Exception as e:
        out.set_exception(e)


def compressed(shape, c) -> bool:
    """torch's rule: a matrix (n x m, m = the rest of the dims) goes as P (n x r) and Q (m x r) when that is at
    least 2x smaller; vectors and the rest go as they are."""
    if len(shape) <= 1:
        return False
    n, m = shape[0], shape.numel() // shape[0]
    r = min(c.rank, n, m)
    return (n + m) * r * 2 < n * m


def arithmetic_s(shapes, c, iters: int = 3) -> float:
    """Seconds of the hook's own arithmetic in one step over parameters of `shapes`, on this machine (for
    ringexp.plan's cost model). Mirrors powerSGD_hook: the error-feedback add, then per compressed matrix
    orthogonalise Q, P = MQ, orthogonalise P, Q = M^T P, M = P Q^T (torch's own _orthogonalize), and the new
    error. Per-matrix overheads dominate on CPU: one big matrix's cost per byte is several times too low."""
    mats = []
    for shape in shapes:
        if compressed(shape, c):
            n, m = shape[0], shape.numel() // shape[0]
            r = min(c.rank, n, m)
            mats.append((torch.randn(1, n, m), torch.randn(1, m, r), torch.empty(1, n, r)))
    flat = torch.randn(sum(s.numel() for s in shapes))
    error = torch.zeros_like(flat)

    def step():
        flat.add_(error)
        for mat, q, p in mats:
            powerSGD_hook._orthogonalize(q)
            torch.bmm(mat, q, out=p)
            powerSGD_hook._orthogonalize(p)
            torch.bmm(mat.transpose(1, 2), p, out=q)
            torch.bmm(p, q.transpose(1, 2), out=mat)
        torch.sub(flat, error, out=error)

    return median_time(step, iters)


def wire_numel(shapes, c) -> int:
    """Elements all-reduced per step once compression has started, by torch's rule: a matrix (n x m, m = the
    rest of the dims) is sent as P (n x r) and Q (m x r) when that is at least 2x smaller, else as it is;
    vectors (biases, norms) are sent uncompressed."""
    total = 0
    for shape in shapes:
        n, m = (shape[0], shape.numel() // shape[0]) if len(shape) > 1 else (1, shape.numel())
        total += (n + m) * min(c.rank, n, m) if compressed(shape, c) else shape.numel()
    return total


def seconds(cl, c, shapes) -> float:
    """Predicted time of one bucket of `shapes` on cluster `cl` [Vogels et al. 2019]: PyTorch's hook all-reduces
    (builtin) the uncompressed vectors, then P and Q (three all-reduces; the model counts their bytes in one and
    the latency of all three), plus its own arithmetic: the cluster's cost per float32 byte, and on a GPU cluster
    that measured none its cost per compressed tensor (costmodel.codec, per_tensor_s)."""
    arithmetic = 4 * sum(s.numel() for s in shapes) * costmodel.codec(cl, c.name)[0] + \
        sum(compressed(s, c) for s in shapes) * costmodel.per_tensor_s(cl, c.name)
    return 2 * comm.seconds("builtin", cl, 0) + comm.seconds("builtin", cl, 4 * wire_numel(shapes, c)) + arithmetic


def measured(cl, c, shapes):
    """Cluster `cl` with PowerSGD's cost per byte measured here for these shapes (arithmetic_s, times the cluster's
    compute slowdown) instead of its file's one large-matrix figure: for a cluster of this machine's kind."""
    per_byte = arithmetic_s(shapes, c) * cl.compute_slowdown / (4 * sum(s.numel() for s in shapes))
    return dataclasses.replace(cl, encode_s_per_byte={**cl.encode_s_per_byte, c.name: per_byte})


def state_dict(state) -> dict:
    """What a resumed run needs of PyTorch's PowerSGDState (its own __getstate__ pickles a numpy generator,
    which torch.load(weights_only=True) refuses): the iteration, error feedback and warm-start factors."""
    rng = state.rng.get_state()
    return {"iter": state.iter, "error_dict": dict(state.error_dict), "p_memory_dict": dict(state.p_memory_dict),
            "q_memory_dict": dict(state.q_memory_dict), "rng_keys": rng[1].tolist(), "rng_pos": rng[2]}


def load_state_dict(state, d: dict) -> None:
    state.iter = d["iter"]
    state.error_dict, state.p_memory_dict, state.q_memory_dict = d["error_dict"], d["p_memory_dict"], d["q_memory_dict"]
    state.rng.set_state(("MT19937", np.array(d["rng_keys"], dtype=np.uint32), d["rng_pos"]))
