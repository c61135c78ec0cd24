"""Runs the tests make: the tiny run (TINY), strategies built from the real composed config and stepped on real
process groups, published cases cut down, and runs killed and resumed (RUN, KILL_CASES, kill_and_resume)."""

import dataclasses
import json
import os
import signal
import time
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch
import yaml
from PIL import Image

from helpers import zygote
from helpers.processes import ROOT, alive, descendants, run_cli, start_module, worker_pid
from ringexp.metrics import state_bytes
from ringexp.records import read_rows, read_summary
from ringexp.trainer import forward_backward
from ringexp.validate import compose_config

# A few seconds of training: tiny model and data, still 2 real gloo workers.
# A row every step (logger.log_every=1), so that tests can follow the run step by step. No W&B (logger=none):
# its offline run costs about 2.5 s of CPU a run; the tests of W&B's records say logger=wandb.
TINY = ["steps=12", "eval_every=6", "throughput_warmup=2", "data.train_size=1024", "data.val_size=101",
        "data.batch_size=16", "model.width=8", "optim.warmup_steps=2", "logger=none", "logger.log_every=1"]


def published_cases(tmp_path, names, change=lambda doc: None) -> str:
    """ringexp/plan/published.yaml with only the cases `names` (and every cluster), changed by `change`, written
    to tmp_path: the path."""
    doc = yaml.safe_load((ROOT / "ringexp" / "plan" / "published.yaml").read_text())
    doc["cases"] = [c for c in doc["cases"] if c["name"] in names]
    change(doc)
    path = tmp_path / "cases.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def make_image_folder(root: Path, n: int = 24) -> Path:
    """A small real image folder with a labels CSV: 3 labels, n PNG images."""
    root.mkdir(parents=True)
    rng = np.random.default_rng(0)
    lines = ["path,cat,dog,bird"]
    for i in range(n):
        Image.fromarray(rng.integers(0, 255, (20, 20, 3), dtype=np.uint8)).save(root / f"img{i}.png")
        lines.append(f"img{i}.png," + ",".join(str(int(v)) for v in rng.integers(0, 2, 3)))
    (root / "labels.csv").write_text("\n".join(lines) + "\n")
    return root


# --- strategies on real process groups ---------------------------------------------------------------------

def strategy_cfg(strategy: str, world: int, **parallel_overrides):
    """The real composed config of `+parallel=strategy` for `world` workers, with parallel.* overridden."""
    cfg = compose_config([f"+parallel={strategy}", f"launcher.nproc_per_node={world}"])
    return dataclasses.replace(cfg, parallel=dataclasses.replace(cfg.parallel, **parallel_overrides))


def train_steps(model, opt, rank: int, k: int, steps: int, no_sync):
    """`steps` optimizer steps of k micro-batches of random data (per-rank, same for every strategy): the
    losses and the whole gradients (FSDP's shards gathered) of every step, and the bytes of parameters,
    gradients and optimizer state the rank held after the first."""
    losses, grads, state = [], [], None
    for step in range(steps):
        g = torch.Generator().manual_seed(100 * step + rank)
        micro = iter([(torch.randn(4, 3, 12, 12, generator=g), torch.randint(0, 2, (4, 5), generator=g).float())
                      for _ in range(k)])
        scaler = torch.amp.GradScaler("cpu", enabled=False)
        losses.append(float(forward_backward(model, micro, k, nullcontext, scaler, no_sync)))
        grads.append(torch.cat([(p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).flatten()
                                for p in model.parameters()]))
        opt.step()
        state = state or state_bytes(model, opt)
        opt.zero_grad()
    return losses, grads, state["state_bytes"]


# --- runs that are killed and resumed ----------------------------------------------------------------------

# 30 steps, a checkpoint every 5: the kill lands after step 8 and the resumption continues from step 5.
RUN = [o for o in TINY if not o.startswith(("steps", "eval_every"))] + [
    "steps=30", "eval_every=10", "checkpoint.every_steps=5", "logger=none"]
KILL_AFTER = 8
EXIT_WITHIN_S = 60
# (preset, what is killed, resume afterwards): exactness for ddp, ring, ring_fp16 and top-k with error feedback,
# and FSDP's distributed checkpoint; a dying rank for ddp, ring, hierarchical and fsdp.
# (plain DDP's kill is ddp_topk's without the compressor state: that case covers it)
KILL_CASES = [("ring+wandb", "rank0", True), ("ring_fp16", "job", True), ("ddp_topk", "rank1", True),
              ("hierarchical", "rank1", False), ("fsdp", "rank1", True)]


def start(run_dir, *overrides, fresh=False):
    """The run started in its own session (start_module's: forked from a warm interpreter unless `fresh`), its
    stdout and stderr piped."""
    return start_module(zygote.MODULE, *overrides, f"hydra.run.dir={run_dir}", fresh=fresh)


