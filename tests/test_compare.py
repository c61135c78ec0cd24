"""Sweeps end with a compare report: a local multirun (one job failing validation) and the report's
table, CSV and plots; the compare CLI on run directories and its bad input; runs whose records are broken or
were planted (each listed as unreadable with its file and why, the other runs reported as before); seed groups
(--groups) and the fastest group's choice (--fastest), on summaries written as ringexp writes them, checked against
numbers computed here and against what scripts/cluster_story.sh computed before compare could."""

import csv
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.processes import ROOT, run_cli, within
from helpers.runs import TINY
from omegaconf import OmegaConf

from ringexp import compare, quality, records
from ringexp.compare import report
from ringexp.verdicts import cells, groups
from ringexp.verdicts.load import YAML_LIMIT, load_local, unflatten

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="session")
def real_run(tmp_path_factory):
    """One real training run, made once: the tests below copy its files and break the copies."""
    run = tmp_path_factory.mktemp("compare") / "run"
    r = run_cli(run, *TINY, "steps=4", "logger=none")
    assert r.returncode == 0, r.stderr[-3000:]
    return run


def copy_run(real_run, dst, tag: str):
    """A copy of the real run whose overrides end with `tag=<tag>`: its label in the report."""
    shutil.copytree(real_run, dst)
    edit_summary(dst, overrides=records.read_summary(dst)["overrides"] + [f"tag={tag}"])
    return dst


def edit_summary(run, **changes):
    (run / "summary.json").write_text(json.dumps(records.read_summary(run) | changes))


