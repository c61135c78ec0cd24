"""Hostile records and outputs of compare, plan and bench: symlinks planted at every name they write (the files
they point to stay as they were; the real files are written), quality records whose numbers do not hold together
(one line naming the file, the group and the entry), validation scores that are not the run's own (no verdict
from them), published-cases files of absurd sizes or the wrong shapes (one line naming the file, the case and the
field, before anything is built), and names of 900 KB (bounded wherever a plot shows or a path holds them). Runs
are fabricated as ringexp writes them (records.write_summary, records.write_scores): no training."""

import functools
import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from helpers.processes import ROOT, plan_refusal, within

from ringexp import bench, compare, metrics, quality, records
from ringexp.cluster import files as clusters
from ringexp.config import CONF_DIR
from ringexp.plan.cli import main as plan_main
from ringexp.validate import compose_config

PNG = b"\x89PNG\r\n\x1a\n"
PRECIOUS = "precious: written by someone else, never by ringexp\n"
TASK = ["model.width=32", "steps=200", "logger=none"]  # what every fabricated run shares
LONG = "n" * 900_000  # a name of 900 KB: matplotlib lays out every character (minutes for one label)
PLAN = ["cluster=local_2x2_250mbit", "model.width=32", "forward_s=0.01", "backward_s=0.02", "optimizer_s=0.002"]


def plant(directory: Path, names, outside: Path) -> dict:
    """A symlink at each of `names` in `directory` to a file of its own in `outside` holding PRECIOUS: {name: the
    file it points to}."""
    directory.mkdir(parents=True, exist_ok=True)
    outside.mkdir(parents=True, exist_ok=True)
    targets = {}
    for name in names:
        targets[name] = outside / f"target-{name}"
        targets[name].write_text(PRECIOUS)
        (directory / name).symlink_to(targets[name])
    return targets


def untouched(directory: Path, targets: dict, written) -> None:
    """Every target still holds PRECIOUS; each name in `written` is now a regular file of ringexp's (the symlink
    replaced, not followed); a name not written (a fixed temporary name of old) still points where it did."""
    for name, target in targets.items():
        assert target.read_text() == PRECIOUS, f"{name}: written through the symlink into {target}"
        path = directory / name
        if name in written:
            assert not path.is_symlink() and path.is_file() and path.stat().st_size > 0, name
            if name.endswith(".png"):
                assert path.read_bytes().startswith(PNG), name
        else:
            assert path.is_symlink() and os.readlink(path) == str(target), name


def summary(overrides, median: float, final: dict, best: dict | None = None) -> dict:
    """A completed run's summary.json with the keys compare reads (as Recorder.summary writes them)."""
    preset = next((o.split("=", 1)[1] for o in overrides if o.startswith("+parallel=")), "ddp")
    return {"status": "completed", "name": ",".join(overrides), "job_type": preset, "strategy": preset,
            "choices": {"parallel": preset}, "overrides": list(overrides), "world_size": 2, "task": run_task(),
            "throughput": {"median": median, "p10": 0.9 * median, "p90": 1.1 * median},
            "time": {"step_s": 0.1, "compute_s": 0.06, "comm_s": 0.03, "exposed_comm_s": 0.02},
            "final": dict(final), "best": dict(best or final)}


@functools.cache
def run_task() -> dict:
    """The task every fabricated run records (summary `task`): TASK's, on 2 ranks."""
    return quality.task_of(compose_config([*TASK, "+parallel=ddp"]), 2)


def fake_run(run_dir: Path, overrides, median: float, auroc: float, f1: float = 0.2) -> Path:
    run_dir.mkdir(parents=True)
    records.write_summary(run_dir, summary(overrides, median, {"auroc_macro": auroc, "f1_macro": f1, "step": 200}))
    return run_dir


# 1. Nothing is ever written through a symlink planted where compare, plan or bench write.

COMPARE_NAMES = (*compare.OUTPUTS, *compare.GROUP_OUTPUTS, "quality.json.tmp")


