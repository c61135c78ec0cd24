"""End-to-end runs of the real CLI: 2 gloo workers, real offline W&B, real records."""

import glob
import math
import os
import subprocess
import sys

import pytest
from helpers.processes import run_cli, run_torchrun
from helpers.runs import TINY
from helpers.wandb_log import history_and_summary

from ringexp.records import read_rows, read_summary

SUMMARY_FIELDS = {
    "status", "run_dir", "name", "group", "job_type", "strategy", "choices", "overrides", "world_size", "device",
    "backend", "steps", "global_batch_size", "accumulation_steps", "throughput", "step_time_s", "loss", "final",
    "best", "val_samples", "peak_memory_bytes", "grad_bytes", "wire_bytes_per_rank_per_step", "wall_time_s",
    "versions",
}
ROW_FIELDS = {"train/loss", "train/lr", "train/samples_per_s", "train/step_time_s", "train/data_wait_s",
              "train/peak_memory_bytes", "comm/wire_bytes_per_rank"}


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    """One 2-process run with offline W&B, shared by the tests that read its records."""
    run_dir = tmp_path_factory.mktemp("default") / "run"
    r = run_cli(run_dir, *[o for o in TINY if not o.startswith("steps")], "steps=20", "name=e2e", "logger=wandb")
    assert r.returncode == 0, r.stderr[-3000:]
    return run_dir


def test_two_process_run_writes_a_complete_summary(default_run):
    s = read_summary(default_run)
    assert SUMMARY_FIELDS <= set(s), SUMMARY_FIELDS - set(s)
    assert s["status"] == "completed" and s["world_size"] == 2 and s["backend"] == "gloo"
    assert s["strategy"] == "ddp" and s["device"] == "cpu"
    assert set(s["choices"]) >= {"model", "data", "compression", "accumulation", "amp", "optim", "logger", "parallel"}
    assert s["versions"]["torch"] and s["versions"]["hydra-core"].startswith("1.3")
    t = s["throughput"]
    assert t["median"] > 0 and t["p10"] <= t["median"] <= t["p90"]
    # 101 validation samples on 2 ranks: every sample counted exactly once, none padded in.
    assert s["val_samples"] == 101
    for part in ("final", "best"):
        assert 0 <= s[part]["auroc_macro"] <= 1 and 0 <= s[part]["f1_micro"] <= 1
    assert s["best"]["auroc_macro"] >= s["final"]["auroc_macro"]
    assert s["wire_bytes_per_rank_per_step"] == s["grad_bytes"]  # ring all-reduce, n=2: 2(n-1)/n = 1
    assert s["group"] == "e2e" and s["job_type"] == "ddp"


def test_loss_falls_and_every_step_is_recorded(default_run):
    rows = read_rows(default_run)
    assert [r["step"] for r in rows] == list(range(1, 21))
    assert all(ROW_FIELDS <= set(r) for r in rows)
    loss = [r["train/loss"] for r in rows]
    assert sum(loss[-4:]) / 4 < sum(loss[:4]) / 4 - 0.02, loss
    assert sum("val/auroc_macro" in r for r in rows) == 4  # eval_every=6 over 20 steps, plus the end


def test_offline_wandb_run_holds_history_and_summary(default_run):
    files = glob.glob(str(default_run / "wandb" / "offline-run-*" / "run-*.wandb"))
    assert len(files) == 1
    history, summary, run = history_and_summary(files[0])
    rows = read_rows(default_run)
    assert [h["_step"] for h in history] == [r["step"] for r in rows]
    assert [h["train/loss"] for h in history] == pytest.approx([r["train/loss"] for r in rows])
    assert history[-1]["val/auroc_macro"] == pytest.approx(rows[-1]["val/auroc_macro"])
    s = read_summary(default_run)
    best = max(r["val/auroc_macro"] for r in rows if "val/auroc_macro" in r)
    assert summary["val/auroc_macro"]["max"] == pytest.approx(best)
    assert summary["throughput.median"] == pytest.approx(s["throughput"]["median"])
    assert run.run_group == "e2e" and run.job_type == "ddp" and run.display_name == s["name"]


