"""`python -m ringexp.train [overrides]`: compose, validate, make the run directory, start the workers.

Under an external `torchrun -m ringexp.train ...`, rank 0 goes through Hydra (which makes the run
directory) and the other ranks compose the same config without Hydra's run directory; rank 0 then hands
them its directory, so all ranks agree on one.
"""

import sys

from ringexp import stop

if __name__ == "__main__":  # Ctrl-C while torch and Hydra load: one line, not an import traceback
    stop.while_loading()

import contextlib
import logging
import os
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import OmegaConf

from ringexp import backend, checkpoint, entry, records, rundir
from ringexp import dist as rdist
from ringexp.config import CONF_DIR, Device, credentials, hidden, plain
from ringexp.errors import ConfigError, PeerLost, RunDirTaken, one_line, print_error, print_warning
from ringexp.launch import launch, refused_elsewhere, run_worker, slurm_task, worker_failure
from ringexp.trainer import resume_mode
from ringexp.validate import checked, compose_config, job_world

log = logging.getLogger("ringexp")


def run_meta(cfg) -> dict:
    """Names and groupings for the records and W&B, from Hydra's view of this run."""
    hc = HydraConfig.get()
    overrides = list(hc.overrides.task)
    name = ",".join(overrides) or "default"
    choices = {k: v for k, v in hc.runtime.choices.items() if not k.startswith("hydra") and k != "schema"}
    choices.setdefault("parallel", str(cfg.parallel.strategy))  # no preset: the schema's default
    multirun = hc.mode == RunMode.MULTIRUN
    sweep = Path(hc.sweep.dir).name if multirun else None
    return {
        "name": name, "overrides": overrides, "choices": choices,
        "group": cfg.name or (f"sweep-{Path(hc.sweep.dir).parent.name}_{sweep}" if multirun else name),
        "job_type": choices["parallel"], "multirun": multirun,
    }


def prepare(cfg, run_dir: Path):
    """Everything that can reject a configuration before any worker starts (ConfigError): validation, and what
    `resume` would continue from, which must exist, fit this configuration and rewrite no completed run's
    records. Returns the TrainConfig."""
    config = checked(cfg)
    mode = resume_mode(config)
    held = checkpoint.held(run_dir)
    if held and not mode:  # appending to another run's records would mix two runs
        raise RunDirTaken(f"{run_dir} already holds a run ({', '.join(held)}); continue it with resume=auto, or pick "
                          "another hydra.run.dir")
    ignored = backend.no_effect(config.backend.env, "gloo" if config.launcher.device == Device.cpu else "nccl")
    if ignored:  # a sweep may mean it (the same presets on CPU and GPU): say so, do not refuse
        print_warning(f"backend.env: {', '.join(ignored)}: no effect on "
                      f"{'gloo (a CPU run)' if config.launcher.device == Device.cpu else 'NCCL (a GPU run)'}")
    ckpt, skipped = checkpoint.resumable(mode, run_dir, config.steps)
    for damaged in skipped:
        print_warning(f"resume: skipping damaged checkpoint {damaged}; continuing from {ckpt.name}")
    if ckpt:
        checkpoint.check(ckpt, config, job_world(config))
    return config


def refused(cfg, run_dir: Path, error: ConfigError, message: str) -> None:
    """A command refused before its workers start changes nothing on disk: a single run takes away the directory
    it created (none, when it found one there). A sweep's job keeps its new directory, saying why it failed
    (`message`), so that the sweep's report lists it."""
    if HydraConfig.get().mode != RunMode.MULTIRUN:
        return rundir.undo(run_dir)
    if not isinstance(error, RunDirTaken) and not (run_dir / records.SUMMARY).exists():
        rundir.save_hydra_files(run_dir, cfg)
        records.mark_failed(run_dir, message)


def fail(run_dir: Path, message: str, code: int) -> None:
    """Print ringexp's one line; exit with `code`, unless in a sweep (whose other jobs still run, and whose
    compare report lists this one)."""
    print_error(message)
    if HydraConfig.get().mode != RunMode.MULTIRUN:
        sys.exit(code)


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="train")
def main(cfg) -> dict | None:
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    with contextlib.ExitStack() as held:
        # one run per directory: the launcher (rank 0 under an external torchrun, task 0 of a Slurm job) holds it
        if int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0"))) == 0:
            try:
                held.enter_context(records.run_lock(run_dir))
            except RunDirTaken as e:  # nothing is written: the directory is another run's
                return fail(run_dir, str(e), 2)
        return run(cfg, run_dir)


