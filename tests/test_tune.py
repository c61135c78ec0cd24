"""python -m ringexp.tune: the search space the planner answers for, the refit on known factors, a tiny tune end
to end on real gloo workers (a planted failing trial, a kill and the same command continuing it) and the inputs it
refuses before writing anything."""

import contextlib
import io
import json
import os
import signal
import time

import numpy as np
import pytest
from helpers.processes import start_module, train_command
from helpers.runs import TINY
from hydra import compose, initialize_config_dir

from ringexp import conffiles, entry, parallel, records
from ringexp.cluster import files as clusters
from ringexp.config import CONF_DIR
from ringexp.models import build_model
from ringexp.tune import cli, loop, ranking, space, trials
from ringexp.tune.config import MAX_RUNS, TuneConfig
from ringexp.tune.loop import Tune
from ringexp.tune.ranking import Ranking
from ringexp.tune.refit import refit, scaled
from ringexp.validate import checked

TASK = [o for o in TINY if not o.startswith("logger.")] + ["logger=none"]
CLUSTER = clusters.read(clusters.path_of("local_2x2_25mbit"))
COMPUTE = {"forward_s": 0.02, "backward_s": 0.04, "optimizer_s": 0.002}


def planner(cfg, cl=CLUSTER, compute=COMPUTE):
    """The planner's prediction of `cfg` (its strategy's step_cost) on a cluster, for the task's model."""
    return parallel.step_cost(cl, cfg, shapes_of(cfg), compute)


SHAPES = {}


def shapes_of(cfg) -> list:
    """The parameter shapes of `cfg`'s model, built once per model configuration: the refits call the planner a few
    thousand times on the same few models (building each anew was most of their time)."""
    key = repr((cfg.model, cfg.data.num_labels))
    if key not in SHAPES:
        SHAPES[key] = [p.shape for p in build_model(cfg.model, cfg.data.num_labels).parameters()]
    return SHAPES[key]


def test_a_knob_is_tried_only_on_the_presets_it_changes_and_each_configuration_once():
    """The bucket size changes DDP's predicted step, not FSDP's; top-k's ratio changes ddp_topk only; PowerSGD's
    start_step, which the planner does not model, is kept for PowerSGD alone; a value equal to the preset's own
    (PowerSGD's rank 8) and the baseline's own configuration are not candidates. A model of 2.6 MB of gradients,
    so that 1 MB buckets are not one bucket (with the tiny model's 20 KB, the planner rightly drops the knob)."""
    task = [*TASK, "model.width=48"]
    base = space.fingerprint(space.preset_config("ddp", task, 2))
    knobs = space.knobs(["parallel.bucket_cap_mb=1", "compression.ratio=0.05", "compression.start_step=10",
                         "compression.rank=8"])
    cands, refused = space.candidates(task, ["ddp", "fsdp", "ddp_topk", "ddp_powersgd"], knobs,
                                      lambda c: planner(c), 2, base)
    names = [c.name for c in cands]
    assert "ddp" not in names and "ddp parallel.bucket_cap_mb=1" in names, names
    assert "fsdp parallel.bucket_cap_mb=1" not in names and "fsdp compression.ratio=0.05" not in names, names
    assert "ddp_topk compression.ratio=0.05" in names and "ddp compression.ratio=0.05" not in names, names
    assert "ddp_powersgd compression.start_step=10" in names and "ddp_topk compression.start_step=10" not in names
    assert "ddp_powersgd compression.rank=8" not in names and refused == [], (names, refused)
    assert len({space.fingerprint(c.cfg) for c in cands}) == len(cands)


