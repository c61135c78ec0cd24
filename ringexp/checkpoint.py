"""Checkpoints: everything a run needs to continue bit-for-bit, written atomically, the newest `keep` kept.

    <run dir>/checkpoints/step-00000050/
        meta.json   step, world size, what must match to resume, the W&B run id; rank 0 writes it last
        model.pt    model and optimizer (DDP family: rank 0 writes them, every rank holds the same)
        *.distcp    FSDP instead: torch.distributed.checkpoint, every rank writes its own shards
                    (how the model is saved and loaded is the strategy's: ringexp.parallel)
        rank<R>.pt  each rank's own: RNG states, compressor state (error-feedback residuals), data position,
                    LR schedule, GradScaler

Each rank writes its own small file rather than gathering it to rank 0: error-feedback residuals are as large
as the gradients, and N of them in rank 0's memory would be the largest thing in the job.

Every rank writes into step-N.tmp; when all have succeeded, rank 0 writes meta.json, with the size and SHA-256 of
every file, and renames the directory. A crash, a kill or a full disk while writing leaves the previous checkpoint
the newest complete one; a file damaged later (cut short, deleted, overwritten) is found by `damage` before
anything is loaded, and resume=auto then takes the newest intact checkpoint, saying which it skipped and why.
Loading uses torch.load(weights_only=True): a checkpoint holds tensors and plain values only.
"""

import contextlib
import fnmatch
import hashlib
import json
import os
import random
import shutil
import stat
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from ringexp import parallel, records
from ringexp.config import AmpMode
from ringexp.errors import CheckpointError, ConfigError, one_line

# What a run appends to in its directory and the directories it writes into: a symlink (or another kind of file) at
# one of these names is refused before the run starts (`planted`), since it would be written through, and it cannot
# be replaced without losing what the run wrote there. The files written whole (summary.json, config.yaml, .hydra/*,
# val_scores.pt, traces, NCCL log copies) replace a symlink at their name instead (records.write_file).
APPENDED = (records.METRICS, ".ringexp.lock", "rank*.log")
DIRECTORIES = ("checkpoints", ".hydra", "workers", "wandb")


def folder(run_dir) -> Path:
    return Path(run_dir) / "checkpoints"


def planted(run_dir, logs=()) -> None:
    """ConfigError naming the first symlink (or other kind of file) in `run_dir` where a run appends (APPENDED, and
    `logs`: Hydra's log files, wherever they are) or at a directory it writes into (DIRECTORIES)."""
    run_dir = Path(run_dir)
    try:
        names = sorted(e.name for e in os.scandir(run_dir))
    except OSError:  # not there yet: nothing planted in it
        names = []
    appended = [run_dir / n for n in names if any(fnmatch.fnmatchcase(n, p) for p in APPENDED)] + \
        [Path(p) for p in logs]
    for path, want in [(p, stat.S_ISREG) for p in appended] + [(run_dir / d, stat.S_ISDIR) for d in DIRECTORIES]:
        try:
            mode = os.lstat(path).st_mode
        except OSError:  # none there: the run makes it
            continue
        what = "a symbolic link" if stat.S_ISLNK(mode) else None if want(mode) else \
            "not a regular file" if want is stat.S_ISREG else "not a directory"
        if what:
            raise ConfigError(f"{path}: {what}, which ringexp does not write through; remove it (what it points to is "
                              "left as it is), or pick another hydra.run.dir")


def complete(run_dir) -> list:
    """Complete checkpoints of a run directory, oldest first (directories of their own, not symlinks to others)."""
    found = [p for p in folder(run_dir).glob("step-*") if p.suffix != ".tmp" and not p.is_symlink()
             and (p / "meta.json").is_file()]
    return sorted(found, key=lambda p: p.name)


def meta(path) -> dict:
    return records.read_json(Path(path) / "meta.json")


def find(resume, run_dir) -> tuple:
    """(the checkpoint to continue from, [the damaged ones skipped, each 'name: why']): None for a fresh start;
    resume=auto: the newest intact one in this run directory, if any; a path: that checkpoint, or a run
    directory's newest intact one. ConfigError naming the file when the one asked for is damaged or none is left."""
    if not resume:
        return None, []
    if resume == "auto":
        return newest_intact(run_dir, required=False)
    path = Path(resume)
    if (path / "meta.json").is_file():
        problem = damage(path)
        if problem:
            raise ConfigError(f"resume: {path}/{problem}; resume from another checkpoint (resume={path.parent.parent} "
                              "takes the newest intact one of that run)")
        return path, []
    return newest_intact(path, required=True)


