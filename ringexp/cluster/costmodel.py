"""The arithmetic behind every prediction: what a message, a ring and an overlapped step cost on a cluster described
by a few constants (a ClusterConfig, ringexp.cluster.schema; conf/cluster/). Pure arithmetic, below every module
that uses it:
each collective answers for its own cost with these pieces (`seconds` in ringexp/comm/*.py), each compressor for
its wire format and codec (ringexp.compress.seconds), each strategy for its step (`step_cost` in
ringexp/parallel/*.py); the planner only asks them.

Constants. A message of n bytes between two ranks takes alpha + n * beta (Hockney, "The communication challenge
for MPP", Parallel Computing 1994), with one (alpha, beta) per level: `intra` between ranks of a node, `inter`
for a node's link to the others (beta: seconds per byte through the node's whole link, all its ranks together).
gamma = `add_s_per_byte`, the cost of summing a received float32 buffer into one's own; a compressor costs
`encode_s_per_byte` and `decode_s_per_byte` per float32 byte it encodes or decodes (decode includes the add).

A ring over p ranks [T, eq. for ring reduce-scatter + all-gather; P]: 2(p-1) steps of n/p bytes, every link busy
at once, so a step is paced by the slowest hop (inter when the ring crosses nodes): 2(p-1) alpha +
2(p-1)/p w n beta + (p-1)/p n gamma, w = wire bytes / float32 bytes of the compressor (1 for none). An all-gather
of payloads that cannot be summed: (p-1)(alpha + payload beta), then p decodes [T, ring all-gather].
Sources: [T] Thakur, Rabenseifner, Gropp, "Optimization of collective communication operations in MPICH",
IJHPCA 2005. [P] Patarasuk, Yuan, "Bandwidth optimal all-reduce algorithms for clusters of workstations",
JPDC 2009. [S] Sergeev, Del Balso, "Horovod", arXiv:1802.05799, and NCCL's src/graph/tuning.cc (the same
latency x steps + bytes / bandwidth per algorithm).

A step: buckets of gradients whose collectives start when backward has produced them and run one after another
on one stream; exposed communication is what is left after backward ends [the overlap model of Echo (Wang et
al. 2024) and ASTRA-sim in its simplest form], and on GPUs backward runs slower by a cited factor while
communication runs beside it (`slowed`).
"""

import math
from dataclasses import dataclass
from functools import lru_cache
from statistics import NormalDist

from ringexp.cluster.schema import (
    CODEC_PASSES,
    CODEC_SHARE,
    EFFICIENCY,
    HBM_BPS,
    OVERLAP_SLOWDOWN,
    POWERSGD_TENSOR_S,
    SOCKET_BPS,
    SOCKET_CHANNELS,
    SOCKET_THREAD_BPS,
    TOPOLOGY,
)


@dataclass(frozen=True)
class Wire:
    """How a compressor sends a float32 buffer: bytes on the wire per float32 byte, and its codec's costs."""
    ratio: float = 1.0
    encode: float = 0.0  # seconds per float32 byte encoded
    decode: float = 0.0  # seconds per float32 byte decoded (and added)


NONE = Wire()


def codec(cl, name: str) -> tuple:
    """(encode, decode) seconds per float32 byte of compressor `name` on cluster `cl`: its file's, where it measured
    them (calibrate does, every codec); else on a GPU cluster (nccl) the generation's, from its memory bandwidth
    (schema.py CODEC_PASSES); else 0 (a CPU cluster's file that measured no such codec)."""
    if name in cl.encode_s_per_byte or cl.backend != "nccl" or name not in CODEC_PASSES:
        return cl.encode_s_per_byte.get(name, 0.0), cl.decode_s_per_byte.get(name, 0.0)
    per = 1 / (CODEC_SHARE * HBM_BPS[cl.gpu_arch])
    return tuple(passes * per for passes in CODEC_PASSES[name])


def per_tensor_s(cl, name: str) -> float:
    """What a compressor costs per compressed tensor beyond its bytes where the file measured nothing of it: on a
    GPU cluster, PowerSGD's orthogonalisation and small matmuls (schema.py POWERSGD_TENSOR_S)."""
    if name != "powersgd" or name in cl.encode_s_per_byte or cl.backend != "nccl":
        return 0.0
    return POWERSGD_TENSOR_S[cl.gpu_arch]


def ranks(cl) -> int:
    return cl.nodes * cl.ranks_per_node




def efficiency(link) -> float:
    """The share of line rate a level's transport reaches: its own `efficiency`, else its topology's (schema.py
    TOPOLOGY), else its transport's (EFFICIENCY), a socket's from its streams, 1 / (1 + line rate / (streams x
    ceiling)) (schema.py SOCKET_BPS), at most what its CPU threads move (socket_threads x SOCKET_THREAD_BPS)."""
    if link.efficiency is not None:
        return link.efficiency
    if link.topology:
        return TOPOLOGY[link.transport][link.topology]
    if link.transport != "socket":
        return EFFICIENCY[link.transport]
    streams = link.streams or SOCKET_CHANNELS
    flows = 1 / (1 + 1 / (link.beta_s_per_byte * streams * (link.socket_Bps or SOCKET_BPS)))
    return min(flows, (link.socket_threads or 1.0) * SOCKET_THREAD_BPS * link.beta_s_per_byte)