def test_an_accumulation_candidate_scales_its_learning_rate_unless_the_user_set_a_rule():
    """Accumulation at the baseline's rate makes 4x fewer updates of the same length: each candidate of it takes
    optim.lr_rule=auto (its name says so), the others do not; a rule or optim.scale_lr among the training overrides
    is kept as given (optim.lr_rule=none turns the pairing off)."""
    knobs = space.knobs(["accumulation.steps=4", "amp.mode=bf16"])
    cands, refused = space.candidates(TASK, ["ddp", "ring_int8"], knobs, None, 2, "")
    by_name = {c.name: c for c in cands}
    assert refused == [] and "ddp accumulation.steps=4 optim.lr_rule=auto" in by_name, list(by_name)
    for c in cands:
        paired = c.cfg.accumulation.steps == 4
        assert (c.cfg.optim.lr_rule == "auto") == paired and ("optim.lr_rule=auto" in c.overrides) == paired, c
    for own, rule, scale in ((["optim.lr_rule=none"], "none", False), (["optim=sgd", "optim.lr_rule=linear"],
                             "linear", False), (["optim.scale_lr=true"], "none", True)):
        cands, refused = space.candidates([*TASK, *own], ["ddp"], knobs, None, 2, "")
        acc = [c for c in cands if c.cfg.accumulation.steps == 4]
        assert refused == [] and [c.name for c in acc] == ["ddp accumulation.steps=4"], (own, cands, refused)
        assert (acc[0].cfg.optim.lr_rule, acc[0].cfg.optim.scale_lr) == (rule, scale), own


def test_an_averaging_knob_is_tried_only_on_the_strategies_that_read_it():
    """parallel.period and warm-up change local_sgd and diloco, the outer rate diloco alone; none is a candidate of
    ddp (where a training run refuses it); diloco's own warm-up (none) is not a candidate again."""
    knobs = space.knobs(["parallel.period=4", "parallel.warmup_steps=0", "parallel.outer_lr=0.5"])
    cands, refused = space.candidates([*TASK, "steps=60"], ["ddp", "local_sgd", "diloco"], knobs, None, 2, "")
    names = sorted(c.name for c in cands)
    assert refused == [] and names == sorted(["ddp", "local_sgd", "diloco", "local_sgd parallel.period=4",
                                              "local_sgd parallel.warmup_steps=0", "diloco parallel.period=4",
                                              "diloco parallel.outer_lr=0.5"]), names
    changed = {c.name: (c.cfg.parallel.period, c.cfg.parallel.warmup_steps, c.cfg.parallel.outer_lr) for c in cands}
    assert changed["local_sgd parallel.warmup_steps=0"] == (8, 0, 0.7) and changed["diloco parallel.period=4"][0] == 4


def test_the_planner_order_prunes_what_it_predicts_slower_and_random_order_prunes_nothing():
    cands, _ = space.candidates(TASK, ["ddp_fp16", "ring_int8", "fsdp"], {}, planner, 2, "")
    base = planner(space.preset_config("ddp", TASK, 2))["samples_s"]
    order, out = space.ranked(cands, base, "planner", 0.1, 0)
    assert [c.predicted["samples_s"] for c in order] == sorted((c.predicted["samples_s"] for c in order),
                                                               reverse=True)
    assert all(c.predicted["samples_s"] >= base / 1.1 for c in order)
    assert all(c.predicted["samples_s"] < base / 1.1 for c, _ in out) and len(order) + len(out) == 3
    shuffled, none = space.ranked(cands, base, "random", 0.1, 0)
    assert sorted(c.name for c in shuffled) == sorted(c.name for c in cands) and none == []


def test_the_refit_recovers_known_factors_and_halves_the_error():
    """Measurements made by the planner itself with compute 1.6x and the inter-node link 0.5x: the refit finds both
    and its error falls to ~0 (a factor the trials cannot see, intra-node here, stays where it does not matter)."""
    cfgs = [space.preset_config(p, [*TASK, *extra], 2) for p in ("ddp", "ddp_fp16", "ring_int8", "hierarchical_int8")
            for extra in ([], ["accumulation.steps=2"])]
    true = np.log([1.6, 1.0, 0.5])
    cl, comp = scaled(CLUSTER, COMPUTE, true)
    points = [(c, planner(c, cl, comp)["step_s"]) for c in cfgs]
    got = refit(points, CLUSTER, COMPUTE, lambda c, cl, comp: planner(c, cl, comp)["step_s"])
    assert got["factors"]["compute"] == pytest.approx(1.6, rel=0.02)
    assert got["factors"]["inter_beta"] == pytest.approx(0.5, rel=0.05)
    assert got["before"] > 0.1 and got["after"] < 0.01 and got["held_out"] < 0.02, got


