"""What this host's work costs, for `calibrate` (every rank at once, the slowest rank's time, ringexp.dist.slowest):
an add and every codec per byte, how much slower a rank computes in training than alone, and the host's share of
a collective call and of one more DDP bucket."""

import statistics
import threading

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from ringexp import comm, compress
from ringexp import dist as rdist
from ringexp.cluster.schema import ClusterConfig, LinkConfig
from ringexp.config import CompressionConfig, ModelConfig
from ringexp.models import build_model
from ringexp.plan.config import PlanConfig
from ringexp.timing import median_time, times_of

CODECS = ("fp16", "bf16", "int8", "topk", "randomk", "sign", "powersgd")


def compute_costs(cfg: PlanConfig, env, sync) -> dict:
    """Per float32 byte, every rank at once (the slowest rank's): an add, each codec's encode and decode
    (PowerSGD: P = MQ, orthogonalise, Q = M^T P, M ~ P Q^T at rank 8, as one encode); and the compute slowdown."""
    x, y = torch.randn(1 << 22, device=env.device), torch.randn(1 << 22, device=env.device)
    nbytes = 4 * x.numel()
    dist.barrier()
    out = {"add_s_per_byte": rdist.slowest(median_time(lambda: y.add_(x), cfg.iters, sync), env.device) / nbytes,
           "encode_s_per_byte": {}, "decode_s_per_byte": {}}
    for name in CODECS[:-1]:
        dist.barrier()
        enc, dec, _ = compress.codec_seconds(CompressionConfig(name=name, error_feedback=False), x, cfg.iters, sync)
        out["encode_s_per_byte"][name] = rdist.slowest(enc, env.device) / nbytes
        out["decode_s_per_byte"][name] = rdist.slowest(dec, env.device) / nbytes
    m, q = torch.randn(1024, 1024, device=env.device), torch.randn(1024, 8, device=env.device)

    def powersgd():
        p = torch.linalg.qr(m @ q).Q
        return p @ (m.T @ p).T

    dist.barrier()
    psgd = rdist.slowest(median_time(powersgd, cfg.iters, sync), env.device)
    out["encode_s_per_byte"]["powersgd"] = psgd / (4 * m.numel())
    out["decode_s_per_byte"]["powersgd"] = 0.0
    return out | compute_slowdown(env, cfg.iters, sync)


def compute_slowdown(env, iters: int, sync) -> dict:
    """{compute_slowdown, jitter_s}. How much slower a rank computes in training than alone: ResNet-18's forward
    and backward (batch 8, 64 x 64) on rank 0 alone, against every rank at once while each also exchanges 4 MB
    messages with its ring neighbours, as DDP's all-reduces run during backward. On shared CPU cores the network
    stack takes its share: 2.9 on the 2 x 2 local cluster, against 2.4 without the exchanges and 2.0 for a matmul
    loop (story runs: 3.4). And how much a rank's compute varies, every rank at once (`jitter`)."""
    model = build_model(ModelConfig(name="resnet18"), 8).to(env.device)
    x, y = torch.randn(8, 3, 64, 64, device=env.device), torch.rand(8, 8, device=env.device)

    def work():
        F.binary_cross_entropy_with_logits(model(x), y).backward()

    work()
    dist.barrier()
    alone = median_time(work, iters, sync) if env.rank == 0 else 0.0
    dist.barrier()
    busy = exchanging(env, lambda: median_time(work, iters, sync))
    return {"compute_slowdown": rdist.slowest(busy, env.device) / rdist.slowest(alone, env.device),
            "jitter_s": jitter(env, work, max(iters, 20), sync)}


def jitter(env, work, iters: int, sync) -> float:
    """costmodel.straggle's jitter_s: the variance of one rank's step over its mean, every rank computing at once
    (a sum of scheduling delays: its variance grows with the time it spans), the ranks' mean."""
    dist.barrier()
    times = times_of(work, iters, sync)
    got = torch.tensor([statistics.pvariance(times) / statistics.mean(times)], device=env.device)
    dist.all_reduce(got)
    return got.item() / env.world_size


def exchanging(env, fn):
    """fn() while a thread on every rank exchanges 4 MB with its ring neighbours on a group of its own; the ranks
    agree each round (a 1-element all-reduce) whether to go on, so that all stop after the same round."""
    side, n = dist.new_group(), env.world_size
    stop = threading.Event()
    send, recv, flag = (torch.randn(1 << 20, device=env.device), torch.empty(1 << 20, device=env.device),
                        torch.zeros(1, device=env.device))

    def loop():
        while True:
            flag.fill_(float(stop.is_set()))
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=side)
            if flag.item():
                return
            for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, send, (env.rank + 1) % n, side),
                                             dist.P2POp(dist.irecv, recv, (env.rank - 1) % n, side)]):
                w.wait()

    thread = threading.Thread(target=loop, name="ringexp-calibrate-exchange", daemon=True)
    thread.start()
    try:
        return fn()
    finally:
        stop.set()
        thread.join()
        dist.destroy_process_group(side)


def call_costs(cfg: PlanConfig, env, sync, m: dict) -> dict:
    """{call_s, bucket_s}: what one builtin all-reduce of a single float takes beyond the model's time for it
    (launch and dispatch), and what one more DDP bucket costs the training thread with communication taken out
    (a hook that returns its bucket at once): 64 layers of 64K parameters in 64 buckets against one bucket."""
    one = torch.zeros(1, device=env.device)
    dist.barrier()
    took = rdist.slowest(median_time(lambda: dist.all_reduce(one), 4 * cfg.iters, sync), env.device)
    cl = ClusterConfig(nodes=m["nodes"], ranks_per_node=m["ranks_per_node"], backend=m["backend"],
                       **{lv: LinkConfig(m[lv]["alpha_s"], m[lv]["beta_s_per_byte"]) for lv in ("intra", "inter")
                          if lv in m})
    per_bucket = [rdist.slowest(reducer_time(env, cap, cfg.iters, sync), env.device) for cap in (0.25, 64)]
    return {"call_s": max(0.0, took - comm.seconds("builtin", cl, 4)),
            "bucket_s": max(0.0, (per_bucket[0] - per_bucket[1]) / 63)}


def reducer_time(env, cap_mb: float, iters: int, sync) -> float:
    """Median forward and backward of a 64-layer linear stack in DDP with `cap_mb` buckets and a hook that sends
    nothing: the reducer's own work (hooks, bucket copies, futures)."""
    model = torch.nn.Sequential(*[torch.nn.Linear(256, 256, bias=False) for _ in range(64)]).to(env.device)
    ddp = DDP(model, bucket_cap_mb=cap_mb, device_ids=None)
    ddp.register_comm_hook(None, returned)
    x = torch.randn(4, 256, device=env.device)

    def step():
        ddp(x).sum().backward()

    step()
    dist.barrier()
    return median_time(step, iters, sync)


def returned(_state, bucket):
    fut = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut
