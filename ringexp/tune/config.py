"""The tune's own keys (TuneConfig): every `tune.KEY=VALUE` of `python -m ringexp.tune`."""

from dataclasses import dataclass, field
from typing import List, Optional

from ringexp import quality
from ringexp.config import need, register


@dataclass
class TuneConfig:
    """`python -m ringexp.tune`'s own keys, given as tune.KEY=VALUE (docs/tune.md); every other KEY=VALUE is a
    training override, the baseline every candidate changes."""
    budget_min: float = 10.0  # machine minutes for the whole tune: baseline, trials and verification
    quality_budget: float = quality.MARGIN  # the equivalence margin a chosen candidate must meet
    error: float = quality.ALPHA  # at most this chance that the chosen candidate is worse than the margin
    presets: List[str] = field(default_factory=list)  # conf/parallel presets to search (empty: every multi-rank one)
    # each "KEY=V1,V2": values tried one knob at a time on every preset the knob changes (ringexp/tune/space.py)
    knobs: List[str] = field(default_factory=lambda: ["accumulation.steps=2,4", "parallel.bucket_cap_mb=5,100",
                                                      "compression.rank=2", "compression.start_step=10",
                                                      "compression.ratio=0.05"])
    search: str = "planner"  # planner: the planner's ranking and pruning; random: shuffled, nothing pruned
    prune: float = 0.1  # leave out candidates predicted this much slower than the baseline (planner search)
    trial_steps: int = 30  # the first rung's trial length; each halving rung runs `eta` times longer
    eta: int = 2  # successive halving: the fastest 1/eta of a rung go on to the next
    rungs: int = 2  # halving rungs (1: one short trial each)
    verify: int = 3  # the most candidates verified at full length over seeds, fastest first
    seeds: int = 3  # seeds per side in verification: the paired verdict over them decides (one seed never does)
    trial_timeout_s: float = 1800.0  # a trial running longer is stopped and recorded as timed out
    command: str = ""  # the training command a trial runs (empty: this Python's -m ringexp.train)
    cluster: Optional[str] = None  # the planner's cluster (name or YAML; null: one matching the job, else calibrated)
    out: Optional[str] = None  # the tune's directory, as hydra.run.dir (null: outputs/tune/<time>); again: continues
    seed: int = 0  # the random search's order

    def __post_init__(self):
        need(0 < self.budget_min <= 7 * 24 * 60, "tune.budget_min", self.budget_min, "must be > 0 and at most a week")
        need(not quality.margin_error(self.quality_budget), "tune.quality_budget", self.quality_budget,
             quality.margin_error(self.quality_budget))
        need(self.search in ("planner", "random"), "tune.search", self.search, "choose planner or random")
        need(0 <= self.prune <= 10, "tune.prune", self.prune, "must be in [0, 10] (a fraction of the baseline's step)")
        need(self.trial_steps >= 1, "tune.trial_steps", self.trial_steps, "must be >= 1")
        need(self.eta >= 2 and self.rungs >= 1, "tune.eta, rungs", f"{self.eta}, {self.rungs}",
             "need eta >= 2 and at least 1 rung")
        need(not quality.level_error(self.error), "tune.error", self.error, quality.level_error(self.error))
        need(self.verify >= 1, "tune.verify", self.verify, "must be >= 1 (candidates verified at full length)")
        need(self.seeds >= quality.MIN_SEEDS, "tune.seeds", self.seeds,
             f"a choice needs at least {quality.MIN_SEEDS} paired seeds (one seed's verdict leaves out the seeds' "
             f"variance: an indication, never a decision); give tune.seeds={quality.MIN_SEEDS} or more (docs/tune.md: "
             "the seeds a choice needs)")
        need(self.trial_timeout_s > 0, "tune.trial_timeout_s", self.trial_timeout_s, "must be > 0 seconds")


@dataclass
class TuneApp:
    """conf/tune.yaml's root: the tune's keys under `tune.` (so that `tune.KEY=VALUE` is Hydra's own override, and
    --help and --cfg job show them); every other KEY=VALUE of the command line is a training override."""
    tune: TuneConfig = field(default_factory=TuneConfig)


register("tune_schema", TuneApp)
