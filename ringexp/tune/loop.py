"""The tune's phases over one directory, every trial recorded before the next starts (trials.Log), so that the
same command continues a tune killed at any point.

    diagnose   the user's configuration at full length, seed 0 (verification's first baseline run): the
               checklist's numbers, the planner's cluster, what a full-length run costs
    predict    every candidate's predicted step (ringexp.predict), the shortlist in the planner's order
    try        successive halving over the shortlist: short trials, the fastest 1/eta go on at eta x the steps,
               each trial only while the budget left still covers it and the verification after it
    verify     the fastest trials at full length over seeds against the baseline's, fastest first, judged by
               ringexp.quality through compare's seed groups; the first equivalent one is chosen
    refit      the cluster's constants refitted on the trials (ringexp.tune.refit)
"""

import dataclasses
import math
import os
import time
from pathlib import Path

from tqdm import tqdm

from ringexp import compress, predict, records
from ringexp.cluster import files as clusters
from ringexp.config import AVERAGING
from ringexp.errors import ConfigError, one_line, print_warning
from ringexp.models import build_model
from ringexp.tune import budget, space, trials, verify
from ringexp.tune.refit import refit
from ringexp.validate import compose_config

OWN = ("steps=", "seed=", "eval_every=", "name=", "hydra.run.dir=", "hydra.sweep.dir=", "resume=")  # the tune's
COMPUTE = ("forward_s", "backward_s", "optimizer_s")  # one rank's compute, as compute.json keeps it
# what to do about a baseline run that did not complete, by its status (the same command runs it again; a command
# of other training overrides is another tune, in another directory)
NEXT = {"timeout": "give a larger tune.trial_timeout_s: the same command with it runs the baseline again",
        "refused": "fix the training overrides, and give them a new tune.out",
        None: "run the same command to try it again, or fix the training overrides and give them a new tune.out"}


