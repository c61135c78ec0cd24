"""What an all-reduce and a training step cost on a cluster described by a few constants (conf/cluster/): the
model behind `python -m ringexp.plan`. Pure arithmetic on a ClusterConfig; plan.py measures the constants.

Constants. A message of n bytes between two ranks takes alpha + n * beta (Hockney, "The communication challenge
for MPP", Parallel Computing 1994), with one (alpha, beta) per level: `intra` between ranks of a node, `inter`
for a node's link to the others (beta: seconds per byte through the node's whole link, all its ranks together).
gamma = `add_s_per_byte`, the cost of summing a received float32 buffer into one's own; a compressor costs
`encode_s_per_byte` and `decode_s_per_byte` per float32 byte it encodes or decodes (decode includes the add).

Collectives (p = nodes x k ranks; N nodes; w = wire bytes / float32 bytes of the compressor, 1 for none):
- ring (ringexp's, and builtin: gloo's and NCCL's all-reduce are rings too) [T, eq. for ring reduce-scatter +
  all-gather; P]: 2(p-1) steps of n/p bytes, every link busy at once, so a step is paced by the slowest hop
  (inter when the ring crosses nodes): 2(p-1) alpha + 2(p-1)/p w n beta + (p-1)/p n gamma.
- two_level [NCCL's and Horovod's hierarchical all-reduce; S]: ring reduce-scatter inside the node (k ranks),
  k rings between nodes each on n/k bytes (together n bytes through each node's link), all-gather inside.
- leader (seed article 000): gather to the node's first rank (k-1 whole buffers in turn), a ring of the N
  leaders on n bytes, and the result sent back to the k-1 others in turn.
- naive (the parameter server): rank 0 receives p-1 whole buffers in turn, sums, and sends p-1 back.
- payloads that cannot be summed (top-k, sign, int8 on builtin) are all-gathered: (p-1)(alpha + payload beta),
  then p decodes [T, ring all-gather].
Sources: [T] Thakur, Rabenseifner, Gropp, "Optimization of collective communication operations in MPICH",
IJHPCA 2005. [P] Patarasuk, Yuan, "Bandwidth optimal all-reduce algorithms for clusters of workstations",
JPDC 2009. [S] Sergeev, Del Balso, "Horovod", arXiv:1802.05799, and NCCL's src/graph/tuning.cc (the same
latency x steps + bytes / bandwidth per algorithm).

A training step (DDP): forward, then backward, during which each bucket's all-reduce starts when backward has
produced its gradients (buckets in the order DDP fills them, which is backward's order) and runs one after
another on one stream; exposed communication is what is left after backward ends [the overlap model of
Echo (Wang et al. 2024) and ASTRA-sim in its simplest form: compute is not slowed by communication].
FSDP (ZeRO-3) moves 3 x (p-1)/p of the parameters per step (two all-gathers, one reduce-scatter; Rajbhandari
et al., "ZeRO", SC 2020; on gloo the reduce-scatter is a whole all-reduce) and overlaps only through its
one-block prefetch, which this model leaves out.
"""

import dataclasses
import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ringexp import compress
from ringexp.comm import ring

ALGORITHMS = ("builtin", "ring", "two_level", "leader", "naive")


@dataclass(frozen=True)
class Wire:
    """How a compressor sends a float32 buffer: bytes on the wire per float32 byte, and its codec's costs."""
    ratio: float = 1.0
    encode: float = 0.0  # seconds per float32 byte encoded
    decode: float = 0.0  # seconds per float32 byte decoded (and added)


NONE = Wire()


def hop(link, nbytes: float) -> float:
    """One message over one link: alpha + n beta."""
    return link.alpha_s + nbytes * link.beta_s_per_byte


def slowest_hop(cl, nbytes: float) -> float:
    """A step of a ring over every rank (ranks numbered node by node): each link carries one message at once, so
    the step lasts as long as the slowest of them, an intra-node hop or a node's link."""
    return max(hop(cl.intra, nbytes) if cl.ranks_per_node > 1 else 0.0, hop(cl.inter, nbytes) if cl.nodes > 1 else 0.0)


