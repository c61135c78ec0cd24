"""NCCL's own choice of algorithm and protocol for one collective, as the cost model has it: NCCL's tuning model
(src/graph/tuning.cc of NCCL v2.23.4-1, commit 68b5423; `tuning.cc:N` below is a line there), on the bandwidths and
latencies of a cluster file. For every algorithm x protocol the cluster enables (and NCCL_ALGO / NCCL_PROTO allow)
a time `latency + bytes / bandwidth`; NCCL runs the lowest (src/enqueue.cc:1820-1838), and so does the model.

Reading of NCCL's model here: NCCL's `nChannels * bw` of the ring graph with the Simple protocol is its estimate of a
rank's bus bandwidth; the cluster file's per-level beta (with its transport's efficiency) is that figure, the
slower level's where the ring crosses nodes, and NCCL's factors per algorithm and protocol apply to it. NCCL's
latencies (hwLat) are per-hop constants; a level's `alpha_s` in the file is the ring Simple one, and the other
protocols' and algorithms' scale with it (the datasheet files give NCCL's own: 3.4 us NVLink, 14 us network).
Left out: the per-channel caps (perChMax*: they bind only below about 20 GB/s per channel x 16 channels), the
plain-tree pattern's 0.85 and the CPU-vendor row of the LL cap (Intel's is taken), CollNet's GPU/NIC factor."""

import contextlib
import contextvars
import math
from collections import Counter

from ringexp.cluster import costmodel
from ringexp.cluster.schema import SOCKET_CHANNELS
from ringexp.config import NCCL_CHOICES, NCCL_COUNTS, nccl_count

ALGOS, PROTOS = NCCL_CHOICES["NCCL_ALGO"], NCCL_CHOICES["NCCL_PROTO"]  # NCCL's names (what NCCL_ALGO/PROTO take)
COLLS = ("allreduce", "allgather", "reducescatter")

BASE_LAT = {"tree": (6.8, 14.0, 8.4), "ring": (6.6, 14.0, 8.4)}  # us, by protocol (tuning.cc:56-59); others 0
HW_LAT = {  # us per hop, by link kind and protocol (tuning.cc:65-78)
    "nvlink": {"tree": (.6, 1.25, 4.0), "ring": (.6, 1.9, 3.4), "collnetdirect": (0, 0, 3.7),
               "collnetchain": (0, 0, 2.8), "nvls": (0, 0, 25), "nvlstree": (0, 0, 25), "pat": (0, 0, 0)},
    "pci": {"tree": (1.0, 1.9, 4.0), "ring": (1.0, 2.5, 5.7), "collnetdirect": (0, 0, 3.7),
            "collnetchain": (0, 0, 2.8), "nvls": (0, 0, 0), "nvlstree": (0, 0, 0), "pat": (0, 0, 0)},
    "net": {"tree": (5.0, 8.5, 14), "ring": (2.7, 4.0, 14.0), "collnetdirect": (0, 0, 31),
            "collnetchain": (0, 0, 30), "nvls": (0, 0, 18), "nvlstree": (0, 0, 14), "pat": (0, 0, 0)},
}
# The LL protocol's bandwidth cap, GB/s, by GPU generation on one node and 1 / 2 / more nodes (tuning.cc:87-89,
# 146-151; on more than one node NCCL picks the row by CPU vendor instead: Intel's, the first row, is taken)
LL_MAX_BW = {"volta": (39.0, 39.0, 20.4), "ampere": (87.7, 22.5, 19.0), "hopper": (141.0, 45.0, 35.0)}
# Tree all-reduce's bandwidth correction by log2(bytes / 64), per protocol (tuning.cc:435-439)
TREE_CORRECTION = (
    (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0),
    (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0),
    (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9))
NET_OVERHEAD_US = 1.0  # per ring step on more than one node, x3 for Simple (tuning.cc:120-125, Intel CPUs)
CHANNELS = 16  # ring channels for the plateau rule's bytes per channel (a ring graph has at most 16: init.cc:897)

chosen = contextvars.ContextVar("nccl_chosen", default=None)  # [(coll, algo, proto)] while `recording`