def test_a_held_out_error_leaves_out_every_trial_of_the_candidate_it_predicts():
    """ring_int8 measured 2x slower than the planner says on both of its rungs: held out together, each is predicted
    from the other candidates alone (about 50% off); a fit that kept its other rung would pull the factors towards
    it and report less."""
    cfgs = [space.preset_config(p, [*TASK, *extra], 2) for p in ("ddp", "ddp_fp16", "ring_int8", "hierarchical_int8")
            for extra in ([], ["accumulation.steps=2"])]
    points = [(c, planner(c, CLUSTER, COMPUTE)["step_s"] * (2 if c.compression.name == "int8" and
                                                            c.parallel.strategy == "ring" else 1)) for c in cfgs]
    keys = [f"{c.parallel.strategy}-{c.compression.name}" for c in cfgs]
    step = lambda c, cl, comp: planner(c, cl, comp)["step_s"]  # noqa: E731
    whole, each = refit(points, CLUSTER, COMPUTE, step, keys), refit(points, CLUSTER, COMPUTE, step)
    ring = [i for i, k in enumerate(keys) if k == "ring-int8"]
    assert len(ring) == 2 and all(whole["held_out_each"][i] > each["held_out_each"][i] for i in ring), (whole, each)
    assert all(abs(whole["held_out_each"][i] - 0.5) < 0.1 for i in ring), whole["held_out_each"]


def bare_tune(tmp_path, *train, **tune_keys):
    """A Tune over the training overrides `train`, nothing run (its phases are driven by the test)."""
    return Tune(TuneConfig(**tune_keys), [*TASK, *train], tmp_path / "tune")


def test_a_candidate_whose_accumulation_cannot_keep_the_evaluations_at_the_baselines_samples_is_refused(tmp_path):
    """eval_every=5 at one micro-batch is 5 micro-batches: accumulation 4 cannot evaluate there (it evaluated every
    8 before); eval_every=8 keeps both the samples (30 steps) and the spacing (every 2 steps)."""
    for every, says, full in ((5, "eval_every=5 at the baseline's accumulation 1 is 5 micro-batches", None),
                              (8, "", (30, 2))):
        t = bare_tune(tmp_path / str(every), "steps=120", f"eval_every={every}")
        cfg = space.preset_config("ring_int8", [*TASK, "accumulation.steps=4"], 2)
        c = space.Candidate("ring_int8 accumulation.steps=4", ["+parallel=ring_int8", "accumulation.steps=4"], cfg)
        why = ranking.spacing_error(t.job.base, c)
        assert says in why and (says or ranking.full_steps(t.job.base, c) == full), why


def two_rungs(tmp_path, outcome):
    """The tune's search over candidates a, b, c on two rungs, the tune's own Job with its trials made up here:
    `outcome(cand, key, seed)` their status. (the names searched, the seeds each rung's trials ran at)"""
    t = bare_tune(tmp_path, "steps=60", trial_steps=15, rungs=2, verify=1)
    order = tuple(space.Candidate(n, [f"+parallel={n}"], t.job.base, {"step_s": 0.1, "samples_s": 1.0}) for n in "abc")
    r = Ranking(t.job.base, CLUSTER, (), COMPUTE, cands=order, order=order, base_pred={"step_s": 0.1, "samples_s": 1.0})
    speed, seeds = {"a": 10.0, "b": 30.0, "c": 20.0}, {}

    class Job(loop.Job):
        def trial(self, key, phase, cand, overrides, steps, seed, every, start=None):
            seeds.setdefault(key[:6], set()).add(seed)
            return {"key": key, "status": outcome(cand, key, seed), "samples_s": speed[cand], "steps": steps}
    return [c.name for c, _ in loop.search(Job(**vars(t.job)), t.budget, r, bar=lambda x, **_: x)], seeds


