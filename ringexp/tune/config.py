"""The tune's own keys (TuneConfig): every `tune.KEY=VALUE` of `python -m ringexp.tune`."""

import math
from dataclasses import dataclass, field
from typing import List, Optional

from omegaconf import OmegaConf

from ringexp import quality
from ringexp.config import TrainConfig, need, register
from ringexp.predict import presets
from ringexp.verdicts.groups import QUALITY, margins_of

BUDGET_MIN = 7 * 24 * 60  # the largest budget, in minutes: a week
MIN_RUN_S = 1.0  # no run of ringexp.train ends sooner: its Python starts and imports torch first
MIN_STEP_S = 1e-4  # nor does a step: Python's training loop, DDP's hooks and a collective each take longer
MAX_RUNS = int(BUDGET_MIN * 60 / MIN_RUN_S)  # the most runs any budget pays for
MAX_STEPS = int(BUDGET_MIN * 60 / MIN_STEP_S)  # the longest trial any budget pays for
# candidates (presets x (1 + knob values)), which the planner composes and predicts, every one, before the first
# trial: 17 times the largest space docs/tune.md plans for (60)
MAX_CANDIDATES = 1024
MAX_RUNGS = 1 + int(math.log2(MAX_CANDIDATES))  # halving MAX_CANDIDATES leaves one after 10 rungs: an 11th runs it
MAX_COMMAND = 128 * 1024  # Linux passes no longer argument to a program (MAX_ARG_STRLEN)


