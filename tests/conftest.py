"""Shared helpers: run the real CLI in a subprocess, shrunk to a few CPU steps."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# A few seconds of training: tiny model and data, still 2 real gloo workers.
TINY = ["steps=12", "eval_every=6", "throughput_warmup=2", "data.train_size=1024", "data.val_size=101",
        "data.batch_size=16", "model.width=8", "optim.warmup_steps=2"]


def run_cli(run_dir: Path, *overrides: str, module: str = "ringexp.train", timeout: int = 300, env=None,
            prefix=()) -> subprocess.CompletedProcess:
    cmd = [*prefix] if prefix else [sys.executable, "-m", module]
    cmd += [*overrides, f"hydra.run.dir={run_dir}"]
    e = {**os.environ, "WANDB_SILENT": "true", **(env or {})}
    e.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=e)


def read_summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def read_rows(run_dir: Path) -> list:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture
def tiny():
    return list(TINY)


@pytest.fixture
def image_folder(tmp_path):
    return make_image_folder(tmp_path / "images")


def make_image_folder(root: Path) -> Path:
    """A small real image folder with a labels CSV: 3 labels, 24 PNG images."""
    import numpy as np
    from PIL import Image

    root.mkdir(parents=True)
    rng = np.random.default_rng(0)
    lines = ["path,cat,dog,bird"]
    for i in range(24):
        Image.fromarray(rng.integers(0, 255, (20, 20, 3), dtype=np.uint8)).save(root / f"img{i}.png")
        lines.append(f"img{i}.png," + ",".join(str(int(v)) for v in rng.integers(0, 2, 3)))
    (root / "labels.csv").write_text("\n".join(lines) + "\n")
    return root