def together(cl, wire_s: float, compute_s: float, segments: int = 1) -> float:
    """Communication and the arithmetic pipelined with it over `segments` pieces: the slower of the two, plus
    the other for one piece while the pipeline fills [pipeline fill, as in T's segmented algorithms]. NCCL
    cuts messages into slices far smaller than a chunk: the slower alone. A CPU ring (gloo's, ringexp's) has
    two segments per chunk at most sizes, one below 4 MB: there the times add up."""
    if cl.backend == "nccl":
        return max(wire_s, compute_s)
    return max(wire_s, compute_s) + min(wire_s, compute_s) / segments


def segments(chunk_bytes: float) -> int:
    """Pipeline segments per chunk of ringexp's ring (and gloo's, which it copies): half a chunk each, within
    ringexp.comm.ring's bounds."""
    size = min(max(chunk_bytes / 2, ring.MIN_AUTO), ring.MAX_AUTO)
    return max(1, math.ceil(chunk_bytes / size))


def ring_s(cl, n: float, ranks: int, step, wire: Wire = NONE, reduced: float | None = None) -> float:
    """Ring reduce-scatter + all-gather of n float32 bytes over `ranks` ranks [T, P]: 2(ranks-1) steps, each
    moving one chunk of n/ranks (as wire bytes) in `step(bytes)` seconds, and (ranks-1)/ranks of the `reduced`
    bytes (default n; each rank's own share) summed. With a wire format every reduce-scatter hop decodes-and-
    adds and re-encodes, the finished chunk is encoded once and the all-gather decodes what it receives.
    The rings are pipelined over segments: one segment is added or encoded while the next one travels
    (`together`). On the local cluster this was the closest of three rules: adding the two raised every shape's
    median error by 1.3-1.6 points; the slower alone left more cases beyond 25% on two of the three shapes
    (docs/results/plan.md)."""
    if ranks <= 1:
        return 0.0
    share = (n if reduced is None else reduced) * (ranks - 1) / ranks
    if wire is NONE:
        compute = share * cl.add_s_per_byte
    else:
        compute = share * wire.decode + share * wire.encode + share / (ranks - 1) * wire.encode + share * wire.decode
    return together(cl, 2 * (ranks - 1) * step(wire.ratio * n / ranks), compute, segments(n / ranks))


def all_reduce_s(cl, n: float, algorithm: str, wire: Wire = NONE, inter_only: bool = False) -> float:
    """Seconds for one all-reduce of n float32 bytes over the whole cluster. `inter_only`: the wire format is
    used between nodes only (hierarchical with compression.scope=inter_node)."""
    nodes, k = cl.nodes, cl.ranks_per_node
    inside = NONE if inter_only else wire
    if algorithm in ("builtin", "ring") or (algorithm == "two_level" and (nodes == 1 or k == 1)):
        return ring_s(cl, n, nodes * k, lambda b: slowest_hop(cl, b), wire)
    if algorithm == "two_level":
        # ring inside each node; then k rings between nodes, each on this rank's n/k shard: together they put
        # n bytes per all-reduce through each node's link, as one ring of n bytes would
        intra = ring_s(cl, n, k, lambda b: hop(cl.intra, b), inside)
        return intra + ring_s(cl, n, nodes, lambda b: hop(cl.inter, b), wire, reduced=n / k)
    if algorithm == "leader":
        # the node's first rank receives and sums k-1 whole buffers in turn, the leaders run a ring, and the
        # result goes back to the k-1 others in turn
        add = cl.add_s_per_byte if inside is NONE else inside.decode + inside.encode / (k or 1)
        gather = (k - 1) * (hop(cl.intra, inside.ratio * n) + n * add)
        back = (k - 1) * hop(cl.intra, inside.ratio * n)
        return gather + ring_s(cl, n, nodes, lambda b: hop(cl.inter, b), wire) + back
    if algorithm == "naive":
        # rank 0 receives p-1 whole buffers in turn (the other nodes' through its node link), sums, sends back
        far = (nodes - 1) * k
        one_way = (k - 1) * hop(cl.intra, wire.ratio * n) + far * hop(cl.inter, wire.ratio * n)
        ranks = nodes * k
        compute = (ranks - 1) * n * (cl.add_s_per_byte if wire is NONE else wire.decode)
        if wire is NONE:  # the adds wait for each buffer; the next one is on its way meanwhile only with a codec
            return 2 * one_way + compute
        return together(cl, one_way, compute + n * wire.encode) + one_way
    raise ValueError(f"the cost model has no all-reduce {algorithm!r}; choose from {', '.join(ALGORITHMS)}")


