"""The run directory before Hydra makes it, and after ringexp refuses a command.

Hydra creates the run (or sweep) directory before ringexp sees the configuration, and answers a directory it cannot
create with tracebacks. `RunDirGuard` (a Hydra callback in conf/train.yaml) looks at the resolved path first, so an
interpolated `hydra.run.dir` under /proc is one line too, and notes what this command is about to create: a command
refused later (ringexp.train) takes away what it created, and changes nothing else on disk. Hydra's own `.hydra/`
files are written by ringexp once a run is accepted (`save_hydra_files`; Hydra would rewrite another run's first).
"""

import os
import shutil
import sys
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ringexp import records
from ringexp.errors import ConfigError, print_error

_created = {}  # {resolved run directory: the topmost directory this command creates for it, None if it existed}


class RunDirGuard(Callback):
    def on_run_start(self, config, **kwargs) -> None:
        HydraConfig.instance().set_config(config)
        guard("hydra.run.dir", OmegaConf.select(config, "hydra.run.dir"))

    def on_multirun_start(self, config, **kwargs) -> None:
        HydraConfig.instance().set_config(config)
        sweep = OmegaConf.select(config, "hydra.sweep.dir")
        guard("hydra.sweep.dir", sweep)
        subdir = first_subdir(config)
        if subdir is not None:  # (an absolute subdir replaces the sweep dir: os.path.join)
            guard("hydra.sweep.subdir", os.path.join(str(sweep), subdir), note=False)


def first_subdir(config):
    """hydra.sweep.subdir as the first job would resolve it, or None where it needs what only a job knows."""
    try:
        job = OmegaConf.create({"hydra": OmegaConf.to_container(config.hydra, resolve=False)})
        job.hydra.job.num, job.hydra.job.id = 0, "0"
        return str(OmegaConf.select(job, "hydra.sweep.subdir"))
    except (OmegaConfBaseException, ValueError):
        return None


def guard(key: str, path, note: bool = True) -> None:
    """One line and exit code 2 when `path` cannot be a directory this user writes into; else note what of it this
    command will create."""
    try:
        top = check(key, str(path))
    except ConfigError as e:
        print_error(str(e))
        sys.exit(2)
    if note:
        _created[Path(path).resolve()] = top


def check(key: str, path: str):
    """The topmost directory of `path` that does not exist yet (None if `path` exists); ConfigError if it cannot be
    created and written into, with room to spare, or holds characters no file name should."""
    if any(c in path for c in "\n\r\0"):
        raise ConfigError(f"{key}={path!r}: a newline or NUL in the path; pick another directory")
    p, top = Path(path).absolute(), None
    while not os.path.lexists(p) and p != p.parent:
        p, top = p.parent, p
    error = OSError(0, "not a directory") if not p.is_dir() else records.cannot_write(p)
    if error is not None:
        raise ConfigError(f"{key}={path}: cannot write there ({error.strerror or error}); free some space there or "
                          "pick another directory")
    return top


def undo(run_dir) -> None:
    """A command refused before its run started: remove the directories it created (nothing, if it found the run
    directory there already)."""
    top = _created.pop(Path(run_dir).resolve(), None)
    if top is not None:
        shutil.rmtree(top, ignore_errors=True)


def save_hydra_files(run_dir, cfg) -> None:
    """What Hydra writes into `.hydra/` (hydra.output_subdir is null in conf/train.yaml: Hydra would write it
    before ringexp has accepted the command, over a run that is already there): the composed config `cfg`, Hydra's
    own, and the overrides."""
    hc = HydraConfig.get()
    out = Path(run_dir) / ".hydra"
    out.mkdir(exist_ok=True)
    for name, node in (("config.yaml", cfg), ("hydra.yaml", {"hydra": hc}), ("overrides.yaml", hc.overrides.task)):
        OmegaConf.save(node, out / name)
