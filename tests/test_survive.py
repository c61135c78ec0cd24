"""Faults a run must survive or report in one line: a NaN loss, W&B out of reach, a full
disk while checkpointing, a checkpoint from another configuration, a worker dying under max_restarts."""

import contextlib
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest
from helpers.processes import error_line, run_cli, worker_pid
from helpers.runs import RUN, TINY, start, wait_for_step
from hydra import compose as hydra_compose
from hydra import initialize_config_dir

from ringexp.config import CONF_DIR
from ringexp.errors import ConfigError
from ringexp.records import read_rows, read_summary
from ringexp.train import prepare

pytestmark = pytest.mark.slow  # real runs of the CLI (the fast tier is -m 'not slow')


def test_nan_loss_stops_the_run_naming_step_and_rank(tmp_path):
    r = run_cli(tmp_path / "run", *TINY, "optim=sgd", "optim.lr=1e30", "logger=none")
    assert r.returncode == 1
    line = error_line(r.stderr)
    assert "loss is nan at step" in line or "loss is inf at step" in line, line
    assert " on rank " in line
    assert read_summary(tmp_path / "run")["status"] == "failed"


def test_a_non_finite_loss_between_logged_rows_is_named_at_the_next_row(tmp_path):
    """The loss is checked on the device every step (no host sync) and read on logged steps: the run stops at the
    first logged step after it, naming the step it happened."""
    r = run_cli(tmp_path / "run", *TINY, "optim=sgd", "optim.lr=1e30", "logger=none", "logger.log_every=5")
    assert r.returncode == 1
    line = error_line(r.stderr)
    step = int(re.search(r"loss is (?:nan|inf) at step (\d+) on rank \d \(checked at step 5\)", line).group(1))
    assert 1 <= step < 5, line
    assert read_rows(tmp_path / "run") == []  # stopped at step 5, its first row, before writing it


def test_fp16_grad_scaler_skips_non_finite_steps_and_counts_them(tmp_path):
    """11 of 12 steps skipped: as many halvings as a calibration could take (65536 down to 32), so the run ends, and
    its last line says how many it skipped."""
    r = run_cli(tmp_path / "run", *TINY, "amp=fp16", "optim=sgd", "optim.lr=1e30", "logger=none")
    assert r.returncode == 0, r.stderr[-2000:]
    s = read_summary(tmp_path / "run")
    rows = read_rows(tmp_path / "run")
    assert s["skipped_steps"] > 0 and rows[-1]["train/skipped_steps"] == s["skipped_steps"]
    assert [row["train/skipped_steps"] for row in rows] == sorted(row["train/skipped_steps"] for row in rows)
    assert f"amp=fp16 skipped {s['skipped_steps']} of 12 steps" in r.stdout, r.stdout


def test_fp16_that_skips_nearly_every_step_fails_saying_how_many(tmp_path):
    """Every step after the first skipped: once the loss scale falls below 1 (17 halvings from 65536, more than a
    calibration ever takes) the run stops at that logged step, failed, in one line saying how many and what to do."""
    r = run_cli(tmp_path / "run", *TINY, "steps=30", "eval_every=30", "amp=fp16", "optim=sgd", "optim.lr=1e30")
    assert r.returncode == 1, r.stderr[-2000:]
    line = error_line(r.stderr)
    skipped, run = map(int, re.search(r"amp=fp16 skipped (\d+) of (\d+) steps", line).groups())
    assert skipped == run - 1 > 16 and "lower optim.lr, or use amp=bf16" in line, line
    assert read_summary(tmp_path / "run")["status"] == "failed"
    assert read_rows(tmp_path / "run")[-1]["train/skipped_steps"] == skipped - 1  # (rows up to the step before)


def test_a_healthy_fp16_run_completes_and_says_nothing_of_skips(tmp_path):
    r = run_cli(tmp_path / "run", *TINY, "amp=fp16")
    assert r.returncode == 0, r.stderr[-2000:]
    assert read_summary(tmp_path / "run")["skipped_steps"] == 0 and "skipped" not in r.stdout, r.stdout