def held(run_dir) -> list:
    """What `run_dir` holds of a run already: its rows, its checkpoints, its completed summary."""
    found = [(records.METRICS, os.path.lexists(Path(run_dir) / records.METRICS)),
             ("checkpoints", bool(complete(run_dir))), ("summary.json", completed_steps(run_dir) is not None)]
    return [name for name, there in found if there]


def completed_steps(run_dir) -> int | None:
    """The steps the run in `run_dir` completed, or None when it has not completed (or there is none). ConfigError
    when its summary.json cannot tell: a run whose records must not be rewritten cannot be told from one that may."""
    path = Path(run_dir) / records.SUMMARY
    if not os.path.lexists(path):
        return None
    try:
        summary = records.read_summary(run_dir)
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path} cannot be read ({e}), so whether the run there completed is unknown; fix or "
                          "remove it, or pick another hydra.run.dir") from None
    if not isinstance(summary, dict) or summary.get("status") != "completed":
        return None
    if type(summary.get("steps")) is not int or summary["steps"] < 1:
        raise ConfigError(f"{path} says the run completed but not after how many steps ({summary.get('steps')!r}); "
                          "fix or remove it, or pick another hydra.run.dir")
    return summary["steps"]


def resumable(mode, run_dir, steps: int) -> tuple:
    """`find`, then what the continuation would do to the records it writes into, refused (ConfigError) unless it
    rewrites nothing of a completed run and nothing of another run: only `steps` raised past a completed run's, from
    the checkpoint at its end, extends it. The rows it continues from must be readable."""
    planted(run_dir)  # (before anything is read there: a symlinked checkpoints/ holds another run's checkpoints)
    ckpt, skipped = find(mode, run_dir)
    run_dir = Path(run_dir)
    own = ckpt is None or ckpt.resolve().parent.parent == run_dir.resolve()
    if not own and held(run_dir):
        raise ConfigError(f"resume={ckpt} is another run's checkpoint, and {run_dir} already holds a run; resume it "
                          "into a new hydra.run.dir (its rows up to the checkpoint are copied there)")
    step = meta(ckpt)["step"] if ckpt else 0
    done = completed_steps(run_dir)
    if done is not None:
        why = (f"it holds no intact checkpoint to continue from{': ' + '; '.join(skipped) if skipped else ''}"
               if ckpt is None else f"raise steps above {done} to train it further" if steps <= done else
               f"its newest intact checkpoint is at step {step}: continuing from there would rewrite its records "
               "(resume=PATH into a new hydra.run.dir continues a copy)" if step < done else "")
        if why:
            raise ConfigError(f"{run_dir} holds a completed run of {done} steps; {why}")
    if step > steps:
        raise ConfigError(f"resume: {ckpt} is at step {step}, past steps={steps}; set steps={step} or more")
    if mode:
        try:
            records.read_rows(ckpt.parent.parent if ckpt else run_dir)
        except (OSError, ValueError) as e:
            raise ConfigError(f"resume: {e}; fix or remove the file (the run's rows continue from it)") from None
    return ckpt, skipped


def newest_intact(run_dir, required: bool) -> tuple:
    found, skipped = complete(run_dir), []
    for path in reversed(found):
        problem = damage(path)
        if problem is None:
            return path, skipped
        skipped.append(f"{path.name}: {problem}")
    if not found and required:
        raise ConfigError(f"resume={run_dir}: no complete checkpoint there; give a run directory with checkpoints/ "
                          "or a checkpoints/step-N directory (or resume=auto)")
    if skipped:
        raise ConfigError(f"resume: every checkpoint in {folder(run_dir)} is damaged ({'; '.join(skipped)}); remove "
                          "them to start over there, or resume from another run (resume=PATH)")
    return None, []


def digest(path: Path) -> str:
    with records.open_regular(path) as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def manifest(path: Path) -> dict:
    """Size and SHA-256 of every file of a checkpoint being written (what `damage` checks)."""
    return {p.name: {"bytes": p.stat().st_size, "sha256": digest(p)}
            for p in sorted(path.iterdir()) if p.is_file() and p.name != "meta.json"}


def meta_digest(m: dict) -> str:
    """meta.json's own checksum: the SHA-256 of its other keys, as canonical JSON."""
    rest = json.dumps({k: v for k, v in m.items() if k != "sha256"}, sort_keys=True)
    return hashlib.sha256(rest.encode()).hexdigest()


