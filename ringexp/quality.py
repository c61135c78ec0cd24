"""Is a configuration as good as the baseline? A verdict on a quality metric that a harmful change would fail.

    paired_seeds(diffs, margin)                 runs of both sides with the same seeds: the t interval of the mean
                                                paired difference and two one-sided tests (TOST) against +-margin
    validation_set(a, b, labels, margin)        one run per side: a paired bootstrap over the validation samples of
                                                the difference in macro-AUROC and macro-F1 (scipy.stats.bootstrap)
    decide(diff, ci95, ci90, margin)            the verdict both end in (VERDICTS)
    read_record(path)                           quality.json (compare.groups' Report.write), every verdict checked

Equivalent means the 90% interval lies inside (-margin, +margin): both one-sided tests reject at 5% (Schuirmann's
TOST). Otherwise a 95% interval wholly below (above) zero is *worse* (*better*); an observed difference as large as
the margin is *not equivalent* (more seeds would narrow the interval around it, not move it inside); what is left
is *inconclusive*, with the number of seeds that would make the 90% interval fit at the observed spread.
"""

import math
from dataclasses import asdict, dataclass

import numpy as np

from ringexp import records

VERDICTS = ("equivalent", "better", "worse", "not equivalent", "inconclusive")
MAX_SEEDS = 100  # beyond this many seeds per side the inconclusive verdict says "more than"
MARGIN = 0.02  # the equivalence margin in macro-AUROC (and macro-F1) by default: compare's, the planner's, the tune's
RESAMPLES = 2000  # bootstrap resamples: the percentile interval's ends move by < 0.002 AUROC between seeds of it
FILE = "quality.json"  # the verdicts' record: compare's seed groups write it (Report.write), the planner reads it
SLACK = 1e-9  # a difference may lie this far past its interval's end: the mean of equal floats is off by an ulp


@dataclass(frozen=True)
class Verdict:
    """`diff`: candidate minus baseline (mean over shared seeds, or on the validation set); `ci95`, `ci90`: its
    intervals; `test`: which test and on what; `more_seeds`: inconclusive only, the seeds to add per side."""

    word: str
    diff: float
    ci95: tuple
    ci90: tuple
    margin: float
    test: str
    more_seeds: int | None = None

    def text(self) -> str:
        """e.g. 'equivalent: +0.003 [-0.004, +0.010] (3 paired seeds)'."""
        word = self.word
        if word == "inconclusive":
            more = f"more than {MAX_SEEDS}" if self.more_seeds is None else f"about {self.more_seeds}"
            word = f"inconclusive: {more} more seed{'' if self.more_seeds == 1 else 's'} would decide it"
        lo, hi = self.ci95
        return f"{word}: {self.diff:+.3f} [{lo:+.3f}, {hi:+.3f}] ({self.test})"

    def record(self) -> dict:
        return asdict(self) | {"ci95": list(self.ci95), "ci90": list(self.ci90)}


def scipy_stats():
    """scipy.stats, imported on first use: about 1 s of CPU that every training command would otherwise pay
    (Hydra loads the sweep's compare callback, and with it this module, for a single run too)."""
    from scipy import stats

    return stats


def margin_error(margin) -> str:
    """Why `margin` cannot be an equivalence margin ('' when it can): one range for every program that takes one."""
    ok = type(margin) in (int, float) and 0 <= margin < 1  # (NaN fails both)
    return "" if ok else f"must be in [0, 1) (macro-AUROC), e.g. {MARGIN}"


def decide(diff: float, ci95: tuple, ci90: tuple, margin: float) -> str:
    if -margin < ci90[0] and ci90[1] < margin:
        return "equivalent"
    if ci95[1] < 0:
        return "worse"
    if ci95[0] > 0:
        return "better"
    return "not equivalent" if abs(diff) >= margin else "inconclusive"


def t_interval(d: np.ndarray, level: float) -> tuple:
    """The t interval of the mean of `d` (scipy's; an exact point where every difference is the same)."""
    if np.ptp(d) == 0:
        return float(d[0]), float(d[0])
    ci = scipy_stats().ttest_1samp(d, 0.0).confidence_interval(level)
    return float(ci.low), float(ci.high)


def paired_seeds(diffs, margin: float) -> Verdict:
    """The verdict on the paired differences (candidate - baseline) of runs with the same seeds (two or more)."""
    d = np.asarray(diffs, dtype=float)
    if len(d) < 2:
        raise ValueError("a paired test over seeds needs at least 2 shared seeds")
    ci95, ci90 = t_interval(d, 0.95), t_interval(d, 0.90)
    word = decide(float(d.mean()), ci95, ci90, margin)
    more = seeds_needed(d, margin) - len(d) if word == "inconclusive" else None
    return Verdict(word, float(d.mean()), ci95, ci90, margin, f"{len(d)} paired seeds",
                   None if more is None or more > MAX_SEEDS else max(more, 1))


