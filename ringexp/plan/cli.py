"""The planner's command line: `python -m ringexp.plan calibrate|predict|accuracy [KEY=VALUE ...]`, Hydra's as
ringexp.train's. PlanConfig's keys (conf/plan.yaml) and the `cluster` group go to the planner's config; every
other KEY=VALUE is a training override (predict's), composed with them as one config (conf/plan.yaml).
cluster_file=PATH.yaml loads that file over the cluster."""

import dataclasses
import sys

from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ringexp import conffiles, entry
from ringexp.cluster import files as clusters
from ringexp.errors import ConfigError
from ringexp.launch import refused_elsewhere
from ringexp.plan import accuracy, calibrate, predict
from ringexp.plan.config import PlanConfig

COMMANDS = {"calibrate": calibrate.calibrate, "predict": predict.predict, "accuracy": accuracy.accuracy}
USAGE = "usage: python -m ringexp.plan calibrate|predict|accuracy [KEY=VALUE ...] (--help for the keys)"
PLAN_KEYS = {f.name for f in dataclasses.fields(PlanConfig)}
HELP = ("--help", "-h", "--hydra-help", "--info", "--cfg", "-c")


def training(overrides: list) -> list:
    """predict's training overrides: the composition's own overrides (Hydra's parsed) less the planner's keys."""
    return entry.others(overrides, PLAN_KEYS)


def resolved(cfg) -> PlanConfig:
    """The composed planner config as a checked PlanConfig, cluster_file's cluster over its cluster."""
    try:
        if cfg.cluster_file:
            cfg.cluster = clusters.read(cfg.cluster_file, over=cfg.cluster, key="cluster_file")
        return OmegaConf.to_object(cfg)
    except (HydraException, OmegaConfBaseException) as e:
        raise conffiles.composition_error(e) from None


def load(args: list) -> tuple:
    """(PlanConfig, training overrides) of the planner's KEY=VALUE arguments, composed without Hydra's app (a
    non-zero rank of calibrate, the README's check)."""
    given = entry.overrides(args)
    return resolved(conffiles.compose(given, "plan")), training(given)


def app(command: str | None, args: list) -> None:
    """Hydra's app over the planner's arguments (its --help, its overrides, its errors), then the command."""

    def run(cfg) -> None:
        if command is None:
            raise ConfigError(f"first argument must be calibrate, predict or accuracy; {USAGE}")
        train = training(list(HydraConfig.get().overrides.task))
        if command != "predict" and train:
            raise ConfigError(f"{command} takes no training overrides (got {train[0]}); see conf/plan.yaml")
        COMMANDS[command](resolved(cfg), train)

    entry.one_run(args, "the planner predicts every preset itself (presets=)")
    entry.hydra_app("plan", f"ringexp.plan {command or ''}".strip(), args, run)


def other_rank(args: list) -> None:
    """A non-zero rank of calibrate under torchrun or Slurm: the same config, nothing written, nothing said (rank 0
    says what is wrong with it)."""
    try:
        cfg, _ = load(args)
    except ConfigError:
        refused_elsewhere()
    calibrate.calibrate_worker(cfg)


def main() -> None:
    args = sys.argv[1:]
    command = args[0] if args and args[0] in COMMANDS else None
    rest = args[1:] if command else args

    def start() -> None:
        if command is None and not any(a in HELP for a in args):
            raise ConfigError(f"first argument must be calibrate, predict or accuracy; {USAGE}")
        app(command, rest)

    if command == "calibrate":  # (a rank of a torchrun or Slurm job: calibrate measures on every rank)
        entry.run(start, lambda: other_rank(rest))
    else:
        entry.run(start, srun=False)
