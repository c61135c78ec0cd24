"""What a cluster is (conf/cluster/*.yaml): its shape, its two levels of network and the compute-side constants the
cost model reads (ringexp.cluster.costmodel), each checked against both ends of its range."""

import math
import re
from dataclasses import dataclass, field
from typing import Dict, Optional

from ringexp.config import NCCL_MAX, nccl_list_error, need

# The share of line rate each transport reaches, as NCCL's large-message bus bandwidth against the datasheet's
# one-way figure (a cluster level's `transport`, unless it gives its own `efficiency`; docs/plan.md):
# - nvlink 0.80: A100 ~230 of 300 GB/s (NVIDIA/nccl-tests#149, NVIDIA's reply), H100 370 of 450 (nccl-tests#212);
# - pcie 0.44: 8 GPUs on PCIe 5.0, 28 of 64 GB/s (NVIDIA/nccl#1639; PCIe systems are bound by CPU and memory);
# - rdma 0.94: DGX-1 rings, 47 of 50 GB/s on 4 x 100 Gb InfiniBand (NVIDIA/nccl#307, NVIDIA's reply; one EDR NIC:
#   12.2 of 12.5, nccl-tests#29; HDR 24 of 25 per NIC, nccl#412; NDR 46-48 of 50, nccl-tests#290);
# - socket: no fixed share; its TCP streams' (SOCKET_BPS below, socket_share);
# - measured 1.0: a level whose beta calibrate measured already has it.
EFFICIENCY = {"measured": 1.0, "nvlink": 0.80, "pcie": 0.44, "rdma": 0.94, "socket": None}
# How a level's bytes travel (a cluster file's `transport`): each has its documented share of line rate above;
# "measured" is a level whose beta calibrate measured, so it already includes it.
TRANSPORTS = tuple(EFFICIENCY)
# NCCL over TCP: a node's link carries `streams` TCP streams each way, NCCL's channels (2 per NIC by default:
# src/graph/connect.cc:459-460 doubles the rings the search finds, nccl-tests#108 "2 channels as default") times
# each connection's sockets (NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD; by default no helper thread, so one
# socket, the connection's own: src/transport/net_socket.cc ncclNetSocketGetNsockNthread). Each stream moves at
# most SOCKET_BPS, and a byte pays the stream's time and the wire's one after the other:
#   1 / bandwidth = 1 / (streams x SOCKET_BPS) + 1 / line rate.
# SOCKET_BPS 4.5 GB/s: the least worst error over NCCL 2.3.7's rings on GCP at 32 Gbit/s (nccl#209: 2.06, 2.77,
# 3.28, 3.75 GB/s with 1, 2, 4, 8 rings, one socket each; this rule gives 2.12, 2.77, 3.27, 3.60), and near iperf3
# on 100 Gbit/s (nccl#450: 42, 72, 87 Gbit/s with 2, 4, 8 flows; the rule 42, 59, 74). NCCL's own runs at 100
# Gbit/s with 4-32 streams reached 4-6 GB/s (nccl#450, nccl#398), below the rule's 7-11: there the slowest of
# many sockets sets the pace (nccl-tests#83: NCCL's rate is the slowest socket's times their number), which the
# rule leaves out.
SOCKET_BPS = 4.5e9
SOCKET_BPS_MAX = 1e12  # a stream's ceiling past a terabyte a second is no ceiling (a file's range)
SOCKET_CHANNELS = 2  # NCCL's channels over one NIC by default (above)
# How much slower a GPU's compute runs while NCCL's kernels run beside it (they take SMs, and 2-3x their rate of
# memory bandwidth: NVIDIA/nccl#689, #1428): Lee et al., "Characterizing Compute-Communication Overlap in
# GPU-Accelerated Distributed Deep Learning", arXiv:2507.03114 (A100 and H100, GPT and LLaMA training): "an
# average computational slowdown of 18.9%, with a maximum of 40.0%". No figure for Volta was found; it takes the
# same. A CPU cluster's calibrated compute_slowdown already holds its communication's share of the cores (0 here).
OVERLAP_SLOWDOWN = {"volta": 0.189, "ampere": 0.189, "hopper": 0.189}
GPU_ARCHS = ("volta", "ampere", "hopper")  # NCCL's low-latency protocols' bandwidth caps differ by generation


