"""Verification: the fastest trials at full length over seeds against the baseline's, fastest first, each judged
by compare's seed groups (ringexp.quality); the first equivalent one is chosen.

The error bound (docs/tune.md): each candidate's verdict is paired over `tune.seeds` seeds and tests equivalence
at alpha = tune.error / tune.verify (Bonferroni over the verification slots). The tune chooses a harmful candidate
only if some verified harmful candidate was called equivalent, and each of the at most `tune.verify` verified is so
called with chance at most alpha, whatever the order: the chosen one is worse than the margin with chance at most
tune.error. A candidate is chosen only on every seed of it and of the baseline completed; a verdict on one seed
(a validation-set bootstrap, which leaves out the seeds' variance) neither chooses nor stops one.
"""

from tqdm import tqdm

from ringexp.tune import budget
from ringexp.tune.budget import FULL
from ringexp.verdicts.groups import QUALITY, seed_groups
from ringexp.verdicts.groups import judge as judged
from ringexp.verdicts.groups import report as seed_report
from ringexp.verdicts.load import load_local

STOPS = ("worse", "not equivalent")  # a decisive verdict that no further seed would turn into a choice
CHOOSES = ("equivalent", "better")


def alpha(tc) -> float:
    """Each one-sided test's level: the tune's error level over its verification slots (Bonferroni)."""
    return tc.error / tc.verify


def verify(t, tried: list, bar=tqdm) -> None:
    """Fastest first: each candidate over its seeds and the baseline's (stopped early by a decisive worse or not
    equivalent, or a failed run); the first one chosen() is. A knob value that made its own preset worse (the preset
    without it verified and not worse) is not verified again on another preset (`blamed`)."""
    blamed = {}
    for c, _ in bar(tried, desc="verify", leave=False):
        if len(t.verified) == t.tc.verify:
            return
        if (why := next((k for k in c.overrides[1:] if k in blamed), None)) is not None:
            t.skipped.append((c, f"{why} made {blamed[why]} worse than {blamed[why].split()[0]} without it"))
            continue
        if not verify_one(t, c):
            return
        if chosen(t.tc, t.verified[-1][1]):
            t.chosen = c
            return
        blamed |= blame(t, c)


def chosen(tc, verdict) -> bool:
    """Whether a candidate's (Verdict, note) lets it be chosen: decisive, over every seed, equivalent or better
    (a failed seed leaves fewer paired seeds than tc.seeds)."""
    v = verdict and verdict[0]
    return bool(v and v.decisive and v.seeds == tc.seeds and v.word in CHOOSES)


def blame(t, c) -> dict:
    """{knob override: candidate name} for `c`'s knobs when `c` was decisively worse and its own preset without
    them was verified and not worse: only then is the knob, not the preset, what made it worse."""
    mine = t.verified[-1][1]
    if len(c.overrides) < 2 or not (mine and mine[0] and mine[0].decisive and mine[0].word == "worse"):
        return {}
    preset = next((v for d, v in t.verified if d.overrides == c.overrides[:1]), None)
    if not (preset and preset[0] and preset[0].decisive and preset[0].word != "worse"):
        return {}
    return {k: c.name for k in c.overrides[1:]}


def verify_one(t, c) -> bool:
    """Run `c`'s seeds (and the baseline's) as far as they decide; False, before any, where the budget cannot
    pay for all of them (a candidate verified on fewer seeds than it needs could not be chosen)."""
    if not t.affords(c):
        return False
    failed = None
    for i in range(t.tc.seeds):
        runs = [t.full(None, i), t.full(c, i)]
        if (bad := next((r for r in runs if r["status"] != "completed"), None)) is not None:
            failed = f"{bad['candidate']} seed {bad['seed']} {bad['status']}: not chosen"
            break
        if stops(judge(t, c)):
            break
    verdict = judge(t, c)
    if failed:
        verdict = (verdict[0] if verdict else None, "; ".join(x for x in (verdict and verdict[1], failed) if x))
    t.verified.append((c, verdict))
    return True


def affords(t, c) -> bool:
    """Whether the budget pays for every seed of `c` and the baseline still to run (or they decide it already)."""
    return decided(t, c) or t.budget.covers(budget.verifying(t, c))


def stops(verdict) -> bool:
    return bool(verdict and verdict[0] and verdict[0].decisive and verdict[0].word in STOPS)


def decided(t, c) -> bool:
    """Whether `c`'s recorded runs already decide it (a continued tune): every seed run, a failed run, or a
    verdict that stops verification early."""
    done = budget.left(t, None) == budget.left(t, c) == 0
    failed = any(r["status"] != "completed" for r in t.log.done.values()
                 if r["phase"] in FULL and r["candidate"] in ("baseline", c.name))
    return done or failed or stops(judge(t, c))


def judge(t, c):
    """(headline Verdict or None, note) of candidate `c` against the baseline over their completed verification
    runs so far, at the tune's alpha; None before both have one."""
    pair = t.pair(c.name)
    if pair is None:
        return None
    verdicts, note = judged(*pair, t.tc.quality_budget, alpha(t.tc))
    return (verdicts[QUALITY[0]], note) if verdicts.get(QUALITY[0]) or note else None


def pair(t, cand: str):
    """(the seed group of `cand`'s completed verification runs, the baseline's), read from their directories; None
    before both have one. (The Tune's `pair`: a simulation gives its own.)"""
    runs = load_local([r["dir"] for r in t.log.done.values()
                       if r["phase"] in FULL and r["candidate"] in ("baseline", cand) and r["status"] == "completed"])
    groups = seed_groups(runs)
    base = [g for g in groups if any(r["dir"] in dirs(t, "baseline") for r in g.runs)]
    mine = [g for g in groups if any(r["dir"] in dirs(t, cand) for r in g.runs)]
    return (mine[0], base[0]) if base and mine else None


def dirs(t, cand: str) -> set:
    return {r["dir"] for r in t.log.done.values() if r["phase"] in FULL and r["candidate"] == cand}


def report(t):
    """compare's seed-group report over every verification run, at the tune's alpha (None before any)."""
    runs = load_local([r["dir"] for r in t.log.done.values() if r["phase"] in FULL
                       and r["status"] == "completed"])
    groups = seed_groups(runs)
    base = next((i for i, g in enumerate(groups) if any(r["dir"] in dirs(t, "baseline") for r in g.runs)), None)
    return seed_report(groups, base, t.tc.quality_budget, alpha(t.tc)) if groups else None

