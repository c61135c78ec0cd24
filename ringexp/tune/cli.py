"""`python -m ringexp.tune [training overrides] [tune.KEY=VALUE ...]`: Hydra's app over the training config and the
tune's keys composed as one (conf/tune.yaml: tune.*, hydra.run.dir, --help, --cfg), the checks made before anything
is written, and the run of its phases (ringexp.tune.loop) into one directory. The composition's overrides other
than the tune's own are the baseline's (training())."""

import shutil
import subprocess
import sys
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf
from tqdm import tqdm

from ringexp import dist as rdist
from ringexp import entry, records, rundir, stop
from ringexp.config import plain
from ringexp.errors import ConfigError, RunDirTaken, one_line, print_error
from ringexp.models import build_model
from ringexp.predict import measure_compute
from ringexp.tune import diagnose, playbook, space, trials
from ringexp.tune.budget import STARTUP_S
from ringexp.tune.config import TuneApp
from ringexp.tune.loop import Tune

USAGE = "usage: python -m ringexp.tune [training overrides] [tune.KEY=VALUE ...] (--help for the keys)"
STATE = "tune.json"  # the tune's own configuration: what a second start must match to continue it
TUNE_HYDRA = ("hydra.run.dir", "hydra.mode")  # Hydra's keys that are the tune's own: its directory, its mode


def training() -> list:
    """The baseline's overrides, which every trial runs: the composition's own (Hydra's parsed task and hydra
    overrides, hydra/launcher=slurm among them) less the tune's keys and its directory."""
    given = HydraConfig.get().overrides
    return entry.others([*given.task, *given.hydra], {"tune", *TUNE_HYDRA})


def checked(cfg):
    """The tune's TuneConfig (its fields check themselves, as the baseline's training config does, composed with it
    by Hydra through conffiles' gate), once its knob values are checked each on its own."""
    app: TuneApp = OmegaConf.to_object(cfg)  # (its schema is registered by ringexp.tune.config)
    tc = app.tune
    space.knobs(tc.knobs)
    return tc


def reachable(cmd: list, train: list) -> None:
    """ConfigError where the trials' launcher cannot start: its program missing, Slurm not answering, the local
    cluster not up."""
    try:
        found = shutil.which(cmd[0]) or Path(cmd[0]).is_file()
    except OSError:  # (a name longer than a file name can be)
        found = False
    if not found:
        raise ConfigError(f"tune.command: cannot run '{cmd[0]}' (no such program); give the command a trial runs")
    checks = [[cmd[0], "status"]] if Path(cmd[0]).name == "cluster_local.sh" else []
    if any(o.startswith("hydra/launcher=slurm") for o in train):
        checks.append(["sinfo", "-h", "-o", "%P"])
    for check in checks:
        try:
            got = subprocess.run(check, capture_output=True, text=True, timeout=10)
            ok = got.returncode == 0 and got.stdout.strip()
        except (OSError, subprocess.TimeoutExpired) as e:
            got, ok = None, False
            said = str(e)
        if not ok:
            said = (got.stderr or got.stdout).strip() if got else said
            raise ConfigError(f"the launcher cannot reach the cluster: `{' '.join(check)}` says "
                              f"'{one_line(said) or 'nothing'}'; start it (docs/tune.md) and run the tune again")


def affordable(tc, tune: Tune) -> None:
    """ConfigError where the budget cannot pay for the baseline's own run (diagnose's): its steps at this machine's
    compute alone."""
    cfg = tune.job.base
    model = build_model(cfg.model, cfg.data.num_labels)
    c = measure_compute(cfg, model, rdist.threads(max(1, cfg.launcher.nproc_per_node)))
    need = STARTUP_S + cfg.steps * cfg.accumulation.steps * (c["forward_s"] + c["backward_s"])
    if tc.budget_min * 60 < need:
        raise ConfigError(f"tune.budget_min={tc.budget_min:g}: the baseline's run of {cfg.steps} steps needs "
                          f"about {need / 60:.1f} min here; give at least that (tune.budget_min)")


MAY_CHANGE = ("budget_min", "trial_timeout_s", "out")  # what a second start may change: more time (a baseline that
# ran out of its time is run again on the next start)


def state(tc, train: list) -> dict:
    """What must match for a second start to continue a tune."""
    return {"train": train, "tune": {k: v for k, v in plain(tc).items() if k not in MAY_CHANGE}}