@pytest.mark.slow
@pytest.mark.parametrize("amp", ["bf16", "fp16"])
def test_amp_runs_finish_on_cpu(amp, tmp_path, tiny):
    r = run_cli(tmp_path / "run", *tiny, f"amp={amp}", "logger.mode=disabled")
    assert r.returncode == 0, r.stderr[-3000:]
    s = read_summary(tmp_path / "run")
    assert s["choices"]["amp"] == amp and math.isfinite(s["loss"]["last"])


@pytest.mark.slow
def test_a_run_forked_from_the_warm_interpreter_trains_as_a_fresh_one(tmp_path, tiny, monkeypatch):
    """Most of the suite's runs are forked from tests/helpers/zygote.py's warm interpreter: the same losses, final
    metrics and bytes on the wire, bit for bit, as a fresh `python -m ringexp.train`."""
    forked = run_cli(tmp_path / "forked", *tiny, "+parallel=ring_fp16")
    monkeypatch.setenv("RINGEXP_TEST_FRESH", "1")
    fresh = run_cli(tmp_path / "fresh", *tiny, "+parallel=ring_fp16")
    assert forked.returncode == fresh.returncode == 0, forked.stderr[-3000:] + fresh.stderr[-3000:]
    runs = [(tmp_path / name) for name in ("forked", "fresh")]
    rows = [[(r["step"], r["train/loss"], r["comm/wire_bytes_per_rank"]) for r in read_rows(d)] for d in runs]
    assert rows[0] == rows[1] and len(rows[0]) == 12, rows
    final = [read_summary(d)["final"] for d in runs]
    assert final[0] == final[1] and final[0]["auroc_macro"] is not None, final


@pytest.mark.slow
def test_single_process_baseline(tmp_path, tiny):
    r = run_cli(tmp_path / "run", *tiny, "+parallel=single", "accumulation=x2", "logger.mode=disabled")
    assert r.returncode == 0, r.stderr[-3000:]
    s = read_summary(tmp_path / "run")
    assert s["world_size"] == 1 and s["wire_bytes_per_rank_per_step"] == 0 and s["global_batch_size"] == 32


