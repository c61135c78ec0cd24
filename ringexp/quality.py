"""Is a configuration as good as the baseline? A verdict on a quality metric that a harmful change would fail.

    paired_seeds(diffs, margin)                 runs of both sides with the same seeds: the t interval of the mean
                                                paired difference and two one-sided tests (TOST) against +-margin
    validation_set(a, b, labels, margin)        one run per side: a paired bootstrap over the validation samples of
                                                the difference in macro-AUROC and macro-F1 (scipy.stats.bootstrap)
    decide(diff, ci95, ci_eq, margin)           the verdict both end in (VERDICTS)
    smallest_level(seeds, margin)               the level below which no paired seeds could be called equivalent
    task_of(cfg, world_size)                    what a verdict was measured on (a record holds it: the planner uses a
                                                verdict only for the same task)
    read_record(path)                           quality.json (verdicts.groups' Report.write), every verdict checked

Equivalent means the equivalence interval, at level 1 - 2 alpha (90% at alpha = 5%), lies inside (-margin, +margin):
both one-sided tests reject at alpha (Schuirmann's TOST). A program that takes the first equivalent of k candidates
tests each at alpha / k (the tune: Bonferroni over its verification slots) and so widens that interval. Otherwise
a 95% interval wholly below (above) zero is *worse* (*better*); an observed difference as large as the margin is
*not equivalent* (more seeds would narrow the interval around it, not move it inside); what is left is
*inconclusive*, with the number of seeds that would make the interval fit at the observed spread. A point interval
(every seed's difference the same) decides only an exact zero: it says nothing of the seeds' spread.

One seed is an indication, never a decision: a validation-set verdict measures the validation samples' noise and
leaves out the seed-to-seed variance (on the slow-link story's records 5-30x wider), so it is *decisive* only with
MIN_SEEDS paired seeds; the tune, the planner and compare's quality column act on decisive verdicts only.
"""

import functools
import math
from dataclasses import asdict, dataclass, replace

import numpy as np

from ringexp import records
from ringexp.config import plain

VERDICTS = ("equivalent", "better", "worse", "not equivalent", "inconclusive")
MAX_SEEDS = 100  # beyond this many seeds per side the inconclusive verdict says "more than"
MARGIN = 0.02  # the equivalence margin in macro-AUROC (and macro-F1) by default: compare's, the planner's, the tune's
# macro-F1's margin in the tune's decision by default: F1 thresholds each label at 0.5, and its paired seed spread is
# about twice macro-AUROC's (the story's task, ddp_fp16 against ddp over 7 seeds: 0.031 against 0.015, docs/tune.md),
# so that at MARGIN no 7 seeds could call a harmless change equivalent on it
F1_MARGIN = 0.05
CHOOSES = ("equivalent", "better")  # the verdicts a decision may act on
DECIDING = ("final AUROC", "final F1")  # what a decision needs equivalent by default (decision): the seed articles'
RESAMPLES = 2000  # bootstrap resamples: the percentile interval's ends move by < 0.002 AUROC between seeds of it
FILE = "quality.json"  # the verdicts' record: compare's seed groups write it (Report.write), the planner reads it
SLACK = 1e-9  # a difference may lie this far past its interval's end: the mean of equal floats is off by an ulp
ALPHA = 0.05  # each one-sided test's level: the equivalence interval is the 90% one
MIN_SEEDS = 2  # paired seeds a decision needs (the t interval over seeds is exact from 2 under normal differences)
INDICATIVE = "one seed (indicative)"  # what a verdict on fewer seeds is called wherever a decision would be shown
FORMAT = 5  # quality.json's format: 2 recorded the task and, per verdict, its seeds and its equivalence level; 3 only
# pairs runs of the baseline's task and code versions, one per seed, and names the runs it left out; 4 records the
# metrics a decision is over (DECIDING) and each metric's margin, F1's its own; 5 each test's level (alpha) and the
# family of configurations it was divided among
# The finest step between two recorded macro-AUROCs at or above chance: torchmetrics computes them in float32 (even
# from float64 scores), whose values in [0.5, 1) are multiples of 2^-24; so are the paired differences of two runs'.
RESOLUTION = 2.0 ** -24


