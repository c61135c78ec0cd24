"""Checkpoints: everything a run needs to continue bit-for-bit, written atomically, the newest `keep` kept.

    <run dir>/checkpoints/step-00000050/
        meta.json   step, world size, what must match to resume, the W&B run id; rank 0 writes it last
        model.pt    model and optimizer (DDP family: rank 0 writes them, every rank holds the same)
        *.distcp    FSDP instead: torch.distributed.checkpoint, every rank writes its own shards
        rank<R>.pt  each rank's own: RNG states, compressor state (error-feedback residuals), data position,
                    LR schedule, GradScaler

Each rank writes its own small file rather than gathering it to rank 0: error-feedback residuals are as large
as the gradients, and N of them in rank 0's memory would be the largest thing in the job.

Every rank writes into step-N.tmp; when all have succeeded, rank 0 writes meta.json and renames the directory.
A crash, a kill or a full disk while writing leaves the previous checkpoint the newest complete one.
Loading uses torch.load(weights_only=True): a checkpoint holds tensors and plain values only.
"""

import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from ringexp.config import ConfigError

SHARDED = ("fsdp",)


class CheckpointError(RuntimeError):
    """A checkpoint could not be written; the previous one is intact."""


def folder(run_dir) -> Path:
    return Path(run_dir) / "checkpoints"


def complete(run_dir) -> list:
    """Complete checkpoints of a run directory, oldest first."""
    found = [p for p in folder(run_dir).glob("step-*") if p.suffix != ".tmp" and (p / "meta.json").is_file()]
    return sorted(found, key=lambda p: p.name)


def meta(path) -> dict:
    return json.loads((Path(path) / "meta.json").read_text())


def find(resume, run_dir):
    """The checkpoint to continue from: None (a fresh start), auto (the newest in this run directory, if any),
    or a path to a checkpoint or to a run directory (its newest); ConfigError if the path holds none."""
    if not resume:
        return None
    if resume == "auto":
        found = complete(run_dir)
        return found[-1] if found else None
    path = Path(resume)
    if (path / "meta.json").is_file():
        return path
    found = complete(path)
    if not found:
        raise ConfigError(f"resume={resume}: no complete checkpoint there; give a run directory with checkpoints/ "
                          "or a checkpoints/step-N directory (or resume=auto)")
    return found[-1]


def fingerprint(cfg, world_size: int) -> dict:
    """What a checkpoint's contents depend on: resuming with any of it changed cannot continue the run."""
    return {"model.name": cfg.model.name, "model.width": cfg.model.width, "world size": world_size,
            "sharded": str(cfg.parallel.strategy) in SHARDED, "compression.name": cfg.compression.name,
            "optim.name": str(cfg.optim.name)}


def check(path, cfg, world_size: int) -> dict:
    """The checkpoint's meta, after checking that this configuration can continue it (ConfigError naming the
    first mismatch otherwise)."""
    try:
        m = meta(path)
    except (OSError, ValueError) as e:
        raise ConfigError(f"resume: {path}/meta.json cannot be read ({e}); pick another checkpoint") from None
    now = fingerprint(cfg, world_size)
    for key, value in now.items():
        if m["fingerprint"].get(key) != value:
            raise ConfigError(f"resume: {path} was written with {key}={m['fingerprint'].get(key)}, this run has "
                              f"{key}={value}; resume with the same setting, or start a new run (resume=null)")
    return m


