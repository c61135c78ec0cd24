"""Verification: the fastest trials at full length over seeds against the baseline's, fastest first, each judged
by compare's seed groups (ringexp.quality); the first equivalent one is chosen."""

from tqdm import tqdm

from ringexp.compare import load_local
from ringexp.compare.groups import QUALITY, seed_groups
from ringexp.compare.groups import judge as judged
from ringexp.compare.groups import report as seed_report
from ringexp.tune import budget
from ringexp.tune.budget import FULL


def verify(t, tried: list, bar=tqdm) -> None:
    """Fastest first: seed 0 of candidate and baseline (a validation-set verdict); a candidate not worse runs
    the other seeds (a paired verdict over seeds); the first equivalent (or better) one is chosen. A knob value
    that made one candidate worse is not verified again on another (`blamed`)."""
    blamed = {}
    for c, _ in bar(tried, desc="verify", leave=False):
        if len(t.verified) == t.tc.verify:
            return
        if (why := next((k for k in c.overrides[1:] if k in blamed), None)) is not None:
            t.skipped.append((c, f"{why} made {blamed[why]} worse"))
            continue
        if not verify_one(t, c):
            return
        verdict = t.verified[-1][1]
        if verdict and verdict[0].word in ("equivalent", "better"):
            t.chosen = c
            return
        if verdict and verdict[0].word == "worse":
            blamed |= {k: c.name for k in c.overrides[1:]}


def verify_one(t, c) -> bool:
    """Run `c`'s seeds (and the baseline's) as far as they decide; False, before any, where the budget cannot
    pay for all of them (a candidate verified on fewer seeds than it needs could not be chosen)."""
    if not decided(t, c) and not t.budget.covers(sum(budget.cost(t, x, i) for i in range(t.tc.seeds)
                                                          for x in (None, c))):
        return False
    for i in range(t.tc.seeds):
        runs = [t.full(None, i), t.full(c, i)]
        if any(r["status"] != "completed" for r in runs):
            break
        verdict = judge(t, c)
        if verdict and verdict[0].word in ("worse", "not equivalent"):
            break
    t.verified.append((c, judge(t, c)))
    return True


def decided(t, c) -> bool:
    """Whether `c`'s recorded runs already decide it (a continued tune): every seed run, or a verdict that
    stops verification early."""
    done = all(budget.cost(t, x, i) == 0 for i in range(t.tc.seeds) for x in (None, c))
    verdict = judge(t, c)
    return done or bool(verdict and verdict[0].word in ("worse", "not equivalent"))


def judge(t, c):
    """(headline Verdict, note) of candidate `c` against the baseline over their verification runs so far."""
    runs = load_local([r["dir"] for r in t.log.done.values()
                       if r["phase"] in FULL and r["candidate"] in ("baseline", c.name)
                       and r["status"] == "completed"])
    groups = seed_groups(runs)
    base = [g for g in groups if any(r["dir"] in dirs(t, "baseline") for r in g.runs)]
    mine = [g for g in groups if any(r["dir"] in dirs(t, c.name) for r in g.runs)]
    if not base or not mine:
        return None
    verdicts, note = judged(mine[0], base[0], t.tc.quality_budget)
    return (verdicts[QUALITY[0]], note) if verdicts.get(QUALITY[0]) else None


def dirs(t, cand: str) -> set:
    return {r["dir"] for r in t.log.done.values() if r["phase"] in FULL and r["candidate"] == cand}


def report(t):
    """compare's seed-group report over every verification run (None before any)."""
    runs = load_local([r["dir"] for r in t.log.done.values() if r["phase"] in FULL
                       and r["status"] == "completed"])
    groups = seed_groups(runs)
    base = next((i for i, g in enumerate(groups) if any(r["dir"] in dirs(t, "baseline") for r in g.runs)), None)
    return seed_report(groups, base, t.tc.quality_budget) if groups else None