def check_out(out: Path, tc, train: list) -> bool:
    """Whether `out` holds this tune already (to continue); ConfigError where it holds anything else."""
    path = out / STATE
    if (pid := records.holder(out)) is not None:
        raise RunDirTaken(f"tune.out={out}: another tune is writing there now (pid {pid}); wait for it, or pick "
                          "another tune.out")
    if path.exists():
        try:
            kept = records.read_json(path)
        except (OSError, ValueError):
            kept = None
        if isinstance(kept, dict) and isinstance(kept.get("tune"), dict):  # (an older tune.json kept them all)
            kept["tune"] = {k: v for k, v in kept["tune"].items() if k not in MAY_CHANGE}
        same = kept == state(tc, train)
        if not same:
            raise ConfigError(f"tune.out={out}: holds a tune of another configuration ({STATE}); give the same "
                              "command to continue it, or another tune.out")
        return True
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"tune.out={out}: not empty and not a tune's; give a new directory")
    return False


def main(argv=None) -> int:
    """The tune's exit code: 0 done, 2 refused (one line, nothing written), 130 interrupted, 1 Hydra's own refusal
    of a key or value it cannot compose (its message)."""
    args = sys.argv[1:] if argv is None else list(argv)
    code = [0]

    def tune_app() -> None:
        entry.one_run(args, "the tune runs into one directory and sweeps itself (tune.presets, tune.knobs)")

        def body(cfg) -> None:
            code[0] = start(cfg, training(), args)

        entry.hydra_app("tune", "ringexp.tune", args, body)

    try:
        entry.run(tune_app, srun=False, args=args)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 1
    return code[0]


def start(cfg, train: list, args: list) -> int:
    """Check everything, then run the tune into Hydra's run directory (absolute: a trial's run directory is given to
    launchers that may start it elsewhere, a Slurm task); a refused tune takes away the directory it made."""
    out, accepted = Path(HydraConfig.get().runtime.output_dir).absolute(), False
    try:
        tc = checked(cfg)
        if tc.out and Path(tc.out).absolute() != out:
            raise ConfigError(f"tune.out={tc.out} and hydra.run.dir={out} name two directories; give one of them")
        again = check_out(out, tc, train)  # (before its records are read: they may be anyone's)
        tune = Tune(tc, train, out)
        reachable(tune.job.cmd, train)
        if not again:
            affordable(tc, tune)
            tune.check_space()
        with records.run_lock(out, "tune", "tune.out"):
            records.claim(out)  # (a second start names this one)
            if not again:
                records.write_json(out / STATE, state(tc, train))
            accepted = True
            return run(tune, args)
    except (ConfigError, RunDirTaken) as e:
        if not accepted:  # (once accepted, what its trials wrote is kept: the same command continues from it)
            rundir.undo(out)
        print_error(str(e))
        return 2


def run(tune: Tune, argv: list) -> int:
    """The phases; Ctrl-C ends with the playbook of what was done (and the same command continues)."""
    checks, note, code = [], "", 0
    done, out = tune.job.log.done, tune.job.out
    before = len(done)
    try:
        tune.plan()
        if before:
            left = sum(f"try-r0-{trials.slug(c.name)}" not in done for c in tune.ranking.order)
            print(f"ringexp: continuing the tune in {out} from its records: {before} recorded (not run again), "
                  f"{left} first-rung trial{'s' * (left != 1)} left, then verification")
        checks = diagnose.checklist(records.read_summary(tune.diagnosis["dir"]), tune.ranking.cluster)
        tune.tune(bar=tqdm)
    except KeyboardInterrupt:
        note, code = "Interrupted: this is what was done so far; the same command continues the tune.", stop.EXIT_CODE
    outcome = playbook.Outcome(tune.job, tune.budget.total_s, tune.ranking, tune.verification, tune.fit)
    chosen = playbook.write(outcome, checks, argv, note)
    spent, ran = tune.budget.spent(), len(done) - before
    print(f"ringexp: tune {'interrupted' if code else 'done'} in {spent / 60:.1f} machine min "
          f"(budget {tune.tc.budget_min:g}); {f'ran {ran} new' if ran else 'ran nothing: every run was recorded'}; "
          f"wrote {out}/playbook.md")
    said = "chosen" if outcome.chosen else "nothing chosen yet; the baseline" if code else "kept the baseline"
    print(f"ringexp: {said}: {chosen}")
    return code