@pytest.mark.slow
def test_a_local_sweep_ends_with_a_compare_report_listing_the_failed_job(tmp_path):
    sweep = tmp_path / "sweep"
    cmd = [sys.executable, "-m", "ringexp.train", "-m", *TINY, "logger=none", "+parallel=ddp,fsdp",
           "compression=none,int8", f"hydra.sweep.dir={sweep}"]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                       env={**os.environ, "WANDB_SILENT": "true"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert "compression=int8 with +parallel=fsdp" in r.stderr  # the failed job said why, the sweep went on
    md = (sweep / "compare.md").read_text()
    rows = [line for line in md.splitlines() if line.startswith("| +parallel")]
    assert len(rows) == 3, md
    assert "(baseline)" in rows[0] and "1.00x" in rows[0]  # the ddp row is the baseline
    assert "Failed runs:" in md and "+parallel=fsdp compression=int8" in md.split("Failed runs:")[1]
    with open(sweep / "compare.csv") as f:
        table = list(csv.DictReader(f))
    assert [t["status"] for t in table] == ["completed"] * 3 + ["failed"]
    assert all(float(t["samples/s"]) > 0 and 0 < float(t["final AUROC"]) < 1 for t in table[:3])
    assert "compression=int8" in table[3]["error"]
    for png in ("throughput.png", "auroc.png", "comm_share.png"):
        data = (sweep / png).read_bytes()
        assert data[:8] == PNG and len(data) > 5000, png
    assert "baseline of the speed-up column" in r.stdout  # the table on the terminal too
    # compare reads the same sweep again, with another baseline and output directory
    runs = load_local([sweep])
    assert len(runs) == 4
    text = report(runs, tmp_path / "again", baseline="fsdp compression=none")
    fsdp_row = next(line for line in text.splitlines() if line.startswith("+parallel=fsdp compression=none"))
    assert fsdp_row.split()[0].endswith("*") or "1.00x" in fsdp_row


def test_compare_cli_rejects_bad_paths_with_one_line(tmp_path, capsys):
    """The command line itself once (its exit code), then each case as main() answers it, in this process."""
    r = subprocess.run([sys.executable, "-m", "ringexp.compare", str(tmp_path / "missing")], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.startswith("ringexp: error: ") and len(r.stderr.splitlines()) == 1, r.stderr
    for args in ([str(tmp_path / "missing")], [str(tmp_path)], [], ["--wandb", "me/proj"]):
        assert compare.main(args) == 2, args
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("ringexp: error: "), (args, lines)


def test_unflatten_restores_wandb_summaries():
    assert unflatten({"throughput.median": 5.0, "final.auroc_macro": 0.9, "status": "completed"}) == {
        "throughput": {"median": 5.0}, "final": {"auroc_macro": 0.9}, "status": "completed"}


@pytest.mark.slow
def test_compare_reports_a_run_whose_last_row_was_cut_short(tmp_path, real_run):
    """A run killed while writing leaves half a line at the end of metrics.jsonl: the report still comes."""
    run = shutil.copytree(real_run, tmp_path / "run")
    text = (run / "metrics.jsonl").read_text()
    (run / "metrics.jsonl").write_text(text[:-40])  # the last row cut in the middle
    r = subprocess.run([sys.executable, "-m", "ringexp.compare", str(run)], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert "(all the same)" in r.stdout and (run / "compare.md").is_file()
    runs = load_local([run])
    assert [row["step"] for row in runs[0]["rows"]] == [1, 2, 3]


@pytest.mark.slow
def test_compare_lists_a_broken_summary_and_reports_the_other_runs(tmp_path, real_run):
    """summary.json of `[]`, `null` or cut-off text: that run is listed as unreadable with its path; the report of
    the completed run still comes."""
    good = shutil.copytree(real_run, tmp_path / "sweep" / "0")
    broken = {"1": "[]", "2": "null", "3": (good / "summary.json").read_text()[:50]}
    for name, text in broken.items():
        (tmp_path / "sweep" / name).mkdir()
        (tmp_path / "sweep" / name / "summary.json").write_text(text)
    r = subprocess.run([sys.executable, "-m", "ringexp.compare", str(tmp_path / "sweep")], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    for name in broken:
        assert f"{tmp_path / 'sweep' / name / 'summary.json'}: unreadable" in r.stdout, r.stdout
    assert (tmp_path / "sweep" / "compare.md").is_file()


def put(name: str, new):
    """A run broken by replacing its file `name` with new(the file's bytes)."""
    def make(run):
        (run / name).write_bytes(new((run / name).read_bytes()))
    return make


def fifo(name: str):
    def make(run):
        (run / name).unlink()
        os.mkfifo(run / name)
    return make


def symlink_out_of_the_sweep(run):
    """summary.json a symlink to a summary outside the directory the user named."""
    outside = run.parent.parent / "outside.json"
    (run / "summary.json").rename(outside)
    (run / "summary.json").symlink_to(outside)


def summary_with(**changes):
    return lambda run: edit_summary(run, **changes)


def failed_before_it_started(overrides_yaml: str):
    """A run whose summary says it failed and has no overrides: compare takes them from Hydra's overrides.yaml."""
    def make(run):
        (run / "summary.json").write_text(json.dumps({"status": "failed", "error": "ringexp: error: bad config"}))
        (run / ".hydra" / "overrides.yaml").write_text(overrides_yaml)
    return make


# each anchored list holds the one before it 10 times: 10**5 strings once OmegaConf has copied every alias out
ALIASES = "- &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"- &{name} [{', '.join(['*' + before] * 10)}]\n" for before, name in zip("abcd", "bcde", strict=True))
OVERRIDES = ".hydra/overrides.yaml"
# case: (how the run is broken, the file the report names, why it says)
BROKEN = {
    "completed-and-nothing-else": (put("summary.json", lambda _: b'{"status": "completed"}'), "summary.json",
                                   "no throughput, which must be a mapping"),
    "summary-nested-100000-deep": (put("summary.json", lambda _: b"[" * 100000), "summary.json",
                                   "JSON nested too deeply"),
    "row-nested-100000-deep": (put("metrics.jsonl", lambda rows: rows + b"[" * 100000 + b"\n"), "metrics.jsonl",
                               "JSON nested too deeply"),
    "metrics-not-utf8": (put("metrics.jsonl", lambda rows: b'{"step": 0, "note": "\xff"}\n' + rows), "metrics.jsonl",
                         "line 1: not UTF-8"),
    "summary-a-fifo": (fifo("summary.json"), "summary.json", "not a regular file"),
    "metrics-a-fifo": (fifo("metrics.jsonl"), "metrics.jsonl", "not a regular file"),
    "summary-a-symlink-out-of-the-sweep": (symlink_out_of_the_sweep, "summary.json", "a symbolic link"),
    "median-text": (summary_with(throughput={"median": "fast"}), "summary.json",
                    "throughput.median is 'fast', not a number >= 0"),
    "throughput-null": (summary_with(throughput=None), "summary.json", "no throughput"),
    "median-negative": (summary_with(throughput={"median": -5.0, "p10": 1.0, "p90": 2.0}), "summary.json",
                        "throughput.median is -5.0"),
    "median-nan": (summary_with(throughput={"median": float("nan")}), "summary.json", "throughput.median is nan"),
    "time-a-list": (summary_with(time=[]), "summary.json", "time is a list, not a mapping"),
    "nodes-a-list": (summary_with(nodes=[2]), "summary.json", "nodes is a list of int, not a count >= 1"),
    "overrides-not-text": (summary_with(overrides=[1, 2]), "summary.json", "overrides is a list of int"),
    "error-a-lone-surrogate": (put("summary.json", lambda _: b'{"status": "failed", "error": "\\ud800"}'),
                               "summary.json", "error is '\\ud800', not text"),
    "overrides-yaml-syntax": (failed_before_it_started("- [unclosed\n"), OVERRIDES,
                              "not valid YAML: expected ',' or ']'"),
    "overrides-yaml-a-mapping": (failed_before_it_started("a: 1\n"), OVERRIDES, "holds a dict"),
    "overrides-yaml-not-text": (failed_before_it_started("- 1\n- [2]\n"), OVERRIDES, "holds a list of int, list"),
    "overrides-yaml-nested-50000-deep": (failed_before_it_started("[" * 50000), OVERRIDES,  # under YAML_LIMIT
                                          "nested more than 32 deep"),
    "overrides-yaml-aliases": (failed_before_it_started(ALIASES), OVERRIDES, "a YAML alias (*name)"),
    "overrides-yaml-too-big": (failed_before_it_started("- steps=1\n" * 10000), OVERRIDES,
                                  f"more than the {YAML_LIMIT} bytes"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(BROKEN))
def test_compare_lists_a_broken_run_as_unreadable_and_reports_the_others(tmp_path, real_run, capsys, case):
    """Records compare reads, broken or planted (cut short, nested past Python's recursion limit, not UTF-8, a FIFO
    or symlink, numbers of the wrong type, Hydra's overrides.yaml malformed): that one run is listed as unreadable
    with its file and why, the other run reported as before, the exit code that of any report with a failed run."""
    breaks, name, why = BROKEN[case]
    sweep = tmp_path / "sweep"
    copy_run(real_run, sweep / "0", "good")
    bad = copy_run(real_run, sweep / "1", "bad")
    breaks(bad)
    with within(60):
        assert compare.main([str(sweep)]) == 0
    out = capsys.readouterr().out.splitlines()
    failed = [line for line in out if line.startswith("FAILED")]
    assert len(failed) == 1 and failed[0].startswith(f"FAILED {bad}: {bad / name}: unreadable ("), out
    assert why in failed[0], failed[0]
    median = records.read_summary(real_run)["throughput"]["median"]
    assert out[1].startswith("(all the same)*") and cells.fmt("samples/s", median) in out[1].split(), out
    md = (sweep / "compare.md").read_text()
    assert "| (all the same) (baseline) |" in md and f"{bad / name}: unreadable (" in md.split("Failed runs:")[1]
    assert (sweep / "throughput.png").read_bytes()[:8] == PNG


@pytest.mark.slow
def test_compare_orders_numbered_runs_before_named_ones(tmp_path, real_run, capsys):
    """A sweep's jobs `0`, `2`, `10` beside a run named `baseline`: a directory's name is compared as a number only
    with another number (2 before 10), names come after."""
    for name in ("baseline", "10", "2", "0"):
        copy_run(real_run, tmp_path / "sweep" / name, name)
    assert compare.main([str(tmp_path / "sweep")]) == 0
    rows = [line.split()[0] for line in capsys.readouterr().out.splitlines()[1:5]]
    assert rows == ["tag=0*", "tag=2", "tag=10", "tag=baseline"]


@pytest.mark.slow
@pytest.mark.parametrize("config", ["fifo", "symlink-out-of-the-sweep"])
def test_a_broken_config_yaml_costs_a_run_only_its_predictions(tmp_path, real_run, capsys, config):
    """A run on a calibrated cluster has its config.yaml read for the predicted columns: a FIFO there must not hang
    the report, a symlink must not make compare read a file outside the sweep; the run is reported without
    predictions, a run beside it with an intact config.yaml with them. (config.load_yaml answers what the YAML
    itself holds.)"""
    nodes, per_node, link = next(iter(compare.calibrations()))
    for name in ("broken", "intact"):
        run = copy_run(real_run, tmp_path / "sweep" / name, name)
        edit_summary(run, nodes=nodes, ranks_per_node=per_node, link=link)
    config_yaml = tmp_path / "sweep" / "broken" / "config.yaml"
    if config == "fifo":
        config_yaml.unlink()
        os.mkfifo(config_yaml)
    else:  # a sound config, but not the sweep's
        config_yaml.rename(tmp_path / "outside.yaml")
        config_yaml.symlink_to(tmp_path / "outside.yaml")
    with within(60):
        assert compare.main([str(tmp_path / "sweep")]) == 0
    head, broken, intact = capsys.readouterr().out.splitlines()[:3]
    assert head.split()[-1] == "error" and "predicted" in head  # the predicted columns are there
    assert broken.startswith("tag=broken") and broken.split()[-3:] == ["-", "-", "-"], broken
    assert intact.startswith("tag=intact") and "-" not in intact.split()[-3:], intact


@pytest.mark.slow
def test_the_sweep_report_lists_a_run_whose_metrics_are_not_utf8(tmp_path, real_run, capsys):
    """The report at the end of every sweep (the SweepReport callback) is written with the one run listed as
    unreadable, instead of a warning that there is no report."""
    sweep = tmp_path / "sweep"
    copy_run(real_run, sweep / "0", "good")
    bad = copy_run(real_run, sweep / "1", "bad")
    put("metrics.jsonl", lambda rows: b"\xff\n" + rows)(bad)
    compare.SweepReport().on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep)}}}))
    assert "no compare report" not in capsys.readouterr().err
    md = (sweep / "compare.md").read_text()
    assert "| (all the same) (baseline) |" in md and f"{bad / 'metrics.jsonl'}: unreadable (line 1: not UTF-8" in md