def test_a_candidate_that_failed_on_any_rung_is_out_of_verification(tmp_path):
    """Two rungs: b crashes on the second after completing the first; it is not among the candidates verified."""
    got, _ = two_rungs(tmp_path, lambda cand, key, _: "crashed" if cand == "b" and key.startswith("try-r1")
                       else "completed")
    assert "b" not in got and got[0] == "c", got


def test_each_rungs_trials_run_at_a_seed_of_their_own_that_no_verification_seed_repeats(tmp_path):
    """Verification runs seeds 0 .. tune.seeds - 1 (at most MAX_RUNS / 2); a trial at seed 0 (as trials once ran)
    would be verification's seed 0 again, shorter: no new evidence of a collapse that comes with a seed."""
    _, seeds = two_rungs(tmp_path, lambda *_: "completed")
    (r0,), (r1,) = seeds["try-r0"], seeds["try-r1"]
    assert r0 != r1 and min(r0, r1) >= MAX_RUNS // 2, seeds


def test_a_short_trial_of_powersgd_measures_it_compressed_and_is_ranked_by_its_whole_run(tmp_path):
    """PowerSGD starting at step 60 of 120: a 20-step trial would measure plain DDP (the old trials did); it runs
    compressed after the warm-up instead, and is ranked as its full-length run would go (60 uncompressed steps at the
    planner's uncompressed/compressed ratio), not at the compressed speed alone."""
    base = bare_tune(tmp_path, "steps=120", "eval_every=10", trial_steps=20).job.base
    cfg = space.preset_config("ddp_powersgd", [*TASK, "compression.start_step=60"], 2)
    c = space.Candidate("ddp_powersgd compression.start_step=60", ["+parallel=ddp_powersgd",
                                                                   "compression.start_step=60"], cfg)
    r = Ranking(base, CLUSTER, tuple(shapes_of(base)), COMPUTE, cands=(c,))
    assert ranking.trial_start(r, c.name) == base.throughput_warmup + 1
    rec = {"samples_s": 100.0, "step_s": 0.1, "start_step": ranking.trial_start(r, c.name)}
    plain, comp = (planner(x)["step_s"] for x in (space.preset_config("ddp", TASK, 2), cfg))
    want = 100.0 * 0.1 / (0.1 * (61 / 120 + 59 / 120 * plain / comp))
    assert plain > comp and ranking.ranking_speed(r, c, rec) == pytest.approx(want) and want < 100.0
    assert ranking.ranking_speed(r, c, {**rec, "start_step": None}) == 100.0


CRASH = """#!/bin/sh
# a launcher whose ring_int8 trials crash (a node lost), as a real one might: the tune must record it and go on
case "$*" in *ring_int8*) kill -9 $$ ;; esac
exec {train} "$@"
"""


def tune_args(tmp_path, out):
    wrapper = tmp_path / "launch.sh"
    wrapper.write_text(CRASH.format(train=train_command(tmp_path)))
    wrapper.chmod(0o755)
    return [*TASK, "steps=24", "eval_every=12", "tune.budget_min=20", "tune.trial_steps=8", "tune.rungs=1",
            "tune.seeds=2", "tune.verify=2", "tune.presets=[ddp_fp16,ring_int8]", "tune.knobs=[]",
            "tune.cluster=local_2x2_1gbit", f"tune.command={wrapper}", f"tune.out={out}"]


def start_tune(args):
    return start_module("ringexp.tune", *args)


def lines(path):
    return path.read_text().splitlines() if path.exists() else []