def beta(link, share: float | None = None) -> float:
    """Seconds per byte as the level's transport moves them: line rate's beta over the share it reaches (`share`
    where given, else the level's own)."""
    return link.beta_s_per_byte / (share or efficiency(link))


def hop(link, nbytes: float, share: float | None = None) -> float:
    """One message over one link: alpha + n beta (at `share` of line rate where given)."""
    return link.alpha_s + nbytes * beta(link, share)


def crossing(link, nbytes: float) -> float:
    """One message of an all-to-all over a link, every rank's messages at once: at the link's
    `all_to_all_efficiency` where it has one. On the story's shaped 25 Mbit/s TCP link a ring (one flow each way)
    reaches 0.86 of the rate and the all-to-all's 4 concurrent flows per node 0.63 (ringexp.bench, 2 x 2 at 2.5 and
    10 MB, docs/results/averaging-story.md): flows started together through a shallow queue (tbf's 100 ms, 312 KB)
    overflow it and lose time to retransmission, TCP incast (Phanishayee et al., FAST 2008)."""
    return hop(link, nbytes, link.all_to_all_efficiency)


def call(cl, took_s: float) -> float:
    """One collective call: its own `took_s`, the host's dispatch (`call_s`) and, where it crosses nodes and keeps
    the node link busy longer than the link's queue holds (`queue_s`), the link's tail (`tail_s`): what such a call
    pays on average beyond its median, a packet lost at a flow's end waiting for a timeout. On the story's shaped
    25 Mbit/s link (tbf, a 100 ms queue) collectives of 2.5 MB paid 10-27 ms over 100 bench rounds; 5 and 64 kB
    ones 0-1 ms, 640 kB 3 ms (docs/plan.md)."""
    crosses = cl.nodes > 1 and took_s > cl.inter.queue_s
    return took_s + cl.call_s + (cl.inter.tail_s if crosses else 0.0)


def straggle(cl, window_s: float) -> float:
    """How long a synchronisation waits for the slowest rank after `window_s` seconds of every rank's own compute:
    the expected largest of p ranks' times over their mean, e(p) x sd. On shared CPU cores a rank's compute varies
    like a sum of scheduling delays, its variance growing with the time it spans: sd = sqrt(jitter_s x T). 4 ranks
    on the 2-core machine: one step of the story's model (35 ms) varied by 8.6 ms, ResNet-18's (396 ms) by 28 ms,
    both jitter_s = 2 ms; a barrier after 1 and 4 steps of the small model waited 9 and 20 ms, this gives 9 and
    17 (after 16: 27 measured, 35 here: the scheduler's fairness evens out long spans)."""
    p = ranks(cl)
    if p < 2 or not cl.jitter_s:
        return 0.0
    return expected_max(p) * math.sqrt(cl.jitter_s * window_s)


@lru_cache(maxsize=64)
def expected_max(p: int) -> float:
    """The expected largest of p standard normal draws, integral of x p phi(x) Phi(x)^(p-1) by the trapezoid rule
    on [-9, 9] (1.029 at 4, 3.241 at 1,000; Blom's closed form is 4% high at 2)."""
    normal, h = NormalDist(), 0.005
    return h * sum(x * p * normal.pdf(x) * normal.cdf(x) ** (p - 1) for x in (-9 + i * h for i in range(3601)))


def slowest_hop(cl, nbytes: float) -> float:
    """A step of a ring over every rank (ranks numbered node by node): each link carries one message at once, so
    the step lasts as long as the slowest of them, an intra-node hop or a node's link."""
    return max(hop(cl.intra, nbytes) if cl.ranks_per_node > 1 else 0.0, hop(cl.inter, nbytes) if cl.nodes > 1 else 0.0)


def all_to_all_s(cl, nbytes: float) -> float:
    """Every rank sends one message of `nbytes` to every other, all posted at once (ranks numbered node by node). A
    node's link carries its k ranks' messages to the p - k ranks elsewhere, k(p - k) in turn, not p - 1: two ranks
    per node double the int8 pseudo-gradient's bytes on the link (an int8 two-phase all-reduce of 2.6 MB on the
    local 2 x 2 cluster at 25 Mbit/s took 0.64 s, about 0.37 s at p - 1; docs/results/averaging-story.md); a
    rank's own p - 1 messages inside its node leave in turn too. The phase lasts as long as the busier; each message
    at the all-to-all's share of the link (`crossing`)."""
    k, p = cl.ranks_per_node, ranks(cl)
    return max(k * (p - k) * crossing(cl.inter, nbytes) if cl.nodes > 1 else 0.0,
               (p - 1) * crossing(cl.intra, nbytes) if k > 1 else 0.0)