@pytest.mark.slow
def test_a_run_directory_whose_name_is_not_utf8_is_listed_by_its_escaped_name(tmp_path, real_run, capsys):
    """A name's bytes that are not UTF-8 cannot be written into compare.md as they are: they are shown as \\xNN."""
    sweep = tmp_path / "sweep"
    copy_run(real_run, sweep / "good", "good")
    bad = sweep / os.fsdecode(b"\xff")
    bad.mkdir()
    (bad / "summary.json").write_text("[]")
    assert compare.main([str(sweep)]) == 0
    assert f"{sweep}/\\xff/summary.json: unreadable (holds a list, not a summary)" in (sweep / "compare.md").read_text()


@pytest.mark.slow
def test_a_real_run_killed_before_its_summary_is_listed_and_named_in_its_group(tmp_path, real_run, capsys):
    """A copy of a real run without its summary.json (what a run killed with everything it started leaves): it is
    found by the files ringexp.train writes before it launches, listed among the runs that did not complete, and
    named in its seed group (under the table and in quality.json) instead of vanishing from both."""
    sweep = tmp_path / "sweep"
    shutil.copytree(real_run, sweep / "0")
    shutil.copytree(real_run, sweep / "1")
    (sweep / "1" / "summary.json").unlink()
    assert compare.main([str(sweep), "--groups"]) == 0
    out = capsys.readouterr().out
    why = "no summary.json: the run was killed before it finished, or is still running"
    assert f"FAILED (all the same): {why}" in out.splitlines(), out
    [group] = quality.read_record(sweep / quality.FILE)["groups"]
    assert group["seeds"] == ["0"] and group["left_out"] == [{"dir": str(sweep / "1"), "seed": "0",
                                                               "why": f"unfinished: {why}"}]
    assert f"- `(all the same)`: {sweep / '1'} (seed 0): unfinished: {why}" in out

