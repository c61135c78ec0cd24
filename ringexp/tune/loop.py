"""The tune's phases over one directory, every trial recorded before the next starts (trials.Log), so that the
same command continues a tune killed at any point.

    diagnose   the user's configuration at full length, seed 0 (verification's first baseline run): the
               checklist's numbers, the planner's cluster, what a full-length run costs
    predict    every candidate's predicted step (ringexp.predict), the shortlist in the planner's order
    try        successive halving over the shortlist: short trials, the fastest 1/eta go on at eta x the steps,
               each trial only while the budget left still covers it and the verification after it
    verify     the fastest trials at full length over seeds against the baseline's, fastest first, judged by
               ringexp.quality through the seed groups of ringexp.verdicts; the first equivalent one is chosen
    refit      the cluster's constants refitted on the trials (ringexp.tune.refit)

Each phase is a free function over values (a Job that runs and records training runs, the Budget, the Ranking)
that returns its record; the Tune only sequences them and keeps their records for the playbook.
"""

import dataclasses
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from ringexp import predict, records
from ringexp.cluster import files as clusters
from ringexp.config import TrainConfig
from ringexp.errors import ConfigError, one_line, print_warning
from ringexp.models import build_model
from ringexp.tune import budget, ranking, space, trials, verify
from ringexp.tune.ranking import Ranking
from ringexp.tune.refit import refit
from ringexp.validate import compose_config

OWN = ("steps=", "seed=", "eval_every=", "name=", "hydra.run.dir=", "hydra.sweep.dir=", "resume=")  # the tune's
COMPUTE = ("forward_s", "backward_s", "optimizer_s")  # one rank's compute, as compute.json keeps it
# what to do about a baseline run that did not complete, by its status (the same command runs it again; a command
# of other training overrides is another tune, in another directory)
NEXT = {"timeout": "give a larger tune.trial_timeout_s: the same command with it runs the baseline again",
        "refused": "fix the training overrides, and give them a new tune.out",
        None: "run the same command to try it again, or fix the training overrides and give them a new tune.out"}


@dataclass(frozen=True)
class Job:
    """How a tune runs training: the user's command and overrides (`base_overrides`; `rest` without parallel=),
    their composed configuration, and the directory whose trials.jsonl (`log`) records every run."""
    tc: object
    out: Path
    base: TrainConfig
    base_overrides: tuple
    rest: tuple
    cmd: list
    log: trials.Log

    def trial(self, key: str, phase: str, cand: str, overrides: list, steps: int, seed: int, every: int,
              start=None) -> dict:
        """A recorded trial, run unless trials.jsonl has it already. A short one logs a row about every tenth of
        its measured steps, so that its throughput is a median over intervals, not one interval; `start`: the
        compressor's first compressed step for it (ranking.trial_start)."""
        if key in self.log.done:
            return self.log.done[key]
        own = list(self.base_overrides) if cand == "baseline" else [*self.rest, *overrides]
        line = [*own, f"steps={steps}", f"eval_every={every}", f"seed={seed}", f"name=tune-{self.out.name}"]
        if phase == "try":
            line.append(f"logger.log_every={max(1, (steps - self.base.throughput_warmup) // 10)}")
            if start is not None:
                line = [o for o in line if not o.startswith("compression.start_step=")]
                line.append(f"compression.start_step={start}")
        rec = trials.run(self.cmd, line, self.out, key, self.tc.trial_timeout_s)
        return self.log.add(rec | {"key": key, "phase": phase, "candidate": cand, "overrides": overrides,
                                   "steps": steps, "every": every, "seed": seed, "start_step": start})

    def full(self, c, i: int) -> dict:
        """Seed `i`'s full-length run of `c` (None: the baseline, whose seed 0 is diagnose's)."""
        seed, key = self.base.seed + i, budget.full_key(self.base.seed, c, i)
        steps, every = ranking.full_steps(self.base, c)
        if c is None:
            return self.trial(key, "diagnose" if i == 0 else "verify", "baseline", [], steps, seed, every)
        return self.trial(key, "verify", c.name, c.overrides, steps, seed, every)

    def timed(self, key: str, phase: str, work) -> None:
        """A step of the tune's own (the planner's), recorded with its time like a trial."""
        if key not in self.log.done:
            start = time.monotonic()
            work()
            self.log.add({"key": key, "phase": phase, "status": "completed", "wall_s": time.monotonic() - start})


