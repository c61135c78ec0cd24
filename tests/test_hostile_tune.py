"""Hostile inputs to the tune (option files that would run code: tests/test_conffiles.py): a trial's directory still
held by a live run, trials.jsonl and compute.json of the wrong shape, knob values out of range, a second tune into a
live one. Each case is made by the test itself; each asserts the one line, the exit
code and that nothing already written was lost."""

import contextlib
import io
import json
import math
import os
import subprocess
import sys
import time

import pytest
from conftest import ROOT, TINY, alive, descendants, run_module, start_module, train_command

from ringexp import records
from ringexp.cluster import files as clusters
from ringexp.errors import ConfigError
from ringexp.models import build_model
from ringexp.tune import cli, trials
from ringexp.tune.config import TuneConfig
from ringexp.tune.loop import Tune

TASK = [o for o in TINY if not o.startswith("logger.")] + ["logger=none"]

def tune_refusal(args):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = cli.main(args)
    return code, err.getvalue()


HOLD = """import fcntl, os, sys, time
os.makedirs(sys.argv[1], exist_ok=True)
f = open(os.path.join(sys.argv[1], ".ringexp.lock"), "a+")
fcntl.lockf(f, fcntl.LOCK_EX)
f.truncate(0); f.write(str(os.getpid())); f.flush()
print("held", flush=True)
time.sleep(float(sys.argv[2]))
"""  # a run's hold on its directory (records.run_lock and claim), without importing torch


def hold(path, seconds):
    """A live process holding `path` as a run does (its lock, its pid), for `seconds`."""
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(path), str(seconds)], stdout=subprocess.PIPE, text=True,
                         cwd=ROOT)
    assert p.stdout.readline().strip() == "held"
    return p


def test_a_trial_directory_held_by_a_live_run_is_never_deleted(tmp_path, capsys):
    """The next start of a killed tune found its own orphaned trial there: it must wait for it, never delete it (and
    the lock with it) under the live run."""
    where = tmp_path / "trials" / "try-r0-ddp"
    where.mkdir(parents=True)
    (where / "summary.json").write_text('{"status": "running"}')
    p = hold(where, 60)
    try:
        with pytest.raises(ConfigError, match=rf"still writes there \(pid {p.pid}\)"):
            trials.run(["true"], [], where, timeout=1.5)
        assert (where / "summary.json").read_text() == '{"status": "running"}' and (where / records.LOCK).exists()
        assert f"waiting for the run still writing there (pid {p.pid})" in capsys.readouterr().err
    finally:
        p.kill()
        p.wait()
    short = hold(where, 1)  # a run that ends while the trial waits: then the directory is the trial's
    rec = trials.run(["true"], [], where, timeout=30)
    short.wait()
    assert rec["status"] == "crashed" and not (where / "summary.json").exists(), rec


def record(out, key, **over):
    r = {"key": key, "phase": "try", "status": "completed", "wall_s": 2.0, "candidate": "ddp_fp16",
         "overrides": ["+parallel=ddp_fp16"], "steps": 8, "every": 8, "seed": 0, "samples_s": 100.0, "step_s": 0.1,
         "dir": str(out / "trials" / key), "reason": ""}
    return r | over


def test_trials_jsonl_lines_of_the_wrong_shape_are_named_and_skipped(tmp_path, capsys):
    out = tmp_path / "tune"
    out.mkdir()
    good = record(out, "try-r0-ddp_fp16")
    lines = [good, {"key": 5}, [1, 2], record(out, "try-r0-a", wall_s="x"), record(out, "try-r0-b", samples_s=None),
             {k: v for k, v in record(out, "try-r0-c").items() if k != "phase"},
             record(out, "try-r0-d", dir=str(tmp_path / "elsewhere"))]
    text = "".join(json.dumps(x) + "\n" for x in lines) + '{"key": "cut sh'
    (out / "trials.jsonl").write_text(text)
    t = Tune(tune_config(out), TASK, out)
    assert list(t.log.done) == ["try-r0-ddp_fp16"] and t.budget.spent() == 2.0
    err = capsys.readouterr().err
    for lineno in range(2, 8):
        assert f"trials.jsonl:{lineno}: " in err and "skipped (that trial runs again)" in err, err
    assert "trials.jsonl:8" not in err and "Traceback" not in err  # the last line, cut short by a kill: dropped
    assert "is not this tune's trial" in err and "wall_s is 'x'" in err


def tune_config(out):
    return TuneConfig(trial_steps=8, out=str(out))


@pytest.mark.parametrize("kept", ['"fast"', '{"forward_s": NaN, "backward_s": 0.1, "optimizer_s": 0.0}',
                                  '{"forward_s": -1, "backward_s": 0.1, "optimizer_s": 0.0}', "fifo", "[1, 2]"])