# Seed groups: summaries written the way ringexp writes them (records.write_summary, with the keys of
# Recorder.summary that compare reads), no training run.
STORY = ["model=resnet18", "data.batch_size=8", "logger=none", "steps=200", "eval_every=100"]


def fake_run(run_dir, overrides, median: float, auroc: float, f1: float = 0.15):
    """A completed run's summary.json; its preset (choices.parallel, job_type) from its +parallel= override."""
    parallel = next((o.split("=", 1)[1] for o in overrides if o.startswith("+parallel=")), "ddp")
    run_dir.mkdir(parents=True)
    records.write_summary(run_dir, {
        "status": "completed", "run_dir": str(run_dir), "name": ",".join(overrides), "job_type": parallel,
        "strategy": parallel, "choices": {"parallel": parallel, "compression": "none"}, "overrides": overrides,
        "world_size": 4, "throughput": {"median": median, "p10": 0.9 * median, "p90": 1.1 * median},
        "final": {"auroc_macro": auroc, "f1_macro": f1, "step": 200},
        "best": {"auroc_macro": auroc + 0.004, "f1_macro": f1, "step": 100}})
    return run_dir


def failed_run(run_dir, overrides):
    """A failed job as a sweep leaves it: the failed summary (records.mark_failed) and Hydra's overrides.yaml."""
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    records.mark_failed(run_dir, "ringexp: error: rank 1 stopped answering")
    return run_dir


