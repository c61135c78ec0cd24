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
# Where a level states its topology (`topology`), the share follows from it instead: NCCL itself takes P2P and
# GPUDirect RDMA no further than a PCIe switch (src/graph/paths.cc: p2pLevel and netGdrLevel PATH_PXB, "don't use
# P2P across CPU Host Bridges"), so past one the bytes are staged through host memory (docs/plan.md):
# - pcie switch 0.72: GPUs under one PCIe switch, P2P: "12 GB/s (PCI Gen 3 switch)" of 15.75 (NVIDIA, nccl#766;
#   nccl#406 "12GB/s instead of 9 or 6"), 4 L40S on one switch 22 of 31.5 (nccl#1202); NCCL's own PCIe model
#   gives 0.76 (src/graph/topo.cc, width x rate / 80);
# - pcie root_complex 0.40: through the CPU, one socket: "6 GB/s (Gen 3 CPU)" of 15.75 (nccl#766), shared memory
#   within a NUMA node 24 of 63 (nccl#1130), 8 GPUs without P2P 28 of 63 (nccl#1639);
# - pcie cross_socket 0.30: a ring crossing the CPUs' link: 2 L4 on two sockets 9.7 of 31.5 (nccl#1358); NCCL's
#   inter-socket figures 10 GB/s (Skylake) and 22 (Sapphire Rapids) of 31.5 and 63 (src/graph/topo.h SKL_QPI_BW,
#   SRP_QPI_BW);
# - rdma gdr 0.94: the NIC on the GPU's PCIe switch with GPUDirect RDMA (the transport's own share above);
# - rdma host 0.64: the NIC behind the CPU, or no GPUDirect: "If the NIC is attached to the CPU getting 16 GB/s is
#   normal" of 25 (NVIDIA, nccl#412), 6 of 12.5 without GPUDirect (nccl#465).
TOPOLOGY = {"pcie": {"switch": 0.72, "root_complex": 0.40, "cross_socket": 0.30},
            "rdma": {"gdr": 0.94, "host": 0.64}}
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
# ... and the CPU threads that move the bytes bound it too. Since NCCL 2.4.2 a rank's one proxy thread drives every
# channel's sockets (src/proxy.cc ncclProxyProgress; "Each GPU has a network thread", nccl#518), and from 2.5.6 no
# helper thread is started on a plain NIC ("By default, we only use the main thread", net_socket.cc
# ncclNetSocketGetNsockNthread): more streams add no thread. nccl#209's rings on 2.4.2 gave 1.85, 1.95, 1.73, 1.45
# GB/s with 1-8 of them, where 2.3.7's thread per ring reached 2.06-3.75: one thread moves about SOCKET_THREAD_BPS
# a direction. A level's `socket_threads` says how many move one direction of a node's traffic (null: 1, the
# ring entering a node on one rank's thread and leaving on another's, nccl#398).
SOCKET_THREAD_BPS = 3.8e9
SOCKET_BPS_MAX = 1e12  # a stream's ceiling past a terabyte a second is no ceiling (a file's range)
SOCKET_CHANNELS = 2  # NCCL's channels over one NIC by default (above)
# How much slower a GPU's compute runs while NCCL's kernels run beside it (they take SMs, and 2-3x their rate of
# memory bandwidth: NVIDIA/nccl#689, #1428): Lee et al., "Characterizing Compute-Communication Overlap in
# GPU-Accelerated Distributed Deep Learning", arXiv:2507.03114 (A100 and H100, GPT and LLaMA training): "an
# average computational slowdown of 18.9%, with a maximum of 40.0%". No figure for Volta was found; it takes the
# same. A CPU cluster's calibrated compute_slowdown already holds its communication's share of the cores (0 here).
OVERLAP_SLOWDOWN = {"volta": 0.189, "ampere": 0.189, "hopper": 0.189}
GPU_ARCHS = ("volta", "ampere", "hopper")  # NCCL's low-latency protocols' bandwidth caps differ by generation
# A GPU codec's cost where a cluster file measures none (a datasheet cluster; calibrate measures its own): an
# elementwise codec moves `passes` bytes per float32 byte at 0.75 of the GPU's memory bandwidth (HBM_BPS: V100 SXM2
# 900 GB/s, A100 40 GB 1,555, H100 SXM 3,350, the datasheets), as this project's codecs did on an H200: fp16
# encode 0.425 ps per byte where 1.5 passes at 0.75 of 4.8 TB/s give 0.42 (docs/results/gpu.md). Passes (encode,
# decode and add), as the kernels touch memory: a cast reads 4 and writes 2 bytes (1.5), its decode reads 2 and
# 4 and writes 4 (2.5); int8 1.25 and 2.25; sign a pass for its scale besides (2.03 both); top-k's radix select
# and compaction about 10 casts (15; DGC's sampled threshold measured 10x a cast on the H200, the decode a
# scatter of k values); random-k by a shared seed a gather and its error feedback (3, 1); PowerSGD about 9 passes
# (error feedback 3, P = MQ, Q = M^T P, M ~ PQ^T, the new error 3) plus POWERSGD_TENSOR_S per compressed tensor:
# its orthogonalisation (torch.linalg.qr: 85-118 us a call, pytorch/pytorch#76673) and small matmuls, eager.
HBM_BPS = {"volta": 900e9, "ampere": 1555e9, "hopper": 3350e9}
CODEC_PASSES = {"fp16": (1.5, 2.5), "bf16": (1.5, 2.5), "int8": (1.25, 2.25), "sign": (2.03, 2.03),
                "topk": (15.0, 0.0), "randomk": (3.0, 1.0), "powersgd": (9.0, 0.0)}