def test_a_compute_json_that_is_no_measurement_is_measured_again(tmp_path, capsys, kept):
    out = tmp_path / "tune"
    out.mkdir()
    path = out / "compute.json"
    if kept == "fifo":
        os.mkfifo(path)
    else:
        path.write_text(kept)
    t = Tune(tune_config(out), TASK, out)
    t.cluster = clusters.read(clusters.path_of("local_2x2_1gbit"))
    got = t.measured_compute(build_model(t.base.model, t.base.data.num_labels))
    assert set(got) == {"forward_s", "backward_s", "optimizer_s"}
    assert all(isinstance(v, float) and math.isfinite(v) and v >= 0 for v in got.values()), got
    assert records.read_json(path) == got  # kept for the next start
    err = capsys.readouterr().err
    assert f"{path}: " in err and "measuring compute again" in err and "Traceback" not in err, err


@pytest.mark.parametrize("knob,says", [("accumulation.steps=0", "need at least 1 micro-batch"),
                                       ("parallel.bucket_cap_mb=nan", "must be > 0"),
                                       ("amp.mode=fp8", "Invalid value 'fp8'")])
def test_a_knob_value_out_of_range_is_refused_before_the_baseline_runs(tmp_path, knob, says):
    out = tmp_path / "tune"
    code, err = tune_refusal([*TASK, f"tune.knobs=[{knob}]", f"tune.out={out}"])
    assert code == 2 and f"tune.knobs: {knob}: {says}" in err and err.count("\n") == 1, err
    assert not out.exists()


def test_a_second_tune_into_a_live_tune_names_its_pid_and_tune_out(tmp_path):
    out = tmp_path / "tune"
    out.mkdir()
    tc = tune_config(out)
    (out / cli.STATE).write_text(json.dumps(cli.state(tc, TASK)))
    p = hold(out, 60)
    before = sorted(os.listdir(out))
    try:
        code, err = tune_refusal([*TASK, "tune.trial_steps=8", f"tune.out={out}"])
    finally:
        p.kill()
        p.wait()
    assert code == 2 and f"tune.out={out}: another tune is writing there now (pid {p.pid})" in err, err
    assert "pick another tune.out" in err and "hydra.run.dir" not in err and err.count("\n") == 1
    assert sorted(os.listdir(out)) == before


SLOW_WRAPPER = """#!/bin/sh
# a launcher that is slow to start the ddp_fp16 trials while {slow} exists (a busy cluster): the tune is killed then
case "$*" in *ddp_fp16*) while [ -e {slow} ]; do sleep 0.2; done ;; esac
exec {train} "$@"
"""


@pytest.mark.slow
def test_a_killed_tune_leaves_no_trial_running_and_the_same_command_continues(tmp_path):
    """SIGKILL to the tune's process group while a trial runs (its own session): the trial stops with its tune, and
    the same command continues: the trial runs again into its directory, nothing is refused."""
    out, slow = tmp_path / "tune", tmp_path / "slow"
    wrapper = tmp_path / "launch.sh"
    wrapper.write_text(SLOW_WRAPPER.format(slow=slow, train=train_command(tmp_path)))
    wrapper.chmod(0o755)
    slow.write_text("")
    args = [*TASK, "steps=16", "eval_every=8", "tune.budget_min=20", "tune.trial_steps=8", "tune.rungs=1",
            "tune.seeds=2", "tune.verify=1", "tune.presets=[ddp_fp16]", "tune.knobs=[]",
            "tune.cluster=local_2x2_1gbit", f"tune.command={wrapper}", f"tune.out={out}"]
    p = start_module("ringexp.tune", *args)
    log = out / "trials" / "try-r0-ddp_fp16" / trials.LOG
    deadline = time.monotonic() + 240
    while not log.exists() and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert log.exists(), p.communicate()[1][-2000:]
    time.sleep(1.0)
    tree = descendants(p.pid) - {p.pid}
    assert len(tree) >= 2, tree  # the keeper, the wrapper (and its sleep)
    os.killpg(p.pid, 9)
    p.wait()
    deadline = time.monotonic() + 20  # (the keeper stops the trial's group at once: SIGTERM)
    while any(alive(x) for x in tree) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [x for x in tree if alive(x)]
    slow.unlink()  # (a trial left running would now start training into the directory the next start reuses)
    assert not left, "the trial outlived its tune"
    again = run_module("ringexp.tune", *args, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    recs = [json.loads(x) for x in (out / "trials.jsonl").read_text().splitlines()]
    assert all(r["status"] == "completed" for r in recs), [(r["key"], r["status"], r.get("reason")) for r in recs]
    assert any(r["key"] == "try-r0-ddp_fp16" for r in recs)