def test_an_averaging_trial_is_its_whole_run_with_its_warm_up_at_its_full_run_share(tmp_path):
    """Local SGD at period 16 logs most intervals without a synchronization: a trial's samples/s is its whole run
    (records.run_rate), not that median (the first averaging tune ranked period 16 by 1,400 samples/s where it ran
    at about 500); a warm-up of 10 DDP steps, a third of a 30-step trial, is ranked at its share of the 120-step
    run (the planner's DDP and local steps), not three times as heavy."""
    summary = {"throughput": {"median": 1400.0, "whole_run": 500.0}, "step_time_s": {"median": 0.023},
               "global_batch_size": 32, "synchronizations": {"period": 16}}
    assert records.run_rate(summary) == (500.0, 32 / 500.0)
    assert records.run_rate({**summary, "synchronizations": None}) == (1400.0, 0.023)
    base = bare_tune(tmp_path, "steps=120", "eval_every=8", trial_steps=30).job.base
    cfg = space.preset_config("local_sgd", [*TASK, "steps=120"], 2)  # 10 DDP steps first
    c = space.Candidate("local_sgd", ["+parallel=local_sgd"], cfg)
    r = Ranking(base, CLUSTER, tuple(shapes_of(base)), COMPUTE, cands=(c,))
    ddp, local = planner(parallel.first_steady(cfg)[1])["step_s"], planner(cfg)["step_s"]
    want = 100.0 * (10 * ddp + 20 * local) / 30 / ((10 * ddp + 110 * local) / 120)
    rec = {"samples_s": 100.0, "step_s": 0.32, "steps": 30}
    assert ddp > local and want > 100.0 and ranking.ranking_speed(r, c, rec) == pytest.approx(want)
    # the refit's prediction of that trial: its whole run, warm-up included, as it was measured
    assert ranking.at_trial(r, {**rec, "candidate": c.name}) == pytest.approx((10 * ddp + 20 * local) / 30)
    none = space.preset_config("local_sgd", [*TASK, "steps=120", "parallel.warmup_steps=0"], 2)
    assert ranking.ranking_speed(r, space.Candidate("w0", [], none), rec) == pytest.approx(100.0)



def test_a_run_that_aborts_after_its_summary_is_completed_and_one_that_never_wrote_it_crashed(tmp_path):
    """torch 2.14.1's gloo aborts a process at exit now and then ("terminate called without an active exception"),
    after rank 0 wrote the completed summary: the trial's numbers stand, its exit code is said; without that
    summary the same exit code is a crash."""
    run = tmp_path / "run"
    run.mkdir()
    log = tmp_path / "trial.log"
    log.write_text("terminate called without an active exception\n")
    summary = {"status": "completed", "throughput": {"median": 20.0, "p10": 19.0, "p90": 21.0, "whole_run": 19.5},
               "step_time_s": {"median": 1.6}, "global_batch_size": 32, "final": {"auroc_macro": 0.97}}
    records.write_summary(run, summary)
    done = trials.outcome(-6, time.monotonic(), run, log)
    assert (done["status"], done["samples_s"], done["auroc"]) == ("completed", 20.0, 0.97)
    assert "exit code -6" in done["reason"]
    assert trials.outcome(0, time.monotonic(), run, log)["reason"] == ""
    records.write_summary(run, {**summary, "status": "running"})
    assert trials.outcome(-6, time.monotonic(), run, log)["status"] == "crashed"


