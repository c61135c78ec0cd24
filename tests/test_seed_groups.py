"""What a seed group may hold, against a careless or hostile sweep (issue 53): a verdict pairs only runs of the
baseline's task and code versions, one per seed, and a baseline whose own runs disagree gives none; every run left
out (another task, none recorded, another code version, a seed again, failed, interrupted, killed before its
summary) is named with why, under the table and in quality.json, which the planner's reader accepts. Runs are
fabricated as ringexp writes them (records.write_summary, records.mark_failed, and the files ringexp.train writes
before it launches): no training."""

import functools
import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from ringexp import compare, quality, records
from ringexp.config import plain
from ringexp.validate import compose_config
from ringexp.versions import versions

TASK = ["model.width=32", "steps=200", "logger=none"]  # what every fabricated run shares
AUROC = {"0": 0.900, "1": 0.906, "2": 0.894, "3": 0.903}  # the baseline's final macro-AUROC per seed
NEAR = {"0": 0.001, "1": -0.002, "2": 0.002, "3": 0.0}  # a candidate as good: its difference per seed


@functools.cache
def task_of(world: int) -> dict:
    """The task a run of TASK on `world` ranks records (summary `task`), as JSON gives it back."""
    return json.loads(json.dumps(quality.task_of(compose_config([*TASK, "+parallel=ddp"]), world)))


@functools.cache
def code() -> dict:
    return versions()


def overrides(preset: str, seed: str) -> list:
    return [*TASK, f"+parallel={preset}", f"seed={seed}"]


def run(run_dir: Path, preset: str, seed: str, auroc: float, world: int = 4, **changes) -> Path:
    """A completed run's summary.json with what compare reads (as Recorder.summary writes it); `changes` replace
    keys (None: the key left out, as in a run from before it was recorded)."""
    summary = {"status": "completed", "name": ",".join(overrides(preset, seed)), "job_type": preset,
               "strategy": preset, "choices": {"parallel": preset}, "overrides": overrides(preset, seed),
               "world_size": world, "task": task_of(world), "versions": code(),
               "throughput": {"median": 40.0, "p10": 36.0, "p90": 44.0},
               "final": {"auroc_macro": auroc, "f1_macro": 0.2, "step": 200},
               "best": {"auroc_macro": auroc, "f1_macro": 0.2, "step": 200}}
    summary = {k: v for k, v in (summary | changes).items() if v is not None}
    run_dir.mkdir(parents=True)
    records.write_summary(run_dir, summary)
    return run_dir


def started(run_dir: Path, preset: str, seed: str) -> Path:
    """What ringexp.train has written once it accepted a run and launched it: .hydra/overrides.yaml, config.yaml
    and a logged row; no summary.json (the run was killed with everything it started, or still runs)."""
    (run_dir / ".hydra").mkdir(parents=True)
    records.write_file(run_dir / ".hydra" / "overrides.yaml", OmegaConf.to_yaml(overrides(preset, seed)))
    records.write_file(run_dir / "config.yaml", OmegaConf.to_yaml(plain(compose_config(overrides(preset, seed)))))
    records.write_file(run_dir / records.METRICS, json.dumps({"step": 1, "train/loss": 0.7}) + "\n")
    return run_dir


def reported(sweep: Path, capsys) -> tuple:
    """(what compare printed, quality.json as the planner's reader reads it: {group: its record})."""
    assert compare.main([str(sweep), "--groups"]) == 0
    out = capsys.readouterr().out
    return out, {g["group"]: g for g in quality.read_record(sweep / quality.FILE)["groups"]}


def left_out(group: dict) -> dict:
    return {Path(e["dir"]).name: (e["seed"], e["why"]) for e in group["left_out"]}


def test_runs_of_another_task_none_another_version_or_a_seed_again_are_left_out_and_named(tmp_path, capsys):
    """ring_fp16 has one run of the baseline's task (seed 0); runs added beside it, each as good as the baseline on
    its own seed, were paired too ('equivalent (4 paired seeds)'): seed 1 on 2 ranks, seed 2 with no task recorded,
    seed 3 under another torch, seed 0 again. Now each is left out with why, the group is seed 0 alone, and with
    no validation scores there is no verdict."""
    sweep = tmp_path / "sweep"
    for seed, auroc in AUROC.items():
        run(sweep / f"ddp-{seed}", "ddp", seed, auroc)
    run(sweep / "c0", "ring_fp16", "0", AUROC["0"] + NEAR["0"])
    run(sweep / "c1", "ring_fp16", "1", AUROC["1"] + NEAR["1"], world=2)
    run(sweep / "c2", "ring_fp16", "2", AUROC["2"] + NEAR["2"], task=None)
    run(sweep / "c3", "ring_fp16", "3", AUROC["3"] + NEAR["3"], versions=code() | {"torch": "0.0.1"})
    run(sweep / "c4", "ring_fp16", "0", AUROC["0"] - NEAR["0"])
    out, groups = reported(sweep, capsys)
    cand = groups["+parallel=ring_fp16"]
    assert cand["seeds"] == ["0"] and all(v is None for v in cand["verdicts"].values()), cand
    why = left_out(cand)
    assert set(why) == {"c1", "c2", "c3", "c4"}, why
    assert why["c1"][0] == "1" and why["c1"][1].startswith("another task (world_size: 2, the baseline's 4; samples: ")
    assert why["c2"] == ("2", "no task recorded (a run from before runs recorded it)")
    assert why["c3"] == ("3", f"another code version (torch: '0.0.1', the baseline's {ascii(code()['torch'])})")
    assert why["c4"] == ("0", f"seed 0 again (the group's run of it: {sweep / 'c0'})")
    assert groups["+parallel=ddp"]["seeds"] == list(AUROC) and groups["+parallel=ddp"]["left_out"] == []
    said = out.split("Left out of their groups (in neither their numbers nor their verdicts):\n", 1)[1]
    for name, (seed, reason) in why.items():
        assert f"- `+parallel=ring_fp16`: {sweep / name} (seed {seed}): {reason}\n" in said, said
    assert "paired seeds" not in out.split("+parallel=ring_fp16`: ", 1)[1].splitlines()[0]