@dataclass(frozen=True)
class Verdict:
    """`diff`: candidate minus baseline (mean over shared seeds, or on the validation set); `ci95`: its two-sided
    95% interval (worse, better); `ci_eq`: the equivalence interval, at `level`; `test`: which test and on what;
    `seeds`: the paired seeds (1 or 0: one run each, on the validation set); `more_seeds`: inconclusive only, the
    seeds to add per side."""

    word: str
    diff: float
    ci95: tuple
    ci_eq: tuple
    margin: float
    test: str
    seeds: int
    level: float = 1 - 2 * ALPHA
    more_seeds: int | None = None

    @property
    def decisive(self) -> bool:
        return self.seeds >= MIN_SEEDS

    def label(self) -> str:
        """The word a decision may act on: the verdict's own, or INDICATIVE on fewer than MIN_SEEDS seeds."""
        return self.word if self.decisive else INDICATIVE

    def decided_on(self) -> tuple:
        """(interval, level) the word was decided on: the 95% one for worse and better, else the equivalence one."""
        return (self.ci95, 0.95) if self.word in ("worse", "better") else (self.ci_eq, self.level)

    def interval_text(self) -> str:
        """e.g. '90% [-0.004, +0.010]': the interval the word was decided on, with its level."""
        (lo, hi), level = self.decided_on()
        return f"{level:.1%}".replace(".0%", "%") + f" [{lo:+.3f}, {hi:+.3f}]"

    def text(self) -> str:
        """e.g. 'equivalent: +0.003, 90% [-0.004, +0.010] (3 paired seeds)'."""
        word = self.word
        if word == "inconclusive":
            more = f"more than {MAX_SEEDS}" if self.more_seeds is None else f"about {self.more_seeds}"
            word = f"inconclusive: {more} more seed{'' if self.more_seeds == 1 else 's'} would decide it"
        if not self.decisive:
            word = f"{INDICATIVE}, {word}"
        return f"{word}: {self.diff:+.3f}, {self.interval_text()} ({self.test})"

    def record(self) -> dict:
        return asdict(self) | {"ci95": list(self.ci95), "ci_eq": list(self.ci_eq)}

    @classmethod
    def of(cls, record: dict, margin: float) -> "Verdict":
        """A verdict's record (quality.json's, checked by read_record) decided again at `margin`."""
        ci95, ci_eq = tuple(record["ci95"]), tuple(record["ci_eq"])
        return cls(decide(record["diff"], ci95, ci_eq, margin), record["diff"], ci95, ci_eq, margin, record["test"],
                   record["seeds"], record["level"])


def scipy_stats():
    """scipy.stats, imported on first use: about 1 s of CPU that every training command would otherwise pay
    (Hydra loads the sweep's compare callback, and with it this module, for a single run too)."""
    from scipy import stats

    return stats


def margin_error(margin) -> str:
    """Why `margin` cannot be an equivalence margin ('' when it can): one range for every program that takes one."""
    ok = type(margin) in (int, float) and 0 <= margin < 1  # (NaN fails both)
    return "" if ok else f"must be in [0, 1) (macro-AUROC), e.g. {MARGIN}"


def level_error(alpha) -> str:
    """Why `alpha` cannot be an error level ('' when it can): one range for every program that takes one."""
    ok = type(alpha) in (int, float) and 0 < alpha < 0.5  # (NaN fails both)
    return "" if ok else f"must be in (0, 0.5), e.g. {ALPHA} (the chance of calling a harmful change equivalent)"


def smallest_level(seeds: int, margin: float) -> float:
    """The level `alpha` that each one-sided test must exceed for any `seeds` paired differences to be called
    equivalent at `margin`. Differences not all equal lie on a grid of RESOLUTION, so their standard deviation is at
    least RESOLUTION / sqrt(seeds), and the 1 - 2 alpha interval reaches at least t(1 - alpha) * RESOLUTION / seeds
    either side of their mean: inside the margin only where that is below it. (Differences all equal decide an
    exact zero only, measuring nothing.) Nor can alpha be below float64's step below 1: 1 - alpha would round to 1,
    and the interval be infinite."""
    return max(float(scipy_stats().t.sf(margin * seeds / RESOLUTION, seeds - 1)), float(np.finfo(float).eps))


