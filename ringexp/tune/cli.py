"""`python -m ringexp.tune [training overrides] [tune.KEY=VALUE ...]`: the tune's command line, its checks before
anything is written, and the run of its phases (ringexp.tune.loop) into one directory."""

import datetime
import shutil
import subprocess
import sys
from pathlib import Path

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException
from tqdm import tqdm

from ringexp import conffiles, records, stop
from ringexp import dist as rdist
from ringexp.config import plain
from ringexp.errors import ConfigError, RunDirTaken, one_line, print_error
from ringexp.models import build_model
from ringexp.predict import measure_compute
from ringexp.tune import diagnose, playbook, space
from ringexp.tune.config import TuneConfig
from ringexp.tune.loop import STARTUP_S, Tune

USAGE = ("usage: python -m ringexp.tune [training overrides] [tune.KEY=VALUE ...]\n"
         "  e.g. python -m ringexp.tune steps=200 tune.budget_min=5 tune.quality_budget=0.02\n"
         "  tune keys (defaults: TuneConfig in ringexp/config.py; docs/tune.md):\n")
STATE = "tune.json"  # the tune's own configuration: what a second start must match to continue it


def parse(args: list) -> tuple:
    """(TuneConfig, training overrides) of the command line."""
    own = [a.removeprefix("tune.") for a in args if a.startswith("tune.")]
    try:
        tc = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(TuneConfig), OmegaConf.from_dotlist(own)))
    except OmegaConfBaseException as e:
        raise ConfigError(f"tune.{getattr(e, 'full_key', '') or ''}: {one_line(str(e)).split(chr(10))[0]}") from None
    train = [a for a in args if not a.startswith("tune.")]
    for a in train:
        if "=" not in a or not a.split("=", 1)[0].lstrip("+~"):
            raise ConfigError(f"'{a}' is not a KEY=VALUE override; {USAGE.splitlines()[0]}")
    space.knobs(tc.knobs)
    conffiles.check(train)  # (the trials check it too: before anything, as ringexp.train does)
    return tc, train


def reachable(cmd: list, train: list) -> None:
    """ConfigError where the trials' launcher cannot start: its program missing, Slurm not answering, the local
    cluster not up."""
    if not (shutil.which(cmd[0]) or Path(cmd[0]).is_file()):
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
    cfg = tune.base
    model = build_model(cfg.model, cfg.data.num_labels)
    c = measure_compute(cfg, model, rdist.threads(max(1, cfg.launcher.nproc_per_node)))
    need = STARTUP_S + cfg.steps * cfg.accumulation.steps * (c["forward_s"] + c["backward_s"])
    if tc.budget_min * 60 < need:
        raise ConfigError(f"tune.budget_min={tc.budget_min:g}: the baseline's run of {cfg.steps} steps needs "
                          f"about {need / 60:.1f} min here; give at least that (tune.budget_min)")


def state(tc, train: list) -> dict:
    """What must match for a second start to continue a tune (its budget may grow)."""
    return {"train": train, "tune": {k: v for k, v in plain(tc).items() if k not in ("budget_min", "out")}}


def check_out(out: Path, tc, train: list) -> bool:
    """Whether `out` holds this tune already (to continue); ConfigError where it holds anything else."""
    path = out / STATE
    if (pid := records.holder(out)) is not None:
        raise RunDirTaken(f"tune.out={out}: another tune is writing there now (pid {pid}); wait for it, or pick "
                          "another tune.out")
    if path.exists():
        try:
            same = records.read_json(path) == state(tc, train)
        except (OSError, ValueError):
            same = False
        if not same:
            raise ConfigError(f"tune.out={out}: holds a tune of another configuration ({STATE}); give the same "
                              "command to continue it, or another tune.out")
        return True
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"tune.out={out}: not empty and not a tune's; give a new directory")
    return False


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if any(a in ("--help", "-h") for a in args):
        print(USAGE + "\n".join(f"    tune.{k}={v}" for k, v in plain(TuneConfig()).items()))
        return 0
    try:
        tc, train = parse(args)
        # absolute: a trial's run directory is given to launchers that may start it elsewhere (a Slurm task)
        when = datetime.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
        out = Path(tc.out or Path("outputs", "tune", when)).absolute()
        again = check_out(out, tc, train)  # (before its records are read: they may be anyone's)
        tune = Tune(tc, train, out)
        reachable(tune.cmd, train)
        if not again:
            affordable(tc, tune)
            tune.check_space()
        with records.run_lock(out, "tune", "tune.out"):
            records.claim(out)  # (a second start names this one)
            if not again:
                records.write_json(out / STATE, state(tc, train))
            return run(tune, args)
    except (ConfigError, RunDirTaken) as e:
        print_error(str(e))
        return 2


def run(tune: Tune, argv: list) -> int:
    """The phases; Ctrl-C ends with the playbook of what was done (and the same command continues)."""
    checks, note, code = [], "", 0
    try:
        base = tune.diagnose()
        tune.predict(base)
        checks = diagnose.checklist(records.read_summary(base["dir"]), tune.cluster)
        tune.verify(tune.search(bar=tqdm), bar=tqdm)
        tune.refit()
    except KeyboardInterrupt:
        note, code = "Interrupted: this is what was done so far; the same command continues the tune.", stop.EXIT_CODE
    chosen = playbook.write(tune, checks, argv, note)
    spent = tune.budget.spent()
    print(f"ringexp: tune {'interrupted' if code else 'done'} in {spent / 60:.1f} machine min "
          f"(budget {tune.tc.budget_min:g}); wrote {tune.out}/playbook.md")
    said = "chosen" if tune.chosen else "nothing chosen yet; the baseline" if code else "kept the baseline"
    print(f"ringexp: {said}: {chosen}")
    return code
