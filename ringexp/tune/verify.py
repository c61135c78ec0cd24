"""Verification: the fastest trials at full length over seeds against the baseline's, fastest first, each judged
by the seed groups of ringexp.verdicts (ringexp.quality) on tune.metrics, equivalent only where it is on every one
(an intersection-union test, each at the same level); the first equivalent one is chosen. A candidate with a run
that collapsed (ringexp.tune.collapse: a trial of its rungs or a verification seed) is not chosen.

The error bound (docs/tune.md): each candidate's verdict is paired over `tune.seeds` seeds and tests equivalence
at alpha = tune.error / tune.verify (Bonferroni over the verification slots). The tune chooses a harmful candidate
only if some verified harmful candidate was called equivalent, and each of the at most `tune.verify` verified is so
called with chance at most alpha, whatever the order: the chosen one is worse than the margin with chance at most
tune.error. A candidate is chosen only on every seed of it and of the baseline completed; a verdict on one seed
(a validation-set bootstrap, which leaves out the seeds' variance) neither chooses nor stops one.
"""

from dataclasses import dataclass, field, replace
from typing import Protocol

from tqdm import tqdm

from ringexp import quality, records
from ringexp.tune import collapse
from ringexp.tune.budget import FULL, Budget
from ringexp.tune.ranking import Ranking
from ringexp.verdicts.groups import judge as judged
from ringexp.verdicts.groups import report as seed_report
from ringexp.verdicts.groups import seed_groups
from ringexp.verdicts.load import load_local

STOPS = ("worse", "not equivalent")  # a decisive verdict that no further seed would turn into a choice


@dataclass
class Verification:
    """What verification did, filled in as it goes (an interrupted tune's playbook shows what it had): each
    verified candidate with its (headline Verdict or None, note), those not verified and why, the chosen one."""
    verified: list = field(default_factory=list)
    skipped: list = field(default_factory=list)
    chosen: object = None


class Runs(Protocol):
    """The full-length runs verification asks for: a tune's (FullRuns), or a simulation's (tests/test_tune_error.py)."""

    def full(self, c, i: int) -> dict: ...  # seed i's run of candidate c (None: the baseline), run or recorded

    def pair(self, cand: str): ...  # (cand's seed group, the baseline's) over their completed runs, or None

    def affords(self, c) -> bool: ...  # whether every seed of c and the baseline still to run is paid for

    def trials(self, c) -> list: ...  # the completed trial records of c (its halving rungs), for collapse

    def baseline_at(self, rec: dict) -> list: ...  # [{metric: value}] of the baseline's full runs at rec's samples


def alpha(tc) -> float:
    """Each one-sided test's level: the tune's error level over its verification slots (Bonferroni)."""
    return tc.error / tc.verify


def verify(tc, tried: list, runs: Runs, bar=tqdm, into: Verification | None = None) -> Verification:
    """Fastest first: each candidate over its seeds and the baseline's (stopped early by a decisive worse or not
    equivalent, a failed run or a collapsed one; not begun where its trial collapsed); the first one chosen() is.
    A knob value that made its own preset worse (the preset without it verified and not worse) is not verified
    again on another preset (`blamed`)."""
    v, blamed = into if into is not None else Verification(), {}
    for c, _ in bar(tried, desc="verify", leave=False):
        if len(v.verified) == tc.verify:
            break
        if (why := next((k for k in c.overrides[1:] if k in blamed), None)) is not None:
            v.skipped.append((c, f"{why} made {blamed[why]} worse than {blamed[why].split()[0]} without it"))
            continue
        # a collapsed trial keeps `c` out before its seeds are paid for, and before a test of it takes one of the
        # tune.verify slots the bound is divided among (the story's tune once spent six of ten so)
        if (fell := collapsed(tc, runs, runs.trials(c))) is not None:
            v.skipped.append((c, fell))
            continue
        if not verify_one(tc, runs, c, v):
            break
        if chosen(tc, v.verified[-1][1]):
            v.chosen = c
            break
        blamed |= blame(v, c)
    return v


