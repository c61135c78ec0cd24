"""The run directory before Hydra makes it, and after ringexp refuses a command.

Hydra creates the run (or sweep) directory before ringexp sees the configuration, and answers a directory it cannot
create with tracebacks. `RunDirGuard` (a Hydra callback in conf/train.yaml) looks at the resolved path first, so an
interpolated `hydra.run.dir` under /proc is one line too, and notes what this command is about to create: a command
refused later (ringexp.train) takes away what it created, and changes nothing else on disk. It checks the log files
of hydra.job_logging the same way (Hydra opens them next, and answers one it cannot open with two tracebacks), and
refuses a run directory holding a symlink where the run appends or writes into (checkpoint.planted). Hydra's own
`.hydra/` files are written by ringexp once a run is accepted (`save_hydra_files`; Hydra would rewrite another run's
first).
"""

import os
import sys
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ringexp import checkpoint, records
from ringexp.errors import ConfigError, print_error

_created = {}  # {resolved run directory: (the topmost directory this command creates for it, None if it existed;
#               the job log files it will write there)}


class RunDirGuard(Callback):
    """Runs before Hydra makes the run directory and configures job logging (hydra._internal.hydra.run calls
    on_run_start before run_job, which makes the directory, then configures logging; a sweep's on_multirun_start
    comes before any job)."""

    def on_run_start(self, config, **kwargs) -> None:
        HydraConfig.instance().set_config(config)
        run_dir = OmegaConf.select(config, "hydra.run.dir")
        guard("hydra.run.dir", run_dir)
        logs = guard_files(config, str(run_dir), first_job=False)
        if Path(run_dir).resolve() in _created:  # (what undo may take away again)
            _created[Path(run_dir).resolve()][1].extend(logs)

    def on_multirun_start(self, config, **kwargs) -> None:
        HydraConfig.instance().set_config(config)
        sweep = OmegaConf.select(config, "hydra.sweep.dir")
        guard("hydra.sweep.dir", sweep)
        subdir = first_subdir(config)
        if subdir is not None:  # (an absolute subdir replaces the sweep dir: os.path.join)
            guard("hydra.sweep.subdir", os.path.join(str(sweep), subdir), note=False)
            guard_files(config, os.path.join(str(sweep), subdir), first_job=True)


def as_job(config, output_dir=None, first_job: bool = True):
    """Hydra's config as a job sees it: the first job of a sweep (`first_job`), with `output_dir` as its
    hydra.runtime.output_dir (Hydra sets it only as the job starts)."""
    job = OmegaConf.create({"hydra": OmegaConf.to_container(config.hydra, resolve=False)})
    if first_job:
        job.hydra.job.num, job.hydra.job.id = 0, "0"
    if output_dir is not None:
        job.hydra.runtime.output_dir = os.path.abspath(output_dir)
    return job


def first_subdir(config):
    """hydra.sweep.subdir as the first job would resolve it, or None where it needs what only a job knows."""
    try:
        return str(OmegaConf.select(as_job(config), "hydra.sweep.subdir"))
    except (OmegaConfBaseException, ValueError):
        return None


def log_files(config, output_dir: str, first_job: bool) -> list:
    """[(key, path)] of every handler of hydra.job_logging that writes a file (its `filename`), resolved as Hydra
    will resolve it in the job writing into `output_dir`; [] where job logging is off, or cannot be resolved before
    the job starts (Hydra then says what is wrong)."""
    try:
        handlers = OmegaConf.to_container(as_job(config, output_dir, first_job).hydra.job_logging,
                                          resolve=True).get("handlers") or {}
    except (OmegaConfBaseException, ValueError, AttributeError):
        return []
    return [(f"hydra.job_logging.handlers.{name}.filename", str(h["filename"])) for name, h in handlers.items()
            if isinstance(h, dict) and h.get("filename") is not None]


def guard_files(config, output_dir: str, first_job: bool) -> list:
    """One line and exit code 2, before Hydra configures job logging (which answers a log file it cannot open with
    two tracebacks), when a log file cannot be written, or when the run directory holds a symlink where the run
    appends or writes into (checkpoint.planted: a resumption would write through it). Returns the log files."""
    logs = log_files(config, output_dir, first_job)
    try:
        for key, path in logs:
            check_log(key, path, output_dir)
        checkpoint.planted(output_dir, [path for _, path in logs])
    except ConfigError as e:
        print_error(str(e))
        sys.exit(2)
    return [path for _, path in logs]