def decide(diff: float, ci95: tuple, ci_eq: tuple, margin: float) -> str:
    if ci_eq[0] == ci_eq[1] and diff != 0:
        return "inconclusive"  # every seed's difference the same: their spread is unknown, not zero
    if -margin < ci_eq[0] and ci_eq[1] < margin:
        return "equivalent"
    if ci95[1] < 0:
        return "worse"
    if min(ci95[0], ci_eq[0]) > 0:  # (at a level past 95% each test's own: else a harmful better slips the bound)
        return "better"
    return "not equivalent" if abs(diff) >= margin else "inconclusive"


def decision(verdicts: dict, metrics) -> tuple:
    """(metric, Verdict) a decision over `metrics` acts on, an intersection-union test: a candidate is equivalent
    or better only where it is on every one of them, each tested at the same level, so the chance of calling a
    harmful one equivalent stays at that level. Where all choose, the first metric's; else the one that stops it
    (worse first, then not equivalent, then undecided); (None, None) where a metric has no verdict."""
    got = [(m, verdicts.get(m)) for m in metrics]
    if any(v is None for _, v in got):
        return None, None
    blocking = [(m, v) for m, v in got if not (v.decisive and v.word in CHOOSES)]
    order = {"worse": 0, "not equivalent": 1}
    return min(blocking, key=lambda mv: order.get(mv[1].word, 2) if mv[1].decisive else 3) if blocking else got[0]


def deciding_text(metrics, margins: dict) -> str:
    """e.g. 'final AUROC (margin 0.02) and final F1 (margin 0.05)': what a decision over `metrics` is taken on."""
    return " and ".join(f"{m} (margin {margins[m]:g})" for m in metrics)


def at_alpha(v: Verdict, alpha: float) -> Verdict:
    """A paired-seeds verdict `v` (paired_seeds': a t interval over v.seeds differences) with its equivalence
    interval at level 1 - 2 alpha instead, its word decided again: the same centre, the half-width times the ratio
    of the two t quantiles. The planner reads a record's verdicts so, at the level its bound needs."""
    was = (1 - v.level) / 2
    half = (v.ci_eq[1] - v.ci_eq[0]) / 2 * t_quantile(1 - alpha, v.seeds - 1) / t_quantile(1 - was, v.seeds - 1)
    mid = (v.ci_eq[0] + v.ci_eq[1]) / 2
    ci_eq = (mid - half, mid + half)
    return replace(v, word=decide(v.diff, v.ci95, ci_eq, v.margin), ci_eq=ci_eq, level=1 - 2 * alpha,
                   more_seeds=None)


def at_margin(v: Verdict, margin: float) -> Verdict:
    """A validation-set verdict `v` decided again at another margin (its intervals are the data's; the margin only
    says where they must lie)."""
    return replace(v, word=decide(v.diff, v.ci95, v.ci_eq, margin), margin=margin, more_seeds=None)


def t_interval(d: np.ndarray, level: float) -> tuple:
    """The t interval of the mean of `d` (what scipy's ttest_1samp(d).confidence_interval(level) gives, at a
    twentieth of its cost: the tune's error simulation computes tens of thousands; an exact point where every
    difference is the same)."""
    if np.ptp(d) == 0:
        return float(d[0]), float(d[0])
    half = t_quantile((1 + level) / 2, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d))
    return float(d.mean() - half), float(d.mean() + half)


@functools.lru_cache(maxsize=4096)
def t_quantile(q: float, df: int) -> float:
    """Student's t quantile, remembered: the levels and seed counts a program uses are few, and each call of scipy's
    costs a hundred times the arithmetic around it (the planner's error simulation makes thousands)."""
    return float(scipy_stats().t.ppf(q, df))


def paired_seeds(diffs, margin: float, alpha: float = ALPHA) -> Verdict:
    """The verdict on the paired differences (candidate - baseline) of runs with the same seeds (two or more), each
    one-sided test at `alpha`."""
    d = np.asarray(diffs, dtype=float)
    if len(d) < MIN_SEEDS:
        raise ValueError(f"a paired test over seeds needs at least {MIN_SEEDS} shared seeds")
    ci95, ci_eq = t_interval(d, 0.95), t_interval(d, 1 - 2 * alpha)
    word = decide(float(d.mean()), ci95, ci_eq, margin)
    more = seeds_needed(d, margin, alpha) - len(d) if word == "inconclusive" else None
    return Verdict(word, float(d.mean()), ci95, ci_eq, margin, f"{len(d)} paired seeds", len(d), 1 - 2 * alpha,
                   None if more is None or more > MAX_SEEDS else max(more, 1))