def all_gather_s(cl, payload: float, n: float, wire: Wire, algorithm: str = "ring") -> float:
    """All-gather of one `payload` (bytes) per rank, then every payload decoded into an n-byte float32 buffer [T].
    naive goes through rank 0: it receives p-1 payloads and sends p-1 times the p payloads."""
    ranks, nodes, k = cl.nodes * cl.ranks_per_node, cl.nodes, cl.ranks_per_node
    decode = ranks * n * wire.decode + n * wire.encode
    if algorithm == "naive":
        far = (nodes - 1) * k
        gather = (k - 1) * hop(cl.intra, payload) + far * hop(cl.inter, payload)
        return gather + (k - 1) * hop(cl.intra, ranks * payload) + far * hop(cl.inter, ranks * payload) + decode
    return (ranks - 1) * slowest_hop(cl, payload) + decode  # a ring all-gather: p-1 steps of one payload


def overlap(ready: list, comm: list, backward_s: float) -> tuple:
    """(finish time of the last bucket, exposed seconds) for buckets whose all-reduces take `comm` seconds,
    each startable at `ready` (seconds into backward), run one at a time in order."""
    end = 0.0
    for r, c in zip(ready, comm, strict=True):
        end = max(end, r) + c
    return end, max(0.0, end - backward_s)


def ddp_step(buckets: list, comm: list, forward_s: float, backward_s: float, optimizer_s: float,
             micro_steps: int = 1) -> dict:
    """One optimizer step of DDP-like data parallelism: `buckets` (bytes, in DDP's order) ready in proportion to
    the gradient bytes backward has produced; with accumulation, micro_steps - 1 micro-steps without
    communication come first (DDP's no_sync), so communication per sample falls by micro_steps."""
    total, ready, done = sum(buckets) or 1, [], 0
    for b in buckets:
        done += b
        ready.append(backward_s * done / total)
    _, exposed = overlap(ready, comm, backward_s)
    step = micro_steps * (forward_s + backward_s) + exposed + optimizer_s
    return {"comm_s": sum(comm), "exposed_s": exposed, "step_s": step}


def fsdp_step(cl, param_bytes: float, forward_s: float, backward_s: float, optimizer_s: float,
              gather_ratio: float = 1.0, reduce_ratio: float = 1.0, micro_steps: int = 1,
              reduce_scatter_as_all_reduce: bool = False) -> dict:
    """One optimizer step of FSDP (ZeRO-3, parameters resharded after forward): parameters all-gathered (in
    the param dtype: `gather_ratio` of float32) in forward and again in backward for every micro-step,
    gradients reduce-scattered (in the reduce dtype) on the last [ZeRO's 3 x (p-1)/p of the parameters]; gloo,
    which has no reduce-scatter, all-reduces the whole buffer instead (ringexp/parallel/fsdp.py)."""
    ranks = cl.nodes * cl.ranks_per_node
    gather = (ranks - 1) * slowest_hop(cl, gather_ratio * param_bytes / ranks)
    wire = NONE if reduce_ratio == 1 else Wire(reduce_ratio, 0.0, cl.add_s_per_byte)
    scatter = ring_s(cl, param_bytes, ranks, lambda b: slowest_hop(cl, b), wire)
    if not reduce_scatter_as_all_reduce:  # half a ring: its reduce-scatter
        scatter /= 2
    comm = micro_steps * 2 * gather + scatter
    return {"comm_s": comm, "exposed_s": comm, "step_s": micro_steps * (forward_s + backward_s) + comm + optimizer_s}


def algorithm_of(cfg) -> str:
    """The all-reduce a training config's strategy runs (the model's name for it)."""
    p = cfg.parallel
    return {"ddp": "builtin", "ring": "ring", "naive": "naive"}.get(str(p.strategy)) or str(p.variant)


def wire_of(cl, c, numel: int, layout=None) -> Wire:
    """Compressor config `c` as a Wire: its payload size once warm, and its codec costs from the cluster file."""
    ratio = compress.payload_bytes(c, numel, layout) / (4 * numel)
    return Wire(ratio, cl.encode_s_per_byte.get(c.name, 0.0), cl.decode_s_per_byte.get(c.name, 0.0))