class Tune:
    """The phases in order over one directory; each phase's record kept for the playbook (what was done so far,
    whenever the tune stops)."""

    def __init__(self, tc, train: list, out: Path):
        base_overrides = [a for a in train if not a.startswith(OWN)]
        base = compose_config([a for a in train if not a.startswith(OWN[3:])])  # with the user's steps, seed
        if tc.trial_steps < base.throughput_warmup + 5:
            raise ConfigError(f"tune.trial_steps={tc.trial_steps}: a trial measures its throughput after "
                              f"throughput_warmup={base.throughput_warmup} steps; give at least "
                              f"{base.throughput_warmup + 5}")
        if tc.cluster:  # (read again once the baseline has run: a mistake in it is found before)
            clusters.read(clusters.path_of(tc.cluster))
        rest = [a for a in base_overrides if not a.lstrip("+").startswith("parallel=")]
        self.tc = tc
        self.job = Job(tc, out, base, tuple(base_overrides), tuple(rest), trials.command(tc.command),
                       trials.Log(out / "trials.jsonl", out))
        self.budget = budget.Budget(tc.budget_min * 60, self.job.log, tc.seeds, base.seed)
        self.diagnosis = self.ranking = self.fit = None  # each phase's record, once it has one
        self.verification = verify.Verification()

    def check_space(self) -> None:
        """ConfigError where the user's restrictions leave nothing to try: every candidate refused, or the
        baseline itself (checked before anything is written; the planner may still prune some later)."""
        space.candidates(list(self.job.rest), list(self.tc.presets), space.knobs(self.tc.knobs), None, None,
                         space.fingerprint(self.job.base), strict=True)

    def plan(self) -> None:
        """diagnose, then predict."""
        self.diagnosis = diagnose(self.job)
        self.ranking = ranked(self.job, self.diagnosis)

    def tune(self, bar=tqdm) -> None:
        """try, verify, refit."""
        tried = search(self.job, self.budget, self.ranking, bar)
        verify.verify(self.tc, tried, verify.FullRuns(self.tc, self.job.full, self.budget, self.ranking), bar,
                      into=self.verification)
        self.fit = refitted(self.job.log.done, self.ranking)


# -- diagnose and predict ---------------------------------------------------------------------------------------
def diagnose(job: Job) -> dict:
    """The baseline at full length, seed 0: the checklist's numbers, and the first of the baseline's seeds that
    verification needs anyway, so that the budget knows from the start what a full-length run costs."""
    first = budget.full_key(job.base.seed, None, 0)
    if job.log.done.get(first, {}).get("status", "completed") != "completed":
        job.log.drop(first)  # nothing can go on without it: each start of the same command tries it again
    rec = job.full(None, 0)
    if rec["status"] != "completed":
        log = trials.where(job.out, first) / trials.LOG
        said = f" (its output: {log})" if os.path.isfile(log) else ""
        raise ConfigError(f"the baseline run {rec['status']}: {rec['reason']}{said}; "
                          f"{NEXT.get(rec['status'], NEXT[None])}")
    return rec


def ranked(job: Job, base_rec: dict) -> Ranking:
    """The planner's Ranking of the tune's space on the cluster of the baseline run's shape."""
    summary = records.read_summary(base_rec["dir"])
    cluster = dataclasses.replace(find_cluster(job, summary), nodes=summary["nodes"],
                                  ranks_per_node=summary["ranks_per_node"])
    model = build_model(job.base.model, job.base.data.num_labels)
    shapes = [p.shape for p in model.parameters() if p.requires_grad]
    compute = measured_compute(job, model, cluster)
    return ranking.rank(job.tc, list(job.rest), job.base, cluster, shapes, compute, base_rec["step_s"])


