"""One training worker: data, model, strategy, the loop, and the records rank 0 writes."""

import itertools
import json
import logging
import math
import os
import time
from contextlib import nullcontext
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from omegaconf import OmegaConf
from torch.utils.data import DataLoader, DistributedSampler, Subset

from ringexp import checkpoint, comm, parallel, profiling, timing
from ringexp import dist as rdist
from ringexp.compress.cast import DTYPES
from ringexp.data import build_datasets, collate
from ringexp.metrics import evaluate, median, peak_memory_bytes, spread, state_bytes
from ringexp.models import build_model, param_bytes
from ringexp.sinks import open_sinks, rewind

log = logging.getLogger("ringexp")


def build_optimizer(model, ocfg, global_batch: int, total_steps: int, momentum_in_compressor: bool = False):
    lr = ocfg.lr * (global_batch / ocfg.base_batch_size if ocfg.scale_lr else 1.0)
    if ocfg.name == "sgd":
        # DGC's momentum correction applies the momentum before compression (ringexp.compress.feedback)
        momentum = 0.0 if momentum_in_compressor else ocfg.momentum
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum, weight_decay=ocfg.weight_decay)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=ocfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, partial(warmup_cosine, warmup=ocfg.warmup_steps, total=total_steps, floor=ocfg.min_lr_ratio))
    return opt, sched


def warmup_cosine(step: int, warmup: int, total: int, floor: float) -> float:
    """LR multiplier: linear warm-up to 1 over `warmup` steps, then cosine down to `floor` at `total`."""
    if step < warmup:
        return (step + 1) / warmup
    t = min(1.0, (step - warmup) / max(1, total - warmup))
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * t))


def amp_context(mode: str, device: torch.device):
    if mode == "off":
        return nullcontext
    return partial(torch.autocast, device.type, dtype=DTYPES[mode])


def forward_backward(model, micro_batches, k: int, autocast, scaler) -> torch.Tensor:
    """k micro-batches into one optimizer step: each loss scaled by 1/k, gradients synchronised across
    ranks only on the last micro-batch (DDP no_sync before it). Returns the step's mean loss (detached)."""
    total = None
    for i in range(k):
        x, y = next(micro_batches)
        with parallel.no_sync(model, sync=i == k - 1):
            with autocast():
                logits = model(x)
            loss = F.binary_cross_entropy_with_logits(logits.float(), y) / k
            scaler.scale(loss).backward()
        total = loss.detach() if total is None else total + loss.detach()
    return total


class Sampler(DistributedSampler):
    """DistributedSampler that can begin an epoch part-way: a resumed run skips the batches it had consumed."""

    skip = 0  # samples

    def __iter__(self):
        return itertools.islice(super().__iter__(), self.skip, None)

    def __len__(self) -> int:
        return super().__len__() - self.skip


def batches(loader, sampler, device, timer: dict, pos: dict):
    """Endless (x, y) on the device, from pos = {epoch, batches (consumed in that epoch), skipped}, which it
    keeps current for checkpoints. Data wait goes to timer['data'], unreadable samples dropped by the loader
    (data.skip_bad) to pos['skipped']."""
    while True:
        sampler.set_epoch(pos["epoch"])
        sampler.skip = pos["batches"] * loader.batch_size
        it = iter(loader)
        while True:
            t = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                break
            pos["batches"] += 1
            pos["skipped"] += loader.batch_size - (0 if batch is None else len(batch[1]))
            if batch is None:  # every image of this batch was unreadable: take the next one
                continue
            x, y = batch[0].to(device, non_blocking=True), batch[1].to(device, non_blocking=True)
            timer["data"] += time.perf_counter() - t
            yield x, y
        pos["epoch"], pos["batches"] = pos["epoch"] + 1, 0


def resume_mode(cfg):
    """`resume` as configured; a restarted job (elastic restart, Slurm requeue) continues where it was."""
    restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)) + int(os.environ.get("SLURM_RESTART_COUNT", 0))
    return cfg.resume or ("auto" if restarts else None)


def from_rows(rows: list, profiled) -> tuple:
    """What a resumed run's summary needs of the steps before the checkpoint, from its metrics.jsonl rows."""
    history = [r["train/loss"] for r in rows if "train/loss" in r]
    evals = [{"step": r["step"]} | {k[4:]: v for k, v in r.items() if k.startswith("val/")}
             for r in rows if "val/auroc_macro" in r]
    timed = [r for r in rows if "train/step_time_s" in r and r["step"] not in profiled]
    parts = [{name: r.get(f"time/{name}") for name in timing.PARTS} for r in timed]
    return history, evals, [r["train/step_time_s"] for r in timed], parts