def test_compare_writes_every_file_in_place_of_a_symlink_never_through_it(tmp_path, capsys):
    """A sweep of two seed groups (so that groups.csv and quality.json are written too) with a symlink planted at
    every name compare writes, and at the fixed temporary name it used for quality.json: the files pointed to are
    unchanged, the real ones are written, and quality.json is a record the planner's reader accepts, of the runs'
    task."""
    sweep = tmp_path / "sweep"
    for seed in (0, 1):
        fake_run(sweep / f"ddp-{seed}", [*TASK, "+parallel=ddp", f"seed={seed}"], 40.0 + seed, 0.90 + seed / 100)
        fake_run(sweep / f"fp16-{seed}", [*TASK, "+parallel=ring_fp16", f"seed={seed}"], 60.0 + seed,
                 0.901 + seed / 100)
    targets = plant(sweep, COMPARE_NAMES, tmp_path / "elsewhere")
    assert compare.main([str(sweep)]) == 0
    capsys.readouterr()
    untouched(sweep, targets, written=set(COMPARE_NAMES) - {"quality.json.tmp"})
    assert "| run |" in (sweep / "compare.md").read_text()
    record = quality.read_record(sweep / "quality.json")
    assert [g["group"] for g in record["groups"]] == ["+parallel=ddp", "+parallel=ring_fp16"]
    assert record["task"] == run_task() and record["format"] == quality.FORMAT


def test_plan_predict_writes_its_files_in_place_of_symlinks(tmp_path, monkeypatch, capsys):
    out = tmp_path / "plan"
    targets = plant(out, ("plan.md", "plan.json", "plan.png"), tmp_path / "elsewhere")
    monkeypatch.setattr(sys, "argv", ["ringexp.plan", "predict", *PLAN, "presets=[ddp,ring_fp16]", f"out={out}"])
    plan_main()
    capsys.readouterr()
    untouched(out, targets, written=set(targets))
    assert json.loads((out / "plan.json").read_text())["recommended"].startswith("python -m ringexp.train")


def test_plan_predict_refuses_a_symlink_planted_as_its_default_directory(tmp_path, monkeypatch, capsys):
    """outputs/plan/<cluster>/<model>/ is made by ringexp: a symlink there is refused in one line, and nothing is
    written where it points."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "outputs" / "plan" / "local_2x2_250mbit").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "outputs" / "plan" / "local_2x2_250mbit" / "small_cnn").symlink_to(tmp_path / "elsewhere")
    line = plan_refusal(monkeypatch, capsys, ["predict", *PLAN, "presets=[ddp]"])
    assert "outputs/plan/local_2x2_250mbit/small_cnn: cannot write the plan there" in line and "out=DIR" in line
    assert not list((tmp_path / "elsewhere").iterdir())


def test_an_output_directory_that_is_a_file_is_one_line(tmp_path, monkeypatch, capsys):
    """compare --out and predict out= naming a file: one line naming it, exit 2, the file as it was (a traceback
    before)."""
    sweep = tmp_path / "sweep"
    fake_run(sweep / "0", [*TASK, "+parallel=ddp"], 40.0, 0.9)
    (tmp_path / "a-file").write_text(PRECIOUS)
    assert compare.main([str(sweep), "--out", str(tmp_path / "a-file")]) == 2
    assert f"{tmp_path / 'a-file'}: cannot write the report there" in capsys.readouterr().err
    line = plan_refusal(monkeypatch, capsys, ["predict", *PLAN, "presets=[ddp]", f"out={tmp_path / 'a-file'}"])
    assert f"{tmp_path / 'a-file'}: cannot write the plan there" in line, line
    assert (tmp_path / "a-file").read_text() == PRECIOUS


def bench_file(path: Path) -> Path:
    rows = [{"algorithm": a, "size_bytes": 4 << 20, "count": 1 << 20, "nodes": 2, "ranks_per_node": 2, "link": "x",
             "time_us": t} for a, t in (("builtin", 4e4), ("hierarchical", 5e4))]
    path.write_text(json.dumps(rows))
    return path


def cases_doc() -> dict:
    """A small published-cases file: the shipped dgx1_v100 cluster and one case of a parameter count (no model to
    build), two runs, one the other's baseline."""
    shipped = yaml.safe_load(Path(ROOT, "ringexp", "plan", "published.yaml").read_text())
    return {"clusters": {"dgx1_v100": shipped["clusters"]["dgx1_v100"]}, "cases": [{
        "name": "tiny", "study": "made-up", "source": "made up for the test", "cluster": "dgx1_v100",
        "params": 25_000_000, "batch": 32,
        "compute": {"step_s": 0.1, "source": "made up"},
        "runs": [{"name": "1 node", "nodes": 1, "ranks_per_node": 8, "step_s": 0.11, "source": "made up"},
                 {"name": "2 nodes", "nodes": 2, "ranks_per_node": 8, "step_s": 0.12, "source": "made up",
                  "baseline": "1 node", "train": ["parallel.bucket_cap_mb=50"]}]}]}


def cases_file(path: Path, change=None) -> Path:
    doc = cases_doc()
    if change:
        change(doc)
    path.write_text(yaml.safe_dump(doc))
    return path


