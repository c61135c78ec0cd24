"""The bench's own keys (BenchConfig, conf/bench.yaml's root)."""

from dataclasses import dataclass, field
from typing import List, Optional

from ringexp.config import Device, LoggerConfig, need, register


@dataclass
class BenchLauncherConfig:
    device: Device = Device.auto  # cuda: NCCL, one GPU per rank; cpu: gloo; auto: cuda where nprocs find GPUs


@dataclass
class BenchConfig:
    """`python -m ringexp.bench`: all-reduce algorithms x message sizes x dtypes x world sizes."""
    algorithms: List[str] = field(default_factory=lambda: ["builtin", "ring", "hierarchical", "hierarchical:leader",
                                                           "naive"])
    compressors: List[str] = field(default_factory=lambda: ["none"])  # each algorithm again per compressor
    ratio: float = 0.01  # topk / randomk in the bench
    sizes: List[int] = field(default_factory=list)  # bytes; empty: min_bytes .. max_bytes by size_factor
    min_bytes: int = 1024
    max_bytes: int = 256 << 20
    size_factor: int = 4
    dtypes: List[str] = field(default_factory=lambda: ["float32"])
    nprocs: List[int] = field(default_factory=lambda: [2, 4])
    iters: int = 10
    min_time_s: float = 2.0  # more rounds (up to 20x iters) for sizes whose iters rounds take less
    warmup: int = 2
    # seconds every rank waits before each timed round, as a training step computes before its all-reduce: a shaped
    # link (tbf) saves tokens while idle, so back-to-back rounds alone can time it faster or slower than training sees
    gap_s: float = 0.0
    segment_kb: Optional[int] = None  # null: the ring's automatic size
    nodes: int = 2  # hierarchical (both variants): emulated nodes; must divide each world size
    timeout_s: float = 300.0
    codec: bool = False  # instead: each compressor's encode/decode speed on one core against an fp16 cast
    launcher: BenchLauncherConfig = field(default_factory=BenchLauncherConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    name: Optional[str] = None

    def __post_init__(self):
        need(0 < self.ratio <= 1, "bench: ratio", self.ratio, "must be in (0, 1]")
        for key in ("iters", "min_bytes", "nodes"):
            need(getattr(self, key) >= 1, f"bench: {key}", getattr(self, key), "must be >= 1")
        need(self.size_factor >= 2, "bench: size_factor", self.size_factor, "must be >= 2")
        need(self.max_bytes >= self.min_bytes, "bench: max_bytes", self.max_bytes,
             f"must be >= min_bytes ({self.min_bytes}), or no size is left to time")
        need(all(s >= 1 for s in self.sizes), "bench: sizes", self.sizes, "every size must be >= 1 byte")
        # codec=true times float32 tensors of size // 4 elements: a smaller size would time an empty tensor
        key, value = ("bench: sizes", self.sizes) if self.sizes else ("bench: min_bytes", self.min_bytes)
        need(not self.codec or min(self.sizes or [self.min_bytes]) >= 4, key, value,
             "codec=true times float32 tensors: every size must hold one element (>= 4 bytes)")
        need(self.warmup >= 0, "bench: warmup", self.warmup, "must be >= 0")
        need(0 <= self.gap_s <= 60, "bench: gap_s", self.gap_s, "must be in [0, 60] seconds")
        need(all(n >= 1 for n in self.nprocs), "bench: nprocs", self.nprocs, "every world size must be >= 1")
        need(self.segment_kb is None or self.segment_kb >= 1, "bench: segment_kb", self.segment_kb, "must be >= 1")
        # both ends of each range: NaN fails every comparison, and an infinite time overflows in the workers
        need(0 <= self.min_time_s <= 3600, "bench: min_time_s", self.min_time_s, "must be in [0, 3600] seconds")
        need(0 < self.timeout_s <= 86400, "bench: timeout_s", self.timeout_s, "must be in (0, 86400] seconds")


register("bench", BenchConfig)