def chosen(tc, verdict) -> bool:
    """Whether a candidate's (Verdict, note) lets it be chosen: decisive, over every seed, equivalent or better
    (a failed seed leaves fewer paired seeds than tc.seeds)."""
    v = verdict and verdict[0]
    return bool(v and v.decisive and v.seeds == tc.seeds and v.word in quality.CHOOSES)


def blame(v: Verification, c) -> dict:
    """{knob override: candidate name} for `c`'s knobs when `c` was decisively worse and its own preset without
    them was verified and not worse: only then is the knob, not the preset, what made it worse."""
    mine = v.verified[-1][1]
    if len(c.overrides) < 2 or not (mine and mine[0] and mine[0].decisive and mine[0].word == "worse"):
        return {}
    preset = next((x for d, x in v.verified if d.overrides == c.overrides[:1]), None)
    if not (preset and preset[0] and preset[0].decisive and preset[0].word != "worse"):
        return {}
    return {k: c.name for k in c.overrides[1:]}


def verify_one(tc, runs: Runs, c, v: Verification) -> bool:
    """Run `c`'s seeds (and the baseline's) as far as they decide; False, before any, where the budget cannot
    pay for all of them (a candidate verified on fewer seeds than it needs could not be chosen)."""
    if not runs.affords(c):
        return False
    failed = None
    for i in range(tc.seeds):
        got = [runs.full(None, i), runs.full(c, i)]
        if (bad := next((r for r in got if r["status"] != "completed"), None)) is not None:
            failed = f"{bad['candidate']} seed {bad['seed']} {bad['status']}: not chosen"
            break
        if (failed := collapsed(tc, runs, got[1:])) is not None or stops(judge(tc, runs, c)):
            break
    verdict = judge(tc, runs, c)
    if failed:  # (no verdict acts on a candidate with a failed or collapsed run: its own is kept in the note)
        said = verdict and verdict[0] and f"its verdict: {verdict[0].text()}"
        verdict = (None, "; ".join(x for x in (failed, verdict and verdict[1], said) if x))
    v.verified.append((c, verdict))
    return True


def collapsed(tc, runs: Runs, recs: list) -> str | None:
    """'<run> collapsed: why; not chosen' for the first of a candidate's run records `recs` that collapsed against
    the baseline's full runs at its samples (ringexp.tune.collapse), else None."""
    for r in recs:
        if (why := collapse.why(collapse.values(r), runs.baseline_at(r), tc.margins(), tc.metrics)):
            return f"{r['key']} ({r['steps']} steps, seed {r['seed']}) collapsed: {why}; not chosen"
    return None


def stops(verdict) -> bool:
    return bool(verdict and verdict[0] and verdict[0].decisive and verdict[0].word in STOPS)


def judge(tc, runs: Runs, c):
    """(Verdict or None, note) of candidate `c` against the baseline over their completed verification runs so far,
    at the tune's alpha: the one its decision over tune.metrics acts on (quality.decision: equivalent only
    where every metric is, each at its margin), its test naming the metric; None before both have one."""
    pair = runs.pair(c.name)
    if pair is None:
        return None
    verdicts, note = judged(*pair, tc.quality_budget, alpha(tc), tc.margins())
    metric, v = quality.decision(verdicts, tc.metrics)
    if v is not None:  # (then every metric has a verdict: the others' said beside it)
        others = "".join(f"; {m} {verdicts[m].word} {verdicts[m].diff:+.3f}" for m in tc.metrics if m != metric)
        v = replace(v, test=f"{metric}, {v.test}{others}")
    return (v, note) if v or note else None


