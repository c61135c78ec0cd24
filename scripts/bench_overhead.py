"""How much does ringexp cost over a plain PyTorch DDP loop? A benchmark, not a test.

In one elastic job of `launcher.nproc_per_node` workers, alternately (ABBA order, so a slow drift of the
machine does not favour either side), the same processes run (a) ringexp's worker loop exactly as
`python -m ringexp.train` runs it (its rows, W&B offline, evaluation) and (b) a minimal DDP loop
written the way a user would (DistributedSampler, DataLoader, DDP, AdamW, nothing else) on the same model,
data, batch size and threads. Both are timed the same way: each step end to end (from the end of one step to
the end of the next, data loading included), averaged over the intervals of `logger.log_every` steps between
ringexp's rows, the median over the steady intervals (after the warm-up steps) compared. Sharing processes
removes the noise of process placement, which on a shared 2-core machine is larger than the difference measured.

    python scripts/bench_overhead.py [--steps 100] [--rounds 10] [--json PATH] [override ...]

With `--vs "OVERRIDES"` the baseline is ringexp itself and the candidate ringexp with those overrides
added, e.g. `--vs "+parallel=ring"`: the hand-written ring's hook against DDP's builtin all-reduce.
With `--json PATH` the figures printed are also written to PATH (`result` lists them; scripts/gpu_check.py
reads them back through ringexp.records).
"""

import argparse
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

from ringexp import dist as rdist
from ringexp import records
from ringexp.data import build_datasets
from ringexp.errors import ConfigError, one_line, print_error
from ringexp.launch import elastic
from ringexp.models import build_model
from ringexp.trainer import Trainer
from ringexp.validate import compose_config

ROOT = Path(__file__).resolve().parent.parent
TARGET = 0.97  # the throughput ratio ringexp / plain loop it should reach (printed, and in --json)


def plain_ddp_loop(cfg, steps: int, device: torch.device) -> list:
    """The baseline: what a minimal hand-written DDP training loop does, and nothing more (on a GPU: the
    config's autocast dtype, pinned memory and the loader's workers, as a user would write it)."""
    train_ds, _, num_labels = build_datasets(cfg.data)
    torch.manual_seed(cfg.seed)
    cuda = device.type == "cuda"
    model = DDP(build_model(cfg.model, num_labels).to(device), device_ids=[device.index] if cuda else None)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay)
    sampler = DistributedSampler(train_ds, shuffle=True, seed=cfg.seed, drop_last=True)
    loader = DataLoader(train_ds, batch_size=cfg.data.batch_size, sampler=sampler, drop_last=True,
                        num_workers=cfg.data.num_workers, pin_memory=cuda)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(str(cfg.amp.mode))
    times, step, epoch, t_prev = [], 0, 0, time.perf_counter()
    while step < steps:
        sampler.set_epoch(epoch)
        for x, y in loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                logits = model(x)
            loss = F.binary_cross_entropy_with_logits(logits.float(), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if cuda and step % cfg.logger.log_every == 0:
                torch.cuda.synchronize(device)  # as ringexp's logged steps wait for the device
            now = time.perf_counter()
            times.append(now - t_prev)
            t_prev, step = now, step + 1
            if step == steps:
                break
        epoch += 1
    return times


def interval_median(times: list, every: int, warmup: int) -> float:
    """The median over intervals of `every` steps (the last may be shorter) that start after `warmup` steps of
    each interval's mean step time: the statistic ringexp's summary reports."""
    means = [statistics.mean(times[a:a + every]) for a in range(0, len(times), every) if a >= warmup]
    return statistics.median(means)


def bench_worker(base, cand, rounds: int, warmup: int, out: str):
    """base: a TrainConfig, or None for the plain loop (then with cand's model and data); cand: a TrainConfig."""
    cfgs = {"base": base, "cand": cand}
    c = cfgs["cand"]
    env = rdist.init(c.launcher.device, c.launcher.threads_per_worker)  # the same threads for both
    results = []
    for r in range(rounds):
        pair = {}
        for side in (("base", "cand") if r % 2 == 0 else ("cand", "base")):
            dist.barrier()
            cfg = cfgs[side]
            if cfg is None:
                pair[side] = interval_median(plain_ddp_loop(c, c.steps, env.device), c.logger.log_every, warmup)
                continue
            run_dir = Path(out) / f"round{r}-{side}"
            run_dir.mkdir(exist_ok=True)
            meta = {"name": f"bench_{side}_round{r}", "group": "bench_overhead",
                    "job_type": str(cfg.parallel.strategy), "choices": {}, "overrides": []}
            summary = Trainer(cfg, env, run_dir, meta).train()
            pair[side] = summary["step_time_s"]["median"] if summary else None
        results.append(pair)
    rdist.cleanup()
    return results


def result(names: tuple, results: list, args, cfg) -> dict:
    """What the run measured, for --json: each side's median step time over the rounds and each round's (seconds
    per step, each the median over its steady intervals), and the throughput ratio candidate / baseline."""
    ratios = [pair["base"] / pair["cand"] for pair in results]
    n = cfg.launcher.nproc_per_node
    return {"baseline": names[0], "candidate": names[1], "model": cfg.model.name, "workers": n,
            "global_batch_size": cfg.data.batch_size * cfg.accumulation.steps * n,
            "steps": args.steps, "warmup": args.warmup, "log_every": cfg.logger.log_every, "vs": args.vs,
            "overrides": args.overrides, "target": TARGET,
            "ratio": {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)},
            "step_s": {"baseline": statistics.median(p["base"] for p in results),
                       "candidate": statistics.median(p["cand"] for p in results)},
            "rounds": [{"baseline_step_s": p["base"], "candidate_step_s": p["cand"], "ratio": r}
                       for p, r in zip(results, ratios, strict=True)]}


