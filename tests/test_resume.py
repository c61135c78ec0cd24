"""Runs that survive: a worker killed with SIGKILL mid-run takes the job down fast, names itself, leaves no
process behind and keeps the last checkpoint; `resume=auto` then continues with the very losses of a run
that was never interrupted."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from conftest import ROOT, TINY, read_rows, read_summary, run_cli

# 30 steps, a checkpoint every 5: the kill lands after step 8 and the resumption continues from step 5.
RUN = [o for o in TINY if not o.startswith(("steps", "eval_every"))] + [
    "steps=30", "eval_every=10", "checkpoint.every_steps=5", "logger=none"]
KILL_AFTER = 8
EXIT_WITHIN_S = 60


def start(run_dir, *overrides):
    env = {**os.environ, "WANDB_SILENT": "true"}
    env.pop("HYDRA_FULL_ERROR", None)
    cmd = [sys.executable, "-m", "ringexp.train", *overrides, f"hydra.run.dir={run_dir}"]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def descendants(pid: int) -> set:
    """pid and every process below it, from /proc."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = set(), [pid]
    while todo:
        p = todo.pop()
        found.add(p)
        todo += children.get(p, [])
    return found


def alive(pid: int) -> bool:
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def worker_pid(run_dir, rank: int) -> int:
    return int(re.search(r"\(pid (\d+)\)", (run_dir / f"rank{rank}.log").read_text()).group(1))


def wait_for_step(proc, run_dir, step: int, timeout=180):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        rows = read_rows(run_dir) if (run_dir / "metrics.jsonl").exists() else []
        if rows and rows[-1]["step"] >= step:
            return
        time.sleep(0.02)
    raise AssertionError(f"no step {step} within {timeout}s")


def overrides(preset: str) -> list:
    """`ring+wandb`: the ring preset with the offline W&B run on (whose id the resumed run must continue)."""
    name, _, extra = preset.partition("+")
    return [f"+parallel={name}"] + (["logger=wandb"] if extra == "wandb" else [])


def losses(run_dir) -> dict:
    return {r["step"]: r["train/loss"] for r in read_rows(run_dir)}


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    """Uninterrupted runs, one per preset, computed once."""
    cache = {}

    def get(preset):
        if preset not in cache:
            run_dir = tmp_path_factory.mktemp("ref") / preset.replace("+", "_")
            r = run_cli(run_dir, *RUN, *overrides(preset))
            assert r.returncode == 0, r.stderr[-3000:]
            cache[preset] = losses(run_dir)
        return cache[preset]

    return get


# (preset, what is killed, resume afterwards): exactness for ddp, ring, ring_fp16 and top-k with error feedback,
# and FSDP's distributed checkpoint; a dying rank for ddp, ring, hierarchical and fsdp.
CASES = [("ddp", "rank1", True), ("ring+wandb", "rank0", True), ("ring_fp16", "job", True), ("ddp_topk", "rank1", True),
         ("hierarchical", "rank1", False), ("fsdp", "rank1", True)]


@pytest.mark.parametrize("preset,kill,resume", CASES)
def test_killed_run_resumes_with_the_same_losses(tmp_path, references, preset, kill, resume):
    kill_and_resume(tmp_path / "run", preset, kill, resume, references)


def kill_and_resume(run_dir, preset: str, kill: str, resume: bool, references) -> float:
    """Kill a run after step KILL_AFTER (one worker, or the whole job), check how it went down, resume it and
    compare every loss with the uninterrupted reference; returns the seconds from the kill to the job's exit."""
    proc = start(run_dir, *RUN, *overrides(preset))
    wait_for_step(proc, run_dir, KILL_AFTER)
    tree = descendants(proc.pid)
    killed_at = time.monotonic()
    if kill == "job":  # the whole job at once, as a preempted or lost node would
        os.killpg(proc.pid, signal.SIGKILL)
    else:
        os.kill(worker_pid(run_dir, int(kill[-1])), signal.SIGKILL)
    _, err = proc.communicate(timeout=EXIT_WITHIN_S + 30)
    took = time.monotonic() - killed_at
    assert proc.returncode != 0
    assert took < EXIT_WITHIN_S, took
    deadline = time.monotonic() + 10
    while any(alive(p) for p in tree) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in tree if alive(p)], "processes left behind"
    if kill != "job":
        line = next(x for x in err.splitlines() if x.startswith("ringexp: error:"))
        assert f"worker rank {kill[-1]} failed" in line and "SIGKILL" in line and "Traceback" not in err, err
        assert read_summary(run_dir)["status"] == "failed"
    steps_before = sorted(losses(run_dir))
    assert steps_before[-1] >= KILL_AFTER
    assert (run_dir / "checkpoints" / "step-00000005" / "meta.json").is_file()
    if not resume:
        return took

    r = run_cli(run_dir, *RUN, *overrides(preset), "resume=auto")
    assert r.returncode == 0, r.stderr[-3000:]
    s = read_summary(run_dir)
    assert s["status"] == "completed" and s["resumed_from"]["step"] >= 5
    rows = read_rows(run_dir)
    assert [row["step"] for row in rows] == list(range(1, 31)), "every step exactly once"
    ref, got = references(preset), losses(run_dir)
    # Bit-identical: same weights, optimizer, schedule, residuals, RNG and data position as the reference.
    assert got == ref, [(k, got[k], ref[k]) for k in ref if got[k] != ref[k]][:5]
    assert s["final"]["auroc_macro"] is not None
    if preset.endswith("+wandb"):  # the resumed run continued the same W&B run: same id, a second segment
        runs = sorted((run_dir / "wandb").glob("offline-run-*"))
        wandb_id = json.loads((run_dir / "checkpoints" / "step-00000030" / "meta.json").read_text())["wandb_id"]
        assert len(runs) == 2 and all(r.name.endswith(f"-{wandb_id}") for r in runs), runs
    return took
