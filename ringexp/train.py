"""`python -m ringexp.train [overrides]`: compose, validate, make the run directory, start the workers.

Under an external `torchrun -m ringexp.train ...`, rank 0 goes through Hydra (which makes the run
directory) and the other ranks compose the same config without Hydra's run directory; rank 0 then hands
them its directory, so all ranks agree on one.
"""

import json
import logging
import os
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import OmegaConf

from ringexp import checkpoint
from ringexp.config import ConfigError, validate

CONF_DIR = str(Path(__file__).resolve().parent.parent / "conf")
log = logging.getLogger("ringexp")


def plain(cfg) -> dict:
    """The resolved config as plain Python (enums as strings): what workers, records and W&B get."""
    return OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)


def checked(cfg):
    """The composed config as a plain DictConfig, launcher resolved and validated (raises ConfigError)."""
    config = OmegaConf.create(plain(cfg))
    validate(config)
    return config


def compose_config(overrides: list):
    """Compose and check the config without Hydra's app (no run directory): for other ranks and scripts."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return checked(compose("train", overrides=overrides))


def run_meta(cfg) -> dict:
    hc = HydraConfig.get()
    overrides = list(hc.overrides.task)
    name = ",".join(overrides) or "default"
    choices = {k: v for k, v in hc.runtime.choices.items() if not k.startswith("hydra") and k != "train_schema"}
    choices.setdefault("parallel", plain(cfg.parallel)["strategy"])  # no preset: the default block
    multirun = hc.mode == RunMode.MULTIRUN
    sweep = Path(hc.sweep.dir).name if multirun else None
    return {
        "name": name, "overrides": overrides, "choices": choices,
        "group": cfg.name or (f"sweep-{Path(hc.sweep.dir).parent.name}_{sweep}" if multirun else name),
        "job_type": choices["parallel"], "multirun": multirun,
    }


def mark_failed(run_dir: Path, error: str) -> None:
    """A summary.json that says the run failed and why; metrics.jsonl, checkpoints and logs stay as they are."""
    (run_dir / "summary.json").write_text(json.dumps({"status": "failed", "error": error}, indent=2) + "\n")


def fail(run_dir: Path, message: str, code: int) -> None:
    """Mark the run failed (unless the directory already holds an earlier run's summary) and print one line."""
    if not (run_dir / "summary.json").exists():
        mark_failed(run_dir, message)
    print(f"ringexp: error: {message}", file=sys.stderr)
    if not HydraConfig.get().mode == RunMode.MULTIRUN:  # in a sweep, the other jobs still run
        sys.exit(code)


def prepare(cfg, run_dir: Path):
    """Everything that can reject a configuration before any worker starts (ConfigError): validation, and the
    checkpoint `resume` names, which must exist and fit this configuration."""
    config = checked(cfg)
    ckpt = checkpoint.find(config.resume, run_dir)
    if ckpt:
        checkpoint.check(ckpt, config, world_size(config))
    return config


def world_size(config) -> int:
    """The job's world size as the launcher will make it: local workers, or an external launcher's / Slurm's."""
    for var in ("WORLD_SIZE", "SLURM_NTASKS"):
        if var in os.environ:
            return int(os.environ[var])
    return config.launcher.nproc_per_node


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="train")
def main(cfg) -> dict | None:
    from ringexp.launch import launch, worker_failure

    run_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        config = prepare(cfg, run_dir)
    except ConfigError as e:
        return fail(run_dir, str(e), 2)
    meta = run_meta(cfg)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(config))
    log.info("%s: %d %s worker(s) -> %s", meta["name"], config.launcher.nproc_per_node, config.launcher.device,
             run_dir)
    try:
        summary = launch(OmegaConf.to_container(config), run_dir, meta)
    except Exception as e:  # a worker died or raised: say so in the run directory, keep records and checkpoints
        message, code = worker_failure(e)
        mark_failed(run_dir, message[:2000])
        kept = checkpoint.complete(run_dir)
        if kept and "resume=auto" not in message:
            message += f" (last checkpoint: {kept[-1]}; resume=auto hydra.run.dir={run_dir} continues from it)"
        print(f"ringexp: error: {message}", file=sys.stderr)
        if HydraConfig.get().mode == RunMode.MULTIRUN:
            return None  # in a sweep the other jobs still run, and the compare report lists this one
        sys.exit(code)
    except BaseException:  # Ctrl-C: say so in the run directory, keep the records
        mark_failed(run_dir, "interrupted")
        raise
    if summary is not None:
        f, t = summary["final"], summary["throughput"]
        print(f"ringexp: done in {summary['wall_time_s']:.0f}s: {t['median']:.0f} samples/s (median), "
              f"val macro-AUROC {f['auroc_macro']:.3f}, macro-F1 {f['f1_macro']:.3f} -> {run_dir}")
        print(f"ringexp: time: {summary['time']['verdict']}")
        if "profile" in summary:
            p = summary["profile"]
            print(f"ringexp: profile of steps {p['steps'][0]}-{p['steps'][1]} in {p['trace']}, top by self time:")
            for op in p["top_ops"]:
                print(f"  {op['self_ms']:10.2f} ms  {op['calls']:6d}x  {op['name']}")
    return summary


def worker_rank_main() -> None:
    """A non-zero rank under an external torchrun: same config, no run directory of its own."""
    from ringexp.loop import run_worker

    try:
        config = compose_config([a for a in sys.argv[1:] if not a.startswith(("hydra.", "hydra/", "-"))])
    except ConfigError as e:
        print(f"ringexp: error: {e}", file=sys.stderr)
        sys.exit(2)
    run_worker(OmegaConf.to_container(config), None, None)


def check_argv(args: list) -> None:
    """What Hydra itself answers with a traceback rather than a message: an override without a key (`=3`)."""
    for a in args:
        if not a.startswith("-") and "=" in a and not a.split("=", 1)[0].lstrip("+~"):
            raise ConfigError(f"override '{a}' has no key; write KEY=VALUE (e.g. steps=100)")


def cli() -> None:
    try:
        check_argv(sys.argv[1:])
    except ConfigError as e:
        print(f"ringexp: error: {e}", file=sys.stderr)
        sys.exit(2)
    if os.environ.get("RANK", "0") != "0" and "WORLD_SIZE" in os.environ:
        worker_rank_main()
    else:
        main()


if __name__ == "__main__":
    cli()