class Tune:
    def __init__(self, tc, train: list, out: Path):
        self.tc, self.out = tc, out
        self.base_overrides = [a for a in train if not a.startswith(OWN)]
        self.rest = [a for a in self.base_overrides if not a.lstrip("+").startswith("parallel=")]
        self.base = compose_config([a for a in train if not a.startswith(OWN[3:])])  # with the user's steps, seed
        if tc.trial_steps < self.base.throughput_warmup + 5:
            raise ConfigError(f"tune.trial_steps={tc.trial_steps}: a trial measures its throughput after "
                              f"throughput_warmup={self.base.throughput_warmup} steps; give at least "
                              f"{self.base.throughput_warmup + 5}")
        if tc.cluster:  # (read again once the baseline has run: a mistake in it is found before)
            clusters.read(clusters.path_of(tc.cluster))
        self.cmd = trials.command(tc.command)
        self.log = trials.Log(out / "trials.jsonl", out)
        self.budget = budget.Budget(tc.budget_min * 60, self.log)
        self.group = f"tune-{out.name}"
        self.cands, self.left_out, self.refused, self.verified, self.skipped = [], [], [], [], []
        self.chosen = None
        self.cluster = self.compute = self.fit = None

    # -- one trial ----------------------------------------------------------------------------------------------
    def trial(self, key: str, phase: str, cand: str, overrides: list, steps: int, seed: int, every: int) -> dict:
        """A recorded trial, run unless trials.jsonl has it already. A short one logs a row about every tenth of
        its measured steps, so that its throughput is a median over intervals, not one interval."""
        if key in self.log.done:
            return self.log.done[key]
        own = self.base_overrides if cand == "baseline" else [*self.rest, *overrides]
        line = [*own, f"steps={steps}", f"eval_every={every}", f"seed={seed}", f"name={self.group}"]
        start = None
        if phase == "try":
            line.append(f"logger.log_every={max(1, (steps - self.base.throughput_warmup) // 10)}")
            if (start := self.trial_start(cand)) is not None:
                line = [o for o in line if not o.startswith("compression.start_step=")]
                line.append(f"compression.start_step={start}")
        rec = trials.run(self.cmd, line, self.out, key, self.tc.trial_timeout_s)
        return self.log.add(rec | {"key": key, "phase": phase, "candidate": cand, "overrides": overrides,
                                   "steps": steps, "every": every, "seed": seed, "start_step": start})

    def trial_start(self, cand: str):
        """The compressor's first compressed step for a short trial of `cand` where its own comes after the trial's
        measured steps begin (PowerSGD's start_step): the trial would measure the uncompressed all-reduce, so it
        starts compressing with them; `ranking_speed` puts the uncompressed steps back. None where it need not."""
        c = next((c for c in self.cands if c.name == cand), None)
        first = self.base.throughput_warmup + 1
        return first if c is not None and compress.first_compressed_step(c.cfg.compression) > first else None

    def ranking_speed(self, c, rec: dict) -> float:
        """A trial's samples/s as its full-length run would have them: measured, or, for a trial that compressed
        from an earlier step than the candidate does, its measured (compressed) step for the compressed share of the
        full run and that step times the planner's uncompressed/compressed ratio for the rest; for an averaging
        (measured over the whole trial), its DDP warm-up's share of the trial made its share of the full run."""
        averaging = c.cfg.parallel.strategy in AVERAGING
        if not averaging and not rec.get("start_step"):
            return rec["samples_s"]
        steps, _ = self.full_steps(c)
        args = (c.cfg, self.cluster, self.shapes, self.compute, False)
        if averaging:  # (a warm-up of 10 steps is a third of a 30-step trial)
            trial, full = (predict.over_steps("", *args, 1, n)["step_s"] for n in (rec["steps"], steps))
            return rec["samples_s"] * trial / full
        compressed, whole = predict.row("", *args)["step_s"], predict.over_steps("", *args, 1, steps)["step_s"]
        return rec["samples_s"] * compressed / whole

    def timed(self, key: str, phase: str, work):
        """A step of the tune's own (the planner's), recorded with its time like a trial."""
        if key not in self.log.done:
            start = time.monotonic()
            work()
            self.log.add({"key": key, "phase": phase, "status": "completed", "wall_s": time.monotonic() - start})

    # -- diagnose and predict -----------------------------------------------------------------------------------
    def diagnose(self) -> dict:
        """The baseline at full length, seed 0: the checklist's numbers, and the first of the baseline's seeds that
        verification needs anyway, so that the budget knows from the start what a full-length run costs."""
        first = budget.full_key(self, None, 0)
        if self.log.done.get(first, {}).get("status", "completed") != "completed":
            self.log.drop(first)  # nothing can go on without it: each start of the same command tries it again
        rec = self.full(None, 0)
        if rec["status"] != "completed":
            log = trials.where(self.out, first) / trials.LOG
            said = f" (its output: {log})" if os.path.isfile(log) else ""
            raise ConfigError(f"the baseline run {rec['status']}: {rec['reason']}{said}; "
                              f"{NEXT.get(rec['status'], NEXT[None])}")
        return rec

    def predict(self, base_rec: dict) -> None:
        summary = records.read_summary(base_rec["dir"])
        self.cluster = dataclasses.replace(self.find_cluster(summary), nodes=summary["nodes"],
                                           ranks_per_node=summary["ranks_per_node"])
        model = build_model(self.base.model, self.base.data.num_labels)
        self.shapes = [p.shape for p in model.parameters() if p.requires_grad]
        self.compute = self.measured_compute(model)
        self.cands, self.refused = space.candidates(self.rest, list(self.tc.presets), space.knobs(self.tc.knobs),
                                                    self.predicted, self.cluster.nodes, space.fingerprint(self.base))
        self.refused += [(c.name, why) for c in self.cands if (why := self.spacing_error(c))]
        self.cands = [c for c in self.cands if not self.spacing_error(c)]
        self.base_pred = self.predicted(self.base)
        self.order, self.left_out = space.ranked(self.cands, self.base_pred["samples_s"], self.tc.search,
                                                 self.tc.prune, self.tc.seed)
        self.scale = base_rec["step_s"] / self.base_pred["step_s"]  # measured over predicted, for the estimates
        if not self.order:
            raise ConfigError("the search space is empty: every candidate was refused or predicted slower than the "
                              f"baseline (tune.prune={self.tc.prune}); widen tune.presets or tune.knobs")

    def measured_compute(self, model) -> dict:
        """One rank's compute as the planner measures it, once per tune (compute.json): a continued tune ranks
        and prunes as the first start did."""
        path = self.out / "compute.json"
        if os.path.lexists(path):
            if (got := kept_compute(path)) is not None:
                return got
        start = time.monotonic()
        compute, _ = predict.compute_times(dict.fromkeys(COMPUTE), self.base, model, self.cluster)
        records.write_json(path, compute)
        self.log.add({"key": "predict", "phase": "predict", "status": "completed", "wall_s": time.monotonic() - start})
        return compute

    def check_space(self) -> None:
        """ConfigError where the user's restrictions leave nothing to try: every candidate refused, or the
        baseline itself (checked before anything is written; the planner may still prune some later)."""
        _, _ = space.candidates(self.rest, list(self.tc.presets), space.knobs(self.tc.knobs), None, None,
                                space.fingerprint(self.base), strict=True)

    def predicted(self, cfg, cl=None, compute=None, window=None) -> dict:
        """The planner's row for `cfg` over the steps `window` = (first, last) that a measurement covers (None: a
        full-length run), from the cluster file's codec costs (not PowerSGD measured here, whose noise would make
        two equal configurations predict apart). Steps before the compressor's first compressed one (PowerSGD's
        start_step) are predicted uncompressed: a short trial of PowerSGD measures plain DDP."""
        first, last = window or (1, math.ceil(self.base.steps * self.base.accumulation.steps
                                              / cfg.accumulation.steps))
        return predict.over_steps("", cfg, cl or self.cluster, self.shapes, compute or self.compute, False, first,
                                  last)

    def at_trial(self, rec: dict, cl=None, compute=None) -> float:
        """The predicted step of trial record `rec`: over the steps its throughput was measured on, those after the
        throughput warm-up, or for an averaging trial its whole run from step 1 (records.run_rate), DDP warm-up
        included: a window from step 11 left a 10-step warm-up out of the prediction but in the measurement."""
        by_name = {c.name: c for c in self.cands}
        cfg = by_name[rec["candidate"]].cfg if rec["candidate"] in by_name else self.base
        if rec.get("start_step"):  # (the trial compressed from there: trial_start)
            cfg = dataclasses.replace(cfg, compression=dataclasses.replace(cfg.compression,
                                                                           start_step=rec["start_step"]))
        first = 1 if cfg.parallel.strategy in AVERAGING else min(self.base.throughput_warmup + 1, rec["steps"])
        window = (first, rec["steps"])
        return self.predicted(cfg, cl, compute, window)["step_s"]

    def find_cluster(self, summary: dict):
        """tune.cluster, else the conf/cluster file of this job's shape and link, else one calibrated here."""
        if self.tc.cluster:
            return clusters.read(clusters.path_of(self.tc.cluster))
        found = clusters.matching(summary["nodes"], summary["ranks_per_node"], summary["link"])
        if found is not None:
            return found
        path = self.out / "calibrated.yaml"
        if trials.multirun(self.base_overrides) or self.tc.command:
            raise ConfigError(f"no conf/cluster file is of this job's shape ({summary['nodes']} x "
                              f"{summary['ranks_per_node']}, link {summary['link']}); calibrate it on the job "
                              "(the planner's calibrate, docs/plan.md) and give tune.cluster=PATH.yaml")
        self.timed("calibrate", "predict", lambda: predict.calibrate_here(path, summary["ranks_per_node"]))
        return clusters.read(path)

    # -- try: successive halving --------------------------------------------------------------------------------
    def search(self, bar=tqdm) -> list:
        """[(Candidate, its last rung's record)], fastest first."""
        alive, last, failed = list(self.order), {}, set()
        for rung in range(self.tc.rungs):
            steps = self.tc.trial_steps * self.tc.eta ** rung
            got = {}
            for c in bar(alive, desc=f"try: rung {rung + 1} of {self.tc.rungs} ({steps} steps)", leave=False):
                key = f"try-r{rung}-{trials.slug(c.name)}"
                need = budget.estimate(self, c, steps) + budget.reserve(self)
                if key not in self.log.done and not self.budget.covers(need):
                    break  # the rest, ranked lower, would not leave room to verify
                rec = self.trial(key, "try", c.name, c.overrides, steps, self.base.seed, steps)
                if rec["status"] == "completed":
                    got[c.name] = (c, rec)
                else:
                    failed.add(c.name)  # on any rung: out of verification (a crash at full length is likelier)
            if not got:
                break
            last |= got
            ranked = sorted(got.values(), key=lambda cr: -self.ranking_speed(*cr))
            alive = [c for c, _ in ranked[:max(self.tc.verify, math.ceil(len(ranked) / self.tc.eta))]]
            if len(ranked) <= self.tc.verify or rung == self.tc.rungs - 1:
                break
        # the candidates of the last rung first (measured longest), then by throughput
        return sorted((cr for name, cr in last.items() if name not in failed),
                      key=lambda cr: (-cr[1]["steps"], -self.ranking_speed(*cr)))

    # -- verify ---------------------------------------------------------------------------------------------------
    def full_steps(self, c) -> tuple:
        """(steps, eval_every) of a full-length run of `c`: the baseline's samples, whatever its accumulation."""
        base, own = self.base.accumulation.steps, c.cfg.accumulation.steps  # (spacing_error: both divide)
        return self.base.steps * base // own, max(1, self.base.eval_every * base // own)

    def spacing_error(self, c) -> str:
        """Why `c` cannot run the baseline's samples with evaluations at the baseline's samples ('' when it can):
        its accumulation must divide the baseline's micro-batches of the run and between evaluations."""
        base, own = self.base.accumulation.steps, c.cfg.accumulation.steps
        bad = next((k for k, v in (("steps", self.base.steps), ("eval_every", self.base.eval_every))
                    if v * base % own), None)
        return "" if bad is None else (
            f"accumulation.steps={own}: {bad}={getattr(self.base, bad)} at the baseline's accumulation {base} is "
            f"{getattr(self.base, bad) * base} micro-batches, not a multiple of {own}, so its evaluations (or its "
            f"samples) could not be the baseline's; give {bad} a multiple of {own}")

    def full(self, c, i: int) -> dict:
        seed, key = self.base.seed + i, budget.full_key(self, c, i)
        if c is None:
            return self.trial(key, "diagnose" if i == 0 else "verify", "baseline", [], self.base.steps, seed,
                              self.base.eval_every)
        steps, every = self.full_steps(c)
        return self.trial(key, "verify", c.name, c.overrides, steps, seed, every)

    def affords(self, c) -> bool:
        return verify.affords(self, c)

    def pair(self, cand: str):
        """(seed group of `cand`'s completed verification runs, the baseline's) or None: what verify judges."""
        return verify.pair(self, cand)

    # -- refit ------------------------------------------------------------------------------------------------------
    def refit(self) -> None:
        points = [(r, r["step_s"]) for r in self.log.done.values()
                  if r["phase"] in ("diagnose", "try") and r["status"] == "completed"]
        if len(points) >= 2:
            self.fit = refit(points, self.cluster, self.compute, lambda r, cl, comp: self.at_trial(r, cl, comp),
                             [r["candidate"] for r, _ in points])


def kept_compute(path: Path):
    """compute.json as measured by an earlier start, or None (with a warning naming the file) where it is not that:
    compute is then measured again."""
    try:
        got = records.read_json(path)
    except (OSError, ValueError) as e:
        return stale(path, one_line(str(e)))
    if not isinstance(got, dict):
        return stale(path, "not an object of seconds")
    bad = next((k for k in COMPUTE if not trials.number(got.get(k))), None)
    if bad is not None:
        return stale(path, f"{bad} is {str(got.get(bad))[:40]!r}, not seconds")
    return {k: float(got[k]) for k in COMPUTE}


def stale(path: Path, why: str) -> None:
    print_warning(f"{path}: {why}; measuring compute again")
    return None
