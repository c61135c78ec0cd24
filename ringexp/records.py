"""The files of a run directory, written and read in one place.

    summary.json     the run's outcome: the full summary, or {"status": "failed", "error": ...}
    metrics.jsonl    one JSON row per logged step (ringexp.sinks.JsonlSink appends them)
    checkpoints/     tensors written durably (fsync) and read with torch.load(weights_only=True)

`read_rows` is the one reader of metrics.jsonl (compare, resume and tests use it): a line cut short by a killed
run is dropped, never fatal.
"""

import contextlib
import errno
import fcntl
import json
import os
import tempfile
from pathlib import Path

import torch

from ringexp.errors import RunDirTaken

METRICS, SUMMARY = "metrics.jsonl", "summary.json"


def read_rows(run_dir) -> list:
    """metrics.jsonl as a list of rows ([] when there is none yet); a line cut short by a kill is dropped."""
    path = Path(run_dir) / METRICS
    rows = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int):
            rows.append(row)
    return rows


def rewind(run_dir, source, step: int) -> list:
    """metrics.jsonl of `run_dir` made the rows of `source` (the run a checkpoint came from, often the same) up to
    `step`, rewritten atomically; a resumed run then appends without duplicate steps. Returns those rows."""
    rows = [r for r in read_rows(source) if r["step"] <= step]
    tmp = Path(run_dir) / f"{METRICS}.tmp"
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    os.replace(tmp, Path(run_dir) / METRICS)
    return rows


def read_summary(run_dir) -> dict:
    return json.loads((Path(run_dir) / SUMMARY).read_text())


def write_summary(run_dir, summary: dict) -> None:
    """summary.json, replaced atomically: a reader sees the old one or the new one, never half of either."""
    tmp = Path(run_dir) / f"{SUMMARY}.tmp"
    try:
        tmp.write_text(json.dumps(summary, indent=2) + "\n")
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, Path(run_dir) / SUMMARY)


def mark_failed(run_dir, error: str) -> None:
    """A summary.json that says the run failed and why; metrics.jsonl, checkpoints and logs stay as they are. A
    completed run's summary is never replaced: a failed or interrupted resumption of it leaves it as it was (its
    failure is in the one line printed, the exit code and the workers' logs)."""
    try:
        if read_summary(run_dir).get("status") == "completed":
            return
    except (OSError, ValueError, AttributeError):  # none yet, or unreadable
        pass
    with contextlib.suppress(OSError):  # a full disk: the one line printed says it all, and nothing is lost
        write_summary(run_dir, {"status": "failed", "error": error})


def cannot_write(path):
    """The OSError that stops 64 KiB from being written into directory `path`, or None."""
    try:
        with tempfile.TemporaryFile(dir=path) as f:
            f.write(b"\0" * 65536)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        return e
    return None


def disk_full(path) -> bool:
    """True when the file system holding `path` cannot take 64 KiB more: the cause to name when a job failed with
    an error that hides it (an empty error file, a JSON file cut short)."""
    e = cannot_write(path)
    return e is not None and e.errno in (errno.ENOSPC, errno.EDQUOT)


def save_tensors(path: Path, obj) -> None:
    """torch.save, flushed to disk before returning (a checkpoint is complete only when its meta.json is)."""
    with open(path, "wb") as f:
        try:
            torch.save(obj, f)
            f.flush()
        except RuntimeError:
            # torch's zip writer reports a write that failed (a full disk) as a position mismatch ("unexpected
            # pos"); one more byte asks the file system itself, whose error says what to do.
            f.write(b"\0")
            f.flush()
            raise
        os.fsync(f.fileno())


def load_tensors(path: Path):
    """Tensors and plain values only: a checkpoint from someone else cannot run code on load."""
    return torch.load(path, map_location="cpu", weights_only=True)


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


@contextlib.contextmanager
def run_lock(run_dir):
    """Hold `run_dir` for this run: a second run started into it at the same time gets RunDirTaken. An advisory
    lock (flock) on a file in the directory: the kernel releases it when the process ends, however it ends."""
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    with open(Path(run_dir) / ".ringexp.lock", "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            raise RunDirTaken(f"{run_dir}: another run is writing there now (pid {f.read().strip() or '?'}); wait "
                              "for it, or pick another hydra.run.dir") from None
        f.truncate(0)
        f.write(str(os.getpid()))
        f.flush()
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