def configs(args) -> tuple:
    """(baseline, candidate) TrainConfigs; bad input (an override, --vs, a --json path that cannot be written) is
    ringexp's one line and exit code 2, before any minute is spent measuring."""
    common = [f"steps={args.steps}", f"throughput_warmup={args.warmup}", *args.overrides]
    try:
        base = compose_config(common)
        cand = compose_config(common + shlex.split(args.vs)) if args.vs else base
        if args.json and (e := records.cannot_write(Path(args.json).resolve().parent)):
            raise ConfigError(f"--json {args.json}: cannot write there ({e.strerror or e})")
    except (ConfigError, HydraException, OmegaConfBaseException, ValueError) as e:
        print_error(one_line(str(e)))
        sys.exit(2)
    return base, cand


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=10, help="steps left out of each median")
    ap.add_argument("--vs", default=None, help="compare ringexp with these overrides added, not the plain loop")
    ap.add_argument("--json", default=None, metavar="PATH", help="also write the figures to this JSON file")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides applied to both (e.g. model.width=32)")
    args = ap.parse_args()
    base, cand = configs(args)
    names = ("ringexp", f"ringexp {args.vs}") if args.vs else ("plain DDP", "ringexp")
    nproc = cand.launcher.nproc_per_node
    print(f"model={cand.model.name} batch={cand.data.batch_size}/rank workers={nproc} steps={args.steps} "
          f"rounds={args.rounds} (median over {cand.logger.log_every}-step intervals after {args.warmup} steps)")
    with tempfile.TemporaryDirectory(prefix="bench-overhead-") as tmp:
        results = elastic(bench_worker, nproc, base if args.vs else None, cand, args.rounds, args.warmup, tmp,
                          log_dir=Path(tmp) / "logs")[0]
    ratios = []
    for r, pair in enumerate(results):
        b, o = pair["base"], pair["cand"]
        ratios.append(b / o)
        print(f"round {r + 1}: {names[0]} {1000 * b:7.1f} ms/step   {names[1]} {1000 * o:7.1f} ms/step   "
              f"throughput ratio = {b / o:.3f}")
    print(f"{names[1]} / {names[0]} throughput (median of {len(ratios)} rounds): {statistics.median(ratios):.3f} "
          f"(min {min(ratios):.3f}, max {max(ratios):.3f}); target >= {TARGET}")
    if args.json:
        records.write_json(args.json, result(names, results, args, cand))


if __name__ == "__main__":
    main()