def seeds_needed(d: np.ndarray, margin: float, alpha: float = ALPHA) -> int:
    """The fewest seeds n whose 1 - 2 alpha t interval at the observed mean and standard deviation lies inside the
    margin (MAX_SEEDS + len(d) + 1 where none up to that does)."""
    room, sd = margin - abs(d.mean()), d.std(ddof=1)
    n = np.arange(2, MAX_SEEDS + len(d) + 1)
    fits = scipy_stats().t.ppf(1 - alpha, n - 1) * sd / np.sqrt(n) < room  # (one call: a loop costs 100 of them)
    return int(n[fits][0]) if fits.any() else MAX_SEEDS + len(d) + 1


def task_of(cfg, world_size: int) -> dict:
    """What a verdict was measured on: the model, the data (but how it is loaded), the optimizer (but optim.lr_rule:
    how the rate follows accumulation is a candidate's choice, like accumulation itself), and the samples of training
    and between evaluations (so that a candidate with accumulation, fewer steps of more samples each, is on its
    baseline's task). Two runs are of one task when these are equal."""
    batch = cfg.data.batch_size * cfg.accumulation.steps * world_size
    data = {k: v for k, v in plain(cfg.data).items() if k not in ("num_workers", "skip_bad")}
    optim = {k: v for k, v in plain(cfg.optim).items() if k != "lr_rule"}
    return {"model": plain(cfg.model), "data": data, "optim": optim, "world_size": world_size,
            "samples": cfg.steps * batch, "eval_every_samples": cfg.eval_every * batch}


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


def validation_set(cand: np.ndarray, base: np.ndarray, labels: np.ndarray, margin: float, what: str,
                   seeds: int = 1) -> list:
    """[macro-AUROC verdict, macro-F1 verdict] of one candidate run against one baseline run scored on the same
    validation samples: the percentile intervals of a paired bootstrap over the samples (both models resampled
    alike). It measures the validation set's noise only, not the seeds': `what` names the runs in the verdict, and
    `seeds` (1: the same seed, 0: none shared) makes it an indication, never a decision."""
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
        ci_eq = tuple(float(x) for x in np.nanquantile(dist[i], [ALPHA, 1 - ALPHA]))
        out.append(Verdict(decide(float(point[i]), ci95, ci_eq, margin), float(point[i]), ci95, ci_eq, margin,
                           f"validation-set bootstrap, {what}", min(seeds, 1)))
    return out


def read_record(path) -> dict:
    """quality.json as compare writes it (verdicts.groups' Report.write: {"format", "task", "margin", "metrics",
    "margins", "groups": [{"group", "baseline", "overrides", "seeds", "left_out", "verdicts": {metric:
    Verdict.record() or null}, ...}]}), every group and verdict checked (record_error): the one reader of the file
    (the planner's quality=). OSError, or ValueError naming the group and the entry. `path` is the one the user
    named (quality=): it may be a symlink."""
    doc = records.parse_json(records.read_bytes(path, follow=True))
    if bad := record_error(doc):
        raise ValueError(bad)
    return doc


