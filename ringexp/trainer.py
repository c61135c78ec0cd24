"""One rank's training: build once, then step, evaluate, checkpoint, finish.

    trainer = Trainer(cfg, env, run_dir, meta)   data, model, strategy, optimizer; resumed from a checkpoint
    summary = trainer.train()                    train_step per step; evaluate, checkpoint when due; finish

What a step records and when is the Recorder's (ringexp.recorder); what parallelism means is the strategy's
(ringexp.parallel). A step that logs nothing waits for nothing: the loss is checked on the device and read on
logged steps only.
"""

import logging
import os
import time
from contextlib import nullcontext, suppress
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils._pytree import tree_map_only

from ringexp import backend, checkpoint, parallel, profiling, records, stop
from ringexp import dist as rdist
from ringexp.config import AMP_DTYPES, AmpMode
from ringexp.data import build_datasets
from ringexp.data.loader import batches, loaders
from ringexp.metrics import evaluate, state_bytes
from ringexp.models import build_model, param_bytes
from ringexp.optim import base_lr, build_optimizer
from ringexp.parallel.base import unwrap
from ringexp.recorder import Recorder

log = logging.getLogger("ringexp")
# The fp16 GradScaler starts at 65536, halves its scale on every step it skips (gradients with inf/NaN) and doubles it
# after 2000 clean ones. A healthy run's calibration stops well above 1 (16 skips in a row would reach it); below 1
# even the unscaled gradients overflow fp16, every step is being skipped, and the run stops (checked on logged steps).
MIN_LOSS_SCALE = 1.0


def forward_backward(model, micro_batches, k: int, autocast, scaler, no_sync) -> torch.Tensor:
    """k micro-batches into one optimizer step: each loss scaled by 1/k, gradients synchronised across ranks only
    on the last micro-batch (`no_sync(sync)` gives the context for each: the strategy's). Returns the step's mean
    loss (detached, on the device)."""
    total = None
    for i in range(k):
        x, y = next(micro_batches)
        with no_sync(i == k - 1):
            with autocast():
                logits = model(x)
            loss = F.binary_cross_entropy_with_logits(logits.float(), y) / k
            scaler.scale(loss).backward()
        total = loss.detach() if total is None else total + loss.detach()
    return total


def amp_context(mode: AmpMode, device: torch.device):
    if mode == AmpMode.off:
        return nullcontext
    return partial(torch.autocast, device.type, dtype=AMP_DTYPES[mode])


def resume_mode(cfg):
    """`resume` as configured; a restarted job (elastic restart, Slurm requeue) continues where it was."""
    restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)) + int(os.environ.get("SLURM_RESTART_COUNT", 0))
    return cfg.resume or ("auto" if restarts else None)


