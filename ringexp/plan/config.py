"""The planner's own keys (PlanConfig): everything `python -m ringexp.plan` takes besides training overrides, and
conf/plan.yaml's root (PlanApp), which composes them with the training config."""

from dataclasses import dataclass, field
from typing import List, Optional

from ringexp import quality
from ringexp.cluster.schema import ClusterConfig, bytes_per_s
from ringexp.config import TrainConfig, need, register


@dataclass
class PlanConfig:
    """`python -m ringexp.plan calibrate|predict|accuracy` (conf/plan.yaml): see ringexp/plan/."""
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    cluster_file: Optional[str] = None  # a cluster file outside conf/cluster/ (calibrate's out=), read over `cluster`
    nodes: Optional[int] = None  # predict: nodes to use (null: the cluster's)
    ranks_per_node: Optional[int] = None  # predict: ranks per node (null: the cluster's; at most that)
    forward_s: Optional[float] = None  # predict: one rank's forward, backward and optimizer step, seconds
    backward_s: Optional[float] = None  # (null: measured here, on one rank, times cluster.compute_slowdown)
    optimizer_s: Optional[float] = None
    presets: List[str] = field(default_factory=list)  # predict: conf/parallel presets (empty: all but single)
    plot_presets: List[str] = field(default_factory=lambda: ["ddp", "hierarchical", "hierarchical_int8", "ring_fp16",
                                                             "ddp_powersgd", "fsdp"])  # predict: plan.png's lines
    quality_budget: float = quality.MARGIN  # predict: the equivalence margin a recommended preset must meet (AUROC)
    f1_budget: float = quality.F1_MARGIN  # predict: and in macro-F1, where the record decides on it too
    # predict: at most this chance that the preset recommended on a verdict is worse than a margin (each verdict read
    # at error / the presets judged on verdicts: the tune's tune.error rule)
    error: float = quality.ALPHA
    # predict: the quality verdicts' record (compare's or the tune's quality.json) of this task (quality.task_of),
    # whose decisive verdicts judge each preset; null: none, so only exact presets may be recommended
    quality: Optional[str] = None
    out: Optional[str] = None  # predict: where plan.md/json/png go; calibrate: the cluster file to write
    nprocs: int = 2  # calibrate: local workers (under torchrun or Slurm: the job's own ranks)
    sizes: List[int] = field(default_factory=lambda: [1 << 12, 1 << 16, 1 << 20, 1 << 22, 1 << 24, 1 << 26])
    iters: int = 5  # calibrate: timed rounds per size (the median is kept)
    label: Optional[str] = None  # calibrate: the cluster's link label (null: the job's, as runs record it)
    bench: List[str] = field(default_factory=list)  # accuracy: bench.json files whose rows to predict
    cases: List[str] = field(default_factory=list)  # accuracy: published-cases YAML files (ringexp/plan/published.yaml)
    line_rate: Optional[str] = None  # calibrate: the inter-node link's line rate (tc's units: 25mbit, 100gbit), so
    # that the file keeps it as beta and what the transport reaches of it as efficiency (null: the label's, if a rate)
    transport: str = "measured"  # calibrate: "socket" keeps what the link reached below line_rate as the socket
    # transport's per-stream ceiling (cluster.inter.socket_Bps) instead of an efficiency

    def __post_init__(self):
        need(self.nodes is None or self.nodes >= 1, "nodes", self.nodes, "must be >= 1")
        need(self.ranks_per_node is None or 1 <= self.ranks_per_node <= self.cluster.ranks_per_node,
             "ranks_per_node", self.ranks_per_node,
             f"cluster {self.cluster.name} has {self.cluster.ranks_per_node} per node")
        for key in ("forward_s", "backward_s", "optimizer_s"):  # (NaN fails both comparisons)
            need(getattr(self, key) is None or 0 <= getattr(self, key) <= 86400, key, getattr(self, key),
                 "must be >= 0 s and at most a day (86400)")
        need(not quality.margin_error(self.quality_budget), "quality_budget", self.quality_budget,
             quality.margin_error(self.quality_budget))
        need(not quality.margin_error(self.f1_budget), "f1_budget", self.f1_budget,
             quality.margin_error(self.f1_budget))
        need(not quality.level_error(self.error), "error", self.error, quality.level_error(self.error))
        need(self.line_rate is None or bytes_per_s(self.line_rate) is not None, "line_rate", self.line_rate,
             "give a rate above 0 as tc writes it: 25mbit, 1gbit, 100gbit (or bytes: 12.5mbps)")
        need(self.transport in ("measured", "socket"), "transport", self.transport, "choose measured or socket")
        need(self.nprocs >= 2, "nprocs", self.nprocs, "calibrate needs at least 2 ranks")
        need(self.iters >= 1 and all(s >= 4 for s in self.sizes), "iters, sizes", f"{self.iters}, {self.sizes}",
             "need >= 1 round and sizes >= 4 bytes")


@dataclass
class PlanApp(PlanConfig, TrainConfig):
    """conf/plan.yaml's root: the planner's keys and the training config (predict's baseline), one Hydra
    composition, so that every argument is Hydra's own override; predict's training overrides are the composition's
    own others (ringexp.plan.cli.training)."""

    def __post_init__(self):
        TrainConfig.__post_init__(self)
        PlanConfig.__post_init__(self)


register("plan", PlanApp)