def record_error(doc) -> str:
    """What makes `doc` no record of verdicts that hold together ('' when nothing does): its shape, then each
    group's and each of its verdicts' (verdict_error), then across the groups (groups_error)."""
    if not isinstance(doc, dict):
        return f"holds {_kind(doc)}, not a record of verdicts (an object with margin, metric and groups)"
    if doc.get("format") != FORMAT:
        return (f"format is {_kind(doc.get('format'))}, not {FORMAT}: a record of an unknown format (format 1 has no "
                "task; format 2 may pair runs of another task or code version; format 3 decides on AUROC alone; format "
                "4 records no family its tests were divided among); run compare on the seed sweep again to write it")
    if doc.get("task") is not None and not isinstance(doc["task"], dict):
        return f"task is {_kind(doc['task'])}, not the task the verdicts were measured on (an object) or null"
    if not _margin(doc.get("margin")):
        return f"margin is {_kind(doc.get('margin'))}, not a number in [0, 1)"
    metrics = doc.get("metrics")
    if not isinstance(metrics, list) or not metrics or not all(isinstance(m, str) for m in metrics):
        return f"metrics is {_kind(metrics)}, not the list of the metrics a decision is over"
    margins = doc.get("margins")
    if not isinstance(margins, dict) or not all(_margin(margins.get(m)) for m in metrics):
        return f"margins is {_kind(margins)}, not each decision metric's margin in [0, 1)"
    if level_error(doc.get("alpha")) or not (type(doc.get("family")) is int and doc["family"] >= 1):
        return (f"alpha is {_kind(doc.get('alpha'))} and family {_kind(doc.get('family'))}, not each test's level in "
                "(0, 0.5) and the count (1 or more) of configurations it was divided among")
    if not isinstance(doc.get("groups"), list) or not doc["groups"]:
        return f"groups is {_kind(doc.get('groups'))}, not a list of the seed groups"
    for i, g in enumerate(doc["groups"]):
        if bad := group_error(g) or level_of(g, doc["alpha"]):
            name = g.get("group") if isinstance(g, dict) else None
            return f"{f'group {named(name)}' if isinstance(name, str) else f'groups[{i}]'}: {bad}"
    return groups_error(doc["groups"])


def level_of(g: dict, alpha: float) -> str:
    """What in sound group `g` was not tested at the record's `alpha`: a decisive verdict at another level (one
    raised to pass as the level a reader needs)."""
    for m, v in g["verdicts"].items():
        if v is not None and v["seeds"] >= MIN_SEEDS and not math.isclose(v["level"], 1 - 2 * alpha, rel_tol=1e-9):
            return f"{m}: its level {v['level']:.4%} is not the record's 1 - 2 alpha = {1 - 2 * alpha:.4%}"
    return ""


def groups_error(groups: list) -> str:
    """What the groups, each sound, say that no compare run wrote: other than one baseline, two groups of one
    configuration (two verdicts for it, of which a reader would take one), or a verdict on more or fewer paired
    seeds than its group and the baseline's list in common (a count raised to make an indication a decision)."""
    baselines = [g for g in groups if g["baseline"]]
    if len(baselines) != 1:
        return f"{len(baselines)} groups are marked baseline; a record has one"
    seen = {}
    for g in groups:
        if (key := frozenset(g["overrides"])) in seen:
            return (f"groups {named(seen[key])} and {named(g['group'])} have the same overrides: two verdicts for one "
                    "configuration")
        seen[key] = g["group"]
    base = set(baselines[0]["seeds"])
    for g in groups:
        paired = sorted(base.intersection(g["seeds"]))
        for metric, v in g["verdicts"].items():
            if v is not None and v["seeds"] != len(paired):
                return (f"group {named(g['group'])}: {named(metric)}: seeds is {v['seeds']}, but the group and the "
                        f"baseline list {len(paired)} seed{'' if len(paired) == 1 else 's'} in common "
                        f"({', '.join(map(named, paired)) or 'none'})")
    return ""


def group_error(g) -> str:
    if not isinstance(g, dict):
        return f"{_kind(g)}, not a group (an object)"
    if not isinstance(g.get("group"), str):
        return f"group is {_kind(g.get('group'))}, not its label (text)"
    if not isinstance(g.get("baseline"), bool):
        return f"baseline is {_kind(g.get('baseline'))}, not true or false"
    if not isinstance(g.get("overrides"), list) or not all(isinstance(o, str) for o in g["overrides"]):
        return f"overrides is {_kind(g.get('overrides'))}, not a list of text"
    seeds = g.get("seeds")
    if not isinstance(seeds, list) or not all(isinstance(s, str) for s in seeds) or len(set(seeds)) < len(seeds):
        return f"seeds is {_kind(seeds)}, not a list of its runs' seeds, each once"
    if not isinstance(g.get("left_out"), list) or not all(map(_left_out, g["left_out"])):
        return f"left_out is {_kind(g.get('left_out'))}, not a list of runs left out ({{dir, seed, why}})"
    if not isinstance(g.get("verdicts"), dict):
        return f"verdicts is {_kind(g.get('verdicts'))}, not an object of verdicts by metric"
    for metric, v in g["verdicts"].items():
        if v is not None and (bad := verdict_error(v)):
            return f"{named(metric)}: {bad}"
    return ""