def unwrap(model):
    return getattr(model, "module", model)


def run_worker(cfg: dict, run_dir, meta):
    """Entry point of every rank (elastic launch, torchrun or Slurm). Returns rank 0's summary."""
    cfg = OmegaConf.create(cfg)
    env = rdist.init(cfg.launcher.device, cfg.launcher.threads_per_worker, cfg.parallel.timeout_s)
    try:
        # Ranks started by an external torchrun each composed the config; rank 0 alone made the run dir.
        shared = [run_dir, meta]
        if env.world_size > 1:
            dist.broadcast_object_list(shared, src=0)
        run_dir, meta = Path(shared[0]), shared[1]
        handler = logging.FileHandler(run_dir / f"rank{env.rank}.log")
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        return train(cfg, env, run_dir, meta)
    except Exception as e:
        from ringexp.launch import PEER_LOST

        if any(p in str(e) for p in PEER_LOST):
            # A consequence: a peer died. Linger a moment, so that the launcher, which reports the first worker
            # it sees fail, sees the dead peer (the cause) before this one.
            time.sleep(2)
        raise
    finally:
        rdist.cleanup()


def train(cfg, env, run_dir: Path, meta: dict):
    t_start = time.perf_counter()
    device, k, steps = env.device, cfg.accumulation.steps, cfg.steps
    mode = resume_mode(cfg)
    ckpt = checkpoint.find(mode, run_dir)
    resumed = checkpoint.check(ckpt, cfg, env.world_size) if ckpt else None
    start = resumed["step"] if resumed else 0
    train_ds, val_ds, num_labels = build_datasets(cfg.data)
    torch.manual_seed(cfg.seed)  # same initial weights on every rank, whatever the strategy
    model = build_model(cfg.model, num_labels)
    rdist.seed_everything(cfg.seed, env.rank)
    grad_bytes = param_bytes(model)
    shapes = [p.shape for p in model.parameters() if p.requires_grad]
    opt_state = checkpoint.load_model(ckpt, cfg, model) if ckpt else None
    clock = timing.Clock(device)
    comm_timer = timing.CommTimer(clock, parallel.exposure(cfg))
    # what a batch looks like (every data set gives 3 x image_size x image_size), for DDP to settle its buckets
    example = torch.zeros(2, 3, cfg.data.image_size, cfg.data.image_size, device=device)
    model = parallel.apply(model, cfg, env, comm_timer, example)

    bs, cuda = cfg.data.batch_size, device.type == "cuda"
    sampler = Sampler(train_ds, env.world_size, env.rank, shuffle=True, seed=cfg.seed, drop_last=True)
    # Loaders draw their worker seeds from generators of their own: the global RNG (dropout) then advances the
    # same way in a run and in its resumption, which restores the RNG at the step it continues from.
    loader_kw = dict(num_workers=cfg.data.num_workers, pin_memory=cuda, persistent_workers=cfg.data.num_workers > 0,
                     collate_fn=collate(cfg.data))
    loader = DataLoader(train_ds, batch_size=bs, sampler=sampler, drop_last=True,
                        generator=torch.Generator().manual_seed(cfg.seed), **loader_kw)
    if len(loader) == 0:
        raise RuntimeError(f"data: {len(train_ds)} training samples cannot fill one batch of {bs} per rank")
    # A disjoint shard per rank (not DistributedSampler, which pads): each validation sample counts once.
    val_loader = DataLoader(Subset(val_ds, range(env.rank, len(val_ds), env.world_size)), batch_size=2 * bs,
                            generator=torch.Generator().manual_seed(cfg.seed), **loader_kw)

    global_batch = bs * k * env.world_size
    opt, sched = build_optimizer(model, cfg.optim, global_batch, steps, cfg.compression.momentum_correction)
    autocast = amp_context(cfg.amp.mode, device)
    scaler = parallel.grad_scaler(cfg, device)
    pos = {"epoch": 0, "batches": 0, "skipped": 0}
    skipped_steps, skipped_bad, local = 0, 0, None
    if ckpt:
        local = checkpoint.load_after_wrap(ckpt, cfg, env, model, opt, opt_state)
        sched.load_state_dict(local["scheduler"])
        scaler.load_state_dict(local["scaler"])
        checkpoint.load_comm_state(model, local["comm"])
        pos, skipped_steps = dict(local["data"]), local["skipped_steps"]
    wire = parallel.wire_bytes(cfg, shapes, env.world_size)
    dense = comm.wire_bytes("builtin", grad_bytes, env.world_size)  # float32 all-reduce of the same gradients
    wire_ratio = wire / dense if dense else None
    pr = cfg.profile
    profiled = range(pr.start_step, pr.start_step + pr.steps) if pr.enabled else range(0)
    history, evals, step_times, parts, elapsed0 = [], [], [], [], 0.0
    sinks = None
    if env.is_main:
        if mode:  # rows the checkpoint does not cover belong to an attempt this run redoes
            rows = rewind(run_dir, Path(ckpt).parent.parent if ckpt else run_dir, start)
            history, evals, step_times, parts = from_rows(rows, profiled)
            elapsed0 = rows[-1].get("train/elapsed_s", 0.0) if rows else 0.0
        sinks = open_sinks(cfg, run_dir, meta, steps, start, resumed and resumed.get("wandb_id"))
    log.info("rank %d/%d (pid %d) on %s: %s, global batch %d", env.rank, env.world_size, os.getpid(), device,
             meta["name"], global_batch)
    if ckpt:
        log.info("resumed from %s (step %d)", ckpt, start)
        checkpoint.set_rng_state(local["rng"], device)  # last: nothing above may draw from it

    timer = {"data": 0.0}
    stream = batches(loader, sampler, device, timer, pos)
    check_loss = not scaler.is_enabled()  # with a GradScaler, a non-finite loss skips the step instead
    scale = scaler.get_scale() if scaler.is_enabled() else None
    state, prof, profile_summary, ok, saved = None, None, None, False, ckpt
    try:
        t_prev = time.perf_counter()
        for step in range(start + 1, steps + 1):
            if step == profiled.start:
                prof = profiling.start(device)
            timer["data"] = 0.0
            comm_timer.reset()
            t0 = clock.now()
            loss = forward_backward(model, stream, k, autocast, scaler)
            t1 = clock.now()
            if cfg.optim.grad_clip:
                scaler.unscale_(opt)
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip)
            scaler.step(opt)
            scaler.update()
            if state is None:  # what each rank holds once gradients and optimizer state exist
                state = state_bytes(model, opt)
            opt.zero_grad(set_to_none=True)
            lr = sched.get_last_lr()[0]
            sched.step()
            t2 = clock.now()
            if check_loss and not torch.isfinite(loss):
                raise FloatingPointError(f"loss is {loss.item()} at step {step} on rank {env.rank}; lower optim.lr, "
                                         "set optim.grad_clip, or check the data")
            if not check_loss:  # the scaler backs off its scale when it found inf/nan gradients (and skipped)
                scale, previous = scaler.get_scale(), scale
                skipped_steps += scale < previous
            if prof is not None and step == profiled[-1]:
                profile_summary = profiling.finish(prof, run_dir, env.rank, profiled.start, step, pr.top, device)
                prof = None

            row = None
            if step % cfg.logger.log_every == 0 or step == steps:
                # One small all-reduce makes loss and data wait means over ranks (and syncs the device).
                stats = torch.tensor([timer["data"], pos["skipped"]], device=device, dtype=torch.float64)
                stats = torch.cat([loss.double().reshape(1), stats])
                if env.world_size > 1:
                    dist.all_reduce(stats)
                loss_sum, wait_sum, skipped_bad = stats.tolist()
                skipped_bad = int(skipped_bad)  # over all ranks, since the start of the run
                loss_mean, wait_mean = loss_sum / env.world_size, wait_sum / env.world_size
                history.append(loss_mean)
                row = {"train/loss": loss_mean, "train/lr": lr, "train/data_wait_s": wait_mean,
                       "train/peak_memory_bytes": peak_memory_bytes(device), "comm/wire_bytes_per_rank": wire,
                       "comm/compression_ratio": wire_ratio, "train/skipped_steps": skipped_steps,
                       "data/skipped_bad": skipped_bad}
            # Step time is end to end (data, compute, communication, logging), evaluation and checkpoints excluded.
            t_end = time.perf_counter()
            if row is not None:
                dt = t_end - t_prev
                clock.sync()
                split = timing.breakdown(dt, timer["data"], clock.since(t0, t1), clock.since(t1, t2),
                                         comm_timer.measure(t0, t1))
                if step not in profiled:  # the profiler's own overhead stays out of the statistics
                    step_times.append(dt)
                    parts.append(split)
                row |= {"train/step_time_s": dt, "train/samples_per_s": global_batch / dt,
                        "train/elapsed_s": elapsed0 + t_end - t_start}
                row |= {f"time/{name}": v for name, v in split.items()}
            excluded = False  # evaluation and checkpoints stay out of the next step's time
            if step % cfg.eval_every == 0 or step == steps:
                excluded = True
                val = evaluate(unwrap(model), val_loader, num_labels, device, autocast)
                evals.append({"step": step, **val})
                row = (row or {}) | {f"val/{k_}": v for k_, v in val.items()}
            if row is not None and sinks:
                sinks.log(row, step)
            if (cfg.checkpoint.every_steps and step % cfg.checkpoint.every_steps == 0) or step == steps:
                own = {"rng": checkpoint.rng_state(device), "comm": checkpoint.comm_state_dict(model),
                       "data": dict(pos), "scheduler": sched.state_dict(), "scaler": scaler.state_dict(),
                       "skipped_steps": skipped_steps}
                saved = checkpoint.save(run_dir, step, cfg, env, model, opt, own, sinks and sinks.wandb_id)
                excluded = True
            t_prev = time.perf_counter() if excluded else t_end
        ok = True
    finally:
        if prof is not None:
            prof.stop()
        if sinks and not ok:
            sinks.close(ok=False)

    if state is None:  # resumed at the last step: nothing left to run
        state = state_bytes(model, opt)
    # The busiest rank's memory: peak, and what it holds of parameters, gradients and optimizer state.
    memory = torch.tensor([peak_memory_bytes(device), *state.values()], device=device, dtype=torch.float64)
    if env.world_size > 1:
        dist.all_reduce(memory, op=dist.ReduceOp.MAX)
    if not env.is_main:
        return None
    memory = dict(zip(["peak_bytes", *state], (int(v) for v in memory.tolist()), strict=True))
    summary = make_summary(cfg, env, meta, run_dir, step_times, parts, history, evals, global_batch, grad_bytes,
                           wire, wire_ratio, memory, elapsed0 + time.perf_counter() - t_start)
    summary |= {"skipped_steps": skipped_steps, "data_skipped_bad": skipped_bad,
                "checkpoint": str(saved) if saved else None,
                "resumed_from": {"checkpoint": str(ckpt), "step": start} if ckpt else None}
    if profile_summary:
        summary["profile"] = profile_summary
        sinks.artifact(run_dir / profile_summary["trace"], "profile")
    log.info("time: %s", summary["time"]["verdict"])
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    sinks.summary(summary)
    sinks.close(ok=True)
    log.info("done: %s", json.dumps(summary["throughput"]))
    return summary