@dataclass
class TuneConfig:
    """`python -m ringexp.tune`'s own keys, given as tune.KEY=VALUE (docs/tune.md); every other KEY=VALUE is a
    training override, the baseline every candidate changes."""
    # Each key's comment says its bound and why; most are what some budget could run: at most a week of machine time
    # (BUDGET_MIN), runs of at least MIN_RUN_S, steps of at least MIN_STEP_S. A value past it could never run.
    budget_min: float = 10.0  # machine minutes for the whole tune: baseline, trials and verification; at most a week
    quality_budget: float = quality.MARGIN  # the equivalence margin a chosen candidate must meet in macro-AUROC
    f1_budget: float = quality.F1_MARGIN  # and in macro-F1 (its seeds spread about twice as far: quality.F1_MARGIN)
    # what a chosen candidate must be equivalent (or better) on, each test at the same level (an intersection-union
    # test: the error bound holds for all of them at once); the seed articles judge every change on AUC and F1
    metrics: List[str] = field(default_factory=lambda: list(quality.DECIDING))
    # at most this chance that the chosen candidate is worse than the margin; above the level at which tune.seeds
    # paired seeds could call anything equivalent (quality.smallest_level, per verification slot)
    error: float = quality.ALPHA
    presets: List[str] = field(default_factory=list)  # conf/parallel presets to search (empty: every multi-rank one)
    # each "KEY=V1,V2": values tried one knob at a time on every preset the knob changes (ringexp/tune/space.py);
    # presets x (1 + knob values) at most MAX_CANDIDATES
    knobs: List[str] = field(default_factory=lambda: ["accumulation.steps=2,4", "parallel.bucket_cap_mb=5,100",
                                                      "compression.rank=2", "compression.start_step=10",
                                                      "compression.ratio=0.05"])
    search: str = "planner"  # planner: the planner's ranking and pruning; random: shuffled, nothing pruned
    prune: float = 0.1  # leave out candidates predicted this much slower than the baseline (planner search)
    # the first rung's trial length; each halving rung runs `eta` times longer, the last at most MAX_STEPS
    trial_steps: int = 30
    eta: int = 2  # successive halving: the fastest 1/eta of a rung go on to the next; at most MAX_CANDIDATES
    rungs: int = 2  # halving rungs (1: one short trial each); at most MAX_RUNGS
    verify: int = 3  # the most candidates verified at full length over seeds, fastest first; at most MAX_CANDIDATES
    # seeds per side in verification: the paired verdict over them decides (one seed never does); at most
    # MAX_RUNS / 2 (each seed is a run of the candidate and one of the baseline)
    seeds: int = 3
    # a trial running longer is stopped and recorded as timed out; at most a week (no budget pays for more)
    trial_timeout_s: float = 1800.0
    command: str = ""  # the training command a trial runs (empty: this Python's -m ringexp.train); MAX_COMMAND
    cluster: Optional[str] = None  # the planner's cluster (name or YAML; null: one matching the job, else calibrated)
    out: Optional[str] = None  # the tune's directory, as hydra.run.dir (null: outputs/tune/<time>); again: continues
    seed: int = 0  # the random search's order: any of 2^64 orders is as good as another

    def __post_init__(self):
        need(0 < self.budget_min <= BUDGET_MIN, "tune.budget_min", self.budget_min, "must be > 0 and at most a week")
        need(not quality.margin_error(self.quality_budget), "tune.quality_budget", self.quality_budget,
             quality.margin_error(self.quality_budget))
        need(not quality.margin_error(self.f1_budget), "tune.f1_budget", self.f1_budget,
             quality.margin_error(self.f1_budget))
        need(bool(self.metrics) and all(m in QUALITY for m in self.metrics) and len(set(self.metrics)) == len(
            self.metrics), "tune.metrics", self.metrics, f"give some of {', '.join(QUALITY)}, each once")
        need(self.search in ("planner", "random"), "tune.search", self.search, "choose planner or random")
        need(0 <= self.prune <= 10, "tune.prune", self.prune, "must be in [0, 10] (a fraction of the baseline's step)")
        self.check_space()
        self.check_verification()
        need(0 < self.trial_timeout_s <= BUDGET_MIN * 60, "tune.trial_timeout_s", self.trial_timeout_s,
             "must be > 0 seconds and at most a week (tune.budget_min's most)")
        need(len(self.command) <= MAX_COMMAND, "tune.command", f"{self.command[:40]}...",
             f"longer than {MAX_COMMAND} characters, which Linux passes to no program; give the command a trial runs")
        need(0 <= self.seed < 2 ** 64, "tune.seed", self.seed, "must be in [0, 2^64)")

    def margins(self) -> dict:
        """{metric: its equivalence margin}: tune.quality_budget for macro-AUROC, tune.f1_budget for macro-F1."""
        return margins_of(self.quality_budget, self.f1_budget)

    def check_space(self) -> None:
        """The search space and its halving within what a budget could run (MAX_CANDIDATES, MAX_RUNGS, MAX_STEPS)."""
        values = sum(len(str(e).partition("=")[2].split(",")) for e in self.knobs)
        size = len(self.presets or presets()) * (1 + values)
        need(size <= MAX_CANDIDATES, "tune.presets, knobs", f"{len(self.presets)} presets, {values} knob values",
             f"{size} candidates to compose and predict; at most {MAX_CANDIDATES} (docs/tune.md): give fewer")
        need(1 <= self.trial_steps <= MAX_STEPS, "tune.trial_steps", self.trial_steps, f"must be in [1, {MAX_STEPS}]")
        need(2 <= self.eta <= MAX_CANDIDATES and 1 <= self.rungs <= MAX_RUNGS, "tune.eta, rungs",
             f"{self.eta}, {self.rungs}", f"need eta in [2, {MAX_CANDIDATES}] and 1 to {MAX_RUNGS} rungs (halving "
             f"{MAX_CANDIDATES} candidates leaves one after {MAX_RUNGS - 1})")
        last = self.trial_steps * self.eta ** (self.rungs - 1)
        need(last <= MAX_STEPS, "tune.trial_steps, eta, rungs", f"{self.trial_steps}, {self.eta}, {self.rungs}",
             f"the last rung's trials would run {last:.3g} steps, more than a week's budget runs at the fastest "
             f"step ({MAX_STEPS} steps); give fewer")

    def check_verification(self) -> None:
        """Slots and seeds a budget could pay for, and an error level that their verdicts could meet."""
        need(1 <= self.verify <= MAX_CANDIDATES, "tune.verify", self.verify,
             f"must be in [1, {MAX_CANDIDATES}] (candidates verified at full length; no space holds more)")
        need(self.seeds >= quality.MIN_SEEDS, "tune.seeds", self.seeds,
             f"a choice needs at least {quality.MIN_SEEDS} paired seeds (one seed's verdict leaves out the seeds' "
             f"variance: an indication, never a decision); give tune.seeds={quality.MIN_SEEDS} or more (docs/tune.md: "
             "the seeds a choice needs)")
        need(self.seeds <= MAX_RUNS // 2, "tune.seeds", self.seeds,
             f"more than {MAX_RUNS // 2}: verifying one candidate would run twice as many runs, more than a week's "
             f"budget holds at {MIN_RUN_S:g} s a run")
        need(not quality.level_error(self.error), "tune.error", self.error, quality.level_error(self.error))
        key, margin = min(((f"tune.{'f1' if m.endswith('F1') else 'quality'}_budget", self.margins()[m])
                           for m in self.metrics), key=lambda km: km[1])  # (the narrowest decides)
        least = quality.smallest_level(self.seeds, margin) * self.verify
        need(least < 0.5, key, margin,
             f"no verdict over {self.seeds} seeds can be equivalent within it at any tune.error over tune.verify="
             f"{self.verify} slots (docs/tune.md); give a larger {key}, or more tune.seeds")
        need(self.error > least, "tune.error", self.error,
             f"no verification could pass: each test runs at tune.error / tune.verify, and {self.seeds} seeds meet "
             f"{key}={margin:g} only above {least / self.verify:.3g} (docs/tune.md); give "
             f"tune.error above {least:.3g}, or more tune.seeds")


@dataclass
class TuneApp(TrainConfig):
    """conf/tune.yaml's root: the training config (the baseline every candidate changes) and the tune's keys under
    `tune.`, composed together by Hydra, so that every argument is Hydra's own override and --help and --cfg job
    show them all; the baseline's overrides are the composition's own others (ringexp.tune.cli.training)."""
    tune: TuneConfig = field(default_factory=TuneConfig)


register("tune", TuneApp)
# conf/tune.yaml's run directory: tune.out where given (OmegaConf's oc.select takes a None as given)
OmegaConf.register_new_resolver("ringexp_given", lambda value, default: default if value is None else value,
                                replace=True)