class Trainer:
    def __init__(self, cfg, env, run_dir, meta: dict):
        t_start = time.perf_counter()
        self.cfg, self.env, self.run_dir = cfg, env, Path(run_dir)
        self.mode = resume_mode(cfg)
        self.ckpt, self.skipped = checkpoint.choose(self.mode, run_dir, env)
        resumed = checkpoint.check(self.ckpt, cfg, env.world_size) if self.ckpt else {}
        self.start = resumed.get("step", 0)
        train_ds, val_ds, self.num_labels = build_datasets(cfg.data)
        self.train_loader, self.val_loader = loaders(cfg.data, train_ds, val_ds, env.rank, env.world_size, cfg.seed,
                                                     env.device.type == "cuda")
        torch.manual_seed(cfg.seed)  # same initial weights on every rank, whatever the strategy
        model = build_model(cfg.model, self.num_labels)
        rdist.seed_everything(cfg.seed, env.rank)
        self.strategy = parallel.build(cfg, env)
        wire = self.strategy.wire_bytes([p.shape for p in model.parameters() if p.requires_grad])
        self.recorder = Recorder(cfg, env, run_dir, meta, self.strategy, param_bytes(model), wire, t_start)
        self.clock = self.recorder.clock
        # what a batch looks like (every data set gives 3 x image_size x image_size), for DDP to settle its buckets
        example = torch.zeros(2, 3, cfg.data.image_size, cfg.data.image_size, device=env.device)
        self.model = self.strategy.wrap(model, self.recorder.comm_timer, example)
        self.no_samples = example[:0]  # the input of a forward with nothing to evaluate
        self.no_sync = partial(self.strategy.no_sync, self.model)
        # the learning rate and the rule that set it (optim.lr_rule against plain DDP's samples per update)
        self.rate = base_lr(cfg.optim, self.recorder.global_batch, parallel.samples_per_update(cfg, env.world_size),
                            env.world_size * cfg.data.batch_size)
        self.opt, self.sched = build_optimizer(self.model, cfg.optim, self.rate["lr"], cfg.steps,
                                               cfg.compression.momentum_correction)
        self.autocast = amp_context(cfg.amp.mode, env.device)
        self.scaler = self.strategy.grad_scaler()
        self.pos = {"epoch": 0, "batches": 0, "skipped": 0}  # where the training stream is (checkpointed)
        self.timer = {"data": 0.0}
        self.stream = batches(self.train_loader, env.device, self.timer, self.pos)
        # Counted on the device, read on logged steps: the first step whose loss was not finite (0: none yet), and
        # the steps the fp16 GradScaler skipped (their gradients held inf/nan).
        self.first_bad = torch.zeros((), dtype=torch.long, device=env.device)
        self.bad_loss = torch.zeros((), device=env.device)
        self.skipped_steps = torch.zeros((), dtype=torch.long, device=env.device)
        self.state, self.saved, self.prof, self.profile = None, self.ckpt, None, None
        self.resume(resumed.get("wandb_id"))

    def resume(self, wandb_id) -> None:
        """From a checkpoint, every state it holds; then open the records (a checkpoint that fails to load leaves
        them as they were); the RNG last: nothing may draw from it after."""
        own = checkpoint.load(self.ckpt, self.env, self.strategy, self.model, self.opt) if self.ckpt else None
        if own is not None:
            self.sched.load_state_dict(own["scheduler"])
            self.scaler.load_state_dict(own["scaler"])
            # (residuals and PowerSGD's factors were loaded onto the CPU; the hooks add them to gradients)
            self.strategy.load_state_dict(tree_map_only(torch.Tensor, lambda t: t.to(self.env.device), own["comm"]))
            self.pos.update(own["data"])
            self.skipped_steps.fill_(own["skipped_steps"])
        source = (self.ckpt.parent.parent if self.ckpt else self.run_dir) if self.mode else None
        self.recorder.open(self.start, source, wandb_id)
        log.info("rank %d/%d (pid %d) on %s: %s, global batch %d", self.env.rank, self.env.world_size, os.getpid(),
                 self.env.device, self.recorder.meta["name"], self.recorder.global_batch)
        if own is not None:
            for damaged in self.skipped:
                log.warning("skipped damaged checkpoint %s", damaged)
            log.info("resumed from %s (step %d)", self.ckpt, self.start)
            checkpoint.set_rng_state(own["rng"], self.env.device)

    def train(self):
        """Run the steps left; returns rank 0's summary (None on other ranks)."""
        cfg, ok = self.cfg, False
        try:
            self.recorder.step_done(excluded=True)  # the first step's time starts here, set-up left out
            for step in range(self.start + 1, cfg.steps + 1):
                stop.check()  # Ctrl-C or SIGTERM: stop here, between steps (ringexp.stop)
                evaluates = step % cfg.eval_every == 0 or step == cfg.steps
                saves = bool(cfg.checkpoint.every_steps and step % cfg.checkpoint.every_steps == 0) or step == cfg.steps
                row = self.train_step(step, due=evaluates or saves)
                if evaluates:
                    row |= self.evaluate(step)
                if row is not None:
                    self.recorder.write(row, step)
                if saves:
                    self.checkpoint(step)
                # evaluation and checkpoints stay out of the next step's time
                self.recorder.step_done(excluded=evaluates or saves)
            ok = True
        finally:
            if self.prof is not None:
                self.prof.stop()
            self.strategy.close()
            if not ok:
                self.recorder.close(ok=False)
        return self.finish()

    def train_step(self, step: int, due: bool = False):
        """One optimizer step (accumulation, AMP, the strategy's communication); its row when it logs one (always
        when `due` to evaluate or checkpoint)."""
        profiled = self.recorder.profiled
        if step == profiled.start:
            self.prof = profiling.start(self.env.device)
        self.timer["data"] = 0.0
        t0 = self.recorder.begin_step()
        loss = forward_backward(self.model, self.stream, self.cfg.accumulation.steps, self.autocast, self.scaler,
                                self.no_sync)
        t1 = self.clock.now()
        lr = self.optimizer_step(step, loss)
        t2 = self.clock.now()
        if self.prof is not None and step == profiled[-1]:
            pr = self.cfg.profile
            self.profile = profiling.finish(self.prof, self.run_dir, self.env.rank, profiled.start, step, pr.top,
                                            self.env.device, self.strategy.groups())
            self.prof = None
        row = self.recorder.record(step, loss, lr, (t0, t1, t2), self.timer["data"], self.pos["skipped"],
                                   self.skipped_steps, due)
        if row is not None:
            self.check_loss(step)
        return row

    def optimizer_step(self, step: int, loss) -> float:
        """Clip, step (through the GradScaler), schedule; returns the learning rate the step used."""
        scaler, opt = self.scaler, self.opt
        if self.cfg.optim.grad_clip:
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.optim.grad_clip)
        if scaler.is_enabled():  # the scaler skips a step whose gradients hold inf/nan and backs off its scale
            scale = scaler._scale.clone()  # (on the device: get_scale() would wait for it every step)
            scaler.step(opt)
            scaler.update()
            self.skipped_steps += scaler._scale < scale
        else:  # without a scaler nothing skips a non-finite loss: remember the first, stop at the next logged step
            opt.step()
            bad = ~torch.isfinite(loss) & (self.first_bad == 0)
            self.first_bad.masked_fill_(bad, step)
            self.bad_loss = torch.where(bad, loss, self.bad_loss)
        if self.state is None:  # what each rank holds once gradients and optimizer state exist
            self.state = state_bytes(self.model, opt)
        opt.zero_grad(set_to_none=True)
        self.strategy.after_step(step)  # (periodic averaging: its communication, timed as such)
        lr = self.sched.get_last_lr()[0]
        self.sched.step()
        return lr

    def check_loss(self, now: int) -> None:
        """Stop if a step since the start had a non-finite loss, or if fp16 loss scaling has been skipping steps
        past MIN_LOSS_SCALE (read here, on a logged step: no sync per step)."""
        step = int(self.first_bad)
        if step:
            raise FloatingPointError(f"loss is {float(self.bad_loss)} at step {step} on rank {self.env.rank} (checked "
                                     f"at step {now}); lower optim.lr, set optim.grad_clip, or check the data")
        scale = self.scaler.get_scale() if self.scaler.is_enabled() else MIN_LOSS_SCALE
        if scale < MIN_LOSS_SCALE:
            raise FloatingPointError(f"amp=fp16 skipped {int(self.skipped_steps)} of {now} steps (gradients with inf "
                                     f"or NaN; its loss scale fell to {scale:.3g}, where even unscaled gradients "
                                     "overflow fp16); lower optim.lr, or use amp=bf16")

    def evaluate(self, step: int) -> dict:
        """Validation loss, AUROC and F1 over the whole validation set (every rank its shard); their row entries."""
        with self.strategy.evaluating(self.model):
            val, scores = evaluate(unwrap(self.model), self.val_loader, self.num_labels, self.env.device,
                                   self.autocast, self.no_samples)
        return self.recorder.evaluation(step, val, scores)

    def checkpoint(self, step: int) -> None:
        own = {"rng": checkpoint.rng_state(self.env.device), "comm": self.strategy.state_dict(),
               "data": dict(self.pos), "scheduler": self.sched.state_dict(), "scaler": self.scaler.state_dict(),
               "skipped_steps": int(self.skipped_steps)}
        sinks = self.recorder.sinks
        self.saved = checkpoint.save(self.run_dir, step, self.cfg, self.env, self.strategy, self.model, self.opt, own,
                                     sinks and sinks.wandb_id)

    def finish(self):
        """The summary (rank 0; None elsewhere), once every step has run."""
        if self.state is None:  # resumed at the last step: nothing left to run
            self.state = state_bytes(self.model, self.opt)
        # unreadable images skipped (data.skip_bad): in training so far, and in the validation set
        val_skipped = self.recorder.evals[-1].get("skipped_bad", 0) if self.recorder.evals else 0
        extra = {"skipped_steps": int(self.skipped_steps), "data_skipped_bad": self.recorder.skipped_bad + val_skipped,
                 "lr_rule": self.rate, "checkpoint": str(self.saved) if self.saved else None,
                 "resumed_from": {"checkpoint": str(self.ckpt), "step": self.start, "skipped": self.skipped}
                 if self.ckpt else None}
        if self.recorder.meta.get("backend_env"):
            extra["backend_env"] = self.recorder.meta["backend_env"] | {"nccl_chose": self.nccl_chose()}
        return self.recorder.finish(self.state, extra, self.profile)

    def nccl_chose(self):
        """How often NCCL logged choosing each algorithm/protocol, over all ranks (collective); None where its log
        (NCCL_DEBUG, in force alike on every rank) was not on."""
        if self.env.backend != "nccl" or not self.recorder.meta["backend_env"]["env"].get("NCCL_DEBUG"):
            return None
        log_file = os.environ.get("NCCL_DEBUG_FILE", "")
        everyone = [backend.nccl_chose(log_file)] * self.env.world_size
        if Path(log_file).is_file():  # beside the run's other logs (best effort: a node may not see the run dir)
            with suppress(OSError):  # (write_file: a link planted at the name is replaced, not written through)
                records.write_file(self.run_dir / f"nccl-rank{self.env.rank}.log", Path(log_file).read_bytes())
        if self.env.world_size > 1:
            dist.all_gather_object(everyone, everyone[0])
        return backend.total(everyone)
