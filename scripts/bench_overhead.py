"""How much does ringexp cost over a plain PyTorch DDP loop? A benchmark, not a test.

Runs, alternately and in one invocation, (a) the default ringexp experiment through its real CLI
(`python -m ringexp.train`, W&B offline, metrics every step) and (b) a minimal DDP loop written the way
a user would (DistributedSampler, DataLoader, DDP, AdamW, nothing else) on the same model, data, batch
size, worker count and threads. Both time each step end to end (from the end of one step to the end of
the next, data loading included); the median over steady steps is compared.

    python scripts/bench_overhead.py [--steps 150] [--rounds 3] [override ...]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

from ringexp.data import build_datasets
from ringexp.launch import elastic
from ringexp.models import build_model
from ringexp.train import CONF_DIR, plain

ROOT = Path(__file__).resolve().parent.parent


def plain_ddp_worker(cfg: dict, steps: int) -> list:
    """The baseline: what a minimal hand-written DDP training loop does, and nothing more."""
    cfg = OmegaConf.create(cfg)
    local_world = int(os.environ["LOCAL_WORLD_SIZE"])
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))  # same as ringexp's workers
    dist.init_process_group("gloo")
    train_ds, _, num_labels = build_datasets(cfg.data)
    torch.manual_seed(cfg.seed)
    model = DDP(build_model(cfg.model, num_labels))
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay)
    sampler = DistributedSampler(train_ds, shuffle=True, seed=cfg.seed, drop_last=True)
    loader = DataLoader(train_ds, batch_size=cfg.data.batch_size, sampler=sampler, drop_last=True)
    times, step, epoch, t_prev = [], 0, 0, time.perf_counter()
    while step < steps:
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = F.binary_cross_entropy_with_logits(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            now = time.perf_counter()
            times.append(now - t_prev)
            t_prev, step = now, step + 1
            if step == steps:
                break
        epoch += 1
    dist.destroy_process_group()
    return times


def run_ringexp(overrides: list, steps: int, out: Path) -> list:
    run_dir = out / f"ringexp-{time.time_ns()}"
    cmd = [sys.executable, "-m", "ringexp.train", f"steps={steps}", *overrides, f"hydra.run.dir={run_dir}"]
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["train/step_time_s"] for r in rows]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=10, help="steps left out of each median")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides applied to both (e.g. model.width=32)")
    args = ap.parse_args()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = plain(compose("train", overrides=args.overrides))
    nproc = cfg["launcher"]["nproc_per_node"]
    print(f"model={cfg['model']['name']} batch={cfg['data']['batch_size']}/rank workers={nproc} "
          f"steps={args.steps} rounds={args.rounds} (median step time after {args.warmup} steps)")
    ratios = []
    with tempfile.TemporaryDirectory(prefix="bench-overhead-") as tmp:
        for r in range(args.rounds):
            base = elastic(plain_ddp_worker, nproc, cfg, args.steps, log_dir=Path(tmp) / f"plain{r}")[0]
            ours = run_ringexp(args.overrides, args.steps, Path(tmp))
            b, o = statistics.median(base[args.warmup:]), statistics.median(ours[args.warmup:])
            ratios.append(b / o)
            print(f"round {r + 1}: plain DDP {1000 * b:7.1f} ms/step   ringexp {1000 * o:7.1f} ms/step   "
                  f"ringexp throughput / plain = {b / o:.3f}", flush=True)
    print(f"ratio (median of {len(ratios)} rounds): {statistics.median(ratios):.3f} "
          f"(min {min(ratios):.3f}, max {max(ratios):.3f}); target >= 0.97")


if __name__ == "__main__":
    main()
