"""`python -m ringexp.bench`: a real multi-process run of the nccl-tests style table, every row checked."""

import csv
import glob
import subprocess
import sys

import pytest
import torch
from conftest import ROOT, error_line, history_and_summary


@pytest.mark.slow
def test_bench_table_checks_every_algorithm_against_builtin(tmp_path):
    run_dir = tmp_path / "bench"
    r = subprocess.run([sys.executable, "-m", "ringexp.bench", "sizes=[1000,65536]", "nprocs=[2,3]", "nodes=1",
                        "compressors=[none,fp16,topk]", "iters=2", "warmup=1", "min_time_s=0",
                        f"hydra.run.dir={run_dir}"], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "busbw" in r.stdout and "#wrong" in r.stdout
    rows = list(csv.DictReader(open(run_dir / "bench.csv")))
    assert len(rows) == 5 * 3 * 2 * 2  # algorithms x compressors x sizes x world sizes
    algos = {"builtin", "ring", "hierarchical", "leader", "naive"}
    assert {row["algorithm"] for row in rows} == algos | {f"{a}+{c}" for a in algos for c in ("fp16", "topk")}
    assert all(int(row["wrong"]) == 0 for row in rows)
    for row in rows:
        n, size, t = int(row["nprocs"]), int(row["size_bytes"]), float(row["time_us"])
        assert float(row["busbw_GBps"]) == pytest.approx(size / t / 1e3 * 2 * (n - 1) / n, rel=1e-6)
        if row["algorithm"] == "builtin":
            assert float(row["vs_builtin"]) == 1.0
    history, _, _ = history_and_summary(glob.glob(str(run_dir / "wandb" / "offline-run-*" / "*.wandb"))[0])
    assert len(history) == len(rows)


def test_bench_refuses_nodes_that_do_not_divide(tmp_path):
    r = subprocess.run([sys.executable, "-m", "ringexp.bench", "nprocs=[3]", "nodes=2",
                        f"hydra.run.dir={tmp_path / 'b'}"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.startswith("ringexp: error: bench: nodes=2 does not divide nprocs=3")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without GPUs")
def test_bench_on_cuda_without_a_gpu_says_so_in_one_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "ringexp.bench", "launcher.device=cuda",
                        f"hydra.run.dir={tmp_path / 'b'}"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and error_line(r.stderr).startswith(
        "ringexp: error: launcher.device=cuda but no GPU is visible; use launcher.device=cpu or auto")
    assert not (tmp_path / "b" / "bench.json").exists()
