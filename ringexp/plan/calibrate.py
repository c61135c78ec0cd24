"""`python -m ringexp.plan calibrate`: on the ranks it runs on (`nprocs` local workers, or every rank of a torchrun or
Slurm job) every rank exchanges a message with a neighbour at each of `sizes`, all at once as in a ring step, first
inside its node, then with the same local rank on the next node; each level's medians are fitted to alpha + n beta.
Then what this host's work costs (host.py). A time is the slowest rank's (ringexp.dist.slowest)."""

import os
import statistics
import time
from functools import partial

import numpy as np
import torch
import torch.distributed as dist

from ringexp import compress
from ringexp import dist as rdist
from ringexp.cluster import files as clusters
from ringexp.cluster import nccl
from ringexp.cluster.schema import SOCKET_CHANNELS, bytes_per_s
from ringexp.comm import p2p, two_phase
from ringexp.config import BackendConfig
from ringexp.errors import ConfigError
from ringexp.launch import elastic, under_external_launcher
from ringexp.plan import host
from ringexp.plan.config import PlanConfig

# The message an all-to-all is measured with: large enough that its bytes, not its latency, set the time (the two
# phases' messages of a 16 MB int8 gradient over 8 ranks are 512 KB), small enough to take seconds at 25 Mbit/s.
ALL_TO_ALL_BYTES = 1 << 20


def exchange_times(cfg: PlanConfig, env, to: int, frm: int, sync) -> list:
    """[(bytes, seconds)]: every rank sends `bytes` to `to` while receiving as much from `frm`, all at once; a
    time is the slowest rank's, the median of `iters` rounds after one warm-up."""
    out = []
    for size in cfg.sizes:
        send, recv = (torch.zeros(size, dtype=torch.uint8, device=env.device) for _ in range(2))
        times = []
        for it in range(cfg.iters + 1):
            dist.barrier()
            t0 = time.perf_counter()
            sent, received = p2p.exchange((send, to), (recv, frm), None, "calibrate")  # as the collectives post
            for w in received + sent:
                w.wait()
            sync()
            t = rdist.slowest(time.perf_counter() - t0, env.device)
            times += [t] if it else []
        out.append((size, statistics.median(times)))
    return out


def all_to_all_time(cfg: PlanConfig, env, sync, nbytes: int = ALL_TO_ALL_BYTES) -> list:
    """[bytes, seconds]: every rank sends `nbytes` to every other rank and receives as much from each, all posted
    at once as the two phases post their exchanges (two_phase.exchange); the slowest rank's median of `iters`
    rounds after one warm-up."""
    ring, times = list(range(env.world_size)), []
    out = [torch.zeros(nbytes, dtype=torch.uint8, device=env.device)] * env.world_size
    for it in range(cfg.iters + 1):
        dist.barrier()
        t0 = time.perf_counter()
        two_phase.exchange(None, ring, env.rank, out, [nbytes] * env.world_size, "calibrate", None)
        sync()
        t = rdist.slowest(time.perf_counter() - t0, env.device)
        times += [t] if it else []
    return [nbytes, statistics.median(times)]


def all_gather_time(cfg: PlanConfig, env, sync, nbytes: int = ALL_TO_ALL_BYTES) -> list:
    """[bytes, seconds]: gloo's (or NCCL's) builtin all-gather of `nbytes` from every rank, as a compressed
    all-reduce through the all-gather calls it (compress.all_gather); the slowest rank's median of `iters`
    rounds after one warm-up."""
    payload, times = torch.zeros(nbytes, dtype=torch.uint8, device=env.device), []
    for it in range(cfg.iters + 1):
        dist.barrier()
        t0 = time.perf_counter()
        compress.all_gather(payload, "builtin")
        sync()
        t = rdist.slowest(time.perf_counter() - t0, env.device)
        times += [t] if it else []
    return [nbytes, statistics.median(times)]


