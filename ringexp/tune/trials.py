"""Trials: one training run each, through the user's launcher, recorded in trials.jsonl whatever its end.

    command(text)                  the training command a trial runs (tune.command, else this Python's train)
    run(cmd, overrides, where, timeout)
                                   run one; a record of how it ended: completed (its throughput, step, wall time),
                                   refused (exit 2: the configuration), timeout, out of memory or crashed (the
                                   reason, from the run's summary or the last line it printed)
    Log(path)                      trials.jsonl: every record by key, appended and flushed one line at a time, so
                                   that a tune killed at any point continues from what it recorded
"""

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from ringexp import records
from ringexp.errors import one_line

LOG = "trial.log"  # a trial's own output, in its directory


def command(text: str) -> list:
    return shlex.split(text) if text.strip() else [sys.executable, "-m", "ringexp.train"]


def multirun(overrides: list) -> bool:
    """A launcher override (hydra/launcher=slurm): the trial runs as a one-job Hydra sweep through it."""
    return any(o.startswith("hydra/launcher=") for o in overrides)


def argv(cmd: list, overrides: list, where: Path) -> tuple:
    """(the command line, the run directory it writes)."""
    if multirun(overrides):
        return [*cmd, "-m", *overrides, f"hydra.sweep.dir={where}"], where / "0"
    return [*cmd, *overrides, f"hydra.run.dir={where}"], where


def run(cmd: list, overrides: list, where: Path, timeout: float) -> dict:
    """Run one trial into `where` (a directory of a tune's: anything left there by an attempt a kill cut short is
    removed first) and return its record. Ctrl-C stops the trial (its process group) and is raised again."""
    if where.exists():
        shutil.rmtree(where)
    where.mkdir(parents=True)
    line, run_dir = argv(cmd, overrides, where)
    start = time.monotonic()
    with open(where / LOG, "w") as log:
        p = subprocess.Popen(line, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            stop(p)
            return ended(start, run_dir, "timeout", f"stopped after {timeout:.0f} s (tune.trial_timeout_s)")
        except KeyboardInterrupt:
            stop(p, signal.SIGINT)
            raise
    return outcome(code, start, run_dir, where / LOG)


def stop(p, sig=signal.SIGTERM, grace: float = 30.0) -> None:
    """Stop the trial's whole process group (its workers too): `sig`, then SIGKILL after `grace` seconds."""
    for s, wait in ((sig, grace), (signal.SIGKILL, None)):
        try:
            os.killpg(p.pid, s)
        except ProcessLookupError:
            return
        try:
            p.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def ended(start: float, run_dir: Path, status: str, reason: str) -> dict:
    return {"status": status, "reason": reason, "wall_s": time.monotonic() - start, "dir": str(run_dir)}


def outcome(code: int, start: float, run_dir: Path, log: Path) -> dict:
    """The record of a trial that exited with `code`."""
    try:
        summary = records.read_summary(run_dir)
    except (OSError, ValueError):
        summary = None
    if code == 0 and summary and summary.get("status") == "completed":
        t = summary["throughput"]
        return ended(start, run_dir, "completed", "") | {
            "samples_s": t["median"], "samples_s_p10": t["p10"], "samples_s_p90": t["p90"],
            "step_s": summary["step_time_s"]["median"] if isinstance(summary.get("step_time_s"), dict)
            else summary.get("step_time_s"), "run_wall_s": summary.get("wall_time_s"),
            "auroc": summary["final"]["auroc_macro"]}
    said = (summary or {}).get("error") or last_line(log)
    if code == 2:
        return ended(start, run_dir, "refused", said)
    if "out of memory" in said.lower():
        return ended(start, run_dir, "out of memory", said)
    return ended(start, run_dir, "crashed", f"exit code {code}: {said}")


def last_line(log: Path) -> str:
    """The last line a trial printed (its error, where it said one), on one line."""
    try:
        lines = [x for x in log.read_text(errors="replace").splitlines() if x.strip()]
    except OSError:
        return "no output"
    said = [x for x in lines if "error" in x.lower()]
    return one_line((said or lines or ["no output"])[-1])[:500]


class Log:
    """trials.jsonl: {key: record}, read back on resume (a line a kill cut short is dropped)."""

    def __init__(self, path: Path):
        self.path, self.done = path, {}
        if path.exists():
            for line in path.read_text().splitlines():
                try:
                    r = json.loads(line)
                    self.done[r["key"]] = r
                except (ValueError, KeyError, TypeError):
                    continue

    def add(self, record: dict) -> dict:
        self.done[record["key"]] = record
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())
        return record
