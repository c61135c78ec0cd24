"""Sweeps end with a compare report: a local multirun (one job failing validation) and the report's
table, CSV and plots; the compare CLI on run directories and its bad input; runs whose records are broken or
were planted (each listed as unreadable with its file and why, the other runs reported as before)."""

import contextlib
import csv
import json
import os
import shutil
import signal
import subprocess
import sys

import pytest
from conftest import ROOT, TINY, run_cli
from omegaconf import OmegaConf

from ringexp import compare, records
from ringexp.compare import load_local, report, unflatten

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


@contextlib.contextmanager
def within(seconds: int):
    """A failed test instead of one that hangs (a FIFO opened for reading waits for a writer forever). pytest's
    failure, not TimeoutError: that is an OSError, which compare takes for an unreadable file."""
    def give_up(*_):
        pytest.fail(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, give_up)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


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


def test_compare_cli_rejects_bad_paths_with_one_line(tmp_path):
    for args in ([str(tmp_path / "missing")], [str(tmp_path)], [], ["--wandb", "me/proj"]):
        r = subprocess.run([sys.executable, "-m", "ringexp.compare", *args], cwd=ROOT, capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 2, (args, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("ringexp: error: "), (args, r.stderr)


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
                                  f"more than the {compare.YAML_LIMIT} bytes"),
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
    assert out[1].startswith("(all the same)*") and compare.fmt("samples/s", median) in out[1].split(), out
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