def meta_problem(m) -> str | None:
    """What makes `m` (a parsed meta.json) no checkpoint's meta as ringexp writes it, or None."""
    if not isinstance(m, dict) or not isinstance(m.get("fingerprint"), dict):
        return "is not a checkpoint's meta (no fingerprint)"
    if m.get("sha256") != meta_digest(m):
        return "does not match its own SHA-256 (edited, damaged, or written by an older ringexp)"
    step, world = m.get("step"), m.get("world_size")
    if type(step) is not int or step < 1 or type(world) is not int or world < 1:
        return f"holds step={step!r}, world_size={world!r}; both must be whole numbers >= 1"
    files = m.get("files")
    if not files:
        return "lists no files, so none of them can be verified"
    if not isinstance(files, dict) or not all(
            isinstance(k, str) and Path(k).name == k and k not in ("meta.json", ".", "..") and isinstance(v, dict)
            and type(v.get("bytes")) is int and isinstance(v.get("sha256"), str) for k, v in files.items()):
        return "has a malformed file list (each file needs its bytes and sha256)"
    missing = [f"rank{r}.pt" for r in range(world) if f"rank{r}.pt" not in files]
    if missing:
        return f"does not list {missing[0]} (world_size={world})"
    if str(m.get("strategy")) not in parallel.STRATEGIES or not isinstance(m.get("wandb_id"), str | None):
        return f"names strategy={m.get('strategy')!r}, wandb_id={m.get('wandb_id')!r}"
    return None


def damage(path) -> str | None:
    """What is wrong with a complete checkpoint, as 'file: why', or None if it is intact: meta.json unreadable or
    not a checkpoint's (ringexp's own checksum), a file it lists missing, not a regular file, of another size or
    checksum, a file it does not list, or what the strategy that wrote it finds in its own files."""
    path = Path(path)
    try:
        m = meta(path)
    except (OSError, ValueError) as e:
        return f"meta.json cannot be read ({e})"
    problem = meta_problem(m)
    if problem:
        return f"meta.json {problem}"
    extra = sorted({p.name for p in path.iterdir()} - set(m["files"]) - {"meta.json"})
    if extra:
        return f"{extra[0]} is not listed in meta.json (added afterwards)"
    for name, want in m["files"].items():
        if not os.path.lexists(path / name):
            return f"{name} is missing"
        try:
            with records.open_regular(path / name) as f:
                size = os.fstat(f.fileno()).st_size
                if size != want["bytes"]:
                    return f"{name} is {size} bytes, meta.json says {want['bytes']} (cut short or replaced)"
                if hashlib.file_digest(f, "sha256").hexdigest() != want["sha256"]:
                    return f"{name} does not match its SHA-256 in meta.json (damaged or replaced)"
        except OSError as e:
            return f"{name} cannot be read ({e.strerror or e})"
    return parallel.STRATEGIES[m["strategy"]].verify(path)


def choose(mode, run_dir, env) -> tuple:
    """`find`, by rank 0 (which reads every file once) for every rank: all continue from the same checkpoint."""
    answer = [None, [], None]
    if env.is_main:
        try:
            answer[:2] = find(mode, run_dir)
        except ConfigError as e:
            answer[2] = str(e)
    if dist.is_initialized() and env.world_size > 1:
        dist.broadcast_object_list(answer, src=0)
    if answer[2]:
        raise ConfigError(answer[2])
    return answer[0], answer[1]


ADDED_LATER = ("data.num_labels", "fp16 loss scaling (amp=fp16)")  # fingerprint keys older checkpoints lack


def fingerprint(cfg, world_size: int) -> dict:
    """What a checkpoint's contents depend on: resuming with any of it changed cannot continue the run."""
    return {"model.name": cfg.model.name, "model.width": cfg.model.width, "world size": world_size,
            "sharded": parallel.STRATEGIES[cfg.parallel.strategy].sharded, "compression.name": cfg.compression.name,
            "optim.name": str(cfg.optim.name), "data.num_labels": cfg.data.num_labels,
            "fp16 loss scaling (amp=fp16)": cfg.amp.mode == AmpMode.fp16}


def check(path, cfg, world_size: int) -> dict:
    """The checkpoint's meta, after checking that this configuration can continue it (ConfigError naming the
    first mismatch otherwise)."""
    m = meta(path)  # (`find` chose it: intact)
    now = fingerprint(cfg, world_size)
    for key, value in now.items():
        if key in ADDED_LATER and key not in m["fingerprint"]:  # written before ringexp recorded it
            continue
        saved = m["fingerprint"].get(key)
        if saved != value:
            raise ConfigError(f"resume: {path} was written with {key}={str(saved)[:80]}, this run has {key}={value}; "
                              "resume with the same setting, or start a new run (resume=null)")
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