def test_a_baseline_whose_own_runs_disagree_gives_no_verdict_and_is_named(tmp_path, capsys):
    """The baseline's seed 1 ran on 2 ranks: its group's first run no longer stands for its task (nor would a
    majority), so there is no verdict at all, the baseline says why, and the record names no task (the planner
    refuses it). A candidate of the first run's task was called equivalent over 3 paired seeds."""
    sweep = tmp_path / "sweep"
    for seed in ("0", "1", "2"):
        run(sweep / f"ddp-{seed}", "ddp", seed, AUROC[seed], world=2 if seed == "1" else 4)
        run(sweep / f"fp16-{seed}", "ring_fp16", seed, AUROC[seed] + NEAR[seed])
    out, groups = reported(sweep, capsys)
    why = (f"the baseline's own runs disagree ({sweep / 'ddp-1'}: another task (world_size: 2, {sweep / 'ddp-0'}'s "
           "4; samples: ")
    assert groups["+parallel=ddp"]["note"].startswith(why), groups["+parallel=ddp"]["note"]
    cand = groups["+parallel=ring_fp16"]
    assert all(v is None for v in cand["verdicts"].values()) and cand["note"].startswith(why), cand
    assert quality.read_record(sweep / quality.FILE)["task"] is None
    assert f"- `+parallel=ddp` (the baseline): {why}" in out
    assert f"- `+parallel=ring_fp16`: no verdict. Note: {why}" in out


def test_runs_that_did_not_complete_are_named_in_their_group(tmp_path, capsys):
    """ring_fp16's seed 2 was killed with everything it started (no summary.json) and seed 3 interrupted: they
    vanished from the group; now both are named with why (and the killed one is listed among the runs that did not
    complete), while the verdict over the two seeds that completed stands."""
    sweep = tmp_path / "sweep"
    for seed in ("0", "1"):
        run(sweep / f"ddp-{seed}", "ddp", seed, AUROC[seed])
        run(sweep / f"fp16-{seed}", "ring_fp16", seed, AUROC[seed] + NEAR[seed])
    started(sweep / "fp16-2", "ring_fp16", "2")
    started(sweep / "fp16-3", "ring_fp16", "3")
    records.mark_failed(sweep / "fp16-3", "interrupted; resume=auto continues from step-00000100", "interrupted")
    out, groups = reported(sweep, capsys)
    cand = groups["+parallel=ring_fp16"]
    assert left_out(cand) == {
        "fp16-2": ("2", "unfinished: no summary.json: the run was killed before it finished, or is still running"),
        "fp16-3": ("3", "interrupted: interrupted; resume=auto continues from step-00000100")}
    assert cand["seeds"] == ["0", "1"] and cand["verdicts"]["final AUROC"]["seeds"] == 2
    assert any(line.startswith("FAILED") and "no summary.json: the run was killed" in line
               for line in out.splitlines()), out
    assert f"- `+parallel=ring_fp16`: {sweep / 'fp16-2'} (seed 2): unfinished: no summary.json" in out


def test_each_test_runs_at_five_percent_over_the_family_and_the_record_says_so(tmp_path, capsys):
    """Three presets beside ddp: each verdict at 5% / 3 (any of the three a choice could take), recorded as the
    record's alpha and family and as each verdict's level; --family 1 tests each at 5%, the 90% interval."""
    sweep = tmp_path / "sweep"
    for seed in ("0", "1", "2"):
        run(sweep / f"ddp-{seed}", "ddp", seed, AUROC[seed])
        for preset in ("ring_fp16", "ring_int8", "ddp_fp16"):
            run(sweep / f"{preset}-{seed}", preset, seed, AUROC[seed] + NEAR[seed])
    for flags, family in (([], 3), (["--family", "1"], 1)):
        assert compare.main([str(sweep), "--groups", *flags]) == 0
        said = capsys.readouterr().out
        record = quality.read_record(sweep / quality.FILE)
        assert record["family"] == family and record["alpha"] == pytest.approx(0.05 / family), record
        levels = {v["level"] for g in record["groups"] for v in g["verdicts"].values() if v}
        assert levels and all(x == pytest.approx(1 - 0.1 / family) for x in levels), levels
        assert (f"tests at {0.05 / family:.2%}: 5% over the 3 configurations" in said) == (family == 3), said
