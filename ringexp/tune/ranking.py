"""What the planner predicts for a tune, as one frozen value: the Ranking (the job's cluster, one rank's compute,
every candidate with its prediction, the order to try them in), made once by `rank` after the baseline has run,
and the free functions that read it. The tune, its budget, its refit and the replay of a recorded sweep all take
a Ranking; none needs a Tune."""

import dataclasses
import math
from dataclasses import dataclass

from ringexp import compress, predict
from ringexp.cluster.schema import ClusterConfig
from ringexp.config import AVERAGING, TrainConfig
from ringexp.errors import ConfigError
from ringexp.tune import space


@dataclass(frozen=True)
class Ranking:
    """The planner's view of a tune, computed once (its parts never change after `rank`)."""
    base: TrainConfig  # the user's composed configuration: steps, seed, accumulation, evaluations
    cluster: ClusterConfig  # the planner's cluster, of the baseline run's shape
    shapes: tuple  # the model's trainable parameter shapes
    compute: dict  # one rank's compute in seconds: forward_s, backward_s, optimizer_s
    cands: tuple = ()  # every candidate the space allows (space.Candidate, with its prediction)
    refused: tuple = ()  # (name, why) of each candidate the space or the baseline's spacing refused
    order: tuple = ()  # the candidates to try, in the planner's order
    left_out: tuple = ()  # (Candidate, why) pruned before any trial
    base_pred: dict | None = None  # the planner's row of the baseline's full-length run
    scale: float = 1.0  # the baseline's measured step over its predicted one (what estimates are scaled by)


def rank(tc, rest: list, base: TrainConfig, cluster: ClusterConfig, shapes, compute: dict,
         base_step_s: float) -> Ranking:
    """The Ranking of the tune `tc` over training overrides `rest` (the user's, without parallel=) once the
    baseline has run at `base_step_s` a step; ConfigError where nothing is left to try."""
    r = Ranking(base, cluster, tuple(shapes), compute)
    cands, refused = space.candidates(rest, list(tc.presets), space.knobs(tc.knobs), lambda cfg: predicted(r, cfg),
                                      cluster.nodes, space.fingerprint(base))
    refused += [(c.name, why) for c in cands if (why := spacing_error(base, c))]
    cands = [c for c in cands if not spacing_error(base, c)]
    base_pred = predicted(r, base)
    order, left_out = space.ranked(cands, base_pred["samples_s"], tc.search, tc.prune, tc.seed)
    if not order:
        raise ConfigError("the search space is empty: every candidate was refused or predicted slower than the "
                          f"baseline (tune.prune={tc.prune}); widen tune.presets or tune.knobs")
    return dataclasses.replace(r, cands=tuple(cands), refused=tuple(refused), order=tuple(order),
                               left_out=tuple(left_out), base_pred=base_pred, scale=base_step_s / base_pred["step_s"])


def predicted(r: Ranking, cfg, cl=None, compute=None, window=None) -> dict:
    """The planner's row for `cfg` over the steps `window` = (first, last) that a measurement covers (None: a
    full-length run), from the cluster file's codec costs (not PowerSGD measured here, whose noise would make
    two equal configurations predict apart). Steps before the compressor's first compressed one (PowerSGD's
    start_step) are predicted uncompressed: a short trial of PowerSGD measures plain DDP."""
    first, last = window or (1, math.ceil(r.base.steps * r.base.accumulation.steps / cfg.accumulation.steps))
    return predict.over_steps("", cfg, cl or r.cluster, r.shapes, compute or r.compute, False, first, last)


def at_trial(r: Ranking, rec: dict, cl=None, compute=None) -> float:
    """The predicted step of trial record `rec`: over the steps its throughput was measured on, those after the
    throughput warm-up, or for an averaging trial its whole run from step 1 (records.run_rate), DDP warm-up
    included: a window from step 11 left a 10-step warm-up out of the prediction but in the measurement."""
    by_name = {c.name: c for c in r.cands}
    cfg = by_name[rec["candidate"]].cfg if rec["candidate"] in by_name else r.base
    if rec.get("start_step"):  # (the trial compressed from there: trial_start)
        cfg = dataclasses.replace(cfg, compression=dataclasses.replace(cfg.compression, start_step=rec["start_step"]))
    first = 1 if cfg.parallel.strategy in AVERAGING else min(r.base.throughput_warmup + 1, rec["steps"])
    return predicted(r, cfg, cl, compute, (first, rec["steps"]))["step_s"]


def trial_start(r: Ranking, cand: str):
    """The compressor's first compressed step for a short trial of `cand` where its own comes after the trial's
    measured steps begin (PowerSGD's start_step): the trial would measure the uncompressed all-reduce, so it
    starts compressing with them; `ranking_speed` puts the uncompressed steps back. None where it need not."""
    c = next((c for c in r.cands if c.name == cand), None)
    first = r.base.throughput_warmup + 1
    return first if c is not None and compress.first_compressed_step(c.cfg.compression) > first else None


def ranking_speed(r: Ranking, c, rec: dict) -> float:
    """A trial's samples/s as its full-length run would have them: measured, or, for a trial that compressed
    from an earlier step than the candidate does, its measured (compressed) step for the compressed share of the
    full run and that step times the planner's uncompressed/compressed ratio for the rest; for an averaging
    (measured over the whole trial), its DDP warm-up's share of the trial made its share of the full run."""
    averaging = c.cfg.parallel.strategy in AVERAGING
    if not averaging and not rec.get("start_step"):
        return rec["samples_s"]
    steps, _ = full_steps(r.base, c)
    args = (c.cfg, r.cluster, r.shapes, r.compute, False)
    if averaging:  # (a warm-up of 10 steps is a third of a 30-step trial)
        trial, full = (predict.over_steps("", *args, 1, n)["step_s"] for n in (rec["steps"], steps))
        return rec["samples_s"] * trial / full
    compressed, whole = predict.row("", *args)["step_s"], predict.over_steps("", *args, 1, steps)["step_s"]
    return rec["samples_s"] * compressed / whole


def full_steps(base: TrainConfig, c) -> tuple:
    """(steps, eval_every) of a full-length run of `c` (None: the baseline): the baseline's samples, whatever its
    accumulation."""
    if c is None:
        return base.steps, base.eval_every
    acc, own = base.accumulation.steps, c.cfg.accumulation.steps  # (spacing_error: both divide)
    return base.steps * acc // own, max(1, base.eval_every * acc // own)


def spacing_error(base: TrainConfig, c) -> str:
    """Why `c` cannot run the baseline's samples with evaluations at the baseline's samples ('' when it can):
    its accumulation must divide the baseline's micro-batches of the run and between evaluations."""
    acc, own = base.accumulation.steps, c.cfg.accumulation.steps
    bad = next((k for k, v in (("steps", base.steps), ("eval_every", base.eval_every)) if v * acc % own), None)
    return "" if bad is None else (
        f"accumulation.steps={own}: {bad}={getattr(base, bad)} at the baseline's accumulation {acc} is "
        f"{getattr(base, bad) * acc} micro-batches, not a multiple of {own}, so its evaluations (or its "
        f"samples) could not be the baseline's; give {bad} a multiple of {own}")
