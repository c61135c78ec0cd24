"""Sweeps end with a compare report: a local multirun (one job failing validation) and the report's
table, CSV and plots; the compare CLI on run directories and its bad input."""

import csv
import os
import subprocess
import sys

import pytest
from conftest import ROOT, TINY

from ringexp.compare import load_local, report, unflatten

PNG = b"\x89PNG\r\n\x1a\n"


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
def test_compare_reports_a_run_whose_last_row_was_cut_short(tmp_path):
    """A run killed while writing leaves half a line at the end of metrics.jsonl: the report still comes."""
    run = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "ringexp.train", *TINY, "steps=4", "logger=none",
                        f"hydra.run.dir={run}"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    text = (run / "metrics.jsonl").read_text()
    (run / "metrics.jsonl").write_text(text[:-40])  # the last row cut in the middle
    r = subprocess.run([sys.executable, "-m", "ringexp.compare", str(run)], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert "(all the same)" in r.stdout and (run / "compare.md").is_file()
    runs = load_local([run])
    assert [row["step"] for row in runs[0]["rows"]] == [1, 2, 3]


@pytest.mark.slow
def test_compare_lists_a_broken_summary_and_reports_the_other_runs(tmp_path):
    """summary.json of `[]`, `null` or cut-off text: that run is listed as unreadable with its path; the report of
    the completed run still comes."""
    good = tmp_path / "sweep" / "0"
    r = subprocess.run([sys.executable, "-m", "ringexp.train", *TINY, "steps=4", "logger=none",
                        f"hydra.run.dir={good}"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
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