def make_summary(cfg, env, meta, run_dir, step_times, parts, history, evals, global_batch, grad_bytes, wire,
                 wire_ratio, memory, wall):
    from ringexp.versions import versions

    steady = step_times[cfg.throughput_warmup:] or step_times
    steady_parts = parts[cfg.throughput_warmup:] or parts
    time_split = {"step_s": median(steady)} | {
        name: median([p[name] for p in steady_parts if p[name] is not None]) for name in timing.PARTS}
    final = evals[-1] if evals else {}
    best = max(evals, key=lambda e: e["auroc_macro"]) if evals else {}
    metric_keys = ("auroc_macro", "auroc_micro", "f1_macro", "f1_micro", "loss")
    return {
        "status": "completed",
        "run_dir": str(run_dir),
        "name": meta["name"], "group": meta["group"], "job_type": meta["job_type"],
        "strategy": cfg.parallel.strategy,
        "choices": meta["choices"], "overrides": meta["overrides"],
        "world_size": env.world_size, "device": str(env.device), "backend": env.backend,
        "steps": cfg.steps, "global_batch_size": global_batch, "accumulation_steps": cfg.accumulation.steps,
        # Median and spread of global samples/s over the steady steps (warm-up steps left out).
        "throughput": spread([global_batch / t for t in steady])
        | {"warmup_steps_excluded": len(step_times) - len(steady)},
        "step_time_s": spread(steady),
        "loss": {"first": history[0] if history else None, "last": history[-1] if history else None},
        "final": {k: final.get(k) for k in metric_keys} | {"step": final.get("step")},
        "best": {k: best.get(k) for k in metric_keys} | {"step": best.get("step")},
        "val_samples": final.get("samples"),
        # medians over the steady steps; ringexp.timing says how each part is measured
        "time": time_split | {"verdict": timing.verdict(time_split, str(cfg.parallel.strategy), str(cfg.amp.mode))},
        "peak_memory_bytes": memory["peak_bytes"],
        "memory": memory,
        "grad_bytes": grad_bytes,
        "wire_bytes_per_rank_per_step": wire,
        "wire_bytes_basis": parallel.wire_note(cfg),
        # wire bytes / those of a float32 ring all-reduce of the same gradients (1.0 uncompressed on a ring)
        "compression": {"name": cfg.compression.name, "ratio_vs_fp32_allreduce": wire_ratio},
        "wall_time_s": wall,
        "versions": versions(),
    }
