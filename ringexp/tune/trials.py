"""Trials: one training run each, through the user's launcher, recorded in trials.jsonl whatever its end.

    command(text)                  the training command a trial runs (tune.command, else this Python's train)
    run(cmd, overrides, out, key, timeout)
                                   run one into the tune `out`'s trials/KEY; a record of how it ended: completed
                                   (its throughput, step, wall time), refused (exit 2: the configuration),
                                   timeout, out of memory or crashed (the reason, from the run's summary or the
                                   last line it printed)
    Log(path, out)                 trials.jsonl: every record by key, appended and flushed one line at a time, so
                                   that a tune killed at any point continues from what it recorded; a line that
                                   is no record of this tune's is named and skipped (that trial runs again)

A trial's first process is ringexp.tune.keeper, which stops the trial when the tune dies, however it dies; and a
trial's directory is reused only once no live run holds it (records.holder). Every trial's directory, run or read
back, must lie inside the tune with every link on the way followed (`where`): trials/ or a trial's directory
swapped for a link to elsewhere would have a directory there removed, and a run written or read there.
"""

import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from ringexp import records
from ringexp.errors import ConfigError, one_line, print_warning

LOG = "trial.log"  # a trial's own output, in its directory
TRIALS = "trials"  # the tune's folder of trial directories, one per key
PHASES = ("diagnose", "predict", "try", "verify")


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