def test_wandb_online_out_of_reach_falls_back_to_offline_and_never_records_the_key(tmp_path):
    key = "f0e1d2c3b4a5968778695a4b3c2d1e0f12345678"
    run_dir = tmp_path / "run"
    # a W&B server that refuses connections, and a key it would not accept anyway
    env = {"WANDB_API_KEY": key, "WANDB_BASE_URL": "http://127.0.0.1:9"}
    r = run_cli(run_dir, *TINY, "logger=wandb", "logger.mode=online", "logger.init_timeout_s=5", env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    warnings = [x for x in r.stderr.splitlines() if x.startswith("ringexp: warning:")]
    assert len(warnings) == 1 and "offline" in warnings[0], r.stderr
    s = read_summary(run_dir)
    assert s["status"] == "completed" and s["final"]["auroc_macro"] is not None
    assert list(run_dir.glob("wandb/offline-run-*/run-*.wandb")), "offline records in the run directory"
    leaks = [p for p in run_dir.rglob("*") if p.is_file() and key.encode() in p.read_bytes()]
    assert not leaks, leaks


SECRETS = {"MY_API_TOKEN": "tok-5f3e1d2c3b4a59687", "db_password": "hunter22x"}  # (any case: "password")


def leaks(folder: Path) -> list:
    """Every file under `folder` that holds one of SECRETS' values."""
    return [p for p in folder.rglob("*") if p.is_file() and any(v.encode() in p.read_bytes() for v in SECRETS.values())]


def test_a_credential_read_from_the_environment_is_recorded_as_its_interpolation(tmp_path):
    """Config values read from credentials in the environment (${oc.env:NAME}, NAME holding KEY, TOKEN, SECRET or
    PASSWORD): the run uses them, and no file of its directory (config.yaml, .hydra/, summary.json, rows, logs,
    checkpoints, W&B's offline run) holds their values, nor does what it prints: ${oc.env:NAME} stands there."""
    run_dir = tmp_path / "run"
    r = run_cli(run_dir, *TINY, "steps=3", "eval_every=3", "logger=wandb", "name=${oc.env:MY_API_TOKEN}",
                "data.root=/data/${oc.env:db_password}/x", "+backend.env.NCCL_SOCKET_IFNAME=${oc.env:MY_API_TOKEN}",
                env=SECRETS)
    assert r.returncode == 0, r.stderr[-3000:]
    assert list(run_dir.glob("wandb/offline-run-*/run-*.wandb")), "an offline W&B run in the run directory"
    assert not leaks(run_dir) and not any(v in r.stdout + r.stderr for v in SECRETS.values()), leaks(run_dir)
    s = read_summary(run_dir)
    assert s["group"] == "${oc.env:MY_API_TOKEN}" and s["task"]["data"]["root"] == "/data/${oc.env:db_password}/x"
    assert s["backend_env"]["env"]["NCCL_SOCKET_IFNAME"] == "${oc.env:MY_API_TOKEN}", s["backend_env"]


def test_a_credential_in_a_refused_sweep_job_is_recorded_as_its_interpolation(tmp_path):
    """A refused job of a sweep keeps its directory with a failed summary.json saying why, and the sweep's report
    lists it: neither holds the credential the refused value came from."""
    sweep = tmp_path / "sweep"
    r = run_cli(tmp_path / "unused", "-m", *TINY, "model.name=${oc.env:MY_API_TOKEN}", f"hydra.sweep.dir={sweep}",
                env=SECRETS)
    line = error_line(r.stderr)
    assert "model.name=${oc.env:MY_API_TOKEN}" in line and read_summary(sweep / "0")["status"] == "failed", line
    assert not leaks(sweep) and not any(v in r.stdout + r.stderr for v in SECRETS.values()), leaks(sweep)


def test_incompatible_checkpoint_is_one_line_naming_the_mismatch(tmp_path):
    src = tmp_path / "src"
    r = run_cli(src, *TINY, "steps=4", "logger=none")
    assert r.returncode == 0, r.stderr[-2000:]
    r = run_cli(tmp_path / "cli", *TINY, "logger=none", f"resume={src}", "model.width=16")
    assert r.returncode == 2, r.stderr[-2000:]  # refused before any worker starts
    assert "model.width=8, this run has model.width=16" in error_line(r.stderr)
    # every other mismatch through the same check the CLI makes before launch (train.prepare)
    for i, (override, words) in enumerate([("launcher.nproc_per_node=4", "world size=2, this run has world size=4"),
                            ("+parallel=fsdp", "sharded=False, this run has sharded=True"),
                            ("data.num_labels=5", "data.num_labels=8, this run has data.num_labels=5"),
                            ("amp=fp16", "fp16 loss scaling (amp=fp16)=False, this run has fp16 loss scaling "
                                         "(amp=fp16)=True")]):
        with pytest.raises(ConfigError, match=re.escape(words)):
            prepare(compose([*TINY, "logger=none", f"resume={src}", override]), tmp_path / f"case{i}")
    with pytest.raises(ConfigError, match="no complete checkpoint"):
        prepare(compose([*TINY, "logger=none", f"resume={tmp_path / 'nope'}"]), tmp_path / "nothing")
    newest = sorted((src / "checkpoints").glob("step-*"))[-1]
    for i, broken in enumerate(["{}", "[]", "null"]):  # a meta.json that parses but is no checkpoint's
        (newest / "meta.json").write_text(broken)
        with pytest.raises(ConfigError, match=re.escape(f"{newest}/meta.json is not a checkpoint's meta")):
            prepare(compose([*TINY, "logger=none", f"resume={newest}"]), tmp_path / f"broken{i}")


def compose(overrides: list):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return hydra_compose("train", overrides=overrides)


@contextlib.contextmanager
def small_disk(run_dir):
    """run_dir/checkpoints as a 400 KiB tmpfs: one checkpoint of RUN fits (about 290 KB), the second does not."""
    (run_dir / "checkpoints").mkdir(parents=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=400k", "tmpfs", str(run_dir / "checkpoints")],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {mounted.stderr.strip()}")
    try:
        yield run_dir
    finally:
        subprocess.run(["umount", "-l", str(run_dir / "checkpoints")], check=False)


@pytest.fixture
def tiny_disk(tmp_path):
    with small_disk(tmp_path / "run") as run_dir:
        yield run_dir


def test_disk_full_while_checkpointing_keeps_the_previous_checkpoint(tmp_path, tiny_disk):
    r = run_cli(tiny_disk, *RUN)
    assert r.returncode == 1
    line = error_line(r.stderr)
    assert "checkpoint at step 10 not written" in line and "No space left on device" in line, line
    assert "step-00000005, is intact" in line, line
    assert read_summary(tiny_disk)["status"] == "failed"
    assert not list((tiny_disk / "checkpoints").glob("*.tmp")), "the partial checkpoint is cleaned up"
    # The previous checkpoint is whole: a new run directory continues from it to the end.
    r = run_cli(tmp_path / "again", *RUN, f"resume={tiny_disk}")
    assert r.returncode == 0, r.stderr[-3000:]
    assert read_summary(tmp_path / "again")["resumed_from"]["step"] == 5
    assert [row["step"] for row in read_rows(tmp_path / "again")] == list(range(1, 31))


def test_max_restarts_restarts_the_workers_and_finishes_from_the_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    proc = start(run_dir, *RUN, "launcher.max_restarts=1")
    wait_for_step(proc, run_dir, 8)
    os.kill(worker_pid(run_dir, 1), signal.SIGKILL)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    s = read_summary(run_dir)
    assert s["status"] == "completed" and s["resumed_from"]["step"] >= 5
    assert [row["step"] for row in read_rows(run_dir)] == list(range(1, 31))
