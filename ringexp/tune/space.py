"""The search space: conf/parallel presets x knob values, each knob changed alone on the presets it changes, every
candidate a list of training overrides over the user's and its checked config, ranked by the planner.

    knobs(entries)                       {knob: [values]} of tune.knobs ("KEY=V1,V2"); unknown knobs refused
    candidates(train, presets, knobs, predict)
                                         the distinct candidates, each with the planner's prediction; a knob value
                                         is kept for a preset only where it changes the prediction (or, for what the
                                         planner does not model, where UNMODELLED says the preset reads it); a
                                         candidate of accumulation also scales its learning rate (PAIRED)
    ranked(cands, base, search, prune, seed)
                                         planner: fastest predicted first, those predicted slower than the baseline
                                         by more than `prune` left out; random: shuffled, none left out
"""

import random
from dataclasses import dataclass, field

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ringexp.config import AVERAGING, TrainConfig, plain
from ringexp.errors import ConfigError, one_line
from ringexp.predict import preset_config, presets

# The knobs the tune varies, and what each one is. The planner answers whether a knob changes a preset (its
# predicted step moves); for what it does not model, UNMODELLED says which configs read the knob.
KNOBS = {
    "parallel.bucket_cap_mb": "DDP's gradient bucket size (MB)",
    "accumulation.steps": "micro-batches per optimizer step (full-length runs keep the samples: fewer steps)",
    "compression.rank": "PowerSGD's rank",
    "compression.start_step": "PowerSGD's uncompressed steps first",
    "compression.ratio": "top-k / random-k: the fraction of elements sent",
    "amp.mode": "autocast: off, bf16 or fp16",
    "parallel.period": "local_sgd, diloco: steps between two synchronisations of the models",
    "parallel.warmup_steps": "local_sgd, diloco: plain DDP steps before the first local one",
    "parallel.outer_lr": "diloco: the outer Nesterov step's learning rate",
    "parallel.fragments": "local_sgd, diloco: parts of the model synchronised at staggered steps",
}
# What a candidate changing a knob also sets: accumulation at the baseline's learning rate makes k times fewer
# updates of the same length over the same samples, so it looked worse wherever it was tried (every accumulation
# candidate of the tune story: about -0.03 AUROC); with the rule it makes longer ones (docs/configuration.md's
# "Fair large batch"). Training overrides naming the pair's key, or optim.scale_lr, keep the user's choice.
# parallel.period is not paired: the rule halves local SGD's AdamW rate at 4 ranks, which was worse on the
# slow-link story in each of 3 paired seeds (docs/averaging.md "Learning rate").
PAIRED = {"accumulation.steps": ["optim.lr_rule=auto"]}
SET_BY_TUNE = ("name", "seed", "steps", "eval_every", "resume", "logger")
UNMODELLED = {"compression.start_step": lambda cfg: cfg.compression.name == "powersgd",
              "amp.mode": lambda cfg: True,
              "parallel.outer_lr": lambda cfg: True, "parallel.fragments": lambda cfg: True}
# Knobs only some strategies read; on the others they are not tried (not refusals: there is nothing to vary)
READ_BY = {"parallel.period": AVERAGING, "parallel.warmup_steps": AVERAGING, "parallel.fragments": AVERAGING,
           "parallel.outer_lr": ("diloco",)}


@dataclass
class Candidate:
    """One configuration to try: `name` (the preset and any knob), `overrides` (over the user's training overrides,
    without steps/seed), `cfg` its checked TrainConfig, `predicted` the planner's step and samples/s."""

    name: str
    overrides: list
    cfg: object = field(repr=False)
    predicted: dict = field(default_factory=dict)

    def record(self) -> dict:
        return {"name": self.name, "overrides": self.overrides, "predicted_step_s": self.predicted.get("step_s"),
                "predicted_samples_s": self.predicted.get("samples_s")}


def knobs(entries) -> dict:
    """{knob: [value, ...]} of tune.knobs entries; a ConfigError names an entry that is not KEY=V1[,V2...] or a
    knob the tune does not know."""
    out = {}
    for e in entries:
        key, _, values = str(e).partition("=")
        if key not in KNOBS:
            raise ConfigError(f"tune.knobs: unknown knob '{key}'; choose from {', '.join(KNOBS)} "
                              "(each entry KEY=V1,V2)")
        if not values or "" in values.split(","):
            raise ConfigError(f"tune.knobs: '{e}' gives no value; write KEY=V1,V2 (e.g. accumulation.steps=2,4)")
        out[key] = [in_range(key, v) for v in values.split(",")]
    return out