def bytes_per_s(rate: str) -> float | None:
    """A tc-style rate ('25mbit', '1gbit', '12.5mbps': bytes) in bytes per second; None if it is not one, or not a
    finite rate above 0 (a line rate of 0bit was taken as none, and the link kept as measured, without a word)."""
    got = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)([kmg]?)(bit|bps)", rate.strip().lower())
    if not got:
        return None
    n = float(got[1]) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[got[2]]
    return (n / 8 if got[3] == "bit" else n) if 0 < n < math.inf else None


@dataclass
class LinkConfig:
    """One level of a cluster's network: a message of n bytes takes alpha_s + n * beta_s_per_byte / efficiency."""
    alpha_s: float = 0.0  # latency per message, seconds
    beta_s_per_byte: float = 1e-9  # seconds per byte at line rate: 1 / bandwidth (inter: of a node's whole link)
    source: str = ""  # where the two numbers come from
    transport: str = "measured"  # one of TRANSPORTS
    efficiency: Optional[float] = None  # share of line rate the transport reaches (null: the transport's default)
    streams: int = 0  # socket: TCP streams each way over a node's link (0: NCCL's default, SOCKET_CHANNELS x 1)
    socket_Bps: Optional[float] = None  # socket: one stream's ceiling, bytes/s (null: SOCKET_BPS)
    all_to_all_efficiency: Optional[float] = None  # the share an all-to-all reaches, every rank's messages at once
    # (null: efficiency's): measured where it differs, as on a shaped TCP link (costmodel.all_to_all_s)
    tail_s: float = 0.0  # what a collective crossing this level pays on average beyond its median: a loss at a
    # flow's end recovered by a timeout on a shallow shaped queue (the bench's mean minus median; costmodel.call)
    queue_s: float = 0.0  # the queue's length in seconds of the link: only a call that outlasts it pays tail_s