def run(cfg, run_dir: Path) -> dict | None:
    """`cfg`, Hydra's composed config, run into `run_dir`. What it says and records never holds the value of a
    credential it reads from the environment (config.credentials): the interpolation stands in its place."""
    secret = credentials(cfg)
    try:
        config = prepare(cfg, run_dir)
    except ConfigError as e:
        refused(cfg, run_dir, e, hidden(str(e), secret))
        return fail(run_dir, hidden(str(e), secret), 2)
    records.claim(run_dir)
    rundir.save_hydra_files(run_dir, cfg)  # (the composed config as written: its interpolations unresolved)
    meta = hidden(run_meta(config), secret) | {"credentials": secret}
    records.write_file(run_dir / "config.yaml", OmegaConf.to_yaml(hidden(plain(config), secret)))
    log.info("%s: %d %s worker(s) -> %s", meta["name"], config.launcher.nproc_per_node, config.launcher.device,
             run_dir)
    try:
        summary = launch(config, run_dir, meta)
    except KeyboardInterrupt:  # before the workers started
        return interrupted(run_dir)
    except Exception as e:  # a worker died or raised: say so in the run directory, keep records and checkpoints
        if stop.requested() and not isinstance(e, PeerLost):  # ... because it was asked to stop
            return interrupted(run_dir)
        message, code = worker_failure(e)
        message = hidden(message, secret)
        if records.disk_full(run_dir):  # the real cause, which an empty error file or a cut JSON file hides
            message = f"the disk holding {run_dir} is full ({message}); free some space"
        records.mark_failed(run_dir, message[:2000])
        kept = checkpoint.complete(run_dir)
        if kept and "resume=auto" not in message:
            message += f" (last checkpoint: {kept[-1]}; {resume_words(run_dir)} continues from it)"
        return fail(run_dir, message, code)
    if summary == stop.INTERRUPTED or stop.requested():
        return interrupted(run_dir)
    if summary is not None:
        report(summary, run_dir)
    return summary


def interrupted(run_dir: Path) -> None:
    """Ctrl-C or a termination signal, once the workers have stopped: one line, exit code 130 (also in a sweep,
    whose remaining jobs are not started)."""
    records.mark_failed(run_dir, "interrupted", "interrupted")
    kept = checkpoint.complete(run_dir)
    where = (f"; {resume_words(run_dir)} continues from {kept[-1].name}" if kept else
             "; no checkpoint was written (checkpoint.every_steps)")
    print_error(f"interrupted{where}")
    sys.exit(stop.EXIT_CODE)


def resume_words(run_dir: Path) -> str:
    """What to add to the command line to continue this run. A Slurm job's run is its sweep's: run locally with
    hydra.run.dir, it would start another world size than the one its checkpoints were written by."""
    if slurm_task():
        return f"resume=auto on the same -m command with hydra.sweep.dir={run_dir.parent}"
    return f"resume=auto hydra.run.dir={run_dir}"


def report(summary: dict, run_dir: Path) -> None:
    f, t, skipped = summary["final"], summary["throughput"], summary["skipped_steps"]
    skips = f", amp=fp16 skipped {skipped} of {summary['steps']} steps (inf/NaN gradients)" if skipped else ""
    print(f"ringexp: done in {summary['wall_time_s']:.0f}s: {t['median']:.0f} samples/s (median), "
          f"val macro-AUROC {f['auroc_macro']:.3f}, macro-F1 {f['f1_macro']:.3f}{skips} -> {run_dir}")
    print(f"ringexp: time: {summary['time']['verdict']}")
    if "profile" in summary:
        p = summary["profile"]
        print(f"ringexp: profile of steps {p['steps'][0]}-{p['steps'][1]} in {p['trace']}, top by self time:")
        for op in p["top_ops"]:
            print(f"  {op['self_ms']:10.2f} ms  {op['calls']:6d}x  {op['name']}")


def worker_rank_main() -> None:
    """A non-zero rank under an external torchrun: same config, no run directory of its own. A configuration error
    is rank 0's to print (it composes the same config): once, not once per rank."""
    try:
        config = compose_config(entry.overrides(sys.argv[1:]))
    except ConfigError:
        refused_elsewhere()
    except KeyboardInterrupt:  # torchrun's agent stopped this rank before it started: another rank failed, and says
        sys.exit(stop.EXIT_CODE)  # why (rank 0 composes the same config)
    try:
        run_worker(config, None, None)
    except Exception as e:  # rank 0 says what failed and what to do; every other rank, in one line, why it stopped
        print_error(one_line(str(e)) or repr(e))
        sys.exit(1)


def cli() -> None:
    stop.default()  # the imports are done: until workers start, Ctrl-C is Python's KeyboardInterrupt
    entry.run(main, worker_rank_main, srun=False)


if __name__ == "__main__":
    rdist.end(cli)