def wait_for_step(proc, run_dir, step: int, timeout=180):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        rows = read_rows(run_dir)
        if rows and rows[-1]["step"] >= step:
            return
        time.sleep(0.02)
    raise AssertionError(f"no step {step} within {timeout}s")


def preset_overrides(preset: str) -> list:
    """`ring+wandb`: the ring preset with the offline W&B run on (whose id the resumed run must continue);
    `ddp+cuda`: on the GPUs (NCCL, one rank per GPU), with deterministic algorithms: cuDNN's and cuBLAS's default
    ones sum in an order that varies, and the losses of two uninterrupted runs drift apart by 1e-3 in 10 steps."""
    name, _, extra = preset.partition("+")
    cuda = ["launcher.device=cuda", "launcher.deterministic=true"]
    # diloco+fast: synchronised (period 3, two fragments, sign with error feedback) before the first checkpoint
    fast = ["parallel.period=3", "parallel.fragments=2", "compression=sign"]
    return [f"+parallel={name}"] + {"wandb": ["logger=wandb"], "cuda": cuda, "fast": fast}.get(extra, [])


def losses(run_dir) -> dict:
    return {r["step"]: r["train/loss"] for r in read_rows(run_dir)}


def reference_losses(run_root):
    """get(preset): the losses of an uninterrupted run of RUN with that preset, computed once (in `run_root()`)."""
    cache = {}

    def get(preset):
        if preset not in cache:
            run_dir = run_root() / preset.replace("+", "_")
            r = run_cli(run_dir, *RUN, *preset_overrides(preset))
            assert r.returncode == 0, r.stderr[-3000:]
            cache[preset] = losses(run_dir)
        return cache[preset]

    return get


def kill_and_resume(run_dir, preset: str, kill: str, resume: bool, references) -> float:
    """Kill a run after step KILL_AFTER (one worker, or the whole job), check how it went down, resume it and
    compare every loss with the uninterrupted reference; returns the seconds from the kill to the job's exit."""
    proc = start(run_dir, *RUN, *preset_overrides(preset))
    wait_for_step(proc, run_dir, KILL_AFTER)
    tree = descendants(proc.pid)
    killed_at = time.monotonic()
    if kill == "job":  # the whole job at once, as a preempted or lost node would
        os.killpg(proc.pid, signal.SIGKILL)
    else:
        os.kill(worker_pid(run_dir, int(kill[-1])), signal.SIGKILL)
    _, err = proc.communicate(timeout=EXIT_WITHIN_S + 30)
    took = time.monotonic() - killed_at
    assert proc.returncode != 0
    assert took < EXIT_WITHIN_S, took
    deadline = time.monotonic() + 10
    while any(alive(p) for p in tree) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in tree if alive(p)], "processes left behind"
    if kill != "job":
        line = next(x for x in err.splitlines() if x.startswith("ringexp: error:"))
        assert f"worker rank {kill[-1]} failed" in line and "SIGKILL" in line and "Traceback" not in err, err
        assert read_summary(run_dir)["status"] == "failed"
    steps_before = sorted(losses(run_dir))
    assert steps_before[-1] >= KILL_AFTER
    assert (run_dir / "checkpoints" / "step-00000005" / "meta.json").is_file()
    if not resume:
        return took

    r = run_cli(run_dir, *RUN, *preset_overrides(preset), "resume=auto")
    assert r.returncode == 0, r.stderr[-3000:]
    s = read_summary(run_dir)
    assert s["status"] == "completed" and s["resumed_from"]["step"] >= 5
    rows = read_rows(run_dir)
    assert [row["step"] for row in rows] == list(range(1, 31)), "every step exactly once"
    ref, got = references(preset), losses(run_dir)
    # Bit-identical: same weights, optimizer, schedule, residuals, RNG and data position as the reference (on GPUs
    # with deterministic algorithms: preset_overrides). A first step off at or before the checkpoint's is the
    # device's nondeterminism; after it, the resumption.
    off = [(k, got[k], ref[k]) for k in ref if got.get(k) != ref[k]]
    assert got.keys() == ref.keys() and not off, off[:5]
    assert s["final"]["auroc_macro"] is not None
    if preset.endswith("+wandb"):  # the resumed run continued the same W&B run: same id, a second segment
        runs = sorted((run_dir / "wandb").glob("offline-run-*"))
        wandb_id = json.loads((run_dir / "checkpoints" / "step-00000030" / "meta.json").read_text())["wandb_id"]
        assert len(runs) == 2 and all(r.name.endswith(f"-{wandb_id}") for r in runs), runs
    return took