def test_plan_accuracy_writes_its_files_in_place_of_symlinks(tmp_path, monkeypatch, capsys):
    names = ("accuracy.md", "accuracy.json", "accuracy.png", "accuracy-published.md", "accuracy-published.json")
    out = tmp_path / "acc"
    targets = plant(out, names, tmp_path / "elsewhere")
    monkeypatch.setattr(sys, "argv", ["ringexp.plan", "accuracy", f"bench=[{bench_file(tmp_path / 'bench.json')}]",
                                      f"cases=[{cases_file(tmp_path / 'cases.yaml')}]", f"out={out}"])
    plan_main()
    assert "2 cases: median |error|" in capsys.readouterr().out
    untouched(out, targets, written=set(names))


MEASURED = {"nodes": 2, "ranks_per_node": 2, "link": "25mbit", "backend": "gloo", "cpu_threads": 1,
            "intra": {"alpha_s": 1e-5, "beta_s_per_byte": 1e-9, "errors": [0.0], "points": [[4096, 1e-5]]},
            "inter": {"alpha_s": 1e-4, "beta_s_per_byte": 3.2e-7, "errors": [0.0], "points": [[4096, 1e-3]]},
            "add_s_per_byte": 1e-10, "encode_s_per_byte": {"fp16": 1e-10}, "decode_s_per_byte": {"fp16": 1e-10},
            "compute_slowdown": 2.0, "jitter_s": 2e-3, "call_s": 1e-5, "bucket_s": 2e-5}  # calibrate's, made up


def test_calibrate_writes_its_cluster_file_in_place_of_a_symlink(tmp_path, capsys):
    targets = plant(tmp_path / "conf", ("mine.yaml",), tmp_path / "elsewhere")
    clusters.write(MEASURED, str(tmp_path / "conf" / "mine.yaml"), None)
    capsys.readouterr()
    untouched(tmp_path / "conf", targets, written={"mine.yaml"})
    assert clusters.read(tmp_path / "conf" / "mine.yaml").name == "mine"


def test_bench_writes_its_results_in_place_of_symlinks(tmp_path):
    rows = [{"size_bytes": 4096, "count": 1024, "algorithm": "ring", "time_us": 12.5}]
    targets = plant(tmp_path / "run", (records.BENCH, "bench.csv"), tmp_path / "elsewhere")
    bench.write_results(rows, tmp_path / "run")
    untouched(tmp_path / "run", targets, written=set(targets))
    assert records.read_bench(tmp_path / "run" / records.BENCH) == rows
    assert (tmp_path / "run" / "bench.csv").read_text().splitlines()[1] == "4096,1024,ring,12.5"


# 2. A quality record is checked where the planner reads it: every verdict's numbers must hold together.

def verdict(diff, ci95, ci_eq, word=None, margin=0.02) -> dict:
    return {"word": word or quality.decide(diff, tuple(ci95), tuple(ci_eq), margin), "diff": diff, "ci95": ci95,
            "ci_eq": ci_eq, "level": 0.9, "seeds": 3, "margin": margin, "test": "3 paired seeds", "more_seeds": None}


@functools.cache
def plan_task() -> dict:
    """The task PLAN predicts (quality.task_of of its ddp config, composed as training composes it, on the
    cluster's 2 x 2 ranks): the one a record must be of for the planner to use its verdicts."""
    return quality.task_of(compose_config(["model.width=32", "+parallel=ddp"], 2), 4)


def record(topk) -> dict:
    """compare's quality.json (of PLAN's task): the ddp baseline, ring_fp16 equivalent, and ddp_topk's verdict
    `topk`, each group of seeds 0, 1 and 2."""
    groups = [{"group": "+parallel=ddp", "baseline": True, "overrides": [*TASK, "+parallel=ddp"], "verdicts": {}},
              {"group": "+parallel=ring_fp16", "baseline": False, "overrides": [*TASK, "+parallel=ring_fp16"],
               "verdicts": {"final AUROC": verdict(0.001, [-0.004, 0.006], [-0.003, 0.005]),
                            "final F1": verdict(0.002, [-0.03, 0.034], [-0.024, 0.028], margin=0.05)}},
              {"group": "+parallel=ddp_topk", "baseline": False, "overrides": [*TASK, "+parallel=ddp_topk"],
               "verdicts": {"final AUROC": topk, "final F1": verdict(-0.01, [-0.05, 0.03], [-0.04, 0.02])}}]
    groups = [g | {"seeds": ["0", "1", "2"], "left_out": []} for g in groups]
    return {"format": quality.FORMAT, "task": plan_task(), "margin": 0.02, "metrics": ["final AUROC", "final F1"],
            "margins": {"final AUROC": 0.02, "final F1": 0.05}, "alpha": 0.05, "family": 2, "groups": groups}