def in_range(key: str, value: str) -> str:
    """`value` where the training schema takes it for `key` on its own (its type and range: the field's own check),
    else a ConfigError before anything runs: a value no preset could take would only be found after the baseline."""
    try:
        given = OmegaConf.from_dotlist([f"{key}={value}"])
        OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(TrainConfig), given))
    except (OmegaConfBaseException, ConfigError) as e:
        said = one_line(str(e)).split(chr(10))[0].removeprefix(f"{key}={value}: ")
        raise ConfigError(f"tune.knobs: {key}={value}: {said}; give values in its range") from None
    return value


def fingerprint(cfg) -> str:
    """What makes two candidates the same configuration (its length, seed and name aside: the tune sets those)."""
    return repr(sorted((k, repr(v)) for k, v in plain(cfg).items() if k not in SET_BY_TUNE))


def candidates(train: list, names: list, knob_values: dict, predict, nodes: int | None, baseline: str,
               strict: bool = False) -> tuple:
    """([Candidate], [(name, why) refused]) over `train` (without +parallel=), the baseline's own configuration
    (its fingerprint) left out; `predict(cfg)` -> the planner's row (None: every knob value kept, for `strict`, the
    check that something is left to search). Bad preset names are the user's mistake (ConfigError); a preset or
    knob value refused with this task is a recorded refusal."""
    bad = [n for n in names if n not in presets()]
    if bad:
        raise ConfigError(f"tune.presets: no preset {bad[0]}; choose from {', '.join(presets())}")
    out, refused, seen = [], [], {baseline}
    for preset in names or presets():
        try:
            own = Candidate(preset, [f"+parallel={preset}"], preset_config(preset, train, nodes))
        except ConfigError as e:
            refused.append((preset, str(e)))
            continue
        own.predicted = predict(own.cfg) if predict else {}
        for c in [own, *variants(own, train, knob_values, predict, nodes, refused)]:
            if (f := fingerprint(c.cfg)) not in seen:
                seen.add(f)
                out.append(c)
    if strict and not out:
        why = f" ({refused[0][0]}: {refused[0][1]})" if refused else " (each is the baseline's own configuration)"
        raise ConfigError(f"the search space is empty after tune.presets and tune.knobs{why}; widen them")
    return out, refused


def variants(own: Candidate, train: list, knob_values: dict, predict, nodes, refused: list):
    """`own` with one knob changed, where the change changes `own` (see the module's docstring)."""
    for key, values in knob_values.items():
        if own.cfg.parallel.strategy not in READ_BY.get(key, (own.cfg.parallel.strategy,)):
            continue
        pair = paired(key, train, own.cfg)
        for v in values:
            changed = [f"{key}={v}", *pair]
            name, extra = " ".join([own.name, *changed]), [*own.overrides, *changed]
            try:
                cfg = preset_config(own.name, [*train, *changed], nodes)
            except ConfigError as e:
                refused.append((name, str(e)))
                continue
            if fingerprint(cfg) == fingerprint(own.cfg):
                continue
            got = predict(cfg) if predict else {}
            if not predict or got["step_s"] != own.predicted["step_s"] or UNMODELLED.get(key, lambda c: False)(cfg):
                yield Candidate(name, extra, cfg, got)


def paired(key: str, train: list, cfg) -> list:
    """The overrides a candidate changing `key` also sets (PAIRED): those whose key the training overrides `train`
    leave alone (optim.lr_rule=none there turns the pairing off), none where `cfg` scales the rate by optim.scale_lr
    (a rule beside it is refused)."""
    said = {o.lstrip("+~").partition("=")[0] for o in train}
    if cfg.optim.scale_lr:
        return []
    return [o for o in PAIRED.get(key, []) if o.partition("=")[0] not in said]


def ranked(cands: list, base_samples_s: float, search: str, prune: float, seed: int) -> tuple:
    """(the order to try, [(Candidate, why) left out]): throughput is samples/s, so that accumulation, which makes a
    step longer and carries more samples, compares fairly."""
    if search == "random":
        order = list(cands)
        random.Random(seed).shuffle(order)
        return order, []
    floor = base_samples_s / (1 + prune)
    keep = [c for c in cands if c.predicted["samples_s"] >= floor]
    out = [(c, f"predicted {c.predicted['samples_s']:.1f} samples/s, below the baseline's {base_samples_s:.1f} "
               f"by more than {prune:.0%}") for c in cands if c.predicted["samples_s"] < floor]
    return sorted(keep, key=lambda c: -c.predicted["samples_s"]), out