def exit_code(argv) -> int:
    """compare.main's exit code, also where argparse exits (an unknown flag, a flag without its value)."""
    try:
        return compare.main(argv)
    except SystemExit as e:
        return e.code


def group_table(out: str) -> dict:
    """The seed groups' table compare printed: {group label (baseline mark removed): {column: cell}}."""
    lines = out.split("\nSeed groups:\n", 1)[1].split("\n* baseline", 1)[0].splitlines()
    head = re.split(r"\s{2,}", lines[0].strip())
    rows = [re.split(r"\s{2,}", line.strip()) for line in lines[1:]]
    assert all(len(r) == len(head) for r in rows), lines
    return {r[0].removesuffix("*"): dict(zip(head, r, strict=True)) for r in rows}


def test_seed_groups_join_the_runs_that_differ_only_in_seed(tmp_path):
    """A run without seed= has the schema's seed; overrides in another order, a name= and Hydra's ++seed= do not
    split a group; another override (compression=int8) or another preset makes another group; the failed run of
    a group is not in it."""
    sweep = tmp_path / "sweep"
    fake_run(sweep / "0", [*STORY, "+parallel=ddp"], 38.9, 0.639)
    fake_run(sweep / "1", ["+parallel=ddp", "seed=1", *STORY[::-1], "name=again"], 38.7, 0.642)
    fake_run(sweep / "2", [*STORY, "++seed=2", "+parallel=ddp"], 37.3, 0.637)
    fake_run(sweep / "3", [*STORY, "+parallel=ddp", "seed=1", "compression=int8"], 50.0, 0.640)
    fake_run(sweep / "4", [*STORY, "+parallel=ddp", "seed=2", "compression=int8"], 52.0, 0.630)
    fake_run(sweep / "5", [*STORY, "+parallel=fsdp", "seed=1"], 18.6, 0.642)
    failed_run(sweep / "6", [*STORY, "+parallel=ddp", "seed=3"])
    failed_run(sweep / "7", [*STORY, "+parallel=hierarchical"])
    found = groups.seed_groups(load_local([sweep]))
    got = [(g.label, g.seeds, [Path(r["dir"]).name for r in g.runs]) for g in found]
    assert got == [("+parallel=ddp", ("0", "1", "2"), ["0", "1", "2"]),
                   ("+parallel=ddp compression=int8", ("1", "2"), ["3", "4"]),
                   ("+parallel=fsdp", ("1",), ["5"])], got
    assert set(found[1].overrides) == {*STORY, "+parallel=ddp", "compression=int8"}
    one = groups.seed_groups(load_local([sweep / "0", sweep / "1"]))  # nothing but the seed differs
    assert [(g.label, g.seeds) for g in one] == [("(all the same)", ("0", "1"))]


