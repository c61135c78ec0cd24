"""Two-phase compressed all-reduce: payloads that cannot be summed on the wire (sign, int8 with per-rank scales,
top-k) reduced without gathering every rank's, so each rank sends about 2(p-1)/p of one payload whatever p is.

The shape of DeepSpeed's compressed_allreduce (deepspeed/runtime/comm/nccl.py, 1-bit and 0/1 Adam) and of Bagua's
ByteGrad (a compressed scatter-reduce, then a compressed all-gather):
1. the buffer is cut into p chunks (ring.chunk_bounds), and each rank compresses every chunk, with its own error
   feedback (`codec.residual("worker", ...)`);
2. an all-to-all: rank q receives every rank's payload of chunk q (p-1 messages of one chunk's payload);
3. the owner decodes and sums them in rank order, adds its own error feedback ("owner") and compresses the sum
   again (top-k: k/p of the chunk's elements, as every chunk is 1/p of the buffer);
4. an all-gather of the owners' payloads: every rank decodes every chunk, the owner its own too, so all ranks
   end with the same numbers.
Both exchanges are point-to-point messages posted at once (p2p.batch: on NCCL one batch, as torch's own
all_to_all is), over `members` of `group` (a sub-ring: hierarchical's inter-node stage) or all of it.

`codec` (ringexp.compress.phases builds it for a compressor, a bucket and its error feedback):
    part(lo, hi) -> the codec of elements [lo, hi) (sign: the scales of the parameters in them): nbytes(numel),
        encode(x) -> uint8 payload, add_into(payload, dst), copy_into(payload, dst)
    residual(role, x) -> x plus that role's residual (x itself, or a new tensor)
    keep(role, x, sent): that role's residual becomes x - sent (or nothing, without error feedback)
    feedback: whether it keeps residuals at all (else the worker's encodings are not decoded again)
"""

from types import SimpleNamespace

import torch

from ringexp.cluster import costmodel
from ringexp.comm.p2p import batch, finish, global_rank, members_of, wait, work_copy
from ringexp.comm.ring import chunk_bounds

OPTIONS = ("timeout_s", "members")


def all_reduce(tensor, group, codec, members=None, timeout_s=None, **_options):
    """Sum `tensor` (a float tensor) over the ring's ranks through `codec`'s format, in place; returns it."""
    ring, r = members_of(group, members)
    n = len(ring)
    if n == 1 or tensor.numel() == 0:
        return tensor
    flat = work_copy(tensor)
    bounds = chunk_bounds(flat.numel(), n)
    parts = [codec.part(b, e) for b, e in bounds]
    x = codec.residual("worker", flat)
    payloads = [part.encode(x[b:e]) for part, (b, e) in zip(parts, bounds, strict=True)]
    if codec.feedback:  # what this rank's encodings lost: decode them (not needed without error feedback)
        sent = torch.empty_like(x)
        for part, payload, (b, e) in zip(parts, payloads, bounds, strict=True):
            part.copy_into(payload, sent[b:e])
        codec.keep("worker", x, sent)
    mine, (lo, hi) = parts[r], bounds[r]
    theirs = exchange(group, ring, r, payloads, [mine.nbytes(hi - lo)] * n, "all-to-all", timeout_s)
    total = torch.zeros(hi - lo, dtype=torch.float32, device=flat.device)
    for q in range(n):  # in rank order: the same sum on every rank, whichever arrived first
        mine.add_into(payloads[r] if q == r else theirs[q], total)
    total = codec.residual("owner", total)
    out = mine.encode(total)
    mine.copy_into(out, flat[lo:hi])
    codec.keep("owner", total, flat[lo:hi])
    gathered = exchange(group, ring, r, [out] * n, [parts[q].nbytes(e - b) for q, (b, e) in enumerate(bounds)],
                        "all-gather", timeout_s)
    for q, (b, e) in enumerate(bounds):
        if q != r:
            parts[q].copy_into(gathered[q], flat[b:e])
    return finish(tensor, flat)


def shifted(codec, offset: int):
    """`codec` for a tensor that starts `offset` elements into the one it was made for (hierarchical's shards)."""
    return SimpleNamespace(part=lambda lo, hi: codec.part(lo + offset, hi + offset), residual=codec.residual,
                           keep=codec.keep, feedback=codec.feedback)


def exchange(group, ring, r: int, outgoing: list, sizes: list, phase: str, timeout_s) -> list:
    """Send outgoing[q] to the ring's q-th rank and receive sizes[q] bytes from it, for every q but ourselves,
    all at once; returns what arrived by position (None at our own). A wait that times out names the phase and
    the peer."""
    device = outgoing[r].device
    incoming = [None if q == r else torch.empty(sizes[q], dtype=torch.uint8, device=device) for q in range(len(ring))]
    peers = [q for q in range(len(ring)) if q != r]
    sends = [(outgoing[q], ring[q]) for q in peers if outgoing[q].numel()]
    recvs = [(incoming[q], ring[q]) for q in peers if sizes[q]]
    sent, received = batch(sends, recvs, group, lambda: f"two-phase all-reduce: {phase}: cannot post")
    cuda = device.type == "cuda"
    labels = [peer for _, peer in recvs] if len(received) == len(recvs) else [None] * len(received)
    for work, peer in zip(received, labels, strict=True):
        wait(work, timeout_s, lambda p=peer: f"two-phase all-reduce: {phase}: nothing from " + (
            f"rank {global_rank(group, p)}" if p is not None else "a peer"), cuda)
    for work in sent:
        wait(work, timeout_s, f"two-phase all-reduce: {phase}: a peer did not take our data", cuda)
    return incoming


def wire_bytes(chunk_bytes: list) -> int:
    """Bytes the busiest rank sends, given each chunk's payload size: its p-1 chunk payloads in the all-to-all,
    then its own chunk's payload to p-1 ranks."""
    total, n = sum(chunk_bytes), len(chunk_bytes)
    return max(total - b + (n - 1) * b for b in chunk_bytes) if n > 1 else 0


def seconds(cl, coded: float, members: int, phase, wire: costmodel.Wire, through: float | None = None) -> float:
    """Predicted seconds of one two-phase all-reduce over `members` ranks of `coded` float32 bytes per rank, each
    message in `wire`'s format: two exchanges, each lasting `phase(bytes)` when every rank sends one chunk payload
    of that many bytes to each other member at once (costmodel.all_to_all_s; `through`: the float32 bytes whose
    payloads cross each link at once, default `coded`: hierarchical's inter-node stages of all local ranks share
    their node's link), and the codec on one rank: every chunk encoded and the owner's p chunks decoded and added,
    its sum encoded, every chunk decoded. The phases wait for each other, so the codec and the wire add up."""
    if members <= 1:
        return 0.0
    chunk = wire.ratio * (coded if through is None else through) / members
    # each decode writes a dense float32 buffer, a memory pass at least (a sparse codec's own decode is k-bound)
    dense = max(wire.decode, cl.add_s_per_byte)
    codec = coded * (wire.encode + dense) + coded / members * wire.encode + coded * dense
    return 2 * phase(chunk) + codec
