"""Loaders for one rank: a training stream that a resumed run can continue mid-epoch, and a validation shard."""

import itertools
import time

import torch
from torch.utils.data import DataLoader, DistributedSampler, Subset

from ringexp import stop
from ringexp.data import collate
from ringexp.errors import DataError


class Sampler(DistributedSampler):
    """DistributedSampler that can begin an epoch part-way: a resumed run skips the batches it had consumed."""

    skip = 0  # samples

    def __iter__(self):
        return itertools.islice(super().__iter__(), self.skip, None)

    def __len__(self) -> int:
        return super().__len__() - self.skip


def loaders(cfg, train_ds, val_ds, rank: int, world_size: int, seed: int, cuda: bool):
    """(train loader, validation loader) for this rank; `cfg` is the data config."""
    bs = cfg.batch_size
    sampler = Sampler(train_ds, world_size, rank, shuffle=True, seed=seed, drop_last=True)
    # Loaders draw their worker seeds from generators of their own: the global RNG (dropout) then advances the
    # same way in a run and in its resumption, which restores the RNG at the step it continues from.
    kw = dict(num_workers=cfg.num_workers, pin_memory=cuda, persistent_workers=cfg.num_workers > 0,
              collate_fn=collate(cfg), worker_init_fn=quiet_worker)
    train = DataLoader(train_ds, batch_size=bs, sampler=sampler, drop_last=True,
                       generator=torch.Generator().manual_seed(seed), **kw)
    if len(train) == 0:
        raise DataError(f"data: {len(train_ds)} training samples cannot fill one batch of {bs} per rank; lower "
                        "data.batch_size")
    # A disjoint shard per rank (not DistributedSampler, which pads): each validation sample counts once.
    val = DataLoader(Subset(val_ds, range(rank, len(val_ds), world_size)), batch_size=2 * bs,
                     generator=torch.Generator().manual_seed(seed), **kw)
    return train, val


def quiet_worker(worker_id: int) -> None:
    """A loader worker ignores Ctrl-C sent to the whole process group: its trainer stops it."""
    stop.ignore()


def batches(loader, device, timer: dict, pos: dict):
    """Endless (x, y) on the device, from pos = {epoch, batches (consumed in that epoch), skipped}, which it keeps
    current for checkpoints. Data wait goes to timer['data'], unreadable samples dropped by the loader
    (data.skip_bad) to pos['skipped']."""
    sampler = loader.sampler
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