def test_seed_group_numbers_are_the_mean_and_sample_sd_of_their_runs(tmp_path, capsys):
    """Each group's row: mean and sample standard deviation of throughput median, final and best macro-AUROC and
    final macro-F1 (computed here with statistics), the speed-up of its mean against the ddp group's, printed,
    in compare.md and in groups.csv; where every group has one seed and --groups is not given, there are none."""
    sweep = tmp_path / "sweep"
    made = {"ddp": [(38.9, 0.639, 0.129), (38.7, 0.642, 0.178), (37.3, 0.637, 0.123)],
            "ddp_powersgd": [(76.4, 0.638, 0.147), (51.3, 0.643, 0.179), (69.0, 0.637, 0.122)],
            "fsdp": [(18.6, 0.642, 0.158)]}
    for preset, seeds in made.items():
        for seed, (median, auroc, f1) in enumerate(seeds):
            fake_run(sweep / f"{preset}-{seed}", [*STORY, f"+parallel={preset}", f"seed={seed}"], median, auroc, f1)
    assert compare.main([str(sweep), "--groups", "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    printed = group_table(out)
    with open(tmp_path / "out" / "groups.csv") as f:
        written = {r["group"]: r for r in csv.DictReader(f)}
    md = (tmp_path / "out" / "compare.md").read_text().split("Seed groups:", 1)[1]
    ddp_tp = statistics.mean(m for m, _, _ in made["ddp"])
    for preset, seeds in made.items():
        label, cols = f"+parallel={preset}", list(zip(*seeds, strict=True))
        want = {"samples/s": cols[0], "final AUROC": cols[1], "best AUROC": [a + 0.004 for a in cols[1]],
                "final F1": cols[2]}
        for column, values in want.items():
            mean, sd = statistics.mean(values), statistics.stdev(values) if len(values) > 1 else None
            assert float(written[label][column]) == pytest.approx(mean, rel=1e-12), (label, column)
            sd_written = written[label][f"{column} sd"]  # empty for one seed: no sample sd
            assert sd_written == "" if sd is None else float(sd_written) == pytest.approx(sd, rel=1e-12), label
            cell = cells.fmt(column, mean) + ("" if sd is None else f" ± {cells.fmt(column, sd)}")
            assert printed[label][column] == cell, (label, column, printed[label])
            assert f" {cell} |" in md.split(label, 1)[1].splitlines()[0], (label, column)
        speed_up = statistics.mean(cols[0]) / ddp_tp
        assert printed[label]["speed-up"] == f"{speed_up:.2f}x" and float(written[label]["speed-up"]) == pytest.approx(
            speed_up, rel=1e-12)
        assert printed[label]["seeds"] == str(len(seeds)) == written[label]["seeds"]
        assert printed[label]["seed values"] == " ".join(map(str, range(len(seeds))))
    assert "| +parallel=ddp (baseline) |" in md and "+parallel=ddp*" in out
    assert compare.main([str(sweep / "ddp-0"), str(sweep / "fsdp-0"), "--out", str(tmp_path / "plain")]) == 0
    assert "Seed groups" not in capsys.readouterr().out and not (tmp_path / "plain" / "groups.csv").exists()


def test_fastest_prints_the_choice_of_the_group_with_the_highest_mean_throughput(tmp_path, capsys):
    """The fastest group by mean, not the fastest run: ddp_powersgd has the fastest run (76.4) and ring_fp16 the
    fastest mean (70.0 against 65.6); a failed run of ring_fp16's group takes no part. Only the value is printed,
    nothing is written."""
    sweep = tmp_path / "sweep"
    for seed, median in enumerate((76.4, 51.3, 69.0)):
        fake_run(sweep / f"p{seed}", [*STORY, "+parallel=ddp_powersgd", f"seed={seed}"], median, 0.64)
    fake_run(sweep / "r0", [*STORY, "+parallel=ring_fp16"], 70.0, 0.64)
    failed_run(sweep / "r1", [*STORY, "+parallel=ring_fp16", "seed=1"])
    fake_run(sweep / "d0", [*STORY, "+parallel=ddp"], 38.9, 0.64)
    before = sorted(p.name for p in sweep.iterdir())
    assert compare.main([str(sweep), "--fastest", "parallel"]) == 0
    assert capsys.readouterr() == ("ring_fp16\n", "")
    assert compare.main([str(sweep), "--fastest", "compression"]) == 0
    assert capsys.readouterr().out == "none\n"
    assert sorted(p.name for p in sweep.iterdir()) == before  # no report written


@pytest.mark.parametrize("where, args", [
    ("sweep", ["--fastest", "nosuch"]), ("sweep", ["--fastest", ""]), ("sweep", ["--fastest", "parallel", "--groups"]),
    ("sweep", ["--fastest"]), ("sweep", ["--groups=yes"]), ("sweep", ["--no-such-flag"]),
    ("sweep", ["--quality-budget", "-0.01"]), ("sweep", ["--quality-budget", "nan"]),
    ("sweep", ["--family", "0"]), ("sweep", ["--family", "two"]),
    ("sweep", ["--baseline", "nosuch"]),
    ("failed", ["--fastest", "parallel"])])  # nothing completed to choose from
def test_compare_rejects_a_bad_flag_with_one_line(tmp_path, capsys, where, args):
    fake_run(tmp_path / "sweep" / "0", [*STORY, "+parallel=ddp"], 38.9, 0.64)
    failed_run(tmp_path / "failed" / "0", [*STORY, "+parallel=ddp"])
    assert exit_code([str(tmp_path / where), *args]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1 and err.startswith("ringexp: error: "), (args, err)
    assert not (tmp_path / where / "compare.md").exists()  # nothing written


def old_fastest(presets: Path) -> str:
    """scripts/cluster_story.sh's first heredoc before compare had --fastest: the independent reference."""
    runs = [json.loads(p.read_text()) for p in presets.glob("*/summary.json")]
    runs = [r for r in runs if r["status"] == "completed"]
    return max(runs, key=lambda r: r["throughput"]["median"])["choices"]["parallel"]


def old_seed_means(out: Path, best: str):
    """Its second heredoc before compare had --groups: runs, mean throughput and mean final macro-AUROC per preset."""
    by = {}
    for p in [*out.glob("presets/*/summary.json"), *out.glob("seeds/*/summary.json")]:
        s = json.loads(p.read_text())
        if s["status"] == "completed" and s["choices"]["parallel"] in ("ddp", best):
            by.setdefault(s["choices"]["parallel"], []).append(s)  # seed 0 from presets/, 1 and 2 from seeds/
    tp = {k: statistics.mean(s["throughput"]["median"] for s in v) for k, v in by.items()}
    au = {k: statistics.mean(s["final"]["auroc_macro"] for s in v) for k, v in by.items()}
    return by, tp, au


def test_compare_answers_what_cluster_story_computed_itself(tmp_path, capsys):
    """scripts/cluster_story.sh's records (presets/ at seed 0 with one failed preset, seeds/ with seeds 1 and 2 of
    ddp and the fastest preset; the numbers of docs/results/cluster-story.md): --fastest parallel names the preset
    the old script's first heredoc chose, and --groups prints the seed counts, mean throughputs, speed-up and mean
    final macro-AUROC (and its difference) its second heredoc printed."""
    out = tmp_path / "cluster-story"
    presets = {"ddp": (38.9, 0.639), "ddp_tuned": (38.2, 0.638), "hierarchical": (47.8, 0.640),
               "hierarchical_int8": (69.0, 0.638), "ring_fp16": (60.3, 0.639), "ddp_powersgd": (76.4, 0.638),
               "fsdp": (18.6, 0.642)}
    for i, (preset, (median, auroc)) in enumerate(presets.items()):
        fake_run(out / "presets" / str(i), [*STORY, f"+parallel={preset}"], median, auroc)
    failed_run(out / "presets" / "7", [*STORY, "+parallel=hierarchical_powersgd"])
    seeds = [("ddp", 1, 38.7, 0.642), ("ddp", 2, 37.3, 0.637), ("ddp_powersgd", 1, 51.3, 0.643),
             ("ddp_powersgd", 2, 69.0, 0.637)]
    for i, (preset, seed, median, auroc) in enumerate(seeds):
        fake_run(out / "seeds" / str(i), [*STORY[:3], f"+parallel={preset}", f"seed={seed}", *STORY[3:]], median, auroc)
    assert compare.main([str(out / "presets"), "--fastest", "parallel"]) == 0
    best = capsys.readouterr().out.strip()
    assert best == old_fastest(out / "presets") == "ddp_powersgd"
    assert compare.main([str(out / "presets"), str(out / "seeds"), "--groups"]) == 0
    printed = group_table(capsys.readouterr().out)
    by, tp, au = old_seed_means(out, best)
    ddp, fast = printed["+parallel=ddp"], printed[f"+parallel={best}"]
    assert (ddp["seeds"], fast["seeds"]) == (str(len(by["ddp"])), str(len(by[best]))) == ("3", "3")
    for row, preset in ((ddp, "ddp"), (fast, best)):  # the mean of a cell "mean ± sd"
        assert row["samples/s"].split(" ± ")[0] == f"{tp[preset]:.1f}", row
        assert row["final AUROC"].split(" ± ")[0] == f"{au[preset]:.3f}", row
    assert (ddp["speed-up"], fast["speed-up"]) == ("1.00x", f"{tp[best] / tp['ddp']:.2f}x")
    assert fast["AUROC vs baseline"] == f"{au[best] - au['ddp']:+.3f}"
    found = {g.label: g for g in groups.seed_groups(load_local([out / "presets", out / "seeds"]))}
    for preset in ("ddp", best):  # the same arithmetic, not only the same rounding
        assert found[f"+parallel={preset}"].mean("samples/s") == tp[preset]
        assert found[f"+parallel={preset}"].mean("final AUROC") == au[preset]


def with_targets(run, *train_s):
    """A fake run's summary `targets` at 0.8 and 0.9: the training seconds to each (None: not reached)."""
    targets = [{"auroc": t, "step": s and 10, "samples": s and 320, "train_s": s, "elapsed_s": s and s + 5}
               for t, s in zip((0.8, 0.9), train_s, strict=True)]
    edit_summary(run, targets=targets)


def test_time_to_target_is_a_mean_and_a_ratio_only_where_every_seed_reached_it(tmp_path, capsys):
    """ddp reaches 0.8 in 40/44 s and 0.9 in 100/110 s; int8 reaches 0.8 in 10/12 s and 0.9 once (25 s) of two:
    its 0.9 cell says 1/2 reached and has no ratio (a mean over the one seed that got there would leave out the one
    that did not); 0.8's ratio compares the means. --help names both columns."""
    sweep = tmp_path / "sweep"
    for seed, (a, b) in enumerate(((40.0, 100.0), (44.0, 110.0))):
        with_targets(fake_run(sweep / f"d{seed}", [*STORY, "+parallel=ddp", f"seed={seed}"], 40.0, 0.95), a, b)
    for seed, (a, b) in enumerate(((10.0, 25.0), (12.0, None))):
        with_targets(fake_run(sweep / f"h{seed}", [*STORY, "+parallel=hierarchical_int8", f"seed={seed}"], 150.0,
                              0.95), a, b)
    assert compare.main([str(sweep)]) == 0
    printed = group_table(capsys.readouterr().out)
    fast = printed["+parallel=hierarchical_int8"]
    assert fast["to 0.8 s"] == f"11.0 ± {statistics.stdev([10, 12]):.1f}" and fast["to 0.8 x"] == f"{42 / 11:.2f}x"
    assert fast["to 0.9 s"] == "1/2 reached" and fast["to 0.9 x"] == "-"
    assert printed["+parallel=ddp"]["to 0.9 s"] == f"105 ± {statistics.stdev([100, 110]):.1f}"  # (no decimals >= 100)
    with open(sweep / "groups.csv") as f:
        rows = {r["group"]: r for r in csv.DictReader(f)}
    assert rows["+parallel=hierarchical_int8"]["to 0.9 s reached"] == "1"
    with pytest.raises(SystemExit):
        compare.main(["--help"])
    helped = " ".join(capsys.readouterr().out.split())
    assert "quality verdict" in helped and "time to target" in helped and "--quality-budget" in helped
