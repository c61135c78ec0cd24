"""Ring all-reduce from point-to-point ops: reduce-scatter, then all-gather (as in the seed articles).

The buffer is cut into n chunks (n = ranks in the ring). In reduce-scatter step s, rank r sends chunk
(r - s) to its right neighbour and adds chunk (r - s - 1) from its left neighbour into its own copy; after
n - 1 steps it holds the full sum of chunk (r + 1). All-gather then passes the finished chunks around the
ring for n - 1 more steps. Each rank sends 2(n-1)/n of the buffer, whatever n is: why the ring scales.

Engineering on top of the textbook version:
- chunks are cut into segments, and every (step, segment) is one pipelined operation: a segment is
  forwarded as soon as it is reduced, not when its whole step is done (no barrier per step), and up to
  `depth` receives are posted ahead, so sending, receiving and adding overlap;
- receive buffers for the reduce-scatter are allocated once per thread and reused;
- every wait has a timeout and names the phase, step and peer;
- on GPUs (NCCL), where a rank's point-to-point operations run one after another in the order posted, each
  (step, segment)'s receive goes out in one batch with its send, and nothing is posted ahead: the kernels queue
  on the device while the host goes on (ringexp.comm.p2p.exchange).
"""

import math

import torch

from ringexp.cluster import costmodel
from ringexp.comm.buffers import scratch
from ringexp.comm.p2p import exchange, finish, global_rank, irecv, isend, members_of, wait, work_copy

# Segment size when none is given: half a chunk (two segments in flight, as gloo's own ring does), but at least
# MIN_AUTO (each message costs a rendezvous and wake-ups: 256 KiB segments were 2x slower at 1-64 MB) and at
# most MAX_AUTO (bounds the receive buffers). Measured with `python -m ringexp.bench
# algorithms=[builtin,ring,ring:2048,ring:4096,ring:16384]` on the 2-core CPU machine: see the README.
MIN_AUTO, MAX_AUTO = 1 << 20, 16 << 20
DEPTH = 4  # receives posted ahead of the one being reduced (2 was 10-20% slower at 16-256 MB, 8 no better)

# all_reduce's options (ringexp.comm refuses others)
OPTIONS = ("segment_bytes", "timeout_s", "wire", "divisor", "paired")


def chunk_bounds(numel: int, n: int) -> list:
    """n contiguous chunks whose sizes differ by at most one element (some may be empty)."""
    base, extra = divmod(numel, n)
    bounds, start = [], 0
    for c in range(n):
        end = start + base + (c < extra)
        bounds.append((start, end))
        start = end
    return bounds


def _buffers(numel: int, dtype, device) -> list:
    """`DEPTH` reusable receive buffers of `numel` elements."""
    return [scratch(f"ring-receive-{i}", numel, dtype, device) for i in range(DEPTH)]


def _pipeline(flat, group, members, seg, steps, timeout_s, wire=None, divisor=None, paired=None) -> None:
    """Run ring steps `steps` (a range within 0 .. 2n-3) over all segments as one pipeline.

    Steps 0 .. n-2 are the reduce-scatter, n-1 .. 2n-3 the all-gather. In both, step s sends chunk r - s
    and receives chunk r - s - 1 (mod n): what a rank receives in step s is exactly what it sends on in
    step s + 1, so each segment is forwarded the moment it has arrived (and, in the reduce-scatter, been
    added), and the two phases run as one pipeline with no barrier between steps.

    `wire` (a compressor's nbytes/encode/decode, see ringexp.compress) puts a low-precision format on the wire
    while sums stay float32: each reduce-scatter hop decodes, adds in float32 and re-encodes; the finished
    chunk is encoded once (and its owner keeps the decoded value, so every rank ends with the same numbers),
    and the all-gather forwards those bytes unchanged.

    `members`: the ranks of `group` that form the ring, in ring order (None: all of them). `divisor`: each
    segment's finished sum is divided by it right after its last add, before the all-gather sends it on (a rank
    divides the 1/n it finishes, not the whole buffer: a DDP hook's mean costs no pass of its own).

    `paired` (default: on CUDA tensors) posts each operation's receive with its send as one batch, in the same
    order on every rank, as NCCL needs; otherwise receives go `DEPTH` ahead (what gloo needs to go fast)."""
    p = _Pipeline(flat, group, members, seg, steps, timeout_s, wire, divisor)
    if flat.is_cuda if paired is None else paired:
        # Every receive is taken (on a GPU: its add queued behind its batch, the host going on) before the next
        # batch: what a step sends arrived in the step before, and one receive buffer in use at a time.
        for i in range(len(p.ops)):
            if i:
                p.receive(i - 1)
            p.exchange(i)
        p.receive(len(p.ops) - 1)
    else:
        for i in range(min(DEPTH, len(p.ops))):
            p.post(i)
        for j in range(p.nseg):  # the first step sends data that is ready now
            p.send(steps[0], j)
        for i, (s, j) in enumerate(p.ops):
            p.receive(i)
            if i + DEPTH < len(p.ops):
                p.post(i + DEPTH)
            if s + 1 in steps:
                p.send(s + 1, j)
    for works, _payload in p.sends:
        for work in works:
            wait(work, timeout_s, f"ring all-reduce: rank {global_rank(group, p.right)} did not take our data",
                 flat.is_cuda)