def run(cmd: list, overrides: list, out: Path, key: str, timeout: float) -> dict:
    """Run one trial into the tune `out`'s trial directory `key` (anything left there by an attempt a kill cut short
    is removed first, once no live run holds it) and return its record. Ctrl-C stops the trial (its process group)
    and is raised again."""
    here = where(out, key)
    clear(here, timeout)
    records.make_dir(here)
    line, run_dir = argv(cmd, overrides, here)
    start = time.monotonic()
    with records.open_append(here / LOG) as log:
        p = subprocess.Popen([sys.executable, "-m", "ringexp.tune.keeper", str(os.getpid()), *line], stdout=log,
                             stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            stop(p)
            return ended(start, run_dir, "timeout", f"killed after {time.monotonic() - start:.0f} s, over its time "
                         f"limit (tune.trial_timeout_s={timeout:g})")
        except KeyboardInterrupt:
            stop(p, signal.SIGINT)
            raise
    return outcome(code, start, run_dir, here / LOG)


def where(out: Path, key: str) -> Path:
    """Trial `key`'s directory in the tune `out`; ConfigError unless it lies inside `out` with every link on the way
    followed (records.inside)."""
    return inside(out, out / TRIALS / key)


def inside(out: Path, path) -> Path:
    """`path`, where it lies inside the tune `out` with every link on the way followed; ConfigError otherwise."""
    try:
        records.inside(out, path)
    except OSError as e:
        raise ConfigError(f"{e.filename}: {e.strerror}; remove the link (what it points to is left as it is), then "
                          "run the same command again") from None
    return Path(path)


def clear(where: Path, wait_s: float) -> None:
    """`where` removed, once no live run holds it (or one run below it: a sweep's job): a run left by a killed start
    of this tune is waited for, up to `wait_s` (its keeper is stopping it), never deleted under it."""
    if not os.path.lexists(where):
        return
    deadline, said = time.monotonic() + wait_s, False
    while (pid := live_holder(where)) is not None:
        if time.monotonic() > deadline:
            raise ConfigError(f"{where}: a run started by an earlier start of this tune still writes there (pid "
                              f"{pid}); stop it (kill {pid}), then give the same command again")
        if not said:
            print_warning(f"{where}: waiting for the run still writing there (pid {pid}), left by an earlier start "
                          "of this tune")
            said = True
        time.sleep(0.5)
    if where.is_symlink() or not where.is_dir():
        where.unlink()
    else:
        shutil.rmtree(where)


def live_holder(where: Path):
    """The pid of a live run holding `where` or its sweep's job directory (`where`/0: never a link, which the tune
    did not make and does not follow), else None."""
    jobs = [] if os.path.islink(where / "0") else [where / "0"]
    return next((pid for d in (where, *jobs) if (pid := records.holder(d)) is not None), None)


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
    """The record of a trial that exited with `code`. A run whose summary says it completed counts as completed
    whatever its exit code: rank 0 writes that summary last, after the final evaluation, and torch 2.14.1's gloo
    can abort a process as it exits after that ("terminate called without an active exception", about 1 run in
    8, a plain torch loop too), which took 2 of the averaging tune's 47 full-length runs (its baseline and 46
    verification runs); the code is recorded."""
    try:
        summary = records.read_summary(run_dir)
    except (OSError, ValueError):
        summary = None
    if summary and summary.get("status") == "completed":
        t, (rate, step), best = summary["throughput"], records.run_rate(summary), summary.get("best") or {}
        return ended(start, run_dir, "completed", "" if code == 0 else f"exit code {code} after its summary") | {
            "samples_s": rate, "samples_s_p10": t["p10"], "samples_s_p90": t["p90"], "step_s": step,
            "run_wall_s": summary.get("wall_time_s"),
            "auroc": summary["final"]["auroc_macro"], "f1": summary["final"].get("f1_macro"),
            "best_auroc": best.get("auroc_macro"), "best_f1": best.get("f1_macro"),
            "loss": (summary.get("loss") or {}).get("last"), "lr_rule": summary.get("lr_rule"),
            "samples": summary.get("steps", 0) * summary.get("global_batch_size", 0) or None}
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
    """trials.jsonl: {key: record}, read back on resume. A line cut short by a kill is dropped; any other line that
    is no record of this tune (`problem`) is named and skipped, so that its trial runs again."""

    def __init__(self, path: Path, out: Path):
        self.path, self.out, self.done = path, out, {}
        if not os.path.lexists(path):
            return
        try:
            lines = records.read_jsonl(path, records.SMALL)
        except (OSError, ValueError) as e:
            raise ConfigError(f"{path}: cannot be read ({one_line(str(e))}); move it away to start the tune "
                              "afresh") from None
        for lineno, r in lines:
            why = "not JSON" if r is None else problem(r, out)
            if why and not (r is None and lineno == len(lines)):
                print_warning(f"{path}:{lineno}: {why}; skipped (that trial runs again)")
            if not why:
                self.done[r["key"]] = r
                if "dir" in r:  # (read back as a run: it must lie inside the tune, whatever links lie on the way)
                    inside(out, r["dir"])

    def add(self, record: dict) -> dict:
        self.done[record["key"]] = record
        records.append_line(self.path, record)
        return record

    def drop(self, key: str) -> None:
        """Forget `key`'s record (a baseline that did not complete runs again on the next start)."""
        self.done.pop(key, None)


def number(x, low: float = 0.0) -> bool:
    return type(x) in (int, float) and math.isfinite(x) and x >= low


def problem(r, out: Path):
    """What makes `r` no record of the tune in `out` (None when it is one)."""
    if not isinstance(r, dict):
        return "not a record (a JSON object)"
    if not isinstance(r.get("key"), str) or r.get("phase") not in PHASES or not isinstance(r.get("status"), str):
        return "no key, phase and status of a trial"
    if not number(r.get("wall_s")):
        return f"wall_s is {r.get('wall_s')!r}, not seconds"
    if "candidate" not in r:
        return None  # a step of the tune's own (the planner's)
    if not isinstance(r["candidate"], str) or not all(type(r.get(k)) is int and r[k] >= 1 for k in ("steps", "every")):
        return "no candidate, steps and eval spacing of a trial"
    if type(r.get("seed")) is not int or not isinstance(r.get("overrides"), list):
        return "no seed and overrides of a trial"
    if r["key"] in ("", ".", "..") or any(c in r["key"] for c in "/\0"):
        return f"its key {r['key'][:200]!r} is not the name of a trial's directory"
    trial = out / TRIALS / r["key"]
    if r.get("dir") not in (str(trial), str(trial / "0")):
        return f"its run directory {str(r.get('dir'))[:200]!r} is not this tune's trial {trial}"
    if r["status"] == "completed" and not all(number(r.get(k), 1e-12) for k in ("samples_s", "step_s")):
        return "a completed trial without its samples/s and step time"
    return None


def slug(name: str) -> str:
    """A candidate's name as a directory name."""
    return "".join(ch if ch.isalnum() or ch in "._" else "-" for ch in name).strip("-")
