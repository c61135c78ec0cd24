"""optim.lr_rule, the learning rate that follows the samples behind one update: its factor for each rule and
optimizer, the refusal beside optim.scale_lr, and real 2-rank runs with accumulation 4 whose logged rate, summary,
W&B summary, compare table and tune trial record say which rule they ran under."""

import glob
import math
import time

import pytest
from helpers.processes import error_line, refused, run_cli
from helpers.runs import TINY
from helpers.wandb_log import history_and_summary

from ringexp import parallel
from ringexp.compare import report
from ringexp.compare.table import columns, table
from ringexp.config import LrRule, OptimName
from ringexp.errors import ConfigError
from ringexp.optim import base_lr, lr_factor
from ringexp.records import read_rows, read_summary
from ringexp.tune import trials
from ringexp.validate import compose_config
from ringexp.verdicts import cells
from ringexp.verdicts.load import load_local

# (rule, optimizer, factor) for one update on 4 times plain DDP's samples (accumulation 4), and on half of them (a
# replica that updates on half the ranks' samples, as a periodic-averaging strategy's does)
FACTORS = [(LrRule.none, OptimName.adamw, 1.0, 1.0), (LrRule.none, OptimName.sgd, 1.0, 1.0),
           (LrRule.linear, OptimName.adamw, 4.0, 0.5), (LrRule.linear, OptimName.sgd, 4.0, 0.5),
           (LrRule.sqrt, OptimName.adamw, 2.0, math.sqrt(0.5)), (LrRule.sqrt, OptimName.sgd, 2.0, math.sqrt(0.5)),
           (LrRule.auto, OptimName.sgd, 4.0, 0.5), (LrRule.auto, OptimName.adamw, 2.0, math.sqrt(0.5))]


@pytest.mark.parametrize("rule,name,four,half", FACTORS, ids=[f"{r}-{n}" for r, n, _, _ in FACTORS])
def test_the_factor_follows_the_rule_and_the_optimizer(rule, name, four, half):
    assert lr_factor(rule, name, 4 * 32, 32) == pytest.approx(four, rel=1e-12)
    assert lr_factor(rule, name, 16, 32) == pytest.approx(half, rel=1e-12)
    assert lr_factor(rule, name, 32, 32) == 1.0  # plain DDP's own batch: every rule leaves the rate alone


def test_samples_per_update_are_the_strategys_count_and_the_record_resolves_auto():
    for preset in ("ddp", "ring_fp16", "fsdp"):
        cfg = compose_config(["data.batch_size=16", "accumulation.steps=4", "optim=sgd", "optim.lr_rule=auto",
                              f"+parallel={preset}"])
        assert parallel.samples_per_update(cfg, 2) == 2 * 16 * 4, preset
        got = base_lr(cfg.optim, 128, 128, 32)
        assert got == {"rule": "linear", "factor": 4.0, "lr": pytest.approx(4 * cfg.optim.lr)}, (preset, got)
    # a strategy that counts its own: local SGD's replica updates on one rank's samples (on its node's, within_node)
    local = compose_config(["data.batch_size=16", "accumulation.steps=4", "+parallel=local_sgd"])
    assert parallel.samples_per_update(local, 4) == 16 * 4
    assert lr_factor(LrRule.linear, OptimName.sgd, parallel.samples_per_update(local, 4), 4 * 16) == 1.0
    scaled = compose_config(["optim.scale_lr=true", "optim.base_batch_size=64"]).optim
    assert base_lr(scaled, 128, 128, 32) == {"rule": "scale_lr", "factor": 2.0, "lr": pytest.approx(2 * scaled.lr)}


def test_scale_lr_with_a_rule_is_one_line_exit_2_and_nothing_written(tmp_path):
    r = refused(tmp_path / "run", *TINY, "optim.scale_lr=true", "optim.lr_rule=sqrt")
    line = error_line(r.stderr)
    assert r.returncode == 2 and "optim.scale_lr=true with optim.lr_rule=sqrt" in line, r.stderr
    assert "optim.lr_rule=none" in line and len(line) < 200, line  # what to do
    assert not (tmp_path / "run").exists()
    with pytest.raises(ConfigError):
        compose_config(["optim.scale_lr=true", "optim.lr_rule=auto"])
    assert compose_config(["optim.scale_lr=true", "optim.lr_rule=none"]).optim.scale_lr  # alone, each is fine


RULES = {"none": ("none", 1.0), "linear": ("linear", 4.0), "sqrt": ("sqrt", 2.0)}  # at accumulation 4, AdamW


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same 2-rank run with accumulation 4 under each rule (the sqrt one with offline W&B)."""
    root = tmp_path_factory.mktemp("lr_rule")
    base = [o for o in TINY if not o.startswith(("steps", "eval_every"))] + ["steps=4", "eval_every=4",
                                                                            "accumulation.steps=4"]
    for rule in RULES:
        r = run_cli(root / rule, *base, f"optim.lr_rule={rule}", *(["logger=wandb"] if rule == "sqrt" else []))
        assert r.returncode == 0, r.stderr[-3000:]
    return root


@pytest.mark.slow
def test_the_logged_rate_is_the_rules_factor_times_the_unscaled_one(runs):
    lrs = {rule: [row["train/lr"] for row in read_rows(runs / rule)] for rule in RULES}
    assert len(lrs["none"]) == 4 and lrs["none"][0] > 0
    for rule, (_, factor) in RULES.items():
        assert lrs[rule] == pytest.approx([factor * lr for lr in lrs["none"]], rel=1e-9), rule


@pytest.mark.slow
def test_summary_wandb_compare_and_a_tune_trial_say_which_rule_a_run_used(runs):
    for rule, (name, factor) in RULES.items():
        s = read_summary(runs / rule)
        assert s["lr_rule"] == {"rule": name, "factor": factor, "lr": pytest.approx(factor * 3e-3)}, s["lr_rule"]
        assert s["accumulation_steps"] == 4 and s["world_size"] == 2
    # the rule is the candidate's, not the task's: a verdict pairs these runs
    assert len({repr(read_summary(runs / rule)["task"]) for rule in RULES}) == 1
    wandb_file, = glob.glob(str(runs / "sqrt" / "wandb" / "offline-run-*" / "run-*.wandb"))
    _, summary, _ = history_and_summary(wandb_file)
    assert (summary["lr_rule.rule"], summary["lr_rule.factor"]) == ("sqrt", 2.0), summary
    compared = load_local([runs / rule for rule in RULES])
    rows, _, _ = table(compared)
    assert "lr rule" in columns(rows) and [r["lr rule"] for r in rows] == ["none x1", "linear x4", "sqrt x2"]
    assert "linear x4" in report(compared, None)
    assert "lr rule" not in columns(table(load_local([runs / "sqrt"]))[0])  # one rule only: no column
    record = trials.outcome(0, time.monotonic(), runs / "sqrt", runs / "sqrt" / "train.log")
    assert record["status"] == "completed" and cells.lr_rule(record) == "sqrt x2", record