def topk_entry(doc) -> dict:
    return doc["groups"][2]["verdicts"]["final AUROC"]


TOPK = "group '+parallel=ddp_topk': 'final AUROC': "
BAD_RECORDS = [
    ("reversed equivalence interval", lambda d: topk_entry(d).update(ci_eq=[0.01, -0.5], ci95=[-0.6, 0.02],
                                                                       word="equivalent"),
     TOPK + "the equivalence interval [+0.010, -0.500] is reversed"),
    ("difference outside its interval", lambda d: topk_entry(d).update(diff=0.05),
     TOPK + "the difference +0.050 lies outside its 95% interval"),
    ("95% interval inside the 90% one", lambda d: topk_entry(d).update(ci95=[-0.35, -0.25]),
     TOPK + "the 95% interval [-0.350, -0.250] and the 90.0% one [-0.400, -0.200] are not nested as their levels"),
    ("word its numbers do not give", lambda d: topk_entry(d).update(word="equivalent"),
     TOPK + "says equivalent, but its numbers (-0.300, equivalence interval [-0.400, -0.200], margin 0.02) are "
     "worse"),
    ("NaN difference", lambda d: topk_entry(d).update(diff=float("nan")), TOPK + "diff is nan, not a finite number"),
    ("infinite end", lambda d: topk_entry(d).update(ci95=[float("-inf"), 0.0]), TOPK + "ci95 is a list of 2, not a"),
    ("interval as a string", lambda d: topk_entry(d).update(ci95="[-0.5, -0.1]"), TOPK + "ci95 is '[-0.5, -0.1]'"),
    ("one-element interval", lambda d: topk_entry(d).update(ci_eq=[-0.3]), TOPK + "ci_eq is a list of 1, not a"),
    ("a format-1 verdict (ci90)", lambda d: topk_entry(d).update(ci90=topk_entry(d).pop("ci_eq")),
     TOPK + "ci_eq is null, not a"),
    ("NaN level", lambda d: topk_entry(d).update(level=float("nan")), TOPK + "level is nan, not the equivalence"),
    ("seeds negative", lambda d: topk_entry(d).update(seeds=-1), TOPK + "seeds is -1, not a count of paired seeds"),
    ("seeds true", lambda d: topk_entry(d).update(seeds=True), TOPK + "seeds is true, not a count of paired seeds"),
    ("verdict a list", lambda d: d["groups"][2]["verdicts"].update({"final AUROC": [-0.3]}),
     TOPK + "a list of 1, not a verdict"),
    ("other metric's entry broken", lambda d: d["groups"][2]["verdicts"]["final F1"].update(ci_eq=[0.02, -0.04]),
     "group '+parallel=ddp_topk': 'final F1': the equivalence interval [+0.020, -0.040] is reversed"),
    ("verdicts null", lambda d: d["groups"][1].update(verdicts=None),
     "group '+parallel=ring_fp16': verdicts is null, not an object"),
    ("overrides a string", lambda d: d["groups"][1].update(overrides="+parallel=ring_fp16"),
     "group '+parallel=ring_fp16': overrides is '+parallel=ring_fp16', not a list of text"),
    ("a group that is a string", lambda d: d["groups"].append("+parallel=fsdp"), "groups[3]: '+parallel=fsdp', not a"),
    ("groups an object", lambda d: d.update(groups={"+parallel=ddp": {}}), "groups is a dict, not a list"),
    ("two baselines", lambda d: d["groups"][1].update(baseline=True), "2 groups are marked baseline"),
    ("one configuration twice", lambda d: d["groups"].append(d["groups"][2] | {"group": "+parallel=ddp_topk again",
                                                                              "verdicts": {}}),
     "groups '+parallel=ddp_topk' and '+parallel=ddp_topk again' have the same overrides: two verdicts for one "
     "configuration"),
    ("one preset twice", lambda d: d["groups"].append(d["groups"][1] | {
        "group": "+parallel=ddp +parallel=ddp_topk", "overrides": [*TASK, "+parallel=ddp", "+parallel=ddp_topk"]}),
     "two verdicts for preset 'ddp_topk' (groups '+parallel=ddp_topk' and '+parallel=ddp +parallel=ddp_topk')"),
    ("seed count raised past the seeds in common", lambda d: d["groups"][2].update(seeds=["0"]),
     TOPK + "seeds is 3, but the group and the baseline list 1 seed in common ('0')"),
    ("seed count past the runs", lambda d: topk_entry(d).update(seeds=5, test="5 paired seeds"),
     TOPK + "seeds is 5, but the group and the baseline list 3 seeds in common ('0', '1', '2')"),
    ("a seed listed twice", lambda d: d["groups"][2].update(seeds=["0", "1", "1"]),
     "group '+parallel=ddp_topk': seeds is a list of 3, not a list of its runs' seeds, each once"),
    ("no left_out", lambda d: d["groups"][1].pop("left_out") and None,
     "group '+parallel=ring_fp16': left_out is null, not a list of runs left out"),
    ("a list, not a record", lambda d: [d], "holds a list of 1, not a record of verdicts"),
    ("no margin", lambda d: d.pop("margin") and None, "margin is null, not a number in [0, 1)"),
    ("no format (format 1)", lambda d: d.pop("format") and None, "format is null, not 5: a record of an unknown"),
    ("format 2 (may pair runs of another task)", lambda d: d.update(format=2), "format is 2, not 5: a record of an "
     "unknown format (format 1 has no task; format 2 may pair runs of another task or code version"),
    ("format 3 (decides on AUROC alone)", lambda d: d.update(format=3), "format is 3, not 5: a record of an "
     "unknown format"),
    ("format 4 (each test at 5% whatever the family)", lambda d: d.update(format=4), "format is 4, not 5: a record "
     "of an unknown format"),
    ("a format to come", lambda d: d.update(format=6), "format is 6, not 5: a record of an unknown format"),
    ("format as text", lambda d: d.update(format="5"), "format is '5', not 5"),
    ("no family", lambda d: d.pop("family") and None, "alpha is 0.05 and family null, not each test's level"),
    ("alpha past 0.5", lambda d: d.update(alpha=0.7), "alpha is 0.7 and family 2, not each test's level in (0, 0.5)"),
    ("a verdict at another level than the record's", lambda d: d.update(alpha=0.025),
     "group '+parallel=ring_fp16': final AUROC: its level 90.0000% is not the record's 1 - 2 alpha = 95.0000%"),
    ("no metrics", lambda d: d.pop("metrics") and None, "metrics is null, not the list of the metrics a decision"),
    ("a metric without its margin", lambda d: d["margins"].pop("final F1") and None,
     "margins is a dict, not each decision metric's margin in [0, 1)"),
    ("task a list", lambda d: d.update(task=["small_cnn"]), "task is a list of 1, not the task the verdicts"),
    ("another task", lambda d: d["task"]["model"].update(width=8),
     "its verdicts are of another task (model.width: 8 in the record, 32 here)"),
    ("another task's every field", lambda d: d.update(task={k: "x" for k in ("model", "data", "optim", "world_size",
                                                                           "samples")}),
     "its verdicts are of another task (model: 'x' in the record, a mapping of 4 here; data: 'x' in the record, a "
     "mapping of "),
    ("no task recorded", lambda d: d.update(task=None), "its verdicts are of another task (the record names none"),
]