@pytest.mark.slow
def test_a_tiny_tune_survives_a_failing_trial_and_a_kill_and_writes_the_playbook(tmp_path):
    """Killed (SIGKILL to its process group, trial included) once three records are in (the baseline's full run,
    the planner's, the first trial): the same command continues
    from them, runs no recorded trial again, records the crashed ring_int8 trials with their reason, verifies, and
    writes a playbook whose choice (if any) best.yaml and the printed command both reproduce."""
    out = tmp_path / "tune"
    args = tune_args(tmp_path, out)
    p = start_tune(args)
    deadline = time.monotonic() + 240
    while len(lines(out / "trials.jsonl")) < 3 and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    os.killpg(p.pid, signal.SIGKILL)
    _, err = p.communicate(timeout=60)
    before = lines(out / "trials.jsonl")
    assert len(before) >= 3, err[-2000:]
    again = start_tune(args)
    stdout, stderr = again.communicate(timeout=600)
    assert again.returncode == 0, stderr[-3000:]
    assert f"from its records: {len(before)} recorded (not run again)" in stdout, stdout
    after = lines(out / "trials.jsonl")
    assert after[:len(before)] == before  # continued, not started over
    recs = [json.loads(x) for x in after]
    keys = [r["key"] for r in recs]
    assert len(keys) == len(set(keys)), keys  # no trial run twice
    crashed = [r for r in recs if "ring_int8" in r.get("candidate", "")]
    assert crashed and all(r["status"] == "crashed" and "exit code" in r["reason"] for r in crashed), crashed
    done = [r for r in recs if r["phase"] == "try" and r["status"] == "completed"]
    assert done and all(r["samples_s"] > 0 for r in done)
    assert recs[0]["key"] == "verify-baseline-s0" and recs[0]["phase"] == "diagnose"  # verification's first run
    assert any(r["phase"] == "verify" and r["candidate"] != "baseline" for r in recs)
    book = (out / "playbook.md").read_text()
    assert "## Checklist" in book and "crashed: exit code" in book and "Median error" in book, book
    chosen = stdout.strip().splitlines()[-1].split(": ", 2)[2]  # ("ringexp: chosen: python -m ringexp.train ...")
    # symlinks planted where the tune writes (to files outside it): replaced, never written through
    written = ["playbook.md", "result.json", "groups.csv", "quality.json", "predicted_vs_measured.png",
               *(["best.yaml"] if (out / "best.yaml").exists() else [])]
    for name in written:
        (tmp_path / f"precious-{name}").write_text("mine")
        (out / name).unlink(missing_ok=True)
        (out / name).symlink_to(tmp_path / f"precious-{name}")
    third = start_tune(args)  # a finished tune, run again: the same choice from its records, nothing run
    out3, err3 = third.communicate(timeout=300)
    assert third.returncode == 0 and out3.strip().splitlines()[-1].split(": ", 2)[2] == chosen, err3[-2000:]
    assert "ran nothing: every run was recorded" in out3 and f"{len(after)} recorded" in out3, out3
    assert lines(out / "trials.jsonl") == after
    assert all((tmp_path / f"precious-{n}").read_text() == "mine" and not (out / n).is_symlink() for n in written)
    if (out / "best.yaml").exists():  # the choice, as best.yaml and as the printed command, is one configuration
        assert composed(chosen.split()[3:], out) == composed([*TASK, "+experiment=best"], out, best=True)


def composed(overrides, out, best=False):
    extra = [f"hydra.searchpath=[file://{out}/conf]"] if best else []
    if best:
        (out / "conf" / "experiment").mkdir(parents=True, exist_ok=True)
        (out / "conf" / "experiment" / "best.yaml").write_text((out / "best.yaml").read_text())
        conffiles.check([*overrides, *extra])  # what ringexp writes for users to load holds only training values
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = checked(compose("train", overrides=[*overrides, *extra]))
    return space.fingerprint(cfg)


def refusal(args):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = cli.main(args)
    return code, err.getvalue()


def test_the_baseline_is_the_compositions_overrides_less_the_tunes_own(tmp_path):
    """One Hydra composition of the training config and the tune's keys: the trials run Hydra's parsed overrides
    less tune.* and the tune's directory, so a knob list (Hydra's grammar) goes to the tune and nothing of it to the
    trials (it once did, and every trial's composition failed on it), and hydra/launcher=slurm goes to the trials."""
    seen = []
    args = ["steps=3", 'tune.knobs=["accumulation.steps=4","parallel.period=4,16"]', "+parallel=ring_fp16",
            f"tune.out={tmp_path / 'tune'}", "hydra/launcher=slurm", "hydra.launcher.partition=debug"]
    entry.hydra_app("tune", "ringexp.tune", args, lambda cfg: seen.append((cli.training(), list(cfg.tune.knobs))))
    assert seen == [(["steps=3", "+parallel=ring_fp16", "hydra/launcher=slurm", "hydra.launcher.partition=debug"],
                     ["accumulation.steps=4", "parallel.period=4,16"])], seen