@dataclass
class ClusterConfig:
    """A cluster for `python -m ringexp.plan` (conf/cluster/): its shape, links, and compute-side costs."""
    name: str = "local"
    nodes: int = 1
    ranks_per_node: int = 2  # the most ranks a node takes (GPUs per node)
    link: str = "loopback"  # the link label runs on this cluster record; compare matches runs to it
    backend: str = "nccl"  # nccl or gloo: gloo has no reduce-scatter (FSDP's is a full all-reduce there)
    intra: LinkConfig = field(default_factory=LinkConfig)
    inter: LinkConfig = field(default_factory=LinkConfig)
    add_s_per_byte: float = 0.0  # summing a received float32 buffer into one's own
    encode_s_per_byte: Dict[str, float] = field(default_factory=dict)  # per float32 byte, by compressor
    decode_s_per_byte: Dict[str, float] = field(default_factory=dict)  # per float32 byte (decode and add)
    compute_slowdown: float = 1.0  # a rank's compute with every rank computing at once / alone (shared CPU cores)
    overlap_slowdown: Optional[float] = None  # nccl: compute's slowdown while communication runs beside it (null:
    # OVERLAP_SLOWDOWN of gpu_arch; gloo: 0)
    cpu_threads: int = 0  # a CPU rank's intra-op threads when calibrated (0: cores here / ranks per node)
    call_s: float = 0.0  # per collective call beyond its alpha-beta time: launch and dispatch (calibrate measures)
    jitter_s: float = 0.0  # a rank's compute over T seconds, every rank computing at once, varies with sd
    # sqrt(jitter_s x T): a synchronisation waits for the slowest rank (costmodel.straggle; calibrate measures it)
    bucket_s: float = 0.0  # per DDP bucket, on the training thread: the reducer's hook, copies and launch
    gpu_arch: str = "hopper"  # nccl: the GPU generation, for NCCL's low-latency protocols' caps (GPU_ARCHS)
    nvls: bool = False  # nccl: NVLink SHARP (NVSwitch multicast, H100 with NVLink 4 switches) is there
    collnet: bool = False  # nccl: in-network reduction (SHARP on InfiniBand switches) is there
    nccl_algo: str = ""  # nccl: NCCL_ALGO as the cluster's NCCL has it ("": NCCL's choice; a run's backend.env wins)
    nccl_proto: str = ""  # nccl: NCCL_PROTO likewise
    source: str = ""

    def __post_init__(self):
        # Every number against both ends of its range: NaN fails every comparison (where min() over a list holding
        # one may skip it), and an infinite or absurd constant only comes back as a prediction of 0 samples/s
        # (a division by zero) or a codec ranked fastest.
        need(self.backend in ("nccl", "gloo"), "cluster.backend", self.backend, "choose nccl or gloo")
        need(bool(self.name) and self.name not in (".", "..") and not set(self.name) & set("/\\\0"), "cluster.name",
             repr(self.name), "must be a plain name (it names the directory outputs/plan/<name>/): no slashes")
        need(1 <= self.nodes <= 1 << 20 and 1 <= self.ranks_per_node <= 1 << 20, "cluster.nodes, ranks_per_node",
             f"{self.nodes}, {self.ranks_per_node}", "must be in [1, 1048576]")
        for level in ("intra", "inter"):
            link = getattr(self, level)
            need(0 < link.beta_s_per_byte <= 1, f"cluster.{level}.beta_s_per_byte", link.beta_s_per_byte,
                 "must be > 0 and at most 1 second per byte (1 / bandwidth; 1 Gbit/s is 8e-9)")
            need(0 <= link.alpha_s <= 60, f"cluster.{level}.alpha_s", link.alpha_s,
                 "must be >= 0 and at most 60 seconds")
            need(link.transport in TRANSPORTS, f"cluster.{level}.transport", link.transport,
                 f"choose one of {', '.join(TRANSPORTS)}")
            need(link.efficiency is None or 0 < link.efficiency <= 1, f"cluster.{level}.efficiency", link.efficiency,
                 "must be in (0, 1]: the share of line rate the transport reaches (null: the transport's default)")
            for key in ("tail_s", "queue_s"):
                need(0 <= getattr(link, key) <= 60, f"cluster.{level}.{key}", getattr(link, key),
                     "must be in [0, 60] seconds")
            need(link.all_to_all_efficiency is None or 0 < link.all_to_all_efficiency <= 1,
                 f"cluster.{level}.all_to_all_efficiency", link.all_to_all_efficiency,
                 "must be in (0, 1]: the share of line rate an all-to-all reaches (null: the level's efficiency)")
            most = NCCL_MAX["NCCL_MAX_NCHANNELS"] * NCCL_MAX["sockets"]
            need(0 <= link.streams <= most, f"cluster.{level}.streams", link.streams,
                 f"must be in [0, {most}] (NCCL's channels x sockets per connection; 0: NCCL's default)")
            need(link.socket_Bps is None or 1e3 <= link.socket_Bps <= SOCKET_BPS_MAX, f"cluster.{level}.socket_Bps",
                 link.socket_Bps, f"must be a finite number of bytes per second in [1e3, {SOCKET_BPS_MAX:g}] (null: "
                 "SOCKET_BPS)")
        costs = {"add_s_per_byte": self.add_s_per_byte} | {
            f"{kind}_s_per_byte.{name}": v for kind in ("encode", "decode")
            for name, v in getattr(self, f"{kind}_s_per_byte").items()}
        for key, v in costs.items():
            need(0 <= v <= 1, f"cluster.{key}", v, "must be >= 0 and at most 1 second per float32 byte")
        need(0 < self.compute_slowdown <= 1000, "cluster.compute_slowdown", self.compute_slowdown,
             "must be > 0 and at most 1000")
        need(self.overlap_slowdown is None or 0 <= self.overlap_slowdown <= 10, "cluster.overlap_slowdown",
             self.overlap_slowdown, "must be in [0, 10] (null: the GPU generation's)")
        need(0 <= self.cpu_threads <= 4096, "cluster.cpu_threads", self.cpu_threads,
             "must be in [0, 4096] (0: cores / ranks)")
        for key in ("call_s", "bucket_s", "jitter_s"):
            need(0 <= getattr(self, key) <= 60, f"cluster.{key}", getattr(self, key), "must be >= 0 and at most 60 s")
        need(self.gpu_arch in GPU_ARCHS, "cluster.gpu_arch", self.gpu_arch, f"choose one of {', '.join(GPU_ARCHS)}")
        for key in ("NCCL_ALGO", "NCCL_PROTO"):
            value = getattr(self, key.lower())
            need(not value or not nccl_list_error(key, value), f"cluster.{key.lower()}", value,
                 nccl_list_error(key, value) if value else "")