def seeds_needed(d: np.ndarray, margin: float) -> int:
    """The fewest seeds n whose 90% t interval at the observed mean and standard deviation lies inside the margin
    (MAX_SEEDS + len(d) + 1 where none up to that does)."""
    room, sd = margin - abs(d.mean()), d.std(ddof=1)
    for n in range(2, MAX_SEEDS + len(d) + 1):
        if scipy_stats().t.ppf(0.95, n - 1) * sd / np.sqrt(n) < room:
            return n
    return MAX_SEEDS + len(d) + 1


def macro(probs: np.ndarray, labels: np.ndarray, w: np.ndarray) -> np.ndarray:
    """[macro-AUROC, macro-F1 at 0.5] of (samples x labels) probabilities, each sample counted w times, for each
    row of weights `w` (resamples x samples): (2, resamples). AUROC is the Mann-Whitney statistic (a tie counts
    half, as torchmetrics counts it) over the weighted samples, a label with one class only left out; F1 uses
    torchmetrics' threshold (a probability above 0.5 is a positive). Weights instead of re-ranking each resample:
    one sort per label serves them all."""
    auroc, f1 = [], []
    for k in range(probs.shape[1]):
        p, y = probs[:, k], labels[:, k].astype(bool)
        order = np.argsort(p, kind="stable")
        starts = np.flatnonzero(np.r_[True, np.diff(p[order]) != 0])  # groups of equal scores, ascending
        wo = w[:, order]
        pos = np.add.reduceat(wo * y[order], starts, axis=1)
        neg = np.add.reduceat(wo * ~y[order], starts, axis=1)
        below = np.cumsum(neg, axis=1) - neg  # negatives scored lower than each group
        npos, nneg = pos.sum(axis=1), neg.sum(axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            auroc.append(np.where((npos > 0) & (nneg > 0), (pos * (below + neg / 2)).sum(axis=1) / (npos * nneg),
                                  np.nan))
            hit = p > 0.5
            tp, called = (w * (hit & y)).sum(axis=1), (w * hit).sum(axis=1) + npos
            f1.append(np.where(called > 0, 2 * tp / np.maximum(called, 1), 0.0))
    return np.stack([np.nanmean(np.stack(auroc), axis=0), np.mean(np.stack(f1), axis=0)])


def validation_set(cand: np.ndarray, base: np.ndarray, labels: np.ndarray, margin: float, what: str) -> list:
    """[macro-AUROC verdict, macro-F1 verdict] of one candidate run against one baseline run scored on the same
    validation samples: the percentile intervals of a paired bootstrap over the samples (both models resampled
    alike). It measures the validation set's noise only, not the seeds': `what` names the runs in the verdict."""
    labels = labels.astype(bool)

    n = len(labels)

    def diff(idx, axis=-1):  # idx: (resamples, samples), scipy's batch of resamples at once, as sample counts
        idx = np.atleast_2d(idx)
        w = np.zeros(idx.shape)
        np.add.at(w, (np.arange(len(idx))[:, None], idx), 1)
        return macro(cand, labels, w) - macro(base, labels, w)

    res = scipy_stats().bootstrap((np.arange(n),), diff, vectorized=True, paired=True, n_resamples=RESAMPLES,
                          batch=100, confidence_level=0.95, method="percentile", rng=np.random.default_rng(0))
    dist = np.asarray(res.bootstrap_distribution)  # (2, RESAMPLES)
    point = diff(np.arange(n))[:, 0]
    out = []
    for i in range(2):
        ci95 = tuple(float(x) for x in np.nanquantile(dist[i], [0.025, 0.975]))
        ci90 = tuple(float(x) for x in np.nanquantile(dist[i], [0.05, 0.95]))
        out.append(Verdict(decide(float(point[i]), ci95, ci90, margin), float(point[i]), ci95, ci90, margin,
                           f"validation-set bootstrap, {what}"))
    return out


def read_record(path) -> dict:
    """quality.json as compare writes it (compare.groups' Report.write: {"margin", "metric", "groups": [{"group",
    "baseline", "overrides", "verdicts": {metric: Verdict.record() or null}, ...}]}), every group and verdict
    checked (record_error); OSError, or ValueError naming the group and the entry. `path` is the one the user named
    (quality=): it may be a symlink."""
    doc = records.parse_json(records.read_bytes(path, follow=True))
    if bad := record_error(doc):
        raise ValueError(bad)
    return doc


def record_error(doc) -> str:
    """What makes `doc` no record of verdicts that hold together ('' when nothing does): its shape, then each
    group's and each of its verdicts' (verdict_error), then exactly one baseline group."""
    if not isinstance(doc, dict):
        return f"holds {_kind(doc)}, not a record of verdicts (an object with margin, metric and groups)"
    if not _margin(doc.get("margin")):
        return f"margin is {_kind(doc.get('margin'))}, not a number in [0, 1)"
    if not isinstance(doc.get("metric"), str):
        return f"metric is {_kind(doc.get('metric'))}, not the name of a metric"
    if not isinstance(doc.get("groups"), list) or not doc["groups"]:
        return f"groups is {_kind(doc.get('groups'))}, not a list of the seed groups"
    for i, g in enumerate(doc["groups"]):
        if bad := group_error(g):
            name = g.get("group") if isinstance(g, dict) else None
            return f"{f'group {_named(name)}' if isinstance(name, str) else f'groups[{i}]'}: {bad}"
    baselines = sum(g["baseline"] for g in doc["groups"])
    return "" if baselines == 1 else f"{baselines} groups are marked baseline; a record has one"


def group_error(g) -> str:
    if not isinstance(g, dict):
        return f"{_kind(g)}, not a group (an object)"
    if not isinstance(g.get("baseline"), bool):
        return f"baseline is {_kind(g.get('baseline'))}, not true or false"
    if not isinstance(g.get("overrides"), list) or not all(isinstance(o, str) for o in g["overrides"]):
        return f"overrides is {_kind(g.get('overrides'))}, not a list of text"
    if not isinstance(g.get("verdicts"), dict):
        return f"verdicts is {_kind(g.get('verdicts'))}, not an object of verdicts by metric"
    for metric, v in g["verdicts"].items():
        if v is not None and (bad := verdict_error(v)):
            return f"{_named(metric)}: {bad}"
    return ""


def verdict_error(v) -> str:
    """What makes `v` no Verdict.record() whose numbers hold together ('' when nothing does): finite numbers, each
    interval [low, high] with low <= high, the difference inside both, the 95% interval holding the 90% one, and
    the word the one decide() gives from those numbers (a reversed interval would otherwise read as equivalent)."""
    if not isinstance(v, dict):
        return f"{_kind(v)}, not a verdict (an object)"
    if v.get("word") not in VERDICTS:
        return f"word is {_kind(v.get('word'))}, not one of {', '.join(VERDICTS)}"
    if not _number(v.get("diff")):
        return f"diff is {_kind(v.get('diff'))}, not a finite number"
    for key, level in (("ci95", "95%"), ("ci90", "90%")):
        ci = v.get(key)
        if not (isinstance(ci, list) and len(ci) == 2 and all(map(_number, ci))):
            return f"{key} is {_kind(ci)}, not a {level} interval [low, high] of finite numbers"
        if ci[0] > ci[1]:
            return f"the {level} interval [{ci[0]:+.3f}, {ci[1]:+.3f}] is reversed (its low end above its high end)"
        if not ci[0] - SLACK <= v["diff"] <= ci[1] + SLACK:
            return f"the difference {v['diff']:+.3f} lies outside its {level} interval [{ci[0]:+.3f}, {ci[1]:+.3f}]"
    (lo95, hi95), (lo90, hi90) = v["ci95"], v["ci90"]
    if lo95 > lo90 + SLACK or hi90 > hi95 + SLACK:
        return (f"the 95% interval [{lo95:+.3f}, {hi95:+.3f}] does not hold the 90% one [{lo90:+.3f}, "
                f"{hi90:+.3f}]")
    if not _margin(v.get("margin")):
        return f"margin is {_kind(v.get('margin'))}, not a number in [0, 1)"
    if not isinstance(v.get("test"), str):
        return f"test is {_kind(v.get('test'))}, not text"
    more = v.get("more_seeds")
    if more is not None and not (type(more) is int and more >= 1):
        return f"more_seeds is {_kind(more)}, not a count >= 1 or null"
    word = decide(v["diff"], tuple(v["ci95"]), tuple(v["ci90"]), v["margin"])
    return "" if word == v["word"] else (f"says {v['word']}, but its numbers ({v['diff']:+.3f}, 90% interval "
                                         f"[{lo90:+.3f}, {hi90:+.3f}], margin {v['margin']:g}) are {word}")


def _number(x) -> bool:
    return type(x) in (int, float) and math.isfinite(x)  # (not bool, NaN or infinite)


def _margin(x) -> bool:
    return _number(x) and 0 <= x < 1


def _named(text: str) -> str:
    """A name from the record in a message: quoted, and cut short (a label may be as long as the overrides)."""
    return ascii(text if len(text) <= 80 else text[:79] + "~")


def _kind(x) -> str:
    """A value in a message: short, and never the repr of a container (which may be nested deep)."""
    if x is None or isinstance(x, bool):
        return {None: "null", True: "true", False: "false"}[x]
    if isinstance(x, str | int | float):
        return ascii(x)[:40]
    return f"a list of {len(x)}" if isinstance(x, list) else f"a {type(x).__name__}"
