"""Quality verdicts that can fail: the paired-seed interval and its two one-sided tests on hand-made differences
with known answers, the validation-set bootstrap's metrics against torchmetrics, and on small real runs a harmful
configuration called worse and fp16 on the wire called equivalent."""

import csv
import math

import numpy as np
import pytest
import torch
from helpers.processes import workers
from helpers.runs import TINY
from scipy import stats

from ringexp import compare, quality
from ringexp import dist as rdist
from ringexp.metrics import quality as torchmetrics_quality
from ringexp.trainer import Trainer
from ringexp.validate import compose_config


def test_the_paired_interval_is_the_t_interval_and_covers_a_known_difference():
    """The 95% interval is mean +- t(0.975, n-1) sd / sqrt(n) (computed here by hand), and over 400 simulated
    studies of 5 paired seeds it holds the true difference about 95% of the time (within 3 binomial sds)."""
    d = np.array([0.012, -0.004, 0.007, 0.001, 0.009])
    half = stats.t.ppf(0.975, 4) * d.std(ddof=1) / math.sqrt(5)
    v = quality.paired_seeds(d, 0.02)
    assert v.ci95 == pytest.approx((d.mean() - half, d.mean() + half), rel=1e-9) and v.test == "5 paired seeds"
    ci = stats.ttest_1samp(d, 0.0).confidence_interval(0.90)
    assert v.ci_eq == pytest.approx((ci.low, ci.high), rel=1e-9) and v.level == pytest.approx(0.90)
    rng = np.random.default_rng(0)
    covered = sum(lo <= 0.01 <= hi for lo, hi in (quality.paired_seeds(rng.normal(0.01, 0.01, 5), 0.02).ci95
                                                  for _ in range(400)))
    assert abs(covered / 400 - 0.95) < 3 * math.sqrt(0.95 * 0.05 / 400), covered


@pytest.mark.parametrize("shift, margin, word", [
    (-0.03, 0.02, "worse"),  # 3 points lower, tightly: not within a 2-point margin
    (0.03, 0.02, "better"),
    (-0.03, 0.05, "equivalent"),  # the same differences within a 5-point margin
    (-0.004, 0.02, "equivalent"),  # significantly lower, but by less than the margin
    (-0.02, 0.02, "not equivalent"),  # as large as the margin, not significant: more seeds cannot make it fit
    (0.0, 0.02, "inconclusive")])
def test_equivalence_is_refused_when_the_margin_is_smaller_than_the_difference(shift, margin, word):
    noise = {"inconclusive": [0.03, -0.03, 0.01], "not equivalent": [0.03, -0.04, 0.01]}.get(word, [0.002, -0.002,
                                                                                                    0.001])
    d = np.array(noise) - np.mean(noise) + shift
    assert quality.paired_seeds(d, margin).word == word


def standard(n: int) -> np.ndarray:
    z = np.linspace(-1, 1, n)
    return (z - z.mean()) / z.std(ddof=1)


def test_an_inconclusive_verdict_names_the_seeds_that_would_decide_it():
    """With N more seeds of the same mean and spread, the verdict is equivalent; with one fewer, still not."""
    d = 0.005 + 0.012 * standard(3)
    v = quality.paired_seeds(d, 0.02)
    assert v.word == "inconclusive" and v.more_seeds >= 1 and "more seed" in v.text()
    n = 3 + v.more_seeds
    assert quality.paired_seeds(0.005 + 0.012 * standard(n), 0.02).word == "equivalent"
    assert quality.paired_seeds(0.005 + 0.012 * standard(n - 1), 0.02).word == "inconclusive"
    assert quality.paired_seeds([0.01, 0.01, 0.01], 0.02).word == "inconclusive"  # no spread: none measured
    with pytest.raises(ValueError, match="2 shared seeds"):
        quality.paired_seeds([0.01], 0.02)


def scores(n=600, labels=6, seed=0, signal=0.3):
    rng = np.random.default_rng(seed)
    y = rng.random((n, labels)) < 0.3
    p = np.clip(signal * y + (1 - signal) * rng.random((n, labels)), 0, 1).astype(np.float32)
    p[:20] = 0.5  # ties, and scores exactly at F1's threshold
    return p, y


def test_the_bootstrap_s_metrics_are_torchmetrics_on_each_resample():
    p, y = scores()
    idx = np.random.default_rng(1).integers(0, len(y), len(y))
    w = np.bincount(idx, minlength=len(y))[None, :]
    for weights, rows in ((np.ones((1, len(y))), slice(None)), (w, idx)):
        want = torchmetrics_quality(torch.tensor(p[rows]), torch.tensor(y[rows]).int(), y.shape[1])
        got = quality.macro(p, y, weights)[:, 0]
        assert got == pytest.approx([float(want["auroc_macro"]), float(want["f1_macro"])], abs=1e-6)