CODEC_SHARE = 0.75
POWERSGD_TENSOR_S = {"volta": 150e-6, "ampere": 120e-6, "hopper": 100e-6}


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
    efficiency: Optional[float] = None  # share of line rate the transport reaches (null: the topology's, else
    # the transport's default)
    topology: str = ""  # pcie: switch, root_complex or cross_socket; rdma: gdr or host (TOPOLOGY; "": not stated)
    streams: int = 0  # socket: TCP streams each way over a node's link (0: NCCL's default, SOCKET_CHANNELS x 1)
    socket_Bps: Optional[float] = None  # socket: one stream's ceiling, bytes/s (null: SOCKET_BPS)
    socket_threads: Optional[float] = None  # socket: CPU threads moving one direction of a node's traffic (null:
    # 1, NCCL 2.4.2 on; 0.5 where one rank a node sends and receives on its one proxy thread; NCCL before 2.4 ran
    # a thread per stream: its streams; NCCL_SOCKET_NTHREADS: channels x threads)
    all_to_all_efficiency: Optional[float] = None  # the share an all-to-all reaches, every rank's messages at once
    # (null: efficiency's): measured where it differs, as on a shaped TCP link (costmodel.all_to_all_s)
    all_gather_efficiency: Optional[float] = None  # the share gloo's builtin all-gather reaches (null: efficiency's):
    # at 2 ranks gloo's ring posts its send to the one peer before the receive from it, and the two ways take turns
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
            check_link(level, getattr(self, level))
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


def check_link(level: str, link: LinkConfig) -> None:
    """Every number of one level of a cluster file against both ends of its range (ClusterConfig's checks)."""
    need(0 < link.beta_s_per_byte <= 1, f"cluster.{level}.beta_s_per_byte", link.beta_s_per_byte,
         "must be > 0 and at most 1 second per byte (1 / bandwidth; 1 Gbit/s is 8e-9)")
    need(0 <= link.alpha_s <= 60, f"cluster.{level}.alpha_s", link.alpha_s,
         "must be >= 0 and at most 60 seconds")
    need(link.transport in TRANSPORTS, f"cluster.{level}.transport", link.transport,
         f"choose one of {', '.join(TRANSPORTS)}")
    kinds = TOPOLOGY.get(link.transport, {})
    need(not link.topology or link.topology in kinds, f"cluster.{level}.topology", link.topology,
         f"choose one of {', '.join(kinds)} for transport {link.transport}" if kinds else
         f"only a pcie or rdma level states a topology (this one is {link.transport}): leave it empty")
    need(link.efficiency is None or 0 < link.efficiency <= 1, f"cluster.{level}.efficiency", link.efficiency,
         "must be in (0, 1]: the share of line rate the transport reaches (null: the transport's default)")
    for key in ("tail_s", "queue_s"):
        need(0 <= getattr(link, key) <= 60, f"cluster.{level}.{key}", getattr(link, key),
             "must be in [0, 60] seconds")
    for key in ("all_to_all_efficiency", "all_gather_efficiency"):
        need(getattr(link, key) is None or 0 < getattr(link, key) <= 1, f"cluster.{level}.{key}",
             getattr(link, key), f"must be in (0, 1]: the share of line rate an {key.split('_eff')[0]} "
             "reaches (null: the level's efficiency)")
    most = NCCL_MAX["NCCL_MAX_NCHANNELS"] * NCCL_MAX["sockets"]
    need(0 <= link.streams <= most, f"cluster.{level}.streams", link.streams,
         f"must be in [0, {most}] (NCCL's channels x sockets per connection; 0: NCCL's default)")
    need(link.socket_threads is None or 0.5 <= link.socket_threads <= most, f"cluster.{level}.socket_threads",
         link.socket_threads, f"must be in [0.5, {most}] (null: NCCL's one proxy thread a direction)")
    need(link.socket_Bps is None or 1e3 <= link.socket_Bps <= SOCKET_BPS_MAX, f"cluster.{level}.socket_Bps",
         link.socket_Bps, f"must be a finite number of bytes per second in [1e3, {SOCKET_BPS_MAX:g}] (null: "
         "SOCKET_BPS)")