def test_a_sound_quality_record_is_read_as_it_was_written(tmp_path, monkeypatch, capsys):
    """The control: the record the bad ones are made from passes and ddp_topk's verdict (worse) leaves it out. The
    shipped slow-link story's record (format 1: no task, ci90) stays a result, not a record the planner reads."""
    path = tmp_path / "quality.json"
    records.write_json(path, record(verdict(-0.300, [-0.45, -0.15], [-0.40, -0.20])))
    monkeypatch.setattr(sys, "argv", ["ringexp.plan", "predict", *PLAN, "presets=[ddp,ring_fp16,ddp_topk]",
                                      f"quality={path}", f"out={tmp_path / 'out'}"])
    plan_main()
    capsys.readouterr()
    got = json.loads((tmp_path / "out" / "plan.json").read_text())
    assert {r["preset"]: r["quality"] for r in got["rows"]}["ddp_topk"] == "worse"
    assert "+parallel=ddp_topk" not in got["recommended"]
    shipped = Path(ROOT, "docs", "results", "cluster-story-quality.json")
    assert len(records.read_json(shipped)["groups"]) == 11
    with pytest.raises(ValueError, match=f"format is null, not {quality.FORMAT}"):
        quality.read_record(shipped)


def test_a_preset_equivalent_on_auroc_but_worse_on_f1_is_not_recommended(tmp_path, monkeypatch, capsys):
    """The record decides on final AUROC and F1 (its metrics): ddp_topk equivalent on AUROC and worse on F1 is
    worse, and not recommended; the same verdicts in a record that decides on AUROC alone make it equivalent. The
    report and plan.json say which metrics decided, and which one stopped it."""
    doc = record(verdict(0.001, [-0.004, 0.006], [-0.003, 0.005]))
    doc["groups"][2]["verdicts"]["final F1"] = verdict(-0.1, [-0.15, -0.05], [-0.14, -0.06], margin=0.05)
    got, said = {}, {}
    for on in (["final AUROC", "final F1"], ["final AUROC"]):
        path = tmp_path / f"quality-{len(on)}.json"
        records.write_json(path, doc | {"metrics": on})
        out = tmp_path / f"out-{len(on)}"
        monkeypatch.setattr(sys, "argv", ["ringexp.plan", "predict", *PLAN, "presets=[ddp,ring_fp16,ddp_topk]",
                                          f"quality={path}", f"out={out}"])
        plan_main()
        said[len(on)] = capsys.readouterr().out
        plan = json.loads((out / "plan.json").read_text())
        got[len(on)] = {r["preset"]: (r["quality"], r["decided_on"]) for r in plan["rows"]}
        assert plan["decided_on"] == dict(zip(on, (0.02, 0.05)[:len(on)], strict=True)), plan["decided_on"]
    assert got[2]["ddp_topk"] == ("worse", "final F1") and got[1]["ddp_topk"] == ("equivalent", "final AUROC"), got
    assert got[2]["ring_fp16"] == got[1]["ring_fp16"] == ("equivalent", "final AUROC"), got
    assert "ddp on final AUROC (margin 0.02) and final F1 (margin 0.05), each by a decisive" in said[2], said[2]
    assert "Left out for quality: ddp_topk (worse on final F1)" in said[2], said[2]
    assert "ddp on final AUROC (margin 0.02), each by a decisive" in said[1], said[1]