def _left_out(x) -> bool:
    """An entry of a group's left_out: the run's directory, its seed (null where unknown) and why."""
    return (isinstance(x, dict) and isinstance(x.get("dir"), str) and isinstance(x.get("why"), str)
            and (x.get("seed") is None or isinstance(x["seed"], str)))


def verdict_error(v) -> str:
    """What makes `v` no Verdict.record() whose numbers hold together ('' when nothing does): finite numbers, each
    interval [low, high] with low <= high, the difference inside both, the wider of the 95% and the equivalence
    interval holding the other, and the word the one decide() gives from those numbers (a reversed interval would
    otherwise read as equivalent)."""
    if not isinstance(v, dict):
        return f"{_kind(v)}, not a verdict (an object)"
    if v.get("word") not in VERDICTS:
        return f"word is {_kind(v.get('word'))}, not one of {', '.join(VERDICTS)}"
    if not _number(v.get("diff")):
        return f"diff is {_kind(v.get('diff'))}, not a finite number"
    if not (_number(v.get("level")) and 0 < v["level"] < 1):
        return f"level is {_kind(v.get('level'))}, not the equivalence interval's confidence level in (0, 1)"
    if not (type(v.get("seeds")) is int and v["seeds"] >= 0):
        return f"seeds is {_kind(v.get('seeds'))}, not a count of paired seeds >= 0"
    for key, level in (("ci95", "95%"), ("ci_eq", "equivalence")):
        ci = v.get(key)
        if not (isinstance(ci, list) and len(ci) == 2 and all(map(_number, ci))):
            return f"{key} is {_kind(ci)}, not a {level} interval [low, high] of finite numbers"
        if ci[0] > ci[1]:
            return f"the {level} interval [{ci[0]:+.3f}, {ci[1]:+.3f}] is reversed (its low end above its high end)"
        if not ci[0] - SLACK <= v["diff"] <= ci[1] + SLACK:
            return f"the difference {v['diff']:+.3f} lies outside its {level} interval [{ci[0]:+.3f}, {ci[1]:+.3f}]"
    (lo95, hi95), (lo90, hi90) = v["ci95"], v["ci_eq"]
    (a, b), (c, d) = ((lo95, hi95), (lo90, hi90)) if v["level"] <= 0.95 else ((lo90, hi90), (lo95, hi95))
    if a > c + SLACK or d > b + SLACK:
        return (f"the 95% interval [{lo95:+.3f}, {hi95:+.3f}] and the {v['level']:.1%} one [{lo90:+.3f}, "
                f"{hi90:+.3f}] are not nested as their levels say")
    if not _margin(v.get("margin")):
        return f"margin is {_kind(v.get('margin'))}, not a number in [0, 1)"
    if not isinstance(v.get("test"), str):
        return f"test is {_kind(v.get('test'))}, not text"
    more = v.get("more_seeds")
    if more is not None and not (type(more) is int and more >= 1):
        return f"more_seeds is {_kind(more)}, not a count >= 1 or null"
    word = decide(v["diff"], tuple(v["ci95"]), tuple(v["ci_eq"]), v["margin"])
    return "" if word == v["word"] else (f"says {v['word']}, but its numbers ({v['diff']:+.3f}, equivalence interval "
                                         f"[{lo90:+.3f}, {hi90:+.3f}], margin {v['margin']:g}) are {word}")


def _number(x) -> bool:
    return type(x) in (int, float) and math.isfinite(x)  # (not bool, NaN or infinite)


def _margin(x) -> bool:
    return _number(x) and 0 <= x < 1


def named(text: str) -> str:
    """A name from the record in a message: quoted, and cut short (a label may be as long as the overrides)."""
    return ascii(text if len(text) <= 80 else text[:79] + "~")


def _kind(x) -> str:
    """A value in a message: short, and never the repr of a container (which may be nested deep)."""
    if x is None or isinstance(x, bool):
        return {None: "null", True: "true", False: "false"}[x]
    if isinstance(x, str | int | float):
        return ascii(x)[:40]
    return f"a list of {len(x)}" if isinstance(x, list) else f"a {type(x).__name__}"