def rng_state(device) -> dict:
    np_state = np.random.get_state()
    state = {"torch": torch.get_rng_state(), "python": random.getstate(),
             "numpy": {"keys": torch.from_numpy(np_state[1].astype(np.int64)), "pos": np_state[2],
                       "has_gauss": np_state[3], "gauss": np_state[4]}}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict, device) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    n = state["numpy"]
    np.random.set_state(("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    if device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)


def comm_state_dict(model):
    """The communication hook's state: ringexp's compressor (residuals, DGC momentum, step counts) or PyTorch's
    PowerSGD (its error feedback and warm-start factors)."""
    from ringexp.compress import powersgd

    s = getattr(model, "comm_state", None)
    if s is None:
        return None
    if hasattr(s, "compressor"):
        return s.compressor.state_dict() if s.compressor is not None else None
    return powersgd.state_dict(s)


def load_comm_state(model, d) -> None:
    from ringexp.compress import powersgd

    s = getattr(model, "comm_state", None)
    if d is None or s is None:
        return
    if hasattr(s, "compressor"):
        s.compressor.load_state_dict(d)
    else:
        powersgd.load_state_dict(s, d)


def first_error(error, env):
    """The first rank's error (as 'rank R: Type: text'), agreed on by every rank; None if all succeeded."""
    mine = None if error is None else f"rank {env.rank}: {type(error).__name__}: {error}"
    errors = [mine]
    if dist.is_initialized() and env.world_size > 1:
        errors = [None] * env.world_size
        dist.all_gather_object(errors, mine)
    return next((e for e in errors if e is not None), None)


def save(run_dir, step: int, cfg, env, model, opt, local: dict, wandb_id=None) -> Path:
    """Write checkpoint `step` (collective: every rank calls it); returns its path. CheckpointError on every rank
    if any rank failed to write, with the previous checkpoint left as it was."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    final = folder(run_dir) / f"step-{step:08d}"
    tmp = final.with_suffix(".tmp")
    error = None
    if env.is_main:
        try:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        except OSError as e:
            error = e
    if (agreed := first_error(error, env)) is not None:
        return fail(run_dir, step, agreed, env)
    try:
        if str(cfg.parallel.strategy) in SHARDED:
            import torch.distributed.checkpoint as dcp

            msd, osd = get_state_dict(model, opt)
            dcp.save({"model": msd, "optimizer": osd}, checkpoint_id=tmp)
        elif env.is_main:
            write(tmp / "model.pt", {"model": unwrap(model).state_dict(), "optimizer": opt.state_dict()})
        write(tmp / f"rank{env.rank}.pt", local)
    except Exception as e:  # a full disk, a vanished directory: every rank must hear of it
        error = e
    agreed = first_error(error, env)
    if agreed is None and env.is_main:
        try:
            m = {"step": step, "world_size": env.world_size, "fingerprint": fingerprint(cfg, env.world_size),
                 "wandb_id": wandb_id, "strategy": str(cfg.parallel.strategy)}
            write_text(tmp / "meta.json", json.dumps(m, indent=2) + "\n")
            shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)
            fsync_dir(final.parent)
            for old in complete(run_dir)[:-cfg.checkpoint.keep]:
                shutil.rmtree(old, ignore_errors=True)
        except OSError as e:
            error = e
    if (agreed := first_error(error, env)) is not None:
        return fail(run_dir, step, agreed, env)
    return final


def fail(run_dir, step: int, error: str, env):
    if env.is_main:
        shutil.rmtree(folder(run_dir) / f"step-{step:08d}.tmp", ignore_errors=True)
    found = complete(run_dir)
    previous = f"the previous one, {found[-1]}, is intact (resume=auto continues from it)" if found else \
        "there is no earlier checkpoint"
    raise CheckpointError(f"checkpoint at step {step} not written ({error}); {previous}")


def write(path: Path, obj) -> None:
    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())


def write_text(path: Path, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def unwrap(model):
    return getattr(model, "module", model)


def read(path: Path):
    return torch.load(path, map_location="cpu", weights_only=True)


def load_model(path, cfg, model):
    """DDP family: the model's weights, into the bare model on every rank, before the strategy wraps it;
    returns the optimizer's state for `load_after_wrap` (None for FSDP, which loads both after wrapping)."""
    if str(cfg.parallel.strategy) in SHARDED:
        return None
    saved = read(Path(path) / "model.pt")
    unwrap(model).load_state_dict(saved["model"])
    return saved["optimizer"]


def load_after_wrap(path, cfg, env, model, opt, opt_state) -> dict:
    """The optimizer (and FSDP's sharded model) into the wrapped model; returns this rank's own state."""
    path = Path(path)
    if str(cfg.parallel.strategy) in SHARDED:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        msd, osd = get_state_dict(model, opt)
        state = {"model": msd, "optimizer": osd}
        dcp.load(state, checkpoint_id=path)
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    else:
        opt.load_state_dict(opt_state)
    return read(path / f"rank{env.rank}.pt")