@pytest.mark.parametrize("case, change, words", BAD_RECORDS, ids=[c[0] for c in BAD_RECORDS])
def test_a_quality_record_whose_numbers_do_not_hold_together_is_one_line_naming_the_group_and_entry(
        tmp_path, monkeypatch, capsys, case, change, words):
    """A reversed 90% interval around -0.300 was read as 'equivalent (-0.300)' and ddp_topk recommended; now each
    broken record, and one of another format or task, is refused before anything is measured or written."""
    doc = record(verdict(-0.300, [-0.45, -0.15], [-0.40, -0.20]))
    doc = change(doc) or doc  # (a change returns a whole new document, or None having changed this one)
    path = tmp_path / "quality.json"
    path.write_text(json.dumps(doc))  # (Python's json writes NaN and Infinity, as a broken writer would)
    out = tmp_path / "out"
    line = plan_refusal(monkeypatch, capsys, ["predict", *PLAN, "presets=[ddp,ring_fp16,ddp_topk]",
                                              f"quality={path}", f"out={out}"])
    assert line.startswith(f"ringexp: error: quality={path}: ") and words in line, line
    assert not out.exists()


# 3. A verdict on the validation set uses only scores that agree with their run's summary.

def scores(signal: float, seed: int, n: int = 300, labels: int = 4) -> tuple:
    rng = np.random.default_rng(seed)
    y = rng.random((n, labels)) < 0.3
    y[0], y[1] = True, False  # every label has both classes
    p = np.clip(signal * y + (1 - signal) * rng.random((n, labels)), 0, 1).astype(np.float32)
    return torch.tensor(p), torch.tensor(y, dtype=torch.uint8)


def scored_run(run_dir: Path, overrides, probs, labels, recorded_auroc=None) -> Path:
    """A run whose val_scores.pt holds `probs` (as the final and best evaluation, step 200) and whose summary
    records their macro-AUROC and F1 as the trainer computes them (ringexp.metrics), or `recorded_auroc`."""
    got = {k: float(v) for k, v in metrics.quality(probs, labels.int(), labels.shape[1]).items()}
    final = {"auroc_macro": got["auroc_macro"] if recorded_auroc is None else recorded_auroc,
             "f1_macro": got["f1_macro"], "step": 200}
    run_dir.mkdir(parents=True)
    records.write_summary(run_dir, summary(overrides, 40.0, final))
    records.write_scores(run_dir, {"labels": labels, "final": {"step": 200, "probs": probs},
                                   "best": {"step": 200, "probs": probs}})
    return run_dir