def compressed_s(cl, c, algo: str, numel: int, layout=None) -> float:
    """One all-reduce of `numel` float32 elements through compressor config `c` on algorithm `algo`: the three
    paths of ringexp.compress.all_reduce (a wire format inside the collective; encode, all-reduce the payload,
    decode; all-gather the payloads and decode every one)."""
    n, m = 4 * numel, compress.COMPRESSORS[c.name]
    if m is None:
        return all_reduce_s(cl, n, algo)
    wire = wire_of(cl, c, numel, layout)
    if m.WIRE and algo != "builtin":
        return all_reduce_s(cl, n, algo, wire, inter_only=str(c.scope) == "inter_node")
    if m.sum_dtype(c) is not None:
        return n * (wire.encode + wire.decode) + all_reduce_s(cl, wire.ratio * n, algo)
    return all_gather_s(cl, wire.ratio * n, n, wire, "naive" if algo == "naive" else "ring")


def bucket_s(cl, cfg, shapes: list) -> float:
    """One DDP bucket (parameters of `shapes`) reduced as the config's strategy and compressor do it; PowerSGD:
    three all-reduces (vectors, P, Q) of its small factors plus its own arithmetic [Vogels et al. 2019]."""
    c, algo = cfg.compression, algorithm_of(cfg)
    numel = sum(s.numel() for s in shapes)
    if c.name == "powersgd":
        small = 4 * compress.powersgd.wire_numel(shapes, c)
        return 2 * all_reduce_s(cl, 0, algo) + all_reduce_s(cl, small, algo) + 4 * numel * cl.encode_s_per_byte.get(
            c.name, 0.0)
    return compressed_s(cl, c, algo, numel, [s.numel() for s in shapes])


def fsdp_ratios(cfg) -> tuple:
    """(gather, reduce) bytes over float32's: FSDP gathers parameters in amp's dtype and reduces gradients in
    compression's cast (ringexp/parallel/fsdp.py's MixedPrecisionPolicy)."""
    half = ("fp16", "bf16")
    return 0.5 if str(cfg.amp.mode) in half else 1.0, 0.5 if cfg.compression.name in half else 1.0


def ddp_buckets(cfg, shapes: list) -> list:
    """DDP's buckets as lists of parameter shapes, in the order they fill: torch's own assignment function, as
    DDP's reducer calls it when it rebuilds its buckets after the first step (parameters in the order backward
    produced their gradients, about the reverse of the model's; every bucket capped at bucket_cap_mb, the
    first one too, since ringexp always passes bucket_cap_mb)."""
    params = [torch.empty(s, device="meta") for s in reversed(shapes)]
    groups, _ = dist._compute_bucket_assignment_by_size(params, [int(cfg.parallel.bucket_cap_mb * (1 << 20))])
    return [[params[i].shape for i in g] for g in groups]


def predict_step(cl, cfg, shapes: list, forward_s: float, backward_s: float, optimizer_s: float,
                 powersgd_s: float | None = None) -> dict:
    """Communication, exposed communication and step time of training config `cfg` (its strategy, compressor,
    bucket size and accumulation) for a model of parameter `shapes`, with the compute times given.
    `powersgd_s`: PowerSGD's own arithmetic per step, measured for these shapes (compress.powersgd.arithmetic_s),
    instead of the cluster file's cost per byte."""
    micro = cfg.accumulation.steps
    if powersgd_s is not None and cfg.compression.name == "powersgd":
        per_byte = powersgd_s / (4 * sum(s.numel() for s in shapes))
        cl = dataclasses.replace(cl, encode_s_per_byte={**cl.encode_s_per_byte, "powersgd": per_byte})
    if str(cfg.parallel.strategy) == "fsdp":
        out = fsdp_step(cl, 4 * sum(s.numel() for s in shapes), forward_s, backward_s, optimizer_s,
                        *fsdp_ratios(cfg), micro, reduce_scatter_as_all_reduce=cl.backend == "gloo")
    else:
        buckets = ddp_buckets(cfg, shapes)
        comm = [bucket_s(cl, cfg, b) for b in buckets]
        out = ddp_step([sum(s.numel() for s in b) for b in buckets], comm, forward_s, backward_s, optimizer_s, micro)
    ranks = cl.nodes * cl.ranks_per_node
    return out | {"samples_s": ranks * micro * cfg.data.batch_size / out["step_s"]}
