"""The planner's command line: `python -m ringexp.plan calibrate|predict|accuracy [KEY=VALUE ...]`, Hydra's as
ringexp.train's. PlanConfig's keys (conf/plan.yaml) and the `cluster` group go to the planner's config; every
other KEY=VALUE is a training override (predict's). cluster=PATH.yaml loads that file over the default cluster."""

import dataclasses
import sys

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


def split(args: list) -> tuple:
    """(the planner's arguments, training overrides, the path of cluster=PATH.yaml or '')."""
    plan = [a for a in args if a.startswith("-") or a.split("=", 1)[0].lstrip("+~").split(".")[0] in PLAN_KEYS]
    path = next((a.split("=", 1)[1] for a in plan if a.startswith("cluster=") and a.endswith((".yaml", ".yml"))), "")
    name = next((a.split("=", 1)[1] for a in plan if a.startswith("cluster=")), "")
    if name and not path and name not in clusters.names():
        raise ConfigError(f"cluster={name}: no such cluster file; choose from {', '.join(clusters.names())} "
                          "(conf/cluster/), or give a YAML path")
    if name and not path:  # read here first, so that Hydra, which reads it again, reads a file that is sound
        clusters.read(clusters.path_of(name))
    return [a for a in plan if not (path and a.startswith("cluster="))], [a for a in args if a not in plan], path


def resolved(cfg, path: str) -> PlanConfig:
    """The composed planner config as a checked PlanConfig, the cluster file at `path` over its cluster."""
    try:
        if path:
            cfg.cluster = clusters.read(path, over=cfg.cluster)
        return OmegaConf.to_object(cfg)
    except (HydraException, OmegaConfBaseException) as e:
        raise conffiles.composition_error(e) from None


def load(args: list) -> tuple:
    """(PlanConfig, training overrides) of the planner's KEY=VALUE arguments, composed without Hydra's app (a
    non-zero rank of calibrate, the README's check)."""
    plan, train, path = split(args)
    return resolved(conffiles.compose(plan, "plan"), path), train


def app(command: str | None, args: list) -> None:
    """Hydra's app over the planner's arguments (its --help, its overrides, its errors), then the command."""
    plan, train, path = split(args)

    def run(cfg) -> None:
        if command is None:
            raise ConfigError(f"first argument must be calibrate, predict or accuracy; {USAGE}")
        if command != "predict" and train:
            raise ConfigError(f"{command} takes no training overrides (got {train[0]}); see conf/plan.yaml")
        COMMANDS[command](resolved(cfg, path), train)

    entry.hydra_app("plan", f"ringexp.plan {command or ''}".strip(), plan, run)


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
