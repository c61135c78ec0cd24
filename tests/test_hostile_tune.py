"""Hostile inputs to the tune (option files that would run code: tests/test_conffiles.py): a trial's directory still
held by a live run, trials.jsonl and compute.json of the wrong shape, knob values out of range, a second tune into a
live one, settings past what any budget could run, links on the way to a trial, a baseline over its time limit. Each
case is made by the test itself; each asserts the one line, the exit code and that nothing already written was
lost."""

import contextlib
import io
import json
import math
import os
import re
import subprocess
import sys
import time

import pytest
from helpers.processes import ROOT, alive, descendants, error_line, run_module, start_module, train_command, within
from helpers.runs import TINY

from ringexp import records
from ringexp.cluster import files as clusters
from ringexp.errors import ConfigError
from ringexp.models import build_model
from ringexp.predict import presets
from ringexp.tune import budget, cli, loop, space, trials
from ringexp.tune.config import MAX_RUNS, TuneConfig
from ringexp.tune.loop import Tune
from ringexp.tune.ranking import Ranking

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
            trials.run(["true"], [], tmp_path, where.name, timeout=1.5)
        assert (where / "summary.json").read_text() == '{"status": "running"}' and (where / records.LOCK).exists()
        assert f"waiting for the run still writing there (pid {p.pid})" in capsys.readouterr().err
    finally:
        p.kill()
        p.wait()
    short = hold(where, 1)  # a run that ends while the trial waits: then the directory is the trial's
    rec = trials.run(["true"], [], tmp_path, where.name, timeout=30)
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
             record(out, "try-r0-d", dir=str(tmp_path / "elsewhere")), record(out, "../../elsewhere")]
    text = "".join(json.dumps(x) + "\n" for x in lines) + '{"key": "cut sh'
    (out / "trials.jsonl").write_text(text)
    t = Tune(tune_config(out), TASK, out)
    assert list(t.job.log.done) == ["try-r0-ddp_fp16"] and t.budget.spent() == 2.0
    err = capsys.readouterr().err
    for lineno in range(2, 9):
        assert f"trials.jsonl:{lineno}: " in err and "skipped (that trial runs again)" in err, err
    assert "trials.jsonl:9" not in err and "Traceback" not in err  # the last line, cut short by a kill: dropped
    assert "is not this tune's trial" in err and "wall_s is 'x'" in err
    assert "its key '../../elsewhere' is not the name of a trial's directory" in err  # (read as a trial before)


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
    cluster = clusters.read(clusters.path_of("local_2x2_1gbit"))
    got = loop.measured_compute(t.job, build_model(t.job.base.model, t.job.base.data.num_labels), cluster)
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
    code, err = tune_refusal([*TASK, f"tune.knobs=['{knob}']", f"tune.out={out}"])
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


BIG = "1000000000000"
ABSURD = [  # (arguments, what the one line says): each ran a tune whose budget arithmetic looped for days, or worse
    ([f"tune.seeds={BIG}"], f"tune.seeds={BIG}: more than {MAX_RUNS // 2}"),
    ([f"tune.verify={BIG}"], f"tune.verify={BIG}: must be in [1, 1024]"),
    ([f"tune.rungs={BIG}"], f"tune.eta, rungs=2, {BIG}: need eta in [2, 1024] and 1 to 11 rungs"),
    ([f"tune.eta={BIG}"], f"tune.eta, rungs={BIG}, 2: need eta in [2, 1024]"),
    ([f"tune.trial_steps={BIG}"], f"tune.trial_steps={BIG}: must be in [1, 6048000000]"),
    (["tune.trial_steps=10", "tune.eta=1024", "tune.rungs=11"], "the last rung's trials would run 1.27e+31 steps"),
    (["tune.budget_min=1e12"], "tune.budget_min=1000000000000.0: must be > 0 and at most a week"),
    (["tune.trial_timeout_s=inf"], "tune.trial_timeout_s=inf: must be > 0 seconds and at most a week"),
    ([f"tune.knobs=['accumulation.steps={','.join(map(str, range(1, 2001)))}']"],  # every shipped preset x 2001
     f"2000 knob values: {len(presets()) * 2001} candidates"),
    ([f"tune.presets=[{','.join(['ddp'] * 2000)}]"], "2000 presets, 7 knob values: 16000 candidates"),
    (["tune.command=" + "x" * 200_000], "longer than 131072 characters"),
    (["tune.seed=-1"], "tune.seed=-1: must be in [0, 2^64)"),
    (["tune.error=1e-300"], "tune.error=1e-300: no verification could pass"),
    (["tune.quality_budget=0"], "tune.quality_budget=0.0: no verdict over 3 seeds can be equivalent within it"),
    (["tune.cluster=nowhere"], "conf/cluster/nowhere.yaml: cannot read it"),
]


@pytest.mark.parametrize("args,says", ABSURD, ids=[a[0][:30] for a, _ in ABSURD])
def test_a_setting_past_what_any_budget_could_run_is_one_line_within_seconds(tmp_path, args, says):
    """Each once started a tune (its baseline, then the halving) that never ended; tune.cluster was read only after
    the baseline's run."""
    out = tmp_path / "tune"
    with within(30):
        code, err = tune_refusal([*TASK, *args, f"tune.out={out}"])
    assert code == 2 and says in err and err.count("\n") == 1 and "Traceback" not in err, err[:2000]
    assert not out.exists()