def fit(points: list, scale: int = 1) -> dict:
    """alpha + beta n through (bytes x scale, seconds) points. beta: least squares on absolute error, so that the
    large messages the collectives are made of set it (a relative fit let small messages, noisy and helped by
    the shaper's burst, pull beta down 15-60% on the local cluster); alpha: what the smallest exchange takes
    beyond beta n. Small messages are what PowerSGD's factors and small buckets are made of, and they are the
    ones latency rules; the least residual of all messages up to 1 MB (the rule before) let one 1 MB message
    that came in under n beta set alpha to 0 on a 3-node cluster whose 4 KB exchange took 0.84 ms. `errors`:
    the fit's relative error at every size."""
    x = np.array([b * scale for b, _ in points], dtype=float)
    t = np.array([s for _, s in points], dtype=float)
    (_, beta), *_ = np.linalg.lstsq(np.stack([np.ones_like(x), x], 1), t, rcond=None)
    if beta <= 0:
        beta = t[-1] / x[-1]
    smallest = int(np.argmin(x))
    alpha = max(0.0, float(t[smallest] - beta * x[smallest]))
    errors = (alpha + beta * x - t) / t
    return {"alpha_s": alpha, "beta_s_per_byte": float(beta), "fit_error": float(np.max(np.abs(errors))),
            "errors": [float(e) for e in errors], "points": [[int(b), s] for b, s in zip(x, t, strict=True)]}


def calibrate_worker(cfg: PlanConfig) -> dict:
    env = rdist.init("cuda" if torch.cuda.is_available() else "cpu")
    sync = partial(rdist.sync, env.device)
    where = rdist.topology(env)
    k, nodes = where["ranks_per_node"], where["nodes"]
    node, local = divmod(env.rank, k)
    out = dict(where) | {"backend": env.backend, "cpu_threads": torch.get_num_threads() if env.backend == "gloo" else 0}
    if k > 1:
        out["intra"] = fit(exchange_times(cfg, env, node * k + (local + 1) % k, node * k + (local - 1) % k, sync))
    if nodes > 1:  # a step of the ring over every rank: one stream each way per node link, beside the intra hops
        n = env.world_size  # (an exchange within one pair of ranks measured 30-50% slower at 1 Gbit/s here)
        out["inter"] = fit(exchange_times(cfg, env, (env.rank + 1) % n, (env.rank - 1) % n, sync))
        out["inter"]["all_to_all"] = all_to_all_time(cfg, env, sync)
        out["inter"]["all_gather"] = all_gather_time(cfg, env, sync)
    out |= host.compute_costs(cfg, env, sync)
    out |= host.call_costs(cfg, env, sync, out)
    rdist.cleanup()
    return out


def calibrate(cfg: PlanConfig, train: list = ()) -> None:
    """Measure on this job's ranks (or `nprocs` local workers) and write the cluster file."""
    check_socket(cfg)
    if under_external_launcher():
        if int(os.environ["WORLD_SIZE"]) < 2:
            raise ConfigError("calibrate needs at least 2 ranks (nprocs=2 or more, or torchrun --nproc-per-node 2)")
        m = calibrate_worker(cfg)
    else:
        m = elastic(calibrate_worker, cfg.nprocs, cfg)[0]
    clusters.write(m, cfg.out, cfg.label, cfg.line_rate, streams(cfg, m["backend"]))


def check_socket(cfg: PlanConfig) -> None:
    """What transport=socket needs, before anything is measured: a line rate to fall short of (line_rate=, or a
    label or the cluster's link that is a rate), and NCCL socket counts NCCL takes (a run's backend.env rule)."""
    if cfg.transport != "socket":
        return
    if not (cfg.line_rate or bytes_per_s(cfg.label or os.environ.get("RINGEXP_CLUSTER_LINK", ""))):
        raise ConfigError("transport=socket keeps what the link reached below its line rate: give line_rate= "
                          "(tc's units: 25mbit, 100gbit)")
    try:
        BackendConfig(env=socket_env())
    except ConfigError as e:
        raise ConfigError(str(e).removeprefix("backend.env.").replace(": ", " in the environment: ", 1)) from None


def socket_env() -> dict:
    """The variables here that set a point-to-point connection's sockets."""
    return {k: os.environ[k] for k in ("NCCL_SOCKET_NTHREADS", "NCCL_NSOCKS_PERTHREAD") if k in os.environ}


def streams(cfg: PlanConfig, backend: str) -> int:
    """The TCP streams the inter-node exchange ran over, where `transport=socket` asks for the link as sockets
    (0 otherwise): gloo's one connection per pair of ranks; NCCL's sockets per connection (its variables here) on
    each of the 2 channels NCCL gives a point-to-point peer over the network (NCCL_NCHANNELS_PER_NET_PEER's
    default: its send and receive, not the rings' NCCL_MIN/MAX_NCHANNELS)."""
    if cfg.transport != "socket":
        return 0
    return nccl.socket_streams(socket_env(), SOCKET_CHANNELS) if backend == "nccl" else 1