def check_log(key: str, path: str, output_dir: str) -> None:
    """ConfigError when the log file `path` cannot be appended to: its folder cannot be written, or is missing
    (Python's logging makes none, and Hydra only the run directory), or the file is not writable."""
    if any(c in path for c in "\n\r\0"):
        raise ConfigError(f"{key}={path!r}: a newline or NUL in the path; pick another file")
    p = Path(path).absolute()
    if p.parent != Path(output_dir).absolute():  # (the run directory: checked by guard, and Hydra makes it)
        top, error = unwritable(p.parent)
        if error is None and top is not None:
            error = OSError(0, f"no folder {top}")
        if error is not None:
            raise ConfigError(f"{key}={path}: cannot write there ({error.strerror or error}); pick a file in a "
                              "folder you can write, or in the run directory")
    if p.is_file() and not p.is_symlink() and not os.access(p, os.W_OK):
        raise ConfigError(f"{key}={path}: cannot write there (Permission denied); pick another file")


def guard(key: str, path, note: bool = True) -> None:
    """One line and exit code 2 when `path` cannot be a directory this user writes into; else note what of it this
    command will create."""
    try:
        top = check(key, str(path))
    except ConfigError as e:
        print_error(str(e))
        sys.exit(2)
    if note:
        _created[Path(path).resolve()] = (top, [])


def check(key: str, path: str):
    """The topmost directory of `path` that does not exist yet (None if `path` exists); ConfigError if it cannot be
    created and written into, with room to spare, or holds characters no file name should."""
    if any(c in path for c in "\n\r\0"):
        raise ConfigError(f"{key}={path!r}: a newline or NUL in the path; pick another directory")
    top, error = unwritable(Path(path))
    if error is not None:
        raise ConfigError(f"{key}={path}: cannot write there ({error.strerror or error}); free some space there or "
                          "pick another directory")
    return top


def unwritable(path: Path) -> tuple:
    """(the topmost directory of `path` that does not exist yet, or None; the OSError that stops this user from
    creating it and writing 64 KiB into it, or None)."""
    p, top = path.absolute(), None
    while not os.path.lexists(p) and p != p.parent:
        p, top = p.parent, p
    return top, OSError(0, "not a directory") if not p.is_dir() else records.cannot_write(p)


def undo(run_dir) -> None:
    """A command refused before its run started: take away what it created, and only that (nothing, if it found the
    run directory there already): its lock and job log in the run directory, then each directory it created, from
    the run directory up, while it is empty. Another run started meanwhile in a folder this command created (two
    runs of one minute under outputs/runs/<date>/) stays whole, and so does anything else put there."""
    run = Path(run_dir).resolve()
    top, logs = _created.pop(run, (None, []))
    if top is None:
        return
    for path in [run / records.LOCK, *map(Path, logs)]:
        if path.parent.resolve() == run and not path.is_symlink() and path.is_file():
            path.unlink()
    for folder in [run, *run.parents]:
        if not folder.is_relative_to(Path(top).resolve()):
            return
        try:
            folder.rmdir()  # (only an empty directory)
        except OSError:
            return


def save_hydra_files(run_dir, cfg) -> None:
    """What Hydra writes into `.hydra/` (hydra.output_subdir is null in conf/train.yaml: Hydra would write it
    before ringexp has accepted the command, over a run that is already there): the composed config `cfg`, Hydra's
    own, and the overrides."""
    hc = HydraConfig.get()
    try:
        out = records.make_dir(Path(run_dir) / ".hydra")  # (a real directory: never a symlink to elsewhere)
    except OSError as e:  # (checkpoint.planted refuses one before the run; a sweep's refused job still gets here)
        raise ConfigError(f"{e.filename}: {e.strerror}; remove it, or pick another hydra.run.dir") from None
    for name, node in (("config.yaml", cfg), ("hydra.yaml", {"hydra": hc}), ("overrides.yaml", hc.overrides.task)):
        records.write_file(out / name, OmegaConf.to_yaml(node))  # a symlink at the name replaced, not followed