def test_the_budget_of_verification_is_closed_form_in_the_seeds(tmp_path):
    """What verifying still costs, at the most seeds a budget could run, is the seeds not recorded times a run's
    estimate, counted over the records (a sum over tune.seeds took days at absurd values); at 3 seeds it is the
    per-seed sum it replaces."""
    for seeds in (3, MAX_RUNS // 2):
        t = Tune(TuneConfig(trial_steps=8, seeds=seeds), TASK, tmp_path / str(seeds))
        c = space.Candidate("ddp_fp16", ["+parallel=ddp_fp16"], t.job.base, {"step_s": 0.2, "samples_s": 1.0})
        r = Ranking(t.job.base, None, (), {}, order=(c,), base_pred={"step_s": 0.1, "samples_s": 2.0})
        b, done = t.budget, t.job.log.done
        for key, cand in (("verify-baseline-s0", "baseline"), ("verify-baseline-s2", "baseline"),
                          ("verify-ddp_fp16-s1", "ddp_fp16"), ("verify-baseline-s007", "baseline")):
            done[key] = record(t.job.out, key, phase="verify", candidate=cand, steps=12, every=6, wall_s=20.0)
        base, mine = b.full_estimate(r, None), b.full_estimate(r, c)
        with within(5):
            assert b.left(None) == seeds - 2 and b.left(c) == seeds - 1  # (s007 is no seed's key)
            assert b.reserve(r) == pytest.approx((seeds - 2) * base + seeds * mine)
            assert b.verifying(r, c) == pytest.approx((seeds - 2) * base + (seeds - 1) * mine)
        if seeds == 3:
            per_seed = sum(0 if budget.full_key(t.job.base.seed, x, i) in done else b.full_estimate(r, x)
                           for i in range(seeds) for x in (None, c))
            assert b.verifying(r, c) == pytest.approx(per_seed)


def tree(path):
    return sorted((str(p.relative_to(path)), p.read_text() if p.is_file() else None) for p in path.rglob("*"))


@pytest.mark.parametrize("link", ["trials", "trials/try-r0-ddp_fp16"])
def test_a_link_on_the_way_to_a_trial_is_one_line_and_nothing_outside_is_touched(tmp_path, link):
    """trials/ (or a trial's own directory) swapped for a link to a directory elsewhere: the next start removed that
    directory's namesake there (trials.clear's rmtree) and wrote a whole run into it. Now the trial, and a tune whose
    records name one, stop in one line naming it, before anything is read, removed or written there."""
    out, outside = tmp_path / "tune", tmp_path / "outside"
    (outside / "try-r0-ddp_fp16").mkdir(parents=True)
    (outside / "try-r0-ddp_fp16" / "precious").write_text("mine")
    (out / "trials").mkdir(parents=True)
    if link == "trials":
        (out / "trials").rmdir()
        (out / "trials").symlink_to(outside)
    else:
        (out / link).symlink_to(outside / "try-r0-ddp_fp16")
    before = tree(outside)
    with pytest.raises(ConfigError, match=f"{out / link}.*: a symbolic link on the way leads outside {out}"):
        trials.run(["true"], [], out, "try-r0-ddp_fp16", timeout=30)
    assert tree(outside) == before
    tc = tune_config(out)
    (out / cli.STATE).write_text(json.dumps(cli.state(tc, TASK)))
    (out / "trials.jsonl").write_text(json.dumps(record(out, "try-r0-ddp_fp16")) + "\n")
    kept = tree(out)
    code, err = tune_refusal([*TASK, "tune.trial_steps=8", f"tune.out={out}"])
    assert code == 2 and err.count("\n") == 1 and "leads outside" in err and "Traceback" not in err, err
    assert tree(outside) == before and tree(out) == kept


SLOW = "#!/bin/sh\nsleep 120\n"  # a training command that outlives any time limit a test gives it


def test_a_baseline_over_its_time_limit_says_so_and_points_only_at_files_that_exist(tmp_path):
    """It said 'fix the training overrides' and named trials/trial.log, which never exists (and a new tune's
    directory was taken away with the trial's real log)."""
    out, slow = tmp_path / "tune", tmp_path / "slow.sh"
    slow.write_text(SLOW)
    slow.chmod(0o755)
    args = [*TASK, "tune.trial_steps=8", "tune.trial_timeout_s=2", "tune.presets=[ddp_fp16]", "tune.knobs=[]",
            f"tune.command={slow}", f"tune.out={out}"]
    code, err = tune_refusal(args)
    line = error_line(err)
    said = re.search(r"the baseline run timeout: killed after (\d+) s, over its time limit \(tune.trial_timeout_s=2\)",
                     line)
    assert code == 2 and said and int(said[1]) >= 2, line
    assert "fix the training overrides" not in line and "give a larger tune.trial_timeout_s" in line, line
    named = [p for p in line.replace("(", " ").replace(")", " ").split() if p.startswith(str(tmp_path))]
    assert named == [str(out / "trials" / "verify-baseline-s0" / trials.LOG)] and all(map(os.path.isfile, named))
    # the same command with a larger limit continues this tune (it runs the baseline again)
    longer = TuneConfig(trial_steps=8, trial_timeout_s=3600, presets=["ddp_fp16"], knobs=[], command=str(slow))
    assert records.read_json(out / cli.STATE) == cli.state(longer, TASK)