def first_error(error, env):
    """The first rank's error (as 'rank R: Type: text'), agreed on by every rank; None if all succeeded."""
    mine = None if error is None else f"rank {env.rank}: {type(error).__name__}: {error}"
    errors = [mine]
    if dist.is_initialized() and env.world_size > 1:
        errors = [None] * env.world_size
        dist.all_gather_object(errors, mine)
    return next((e for e in errors if e is not None), None)


def save(run_dir, step: int, cfg, env, strategy, model, opt, own: dict, wandb_id=None) -> Path:
    """Write checkpoint `step` (collective: every rank calls it); returns its path. `own` is this rank's own state
    (rank<R>.pt). CheckpointError on every rank if any rank failed to write, the previous checkpoint left as it was."""
    final = folder(run_dir) / f"step-{step:08d}"
    tmp = final.with_suffix(".tmp")
    agreed = first_error(_attempt(env.is_main, _fresh_dir, tmp), env)
    if agreed is None:
        def write():
            records.make_dir(tmp)  # (still rank 0's real directory, not a symlink put there since)
            strategy.save(tmp, model, opt)
            records.save_tensors(tmp / f"rank{env.rank}.pt", own)
        agreed = first_error(_attempt(True, write), env)
    if agreed is None:
        m = {"step": step, "world_size": env.world_size, "fingerprint": fingerprint(cfg, env.world_size),
             "wandb_id": wandb_id, "strategy": str(cfg.parallel.strategy)}
        agreed = first_error(_attempt(env.is_main, _publish, tmp, final, m, cfg.checkpoint.keep), env)
    if agreed is not None:
        fail(run_dir, step, agreed, env)
    return final


def _attempt(mine: bool, fn, *args):
    """Run fn(*args) if it is this rank's to run; the error it raised (a full disk, a vanished directory), or None."""
    try:
        if mine:
            fn(*args)
    except Exception as e:
        return e
    return None


def _fresh_dir(tmp: Path) -> None:
    """step-N.tmp made anew in a real checkpoints/ (records.make_dir), whatever was at its name removed first."""
    records.make_dir(tmp.parent)
    remove(tmp)
    tmp.mkdir()


def remove(path: Path) -> None:
    """The checkpoint directory `path` removed, or whatever else is at its name: a symlink is unlinked, never followed
    (rmtree refuses one and, told to ignore errors, would leave it there for mkdir or rename to fail on)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISDIR(mode):
        shutil.rmtree(path, ignore_errors=True)
    else:
        os.unlink(path)


def _publish(tmp: Path, final: Path, m: dict, keep: int) -> None:
    """Rank 0, once every rank has written: meta.json last, then the rename that makes the checkpoint complete."""
    m["files"] = manifest(tmp)
    m["sha256"] = meta_digest(m)
    records.write_file(tmp / "meta.json", json.dumps(m, indent=2) + "\n", durable=True)
    remove(final)
    os.replace(tmp, final)
    records.fsync_dir(final.parent)
    for old in complete(final.parent.parent)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def fail(run_dir, step: int, error: str, env):
    if env.is_main:
        with contextlib.suppress(OSError):  # (the error said already is the one to report)
            remove(folder(run_dir) / f"step-{step:08d}.tmp")
    found = complete(run_dir)
    previous = f"the previous one, {found[-1]}, is intact (resume=auto continues from it)" if found else \
        "there is no earlier checkpoint"
    raise CheckpointError(f"checkpoint at step {step} not written ({error}); {previous}")


def load(path, env, strategy, model, opt) -> dict:
    """Model and optimizer (through the strategy) into the wrapped model; returns this rank's own state.
    CheckpointError naming the file when one cannot be loaded."""
    path = Path(path)
    try:
        strategy.load(path, model, opt)
    except CheckpointError:
        raise
    except Exception as e:
        raise CheckpointError(f"resume: {path}: the model cannot be loaded ({type(e).__name__}: "
                              f"{one_line(str(e))}); resume from another checkpoint (resume=PATH)") from None
    own = path / f"rank{env.rank}.pt"
    try:
        return records.load_tensors(own)
    except Exception as e:
        raise CheckpointError(f"resume: {own} cannot be loaded ({type(e).__name__}: {one_line(str(e))}); resume "
                              "from another checkpoint (resume=PATH)") from None