def together(cl, wire_s: float, compute_s: float, segments: int = 1) -> float:
    """Communication and the arithmetic pipelined with it over `segments` pieces: the slower of the two, plus
    the other for one piece while the pipeline fills [pipeline fill, as in T's segmented algorithms]. NCCL
    cuts messages into slices far smaller than a chunk: the slower alone. A CPU ring (gloo's, ringexp's) has
    two segments per chunk at most sizes, one below 4 MB: there the times add up."""
    if cl.backend == "nccl":
        return max(wire_s, compute_s)
    return max(wire_s, compute_s) + min(wire_s, compute_s) / segments


def ring_s(cl, n: float, members: int, step, wire: Wire = NONE, reduced: float | None = None,
           segments: int = 1) -> float:
    """Ring reduce-scatter + all-gather of n float32 bytes over `members` ranks [T, P]: 2(members-1) steps, each
    moving one chunk of n/members (as wire bytes) in `step(bytes)` seconds, and (members-1)/members of the
    `reduced` bytes (default n; each rank's own share) summed. With a wire format every reduce-scatter hop
    decodes-and-adds and re-encodes, the finished chunk is encoded once and the all-gather decodes what it
    receives. The ring is pipelined over `segments` per chunk: one segment is added or encoded while the next
    one travels (`together`). On the local cluster this was the closest of three rules: adding the two raised
    every shape's median error by 1.3-1.6 points; the slower alone left more cases beyond 25% on two of the three
    shapes (docs/results/plan.md)."""
    if members <= 1:
        return 0.0
    share = (n if reduced is None else reduced) * (members - 1) / members
    if wire is NONE:
        compute = share * cl.add_s_per_byte
    else:
        compute = share * wire.decode + share * wire.encode + share / (members - 1) * wire.encode + share * wire.decode
    return together(cl, 2 * (members - 1) * step(wire.ratio * n / members), compute, segments)


def ring_gather_s(cl, payload: float, n: float, wire: Wire, share: float | None = None) -> float:
    """All-gather of one `payload` (bytes) per rank round a ring of every rank, then every payload decoded into
    an n-byte float32 buffer [T]: p-1 steps of one payload, the node link's at `share` of its line rate where given
    (gloo's builtin all-gather: its link's all_gather_efficiency)."""
    step = max(hop(cl.intra, payload) if cl.ranks_per_node > 1 else 0.0,
               hop(cl.inter, payload, share) if cl.nodes > 1 else 0.0)
    return (ranks(cl) - 1) * step + ranks(cl) * n * wire.decode + n * wire.encode


def root_gather_s(cl, payload: float, n: float, wire: Wire) -> float:
    """All-gather through rank 0: it receives p-1 payloads (the other nodes' through its node link) and sends
    every one of p-1 ranks the p payloads; then every payload decoded."""
    far, k = (cl.nodes - 1) * cl.ranks_per_node, cl.ranks_per_node
    gather = (k - 1) * hop(cl.intra, payload) + far * hop(cl.inter, payload)
    back = (k - 1) * hop(cl.intra, ranks(cl) * payload) + far * hop(cl.inter, ranks(cl) * payload)
    return gather + back + ranks(cl) * n * wire.decode + n * wire.encode


def overlap_slowdown(cl) -> float:
    """How much slower compute runs while communication runs beside it: the file's, else on NCCL the GPU
    generation's (schema.py OVERLAP_SLOWDOWN), on gloo 0 (a CPU cluster's compute_slowdown holds it)."""
    if cl.overlap_slowdown is not None:
        return cl.overlap_slowdown
    return OVERLAP_SLOWDOWN[cl.gpu_arch] if cl.backend == "nccl" else 0.0


def slowed(cl, comm_s: float, exposed_s: float) -> float:
    """What a step loses beyond compute when `comm_s` seconds of collectives ran, `exposed_s` of them after
    backward: backward lasts overlap_slowdown x the rest longer (the communication beside it slows it), which
    hides as much more of what was exposed."""
    return max(exposed_s, overlap_slowdown(cl) * (comm_s - exposed_s))


def overlap(ready: list, comm: list, backward_s: float) -> tuple:
    """(finish time of the last bucket, exposed seconds) for buckets whose collectives take `comm` seconds,
    each startable at `ready` (seconds into backward), run one at a time in order."""
    end = 0.0
    for r, c in zip(ready, comm, strict=True):
        end = max(end, r) + c
    return end, max(0.0, end - backward_s)


def step(comm_s: float, exposed_s: float, compute: dict, micro_steps: int = 1) -> dict:
    """One optimizer step's figures from its communication and what of it is exposed: `micro_steps` forward and
    backward passes, the exposed communication, the optimizer (`compute`: forward_s, backward_s, optimizer_s)."""
    return {"comm_s": comm_s, "exposed_s": exposed_s, "step_s": work(compute, micro_steps) + exposed_s}


def work(compute: dict, micro_steps: int = 1) -> float:
    """One optimizer step's compute: `micro_steps` forward and backward passes and the optimizer."""
    return micro_steps * (compute["forward_s"] + compute["backward_s"]) + compute["optimizer_s"]