def measured_compute(job: Job, model, cluster) -> dict:
    """One rank's compute as the planner measures it, once per tune (compute.json): a continued tune ranks
    and prunes as the first start did."""
    path = job.out / "compute.json"
    if os.path.lexists(path):
        if (got := kept_compute(path)) is not None:
            return got
    start = time.monotonic()
    compute, _ = predict.compute_times(dict.fromkeys(COMPUTE), job.base, model, cluster)
    records.write_json(path, compute)
    job.log.add({"key": "predict", "phase": "predict", "status": "completed", "wall_s": time.monotonic() - start})
    return compute


def find_cluster(job: Job, summary: dict):
    """tune.cluster, else the conf/cluster file of this job's shape and link, else one calibrated here."""
    if job.tc.cluster:
        return clusters.read(clusters.path_of(job.tc.cluster))
    found = clusters.matching(summary["nodes"], summary["ranks_per_node"], summary["link"])
    if found is not None:
        return found
    path = job.out / "calibrated.yaml"
    if trials.multirun(list(job.base_overrides)) or job.tc.command:
        raise ConfigError(f"no conf/cluster file is of this job's shape ({summary['nodes']} x "
                          f"{summary['ranks_per_node']}, link {summary['link']}); calibrate it on the job "
                          "(the planner's calibrate, docs/plan.md) and give tune.cluster=PATH.yaml")
    job.timed("calibrate", "predict", lambda: predict.calibrate_here(path, summary["ranks_per_node"]))
    return clusters.read(path)


# -- try: successive halving ------------------------------------------------------------------------------------
def search(job: Job, spend: budget.Budget, r: Ranking, bar=tqdm) -> list:
    """[(Candidate, its last rung's record)], fastest first."""
    tc, alive, last, failed = job.tc, list(r.order), {}, set()
    for rung in range(tc.rungs):
        steps = tc.trial_steps * tc.eta ** rung
        got = {}
        for c in bar(alive, desc=f"try: rung {rung + 1} of {tc.rungs} ({steps} steps)", leave=False):
            key = f"try-r{rung}-{trials.slug(c.name)}"
            if key not in job.log.done and not spend.covers(spend.estimate(r, c, steps) + spend.reserve(r)):
                break  # the rest, ranked lower, would not leave room to verify
            rec = job.trial(key, "try", c.name, c.overrides, steps, budget.trial_seed(job.base.seed, rung), steps,
                            ranking.trial_start(r, c.name))
            if rec["status"] == "completed":
                got[c.name] = (c, rec)
            else:
                failed.add(c.name)  # on any rung: out of verification (a crash at full length is likelier)
        if not got:
            break
        last |= got
        ordered = sorted(got.values(), key=lambda cr: -ranking.ranking_speed(r, *cr))
        alive = [c for c, _ in ordered[:max(tc.verify, math.ceil(len(ordered) / tc.eta))]]
        if len(ordered) <= tc.verify or rung == tc.rungs - 1:
            break
    # the candidates of the last rung first (measured longest), then by throughput
    return sorted((cr for name, cr in last.items() if name not in failed),
                  key=lambda cr: (-cr[1]["steps"], -ranking.ranking_speed(r, *cr)))


# -- refit --------------------------------------------------------------------------------------------------------
def refitted(done: dict, r: Ranking):
    """The cluster's constants refitted on the completed trials among records `done` (refit.refit), or None
    under two."""
    points = [(x, x["step_s"]) for x in done.values()
              if x["phase"] in ("diagnose", "try") and x["status"] == "completed"]
    if len(points) < 2:
        return None
    return refit(points, r.cluster, r.compute, lambda x, cl, comp: ranking.at_trial(r, x, cl, comp),
                 [x["candidate"] for x, _ in points])


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