@pytest.mark.slow
def test_timm_model_by_name_without_downloads(tmp_path, tiny):
    r = run_cli(tmp_path / "run", *tiny, "model=resnet18", "steps=2", "data.batch_size=4", "logger.mode=disabled",
                env={"HF_HUB_OFFLINE": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert read_summary(tmp_path / "run")["grad_bytes"] > 40_000_000  # resnet18: 11 M float32 parameters


@pytest.mark.slow
def test_image_folder_data(tmp_path, tiny, image_folder):
    r = run_cli(tmp_path / "run", *tiny, "data=image_folder", f"data.root={image_folder}", "data.num_workers=0",
                "data.image_size=16", "data.batch_size=4", "steps=3", "logger.mode=disabled")
    assert r.returncode == 0, r.stderr[-3000:]
    assert read_summary(tmp_path / "run")["val_samples"] == 2  # 10% of 24 images held out


@pytest.mark.slow
def test_external_torchrun_agrees_on_one_run_directory(tmp_path, tiny):
    prefix = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
              "-m", "ringexp.train"]
    r = run_torchrun([*prefix, *tiny, "logger.mode=disabled", "backend=gloo_loopback"], tmp_path, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    runs = [p for p in (tmp_path / "outputs" / "runs").glob("*/*") if p.is_dir()]
    assert len(runs) == 1, runs
    s = read_summary(runs[0])
    assert s["world_size"] == 2 and s["status"] == "completed"
    assert sorted(p.name for p in runs[0].glob("rank*.log")) == ["rank0.log", "rank1.log"]
    # the backend group's variable, read back from both torchrun ranks
    be = s["backend_env"]
    assert be["env"]["GLOO_SOCKET_IFNAME"] == "lo" and be["from"]["GLOO_SOCKET_IFNAME"] == "config", be
    assert be["ranks"] == 2 and "differs" not in be, be


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ring", "hierarchical", "naive"])
def test_every_hooked_strategy_trains_with_accumulation_and_amp(strategy, tmp_path, tiny):
    from ringexp import comm

    r = run_cli(tmp_path / "run", *tiny, f"+parallel={strategy}", "accumulation=x2", "amp=bf16", "logger.mode=disabled")
    assert r.returncode == 0, r.stderr[-3000:]
    s = read_summary(tmp_path / "run")
    assert s["strategy"] == strategy and s["status"] == "completed" and math.isfinite(s["loss"]["last"])
    nodes = 2 if strategy == "hierarchical" else None
    assert s["wire_bytes_per_rank_per_step"] == comm.wire_bytes(strategy, s["grad_bytes"], 2, nodes=nodes)


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["ring_fp16", "ring_int8", "ddp_fp16", "ddp_powersgd", "ddp_topk",
                                    "hierarchical_int8"])
def test_every_compression_preset_trains_and_reports_its_bytes(preset, tmp_path, tiny):
    r = run_cli(tmp_path / "run", *tiny, f"+parallel={preset}", "accumulation=x2", "logger.mode=disabled")
    assert r.returncode == 0, r.stderr[-3000:]
    s = read_summary(tmp_path / "run")
    assert s["status"] == "completed" and s["loss"]["last"] < s["loss"]["first"]
    ratio = s["compression"]["ratio_vs_fp32_allreduce"]
    assert s["wire_bytes_per_rank_per_step"] == pytest.approx(ratio * s["grad_bytes"], rel=1e-6)  # n=2: ring = 1x
    expected = {"ring_fp16": (0.5, 0.5), "ddp_fp16": (0.5, 0.5), "ring_int8": (0.25, 0.26),
                "hierarchical_int8": (0.25, 0.26), "ddp_topk": (0.01, 0.025), "ddp_powersgd": (0.01, 0.5)}[preset]
    assert expected[0] <= ratio <= expected[1], ratio
    rows = [r for r in read_rows(tmp_path / "run") if "comm/wire_bytes_per_rank" in r]
    assert rows and all(r["comm/compression_ratio"] == ratio for r in rows)


@pytest.mark.slow
def test_rows_every_log_every_steps_and_on_evaluation_steps(tmp_path, tiny):
    """Between rows a step records nothing; a row's step time is the mean over the steps since the previous row,
    and throughput is taken over those intervals (warm-up steps left out)."""
    r = run_cli(tmp_path / "run", *tiny, "logger.log_every=5", "logger=none")
    assert r.returncode == 0, r.stderr[-3000:]
    rows = read_rows(tmp_path / "run")
    assert [row["step"] for row in rows] == [5, 6, 10, 12]  # every 5, evaluation at 6 and 12, the last step
    assert all(row["train/step_time_s"] > 0 and "train/loss" in row for row in rows)
    s = read_summary(tmp_path / "run")
    # intervals 1-5, 6, 7-10, 11-12; throughput_warmup=2 leaves out the first
    assert s["throughput"]["n"] == 3 and s["throughput"]["warmup_steps_excluded"] == 5
    assert s["step_time_s"]["median"] in [row["train/step_time_s"] for row in rows[1:]]


DETERMINISTIC = r"""
import os, torch
from ringexp import dist
before = torch.are_deterministic_algorithms_enabled()
dist.deterministic()
print(before, torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
      os.environ["CUBLAS_WORKSPACE_CONFIG"])
"""


@pytest.mark.parametrize("given", [None, ":16:8"])
def test_launcher_deterministic_turns_on_deterministic_algorithms_and_keeps_a_given_cublas_workspace(given):
    """launcher.deterministic=true (what tests/test_gpu.py's resumed CUDA runs need to match bit for bit): torch's
    deterministic algorithms, warning where an op has none (CUDA's max-pooling backward) instead of failing the
    run, and cuBLAS's fixed workspace unless the user set one."""
    env = {k: v for k, v in os.environ.items() if k != "CUBLAS_WORKSPACE_CONFIG"}
    r = subprocess.run([sys.executable, "-c", DETERMINISTIC], capture_output=True, text=True, timeout=120,
                       env=env | ({"CUBLAS_WORKSPACE_CONFIG": given} if given else {}))
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["False", "True", "True", given or ":4096:8"], r.stdout