def test_the_validation_set_test_tells_a_harmed_model_from_a_copy():
    """Scores of the same model: equivalent, the interval around 0; a model with less signal: worse, its interval
    holding the difference measured on the whole set."""
    p, y = scores()
    same, _ = quality.validation_set(p + np.float32(1e-4), p, y, 0.02, "copy")
    assert same.word == "equivalent" and same.ci95[0] <= 0 <= same.ci95[1]
    harmed, _ = scores(signal=0.1)
    auroc, f1 = quality.validation_set(harmed, p, y, 0.02, "harmed")
    want = quality.macro(harmed, y, np.ones((1, len(y))))[0, 0] - quality.macro(p, y, np.ones((1, len(y))))[0, 0]
    assert auroc.word == "worse" and auroc.ci95[0] <= want <= auroc.ci95[1] and auroc.diff == pytest.approx(want)


# 30 steps (about one epoch of the 2,048 samples): top-k is worse by 0.12 AUROC (95% interval up to -0.09) and fp16's
# 90% interval is [-0.012, +0.006], further inside the 0.02 margin than at 60 steps ([-0.014, +0.001]); at 20 steps
# top-k is only 0.04 worse, too close to call a fixed check
SHORT = [*TINY, "steps=30", "eval_every=10", "data.train_size=2048", "data.val_size=512", "data.batch_size=32",
         "logger=none"]
PRESETS = {"plain": ["+parallel=ddp"], "fp16": ["+parallel=ddp_fp16"],
           "harmful": ["+parallel=ddp_topk", "compression.ratio=0.001", "compression.error_feedback=false"]}


def train_worker(run_dir, overrides):
    """One real 2-rank run of `overrides` into `run_dir` (its meta as train.run_meta would name it)."""
    env = rdist.init("cpu")
    cfg = compose_config(overrides)
    meta = {"name": ",".join(overrides), "group": "quality", "job_type": "ddp", "overrides": overrides,
            "choices": {"parallel": overrides[len(SHORT)].split("=", 1)[1]}, "backend_env": {"preset": "default"}}
    summary = Trainer(cfg, env, run_dir, meta).train()
    rdist.cleanup()
    return summary


@pytest.mark.slow
def test_on_real_runs_a_harmful_config_is_worse_and_fp16_on_the_wire_is_equivalent(tmp_path, capsys):
    """Top-k at 0.1% without error feedback against plain DDP at the same seed, on the validation set (one seed
    each: the bootstrap over its samples); fp16 on the wire against the same."""
    for name, preset in PRESETS.items():
        (tmp_path / name).mkdir()
        workers(train_worker, 2, tmp_path / name, [*SHORT, *preset])
    assert compare.main([str(tmp_path / n) for n in PRESETS] + ["--groups", "--out", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    with open(tmp_path / "out" / "groups.csv") as f:
        got = {r["group"]: r for r in csv.DictReader(f)}
    fp16, harmful = got["+parallel=ddp_fp16"], got[" ".join(PRESETS["harmful"])]
    assert got["+parallel=ddp"]["quality"] == "baseline", printed
    assert fp16["quality"] == harmful["quality"] == quality.INDICATIVE, printed  # one seed: no decision
    assert fp16["final AUROC verdict"].startswith(f"{quality.INDICATIVE}, equivalent:"), printed
    assert harmful["final AUROC verdict"].startswith(f"{quality.INDICATIVE}, worse:"), printed
    assert "tested on the validation set" in printed and "validation-set bootstrap" in harmful["final AUROC verdict"]


def test_identical_differences_decide_only_an_exact_zero():
    """Two seeds with the same non-zero difference have no spread to measure: inconclusive, never a zero-width
    equivalent; the same zero difference on every seed (the same arithmetic) is equivalent."""
    same = quality.paired_seeds([0.004, 0.004], 0.02)
    assert same.word == "inconclusive" and same.ci_eq == (0.004, 0.004), same
    assert quality.verdict_error(same.record()) == ""
    assert quality.paired_seeds([0.0, 0.0, 0.0], 0.02).word == "equivalent"


def test_a_smaller_alpha_widens_the_equivalence_interval_and_can_turn_equivalent_into_inconclusive():
    d = np.array([0.003, -0.004, 0.009])
    plain, strict = quality.paired_seeds(d, 0.02), quality.paired_seeds(d, 0.02, alpha=0.05 / 6)
    assert plain.word == "equivalent" and strict.word == "inconclusive", (plain, strict)
    assert strict.level == pytest.approx(1 - 2 * 0.05 / 6) and strict.ci_eq[0] < plain.ci_eq[0]
    assert "98.3% [" in strict.text() and quality.verdict_error(strict.record()) == ""


def test_one_seed_is_an_indication_never_a_decision():
    v = quality.Verdict("worse", -0.03, (-0.04, -0.02), (-0.038, -0.022), 0.02, "validation-set bootstrap", 1)
    assert not v.decisive and v.label() == quality.INDICATIVE and v.text().startswith(quality.INDICATIVE)
    assert quality.paired_seeds([0.001, 0.002], 0.02).decisive