def test_validation_scores_that_disagree_with_the_summary_give_no_verdict(tmp_path, capsys):
    """The candidate's summary says final macro-AUROC 0.600 against the baseline's 0.9, but its val_scores.pt is a
    copy of the baseline's: it was shown 'equivalent [+0.000, +0.000]' beside -0.3; now no verdict, and the note
    says why. A candidate whose scores are its own still gets its verdict."""
    sweep = tmp_path / "sweep"
    probs, labels = scores(0.5, 0)
    scored_run(sweep / "base", [*TASK, "+parallel=ddp"], probs, labels)
    shutil.copytree(sweep / "base", sweep / "replaced")
    records.write_summary(sweep / "replaced", summary([*TASK, "+parallel=ddp_topk"], 90.0,
                                                      {"auroc_macro": 0.600, "f1_macro": 0.1, "step": 200}))
    scored_run(sweep / "own", [*TASK, "+parallel=ring_fp16"], scores(0.5, 0)[0] + 1e-4, labels)
    assert compare.main([str(sweep), "--groups"]) == 0
    printed = capsys.readouterr().out
    groups = {g["group"]: g for g in records.read_json(sweep / "quality.json")["groups"]}
    replaced = groups["+parallel=ddp_topk"]
    assert all(v is None for v in replaced["verdicts"].values()), replaced["verdicts"]
    base_auroc = records.read_summary(sweep / "base")["final"]["auroc_macro"]
    assert (f"{sweep / 'replaced'}/val_scores.pt disagrees with summary.json ({base_auroc:.3f} vs 0.600"
            in replaced["note"]) and "no validation-set verdict" in replaced["note"], replaced["note"]
    assert "equivalent" not in next(line for line in printed.splitlines() if line.startswith("- `+parallel=ddp_topk"))
    assert groups["+parallel=ring_fp16"]["verdicts"]["final AUROC"]["word"] == "equivalent"


@pytest.mark.parametrize("content", [{"labels": "not a tensor"}, [1, 2], {"labels": torch.zeros(4, 2)}])
def test_validation_scores_of_the_wrong_shape_give_no_verdict_and_no_traceback(tmp_path, capsys, content):
    sweep = tmp_path / "sweep"
    probs, labels = scores(0.5, 0)
    scored_run(sweep / "base", [*TASK, "+parallel=ddp"], probs, labels)
    scored_run(sweep / "cand", [*TASK, "+parallel=ring_fp16"], probs, labels)
    records.write_scores(sweep / "cand", content)
    assert compare.main([str(sweep), "--groups"]) == 0
    capsys.readouterr()
    cand = records.read_json(sweep / "quality.json")["groups"][1]
    assert all(v is None for v in cand["verdicts"].values()) and "val_scores.pt holds no" in cand["note"], cand


# 4. A published-cases file: absurd sizes and wrong shapes are one line naming the case and field.

def case0(doc) -> dict:
    return doc["cases"][0]


def as_model(name):
    def change(doc):
        case0(doc).pop("params")
        case0(doc)["model"] = name
    return change


BAD_CASES = [
    ("10^15 parameters", lambda d: case0(d).update(params=10 ** 15), "case tiny: params: 1000000000000000 must be"),
    ("parameters as text", lambda d: case0(d).update(params="10^15"), "case tiny: params: '10^15' must be a whole"),
    ("a step of 1e308 s", lambda d: case0(d)["compute"].update(step_s=1e308),
     "case tiny: compute.step_s: 1e+308 must be a finite number > 0 and at most 86400"),
    ("a run's throughput of 1e300", lambda d: case0(d)["runs"][0].update(samples_s=1e300) or
     case0(d)["runs"][0].pop("step_s"), "case tiny: run '1 node': samples_s: 1e+300 must be"),
    ("a list inside train", lambda d: case0(d).update(train=[["+parallel=ddp"]]),
     "case tiny: train: a list of list is not a list of training overrides"),
    ("a string for train", lambda d: case0(d).update(train="+parallel=ddp"),
     "case tiny: train: '+parallel=ddp' is not a list of training overrides"),
    ("a string for a run's train", lambda d: case0(d)["runs"][1].update(train="parallel.bucket_cap_mb=5"),
     "case tiny: run '2 nodes': train: 'parallel.bucket_cap_mb=5' is not a list"),
    ("an unknown model", as_model("resnet_nosuch"), "case tiny: model: resnet_nosuch is neither small_cnn nor a timm"),
    ("a model that is a list", as_model(["resnet50"]), "case tiny: model: a list of str is not a timm model's name"),
    ("an unknown preset", lambda d: case0(d).update(train=["+parallel=nosuch"]),
     "case tiny: train: In 'train': Could not find 'parallel/nosuch'"),
    ("an unknown key in a run's train", lambda d: case0(d)["runs"][1].update(train=["nosuch=1"]),
     "case tiny: run '2 nodes': train: Could not override 'nosuch'"),
    ("a batch of 10^12", lambda d: case0(d).update(batch=10 ** 12), "case tiny: batch: 1000000000000 must be in [1,"),
    ("env a list", lambda d: case0(d).update(env=["NCCL_ALGO=Ring"]), "case tiny: env: a list of str is not a mapping"),
    ("a run on 0 nodes", lambda d: case0(d)["runs"][0].update(nodes=0),
     "case tiny: run '1 node': nodes, ranks_per_node: cluster.nodes, ranks_per_node=0, 8: must be in"),
]


