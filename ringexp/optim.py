"""The optimizer and its schedule: AdamW or SGD, linear warm-up then cosine decay, from a learning rate that may
follow the samples behind one update (optim.lr_rule: lr_factor)."""

import math
from functools import partial

import torch

from ringexp.config import LrRule, OptimName


def lr_factor(rule: LrRule, name: OptimName, effective: int, reference: int) -> float:
    """What optim.lr is multiplied by under `rule` when one optimizer update of a replica stands on `effective`
    samples where plain DDP's stands on `reference` (world size x data.batch_size): their ratio (linear) or its
    square root (sqrt), so that a larger batch, which makes fewer updates over the same samples, makes longer ones;
    none: 1. For optimizer `name` where the rule is auto (see resolved)."""
    ratio = effective / reference
    return {LrRule.none: 1.0, LrRule.linear: ratio, LrRule.sqrt: math.sqrt(ratio)}[resolved(rule, name)]


def resolved(rule: LrRule, name: OptimName) -> LrRule:
    """auto as the rule it stands for: linear for SGD (Goyal et al. 2017), sqrt for AdamW, whose update is
    normalised by the gradients' second moment (Malladi et al. 2022: square-root scaling for adaptive optimizers)."""
    if rule != LrRule.auto:
        return rule
    return LrRule.linear if name == OptimName.sgd else LrRule.sqrt


def base_lr(ocfg, global_batch: int, effective: int, reference: int) -> dict:
    """The learning rate the schedule starts from (before warm-up and decay) and what made it, as records hold it:
    {"rule": none, linear or sqrt (auto resolved), or scale_lr (optim.scale_lr: global batch / base_batch_size),
    "factor", "lr"}. `effective`, `reference`: see lr_factor (config.OptimConfig refuses scale_lr with a rule)."""
    if ocfg.scale_lr:
        rule, factor = "scale_lr", global_batch / ocfg.base_batch_size
    else:
        rule, factor = resolved(ocfg.lr_rule, ocfg.name), lr_factor(ocfg.lr_rule, ocfg.name, effective, reference)
    return {"rule": str(rule), "factor": factor, "lr": ocfg.lr * factor}


def build_optimizer(model, ocfg, lr: float, total_steps: int, momentum_in_compressor: bool = False):
    """(optimizer, LR scheduler) for `ocfg` (the optim config) starting from `lr` (base_lr's, where the rules apply;
    optim.lr as it is where the rate does not matter). `momentum_in_compressor`: DGC's momentum correction applies
    SGD's momentum before compression (ringexp.compress.feedback), so the optimizer runs without it."""
    kw = {"lr": lr, "weight_decay": ocfg.weight_decay, "fused": fused_ok(model, ocfg.name) or None}
    if ocfg.name == OptimName.sgd:
        opt = torch.optim.SGD(model.parameters(), momentum=0.0 if momentum_in_compressor else ocfg.momentum, **kw)
    else:
        opt = torch.optim.AdamW(model.parameters(), **kw)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, partial(warmup_cosine, warmup=ocfg.warmup_steps, total=total_steps, floor=ocfg.min_lr_ratio))
    return opt, sched


def fused_ok(model, name: OptimName = OptimName.adamw) -> bool:
    """Whether torch's fused kernels apply: one pass over all parameters instead of a loop per tensor, e.g. AdamW on
    ResNet-18 in 18 ms instead of 80 ms on one CPU core (measured; on 4 ranks sharing 2 cores the loop was as long
    as the backward pass). They exist for floating-point parameters on CPU and CUDA; elsewhere torch's default. On
    FSDP2's sharded parameters (DTensors) torch has a sharding rule for fused AdamW but none for fused SGD
    (aten._fused_sgd_ raises NotImplementedError in the workers): SGD then takes torch's default."""
    params = list(model.parameters())
    if name == OptimName.sgd:
        from torch.distributed.tensor import DTensor  # (here: a second of start-up for every command)

        if any(isinstance(p, DTensor) for p in params):
            return False
    return all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)


def warmup_cosine(step: int, warmup: int, total: int, floor: float) -> float:
    """LR multiplier: linear warm-up to 1 over `warmup` steps, then cosine down to `floor` at `total`."""
    if step < warmup:
        return (step + 1) / warmup
    t = min(1.0, (step - warmup) / max(1, total - warmup))
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * t))