@pytest.mark.parametrize("extra,says", [
    (["tune.budget_min=0.01"], "tune.budget_min=0.01: the baseline's run of 12 steps"),
    (["tune.presets=[ddp]", "tune.knobs=[]"], "the search space is empty"),
    (["tune.quality_budget=-0.1"], "tune.quality_budget=-0.1: must be in [0, 1)"),
    (["tune.knobs=['parallel.bucket_mb=5']"], "unknown knob 'parallel.bucket_mb'"),
    (["tune.presets=[warp]"], "tune.presets: no preset warp"),
    (["tune.command=/nonexistent/launcher"], "cannot run '/nonexistent/launcher'"),
    (["hydra/launcher=slurm", "tune.command=echo"], "the launcher cannot reach the cluster"),
    (["tune.trial_steps=3"], "tune.trial_steps=3"),
    (["tune.seeds=0"], "tune.seeds=0: a choice needs at least 2 paired seeds"),
    (["tune.seeds=1"], "tune.seeds=1: a choice needs at least 2 paired seeds"),
    (["tune.error=-0.1"], "tune.error=-0.1: must be in (0, 0.5)"),
    (["tune.error=nan"], "tune.error=nan: must be in (0, 0.5)"),
])
def test_bad_input_is_one_line_exit_2_and_nothing_written(tmp_path, extra, says):
    out = tmp_path / "tune"
    env = {} if "slurm" not in " ".join(extra) else {"SLURM_CONF": str(tmp_path / "no-slurm.conf")}
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        code, err = refusal([*TASK, *extra, f"tune.out={out}"])
    assert code == 2 and says in err and err.count("\n") == 1 and "Traceback" not in err, err
    assert not out.exists()


def test_a_misspelt_tune_key_is_hydras_own_message_and_nothing_is_written(tmp_path):
    out = tmp_path / "tune"
    code, err = refusal([*TASK, "tune.colour=red", f"tune.out={out}"])
    assert code == 1 and "Could not override 'tune.colour'" in err and "Traceback" not in err, err
    assert not out.exists()


def test_help_and_cfg_job_are_hydras_and_the_run_dir_is_the_tunes(tmp_path, capsys):
    """--help and --cfg job behave as in ringexp.train (Hydra's own, over conf/tune.yaml); hydra.run.dir is the
    tune's directory (it was once ignored, and the tune wrote under outputs/tune/), and it and tune.out naming two
    directories is one line."""
    assert cli.main(["--help"]) == 0
    said = capsys.readouterr().out
    assert "python -m ringexp.tune [training overrides]" in said and "budget_min: 10.0" in said, said
    assert "parallel: ddp," in said  # the training groups a baseline may choose from
    assert cli.main([*TASK, "tune.budget_min=3", "--cfg", "job"]) == 0
    assert "budget_min: 3.0" in capsys.readouterr().out
    out = tmp_path / "tune"
    code, err = refusal([*TASK, "tune.presets=[ddp]", "tune.knobs=[]", f"hydra.run.dir={out}"])
    assert code == 2 and "the search space is empty" in err and not out.exists(), err  # refused: taken away again
    code, err = refusal([*TASK, f"hydra.run.dir={out}", f"tune.out={tmp_path / 'other'}"])
    assert code == 2 and "name two directories" in err and err.count("\n") == 1, err
    code, err = refusal(["-m", *TASK, f"tune.out={out}"])
    assert code == 2 and "drop -m" in err, err


def test_a_directory_of_another_tune_or_of_anything_else_is_refused(tmp_path):
    out = tmp_path / "tune"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    code, err = refusal([*TASK, f"tune.out={out}"])
    assert code == 2 and "not empty and not a tune's" in err, err
    (out / "notes.txt").unlink()
    (out / cli.STATE).write_text(json.dumps({"train": ["steps=5"], "tune": {}}))
    code, err = refusal([*TASK, f"tune.out={out}"])
    assert code == 2 and "holds a tune of another configuration" in err, err
    assert sorted(p.name for p in out.iterdir()) == [cli.STATE]