@dataclass(frozen=True)
class FullRuns:
    """A tune's full-length runs: run (or read from trials.jsonl) by `run(c, i)`, judged from their directories,
    paid for out of `budget` as `ranking` estimates them."""
    tc: object
    run: object  # (c, i) -> the record of seed i's full-length run of c (loop.Job.full)
    budget: Budget
    ranking: Ranking

    def full(self, c, i: int) -> dict:
        return self.run(c, i)

    def pair(self, cand: str):
        return pair(self.budget.log.done, cand)

    def trials(self, c) -> list:
        return [r for r in self.budget.log.done.values()
                if r["phase"] == "try" and r["candidate"] == c.name and r["status"] == "completed"]

    def baseline_at(self, rec: dict) -> list:
        """The baseline's full runs at trial record `rec`'s samples (its steps where it predates them). A trial's
        schedule (warm-up, decay) ends within its few steps, unlike the baseline's: it meets the baseline where
        that had run as many samples or as many optimizer steps, whichever came first (an accumulation candidate's
        20 steps of 4 micro-batches, 0.80-0.82 AUROC in the bound story, once met the baseline's step 80, 0.92,
        and were each taken for a collapse; at its step 16 the baseline had 0.70). A trial meets the diagnose
        phase's run alone, which every trial follows, so that it is judged the same whenever it is checked: against
        the lowest of however many seeds had run, one of the story was a collapse in its tune and not in the
        continued tune."""
        trial, got = rec.get("phase") == "try", []
        phases = ("diagnose",) if trial else FULL
        for r in self.budget.log.done.values():
            if r["phase"] in phases and r["candidate"] == "baseline" and r["status"] == "completed":
                both = rec.get("samples") and r.get("samples")
                at, per_step = (rec["samples"], r["samples"] // r["steps"]) if both else (rec["steps"], 1)
                if trial:
                    at = min(at, rec["steps"] * per_step)
                got.append(collapse.at_samples(records.read_rows(r["dir"]), at, per_step))
        return [g for g in got if g is not None]

    def affords(self, c) -> bool:
        """Whether the budget pays for every seed of `c` and the baseline still to run (or they decide it)."""
        return self.decided(c) or self.budget.covers(self.budget.verifying(self.ranking, c))

    def decided(self, c) -> bool:
        """Whether `c`'s recorded runs already decide it (a continued tune): every seed run, a failed run, or a
        verdict that stops verification early."""
        done = self.budget.left(None) == self.budget.left(c) == 0
        mine = [r for r in self.budget.log.done.values() if r["phase"] in FULL and r["candidate"] == c.name]
        failed = any(r["status"] != "completed" for r in self.budget.log.done.values()
                     if r["phase"] in FULL and r["candidate"] in ("baseline", c.name))
        fell = collapsed(self.tc, self, [r for r in mine if r["status"] == "completed"])
        return done or failed or fell is not None or stops(judge(self.tc, self, c))


def pair(done: dict, cand: str):
    """(the seed group of `cand`'s completed verification runs among trial records `done`, the baseline's), read
    from their directories; None before both have one."""
    runs = load_local([r["dir"] for r in done.values()
                       if r["phase"] in FULL and r["candidate"] in ("baseline", cand) and r["status"] == "completed"])
    groups = seed_groups(runs)
    base = [g for g in groups if any(r["dir"] in dirs(done, "baseline") for r in g.runs)]
    mine = [g for g in groups if any(r["dir"] in dirs(done, cand) for r in g.runs)]
    return (mine[0], base[0]) if base and mine else None


def dirs(done: dict, cand: str) -> set:
    return {r["dir"] for r in done.values() if r["phase"] in FULL and r["candidate"] == cand}


def report(tc, done: dict):
    """The seed-group report over every verification run among trial records `done`, at the tune's alpha (None
    before any)."""
    runs = load_local([r["dir"] for r in done.values() if r["phase"] in FULL and r["status"] == "completed"])
    groups = seed_groups(runs)
    base = next((i for i, g in enumerate(groups) if any(r["dir"] in dirs(done, "baseline") for r in g.runs)), None)
    return (seed_report(groups, base, tc.quality_budget, alpha(tc), tc.margins(), tc.metrics, tc.verify)
            if groups else None)
