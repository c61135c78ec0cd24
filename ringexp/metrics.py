"""What a run measures: validation quality (torchmetrics, whole set exactly once) and step statistics."""

import resource
import statistics
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ringexp.errors import DataError

# torchmetrics is imported where it is used: its package imports matplotlib, scipy.signal and torchvision with
# torch's compiler, about 4 s of CPU that a command refused before training (most of a refusal's start-up) never
# needs. A launcher that forks its workers calls preload() first, so that they share one import.


def preload() -> None:
    import torchmetrics  # noqa: F401


def peak_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    # ru_maxrss is in KiB on Linux, bytes on macOS
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss if sys.platform == "darwin" else rss * 1024


@torch.no_grad()
def evaluate(model, loader, num_labels: int, device: torch.device, autocast, empty: torch.Tensor) -> tuple:
    """Validation loss, macro/micro AUROC and F1@0.5 over the whole validation set, every rank its shard; and the
    scores behind them, (probabilities, labels) of every sample on the CPU, for the quality tests (ringexp.quality).

    The loader must hold a disjoint shard per rank (not DistributedSampler, which pads by repeating samples);
    the shards' predictions are gathered, uneven or empty (a shard whose images were all unreadable), so every
    sample counts exactly once. `empty`: an input batch of no samples, for the forwards a rank runs with nothing
    left to evaluate.
    """
    was_training = model.training
    model.eval()
    loss_count = torch.zeros(3, device=device, dtype=torch.float64)  # loss sum, samples, unreadable samples
    # Shards may differ by a batch; a sharded model (FSDP) gathers parameters in every forward, so each rank
    # runs as many forwards as the longest shard (the extra ones on an empty batch).
    forwards = torch.tensor([len(loader)], device=device)
    if dist.is_initialized():
        dist.all_reduce(forwards, op=dist.ReduceOp.MAX)
    probs, targets = [torch.zeros(0, num_labels, device=device)], [torch.zeros(0, num_labels, device=device)]
    for batch in loader:
        if batch is None:  # nothing readable in it (data.skip_bad): made up by an empty forward below
            continue
        x, y = batch[0].to(device, non_blocking=True), batch[1].to(device, non_blocking=True)
        with autocast():
            logits = model(x).float()
        loss_count[0] += F.binary_cross_entropy_with_logits(logits, y, reduction="sum") / num_labels
        loss_count[1] += len(y)
        probs.append(torch.sigmoid(logits))
        targets.append(y)
    for _ in range(int(forwards) - (len(probs) - 1)):
        with autocast():
            model(empty)
    model.train(was_training)
    loss_count[2] = len(loader.dataset) - loss_count[1]  # dropped by data.skip_bad
    probs, targets = torch.cat(probs), torch.cat(targets)
    if dist.is_initialized() and dist.get_world_size() > 1:
        from torchmetrics.utilities.distributed import gather_all_tensors

        dist.all_reduce(loss_count)
        probs, targets = torch.cat(gather_all_tensors(probs)), torch.cat(gather_all_tensors(targets))
    if loss_count[1] == 0:
        raise DataError(f"none of the {int(loss_count[2])} validation images could be read (data.skip_bad skipped "
                        "them all); fix the images or the CSV")
    out = {k: float(v) for k, v in quality(probs, targets.int(), num_labels).items()}
    out["loss"] = float(loss_count[0] / loss_count[1])
    out["samples"] = int(loss_count[1])
    out["skipped_bad"] = int(loss_count[2])
    return out, (probs.cpu(), targets.to(torch.uint8).cpu())


def quality(probs: torch.Tensor, targets: torch.Tensor, num_labels: int) -> dict:
    """Macro and micro AUROC and F1@0.5 of the whole set (already gathered: no synchronisation here)."""
    from torchmetrics import MetricCollection
    from torchmetrics.classification import MultilabelAUROC, MultilabelF1Score

    metrics = MetricCollection({
        "auroc_macro": MultilabelAUROC(num_labels, average="macro", sync_on_compute=False),
        "auroc_micro": MultilabelAUROC(num_labels, average="micro", sync_on_compute=False),
        "f1_macro": MultilabelF1Score(num_labels, threshold=0.5, average="macro", sync_on_compute=False),
        "f1_micro": MultilabelF1Score(num_labels, threshold=0.5, average="micro", sync_on_compute=False),
    }).to(probs.device)
    metrics.update(probs, targets)
    return metrics.compute()


def local_bytes(t: torch.Tensor) -> int:
    """Bytes this rank holds of `t` (its shard, for FSDP's DTensors)."""
    t = t.to_local() if hasattr(t, "to_local") else t
    return t.numel() * t.element_size()


def state_bytes(model, opt) -> dict:
    """Bytes of parameters, gradients and optimizer state held by this rank: what sharding divides."""
    params = list(model.parameters())
    out = {"params_bytes": sum(local_bytes(p) for p in params),
           "grads_bytes": sum(local_bytes(p.grad) for p in params if p.grad is not None),
           "optimizer_bytes": sum(local_bytes(v) for s in opt.state.values() for v in s.values() if torch.is_tensor(v))}
    out["state_bytes"] = sum(out.values())
    return out


def median(values: list):
    return statistics.median(values) if values else None


def spread(values: list) -> dict:
    """Median with its spread; the machines are noisy, so medians and percentiles, not means."""
    if not values:
        return {"median": None, "p10": None, "p90": None, "min": None, "max": None, "n": 0}
    v = sorted(values)
    q = statistics.quantiles(v, n=10, method="inclusive") if len(v) > 1 else [v[0]] * 9
    return {"median": statistics.median(v), "p10": q[0], "p90": q[-1], "min": v[0], "max": v[-1], "n": len(v)}