def socket_streams(env: dict, streams: int) -> int:
    """The TCP streams NCCL runs each way over a node's link with a run's `env`: its channels times every
    connection's sockets, each taken from env where it sets them, else from the cluster's `streams` (0: NCCL's
    default, SOCKET_CHANNELS channels of one socket). Channels: at most NCCL_MAX_NCHANNELS, then at least
    NCCL_MIN_NCHANNELS (src/graph/connect.cc: the rings cut to the maximum, then copied up to the minimum, which
    wins); sockets: NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD, where one not set takes NCCL's automatic value (no
    helper thread, one socket per thread: then the connection's own socket carries the data;
    src/transport/net_socket.cc ncclNetSocketGetNsockNthread)."""
    if not any(k in env for k in NCCL_COUNTS):
        return streams

    def count(key: str, default: int) -> int:  # as NCCL reads it ("010" is 8; env was checked: BackendConfig)
        return nccl_count(env.get(key, default))

    own = max(1, streams // SOCKET_CHANNELS) if streams else 1  # the cluster's sockets per connection
    sockets = own
    if "NCCL_SOCKET_NTHREADS" in env or "NCCL_NSOCKS_PERTHREAD" in env:
        sockets = max(1, count("NCCL_SOCKET_NTHREADS", 0) * count("NCCL_NSOCKS_PERTHREAD", 1))
    return channels(env) * sockets


def channels(env: dict) -> int:
    """NCCL's channels over one NIC with a run's `env`: SOCKET_CHANNELS, at most NCCL_MAX_NCHANNELS, then at least
    NCCL_MIN_NCHANNELS."""
    most = nccl_count(env.get("NCCL_MAX_NCHANNELS", SOCKET_CHANNELS))
    return max(min(SOCKET_CHANNELS, most), nccl_count(env.get("NCCL_MIN_NCHANNELS", 0)))


def socket_threads(env: dict, threads):
    """The CPU threads moving one direction of a node's socket traffic with a run's `env`: NCCL_SOCKET_NTHREADS
    helper threads on each channel's connection (src/transport/net_socket.cc), else the cluster's `threads`."""
    helpers = nccl_count(env.get("NCCL_SOCKET_NTHREADS", 0))
    return channels(env) * helpers if helpers else threads


@contextlib.contextmanager
def recording():
    """Collect every choice the model makes inside (for the planner's table: which algorithm and protocol)."""
    token = chosen.set([])
    try:
        yield chosen.get()
    finally:
        chosen.reset(token)


def record(choices: list) -> None:
    """Choices made elsewhere, recorded again while `recording` (a cost reckoned once for many equal calls)."""
    if (log := chosen.get()) is not None:
        log.extend(choices)


def enabled(cl, coll: str) -> list:
    """[(algo, proto)] NCCL may run `coll` with on cluster `cl` (tuning.cc:170-179, 289-336; enqueue.cc:1790-1800),
    narrowed by the cluster's NCCL_ALGO / NCCL_PROTO (`nccl_algo`, `nccl_proto`: NCCL's syntax)."""
    nodes, ppn = cl.nodes, cl.ranks_per_node
    algos = {"ring"}
    collnet = {"collnetdirect", "collnetchain"} if cl.collnet else set()
    if coll == "allreduce":
        algos |= {"tree"} | collnet | ({"nvls"} if cl.nvls and (nodes == 1 or cl.collnet) else set()) | \
            ({"nvlstree"} if cl.nvls and nodes > 1 else set())
    else:
        algos |= ({"nvls"} if cl.nvls and nodes == 1 else set()) | (collnet & {"collnetdirect"}) | \
            ({"pat"} if ppn == 1 and nodes > 1 else set())
    # LL128 by default only over NVLink, between nodes only with RDMA (tuning.cc:324-336); named, always
    ll128 = cl.intra.transport == "nvlink" and (nodes == 1 or cl.inter.transport == "rdma")
    protos = {"ll", "simple"} | ({"ll128"} if ll128 else set())
    algos, protos = narrowed(algos, cl.nccl_algo, coll), narrowed(protos, cl.nccl_proto, coll, PROTOS)
    simple_only = {"nvls", "nvlstree", "pat", "collnetdirect", "collnetchain"}
    return [(a, p) for a in ALGOS if a in algos for p in PROTOS
            if p in protos and (p == "simple" or a not in simple_only)]


def narrowed(default: set, spec: str, coll: str, names=ALGOS) -> set:
    """`default` as NCCL_ALGO / NCCL_PROTO `spec` leaves it for `coll`: 'a,b' (only these), '^a' (all but these),
    'allreduce:tree;allgather:ring' (per collective, NCCL 2.24+; the first entry may apply to all). A named
    protocol is on even where NCCL would not pick it by default (tuning.cc:289); an algorithm the hardware lacks
    stays off."""
    if not spec:
        return default
    rule = None
    for part in spec.lower().split(";"):
        func, colon, names_ = part.rpartition(":") if ":" in part else ("", "", part)
        if not colon or func == coll:
            rule = names_
    if rule is None:
        return default
    listed = {n.strip() for n in rule.lstrip("^").split(",") if n.strip()}
    left = default - listed if rule.startswith("^") else listed & (set(PROTOS) if names is PROTOS else default)
    return left or default  # nothing left for this collective: NCCL falls back to its ring (tuning.cc:342-356)


def bus_bw(cl, coll: str, algo: str, proto: str) -> float:
    """A rank's bus bandwidth, GB/s, with `algo` and `proto` (tuning.cc:181-227 and its busBw -> algBw ratio): the
    ring Simple figure from the cluster's levels, NCCL's factors on it."""
    intra = 1e-9 / costmodel.beta(cl.intra)
    inter = 1e-9 / costmodel.beta(cl.inter) if cl.nodes > 1 else math.inf
    bw = min(intra, inter)
    nodes, p = cl.nodes, costmodel.ranks(cl)
    ll_max = LL_MAX_BW[cl.gpu_arch if nodes == 1 else "volta"][min(nodes, 3) - 1]  # (multi-node: Intel's row)
    if algo == "nvlstree":
        bw = min(intra, inter if nodes <= 2 else inter / 2)
    elif algo in ("collnetdirect", "collnetchain"):
        bw = intra
    if algo == "ring" and proto == "ll":
        bw = min(ll_max, bw * .5)
    if algo == "ring" and proto == "ll128":
        bw *= .92
    if algo == "tree" and coll == "allreduce":
        bw *= .92
    if algo == "tree" and proto == "ll":
        bw = min(bw / 3.8, ll_max)
    if algo == "tree" and proto == "ll128":
        bw *= 7 / 9 if nodes == 1 else 120 / 128
    if algo == "pat":
        bw *= .85
    if algo != "ring" and coll != "allreduce":
        return bw  # no busBw -> algBw conversion for these (tuning.cc:221)
    steps = 2 * (p - 1) if coll == "allreduce" else p - 1
    return bw * (p / steps if algo == "ring" else 5 / 6 if algo in ("nvls", "nvlstree") else .5)


def latency_us(cl, coll: str, algo: str, proto: str) -> float:
    """NCCL's latency of one call, us (tuning.cc:233-282), each level's per-hop figure scaled by the cluster's
    alpha against NCCL's ring Simple one for that level."""
    i = PROTOS.index(proto)
    nodes, p = cl.nodes, costmodel.ranks(cl)
    ppn = p // nodes
    kind = "nvlink" if cl.intra.transport == "nvlink" else "pci"
    intra = HW_LAT[kind][algo][i] * scale(cl.intra.alpha_s, HW_LAT[kind]["ring"][2])
    inter = HW_LAT["net"]["tree" if ppn == 1 else algo][i] * scale(cl.inter.alpha_s, HW_LAT["net"]["ring"][2])
    lat = BASE_LAT.get(algo, (0, 0, 0))[i]
    log_nodes = int(math.log2(nodes))
    if algo == "ring":
        steps = 2 * (p - 1) if coll == "allreduce" else p - 1
        inter_steps = 0 if nodes == 1 else 2 * (nodes - 1) if coll == "allreduce" else nodes - 1
        if nodes > 1:
            intra = max(intra, NET_OVERHEAD_US * (3 if proto == "simple" else 1))
        return lat + (steps - inter_steps) * intra + inter_steps * inter
    if algo == "tree":
        return lat + 2 * ((ppn - 1) * intra + log_nodes * inter)
    if algo == "collnetdirect":
        return lat + 2 * (min(1, ppn - 1) * intra + (ppn - 1) * 0.4) + inter
    if algo == "collnetchain":
        return lat + 2 * (ppn - 1) * intra + inter
    if algo == "nvls":
        return intra + (inter if nodes > 1 else 0)
    if algo == "nvlstree":
        return lat + intra + 2 * log_nodes * inter
    return 8 + log_nodes * (inter / 3.5) + p * 2.8  # pat


def scale(alpha_s: float, nccl_us: float) -> float:
    return alpha_s * 1e6 / nccl_us


def time_s(cl, coll: str, algo: str, proto: str, nbytes: float) -> float:
    """One call's seconds (tuning.cc:441-465): latency (the ring's Simple plateau rule included) + bytes over the
    algorithm bandwidth, a tree all-reduce's bandwidth corrected by message size."""
    bw, lat = bus_bw(cl, coll, algo, proto), latency_us(cl, coll, algo, proto)
    size = int(math.log2(nbytes / 64)) if nbytes >= 64 else -1
    if algo == "tree" and coll == "allreduce" and 0 <= size < 23:
        bw *= TREE_CORRECTION[PROTOS.index(proto)][size]
    if algo == "ring" and proto == "simple" and cl.nodes > 1 and coll == "allreduce" and \
            nbytes // (CHANNELS * costmodel.ranks(cl)) >= 64:
        lat *= 1.9 if cl.gpu_arch == "volta" else 1.4
    return (lat + nbytes / (1000 * bw)) * 1e-6


def seconds(cl, coll: str, nbytes: float) -> float:
    """The fastest enabled algorithm x protocol for one `coll` of `nbytes` (all-gather and reduce-scatter: the whole
    buffer, as NCCL counts it), recorded while `recording`."""
    if costmodel.ranks(cl) <= 1:
        return 0.0
    t, algo, proto = min((time_s(cl, coll, a, p, nbytes), a, p) for a, p in enabled(cl, coll))
    if (log := chosen.get()) is not None:
        log.append((coll, algo, proto))
    return t


def summary(choices: list) -> str:
    """'allreduce ring/LL x3, tree/LL128 x2' of recorded choices, most used first."""
    return ", ".join(f"{coll} {a}/{'Simple' if p == 'simple' else p.upper()} x{n}"
                     for (coll, a, p), n in Counter(choices).most_common())