@pytest.mark.parametrize("case, change, words", BAD_CASES, ids=[c[0] for c in BAD_CASES])
def test_a_published_case_of_absurd_size_or_wrong_shape_is_one_line_naming_the_case_and_field(
        tmp_path, monkeypatch, capsys, case, change, words):
    """params 10^15 allocated 5 GB before std::bad_alloc, a step of 1e308 s made every prediction infinite, the
    wrong shapes were tracebacks: each is now refused before anything is built or written."""
    path = cases_file(tmp_path / "cases.yaml", change)
    out = tmp_path / "acc"
    with within(60):
        line = plan_refusal(monkeypatch, capsys, ["accuracy", f"cases=[{path}]", f"out={out}"])
    assert line.startswith(f"ringexp: error: cases={path}: ") and words in line, line
    assert not out.exists()


# 5. Names of 900 KB: bounded in every title, label and path.

def long_cluster(path: Path) -> Path:
    doc = yaml.safe_load(Path(CONF_DIR, "cluster", "local_2x2_250mbit.yaml").read_text())
    path.write_text(yaml.safe_dump(doc | {"name": LONG}))
    return path


def test_a_cluster_named_with_900_kb_is_planned_into_a_bounded_directory_with_its_plot(tmp_path, monkeypatch,
                                                                                         capsys):
    """The default directory outputs/plan/<cluster>/<model>/ holds a bounded name (900 KB is no file name), and the
    plot's legend shows the name short (laying out 900 KB took minutes)."""
    monkeypatch.chdir(tmp_path)
    cluster = long_cluster(tmp_path / "long.yaml")
    monkeypatch.setattr(sys, "argv", ["ringexp.plan", "predict", *PLAN[1:], f"cluster_file={cluster}",
                                      "presets=[ddp,ring_fp16]"])
    with within(60):
        plan_main()
    capsys.readouterr()
    (made,) = (tmp_path / "outputs" / "plan").iterdir()
    assert made.name == clusters.file_name(LONG) and len(made.name.encode()) <= clusters.NAME_BYTES
    assert (made / "small_cnn" / "plan.png").read_bytes().startswith(PNG)
    assert json.loads((made / "small_cnn" / "plan.json").read_text())["cluster"]["name"] == LONG


def test_accuracy_on_a_cluster_named_with_900_kb_finishes_with_its_plot(tmp_path, monkeypatch, capsys):
    out = tmp_path / "acc"
    monkeypatch.setattr(sys, "argv", ["ringexp.plan", "accuracy", f"bench=[{bench_file(tmp_path / 'bench.json')}]",
                                      f"cluster_file={long_cluster(tmp_path / 'long.yaml')}", f"out={out}"])
    with within(60):
        plan_main()
    capsys.readouterr()
    assert (out / "accuracy.png").read_bytes().startswith(PNG)


def test_compare_on_a_run_labelled_with_900_kb_finishes_with_its_plots(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    fake_run(sweep / "0", [*TASK, "+parallel=ddp"], 40.0, 0.9)
    fake_run(sweep / "1", [*TASK, "+parallel=ring_fp16", f"tag={LONG}"], 60.0, 0.9)
    with within(60):
        assert compare.main([str(sweep), "--groups"]) == 0
    capsys.readouterr()
    for name in ("throughput.png", "auroc.png", "comm_share.png"):
        assert (sweep / name).read_bytes().startswith(PNG), name
    assert LONG in (sweep / "compare.md").read_text()  # the table keeps the whole label


def test_calibrate_names_its_cluster_file_with_a_bounded_plain_name():
    """A link label of 900 KB (or one holding a slash) names conf/cluster/<name>.yaml: bounded, one plain name, and
    two long labels sharing their start stay apart."""
    name, text = clusters.from_measurements(MEASURED, None, LONG)
    assert len(name.encode()) <= 255 and name.startswith("calibrated_2x2_nnn")  # (a file system's NAME_MAX)
    assert f"name: {name}\n" in text
    other, _ = clusters.from_measurements(MEASURED, None, LONG + "m")
    assert other != name
    slashed, _ = clusters.from_measurements(MEASURED, None, "../../etc/x")
    assert "/" not in slashed and slashed == "calibrated_2x2_.._.._etc_x"