class _Pipeline:
    """The state of one pipelined pass: the (step, segment) operations, receives posted ahead, sends in flight."""

    def __init__(self, flat, group, members, seg, steps, timeout_s, wire, divisor=None):
        self.flat, self.group, self.seg, self.steps = flat, group, seg, steps
        self.timeout_s, self.wire, self.divisor = timeout_s, wire, divisor
        ring, self.r = members_of(group, members)  # our position in the ring; chunks are numbered by position
        self.n = len(ring)
        self.bounds = chunk_bounds(flat.numel(), self.n)
        self.right, self.left = ring[(self.r + 1) % self.n], ring[(self.r - 1) % self.n]  # ranks in `group`
        self.nseg = max(1, math.ceil(max(e - b for b, e in self.bounds) / seg))
        self.ops = [(s, j) for s in steps for j in range(self.nseg)]
        if wire is None:
            self.bufs = _buffers(min(seg, flat.numel()), flat.dtype, flat.device)
        else:  # encoded sends of steps 0 .. n-1 and all-gather receives each get a slot of one reused arena
            self.slot_bytes = -(-wire.nbytes(min(seg, flat.numel())) // 8) * 8
            self.bufs = _buffers(self.slot_bytes, torch.uint8, flat.device)
            # encoded sends and all-gather receives of the wire path
            self.arena = scratch("ring-arena", (2 * self.n - 1) * self.nseg * self.slot_bytes, torch.uint8,
                                 flat.device)
        self.pending, self.sends, self.received = {}, [], {}  # wire: received bytes to forward

    def view(self, chunk, j):
        b, e = self.bounds[chunk % self.n]
        lo, hi = b + j * self.seg, min(b + (j + 1) * self.seg, e)
        return self.flat[lo:hi] if hi > lo else None

    def slot(self, k, j):
        """Arena slot k = s for the sends of steps 0 .. n-1; s + 1 for all-gather receives (s >= n-1)."""
        i = k * self.nseg + j
        return self.arena[i * self.slot_bytes:(i + 1) * self.slot_bytes]

    def incoming(self, i):
        """(where operation i's segment lands, where it belongs), or None where its chunk has no such segment."""
        s, j = self.ops[i]
        dst = self.view(self.r - s - 1, j)
        if dst is None:
            return None
        # All-gather receives go straight into place. Our reduce-scatter send from that region may still
        # be in flight, but that is safe: the finished sum that arrives there includes what we sent, so it
        # cannot reach us before the right neighbour has received all of our send.
        reduce = s < self.n - 1
        if self.wire is None:
            into = self.bufs[i % DEPTH][: dst.numel()] if reduce else dst
        else:
            into = (self.bufs[i % DEPTH] if reduce else self.slot(s + 1, j))[:self.wire.nbytes(dst.numel())]
        return into, dst

    def post(self, i) -> None:
        if (landing := self.incoming(i)) is not None:
            s, j = self.ops[i]
            work = irecv(landing[0], self.group, self.left, lambda: self.where(s, j, "nothing from", self.left))
            self.pending[i] = ([work], landing[1], landing[0])

    def exchange(self, i) -> None:
        """Operation i's send and receive as one batch (NCCL's order: see _pipeline)."""
        s, j = self.ops[i]
        landing, payload = self.incoming(i), self.outgoing(s, j)
        sent, received = exchange(None if payload is None else (payload, self.right),
                                  None if landing is None else (landing[0], self.left), self.group,
                                  lambda: self.where(s, j, "cannot exchange with", self.left))
        if landing is not None:
            self.pending[i] = (received, landing[1], landing[0])
        if payload is not None:
            self.sends.append((sent, payload))

    def receive(self, i) -> None:
        """Wait for operation i's segment; add it (reduce-scatter) or take it (all-gather)."""
        if i not in self.pending:
            return
        (s, j), n, wire = self.ops[i], self.n, self.wire
        works, dst, into = self.pending.pop(i)
        for work in works:
            wait(work, self.timeout_s, lambda: self.where(s, j, "nothing from", self.left), dst.is_cuda)
        if s < n - 1:
            dst.add_(into) if wire is None else wire.add_into(into, dst)
            if s == n - 2 and self.divisor is not None:  # this segment of our chunk is complete
                dst.div_(self.divisor)
        elif wire is not None:
            wire.copy_into(into, dst)
            if s + 1 in self.steps:
                self.received[(s, j)] = into

    def send(self, s, j) -> None:
        if (payload := self.outgoing(s, j)) is not None:
            work = isend(payload, self.group, self.right, lambda: self.where(s, j, "cannot send to", self.right))
            self.sends.append(([work], payload))

    def outgoing(self, s, j):
        """What step s sends of segment j (encoded on the wire path), or None where its chunk has no such segment."""
        src = self.view(self.r - s, j)
        if src is None:
            return None
        wire = self.wire
        if wire is None:
            payload = src
        elif s < self.n - 1:  # a partial sum, re-encoded at every hop
            payload = wire.encode_into(src, self.slot(s, j))
        elif s == self.n - 1:  # our finished segment: keep what the others will decode
            payload = wire.encode_into(src, self.slot(s, j))
            wire.copy_into(payload, src)
        else:  # the all-gather forwards what it received
            payload = self.received.pop((s - 1, j))
        return payload

    def where(self, s, j, what: str, peer: int) -> str:
        """Which step and segment of which phase, and the peer: what a failure message says."""
        n = self.n
        phase = f"reduce-scatter step {s + 1}" if s < n - 1 else f"all-gather step {s - n + 2}"
        return (f"ring all-reduce: {phase}/{n - 1}, segment {j + 1}/{self.nseg}: {what} rank "
                f"{global_rank(self.group, peer)}")


def _segment(flat, n: int, segment_bytes) -> int:
    """Elements per segment: `segment_bytes` if given, else half a chunk within [MIN_AUTO, MAX_AUTO]."""
    if segment_bytes is None:
        half_chunk = math.ceil(flat.numel() * flat.element_size() / (2 * n))
        segment_bytes = min(max(half_chunk, MIN_AUTO), MAX_AUTO)
    if segment_bytes < 1:
        raise ValueError(f"segment_bytes={segment_bytes}: must be >= 1")
    return max(1, segment_bytes // flat.element_size())


def reduce_scatter(flat, group=None, segment_bytes=None, timeout_s=None, wire=None, members=None,
                   paired=None) -> int:
    """Sum `flat` over the ring so that this rank holds the full sum of one chunk; returns its index."""
    ring, r = members_of(group, members)
    n = len(ring)
    _pipeline(flat, group, ring, _segment(flat, n, segment_bytes), range(n - 1), timeout_s, wire, paired=paired)
    return (r + 1) % n


def all_gather(flat, group=None, segment_bytes=None, timeout_s=None, wire=None, members=None,
               paired=None) -> None:
    """The inverse: every rank holds the finished chunk reduce_scatter left it; afterwards, all chunks."""
    n = len(members_of(group, members)[0])
    _pipeline(flat, group, members, _segment(flat, n, segment_bytes), range(n - 1, 2 * n - 2), timeout_s, wire,
              paired=paired)


def all_reduce(tensor, group=None, segment_bytes=None, timeout_s=None, wire=None, members=None, divisor=None,
               paired=None, **_options):
    """Sum `tensor` in place over the ring; with `divisor`, the sum divided by it (the world size: the mean).
    `paired`: NCCL's schedule (see _pipeline; default: on CUDA tensors), which gloo runs too."""
    n = len(members_of(group, members)[0])
    if tensor.numel() == 0:
        return tensor
    if n == 1:
        if divisor is not None:
            tensor.detach().div_(divisor)
        return tensor
    flat = work_copy(tensor)
    _pipeline(flat, group, members, _segment(flat, n, segment_bytes), range(2 * n - 2), timeout_s, wire, divisor,
              paired)
    return finish(tensor, flat)


def wire_bytes(nbytes: int, world_size: int, wire_ratio: float = 1.0, **_options) -> int:
    """`wire_ratio`: encoded / float32 bytes of a compressor on the wire (ringexp.compress)."""
    return int(2 * (world_size - 1) * nbytes * wire_ratio) // world_size if world_size > 1 else 0


def segments(chunk_bytes: float) -> int:
    """Pipeline segments per chunk of `chunk_bytes` with the automatic segment size (and gloo's ring, which this one
    copies): half a chunk each, within [MIN_AUTO, MAX_AUTO]."""
    size = min(max(chunk_bytes / 2, MIN_AUTO), MAX_AUTO)
    return max(1, math.ceil(chunk_bytes / size))


def seconds(cl, nbytes: float, wire=costmodel.NONE, **_options) -> float:
    """Predicted time of one all-reduce of `nbytes` float32 bytes over every rank of cluster `cl`: 2(p-1) steps of
    one chunk, each paced by the slowest hop (ringexp.cluster.costmodel.ring_s), encoded as `wire` at every hop."""
    p = costmodel.ranks(cl)
    return costmodel.ring_s(cl, nbytes, p, lambda b: costmodel.slowest_hop(cl, b), wire, segments=segments(nbytes / p))
