"""From Hydra's composed config to the typed TrainConfig every worker gets, checked across groups.

Each dataclass of ringexp.config checks its own fields when built; what spans several groups (a compressor a
strategy cannot carry, workers the machine does not have, data that cannot fill a batch, a profile window past
the end) is checked here, before any worker starts. Every failure is a ConfigError (DataError for data): one
line that says what to do.
"""

import dataclasses
import os

import torch
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ringexp import compress, conffiles, parallel
from ringexp.config import AVERAGING, AmpMode, Device, OptimName, StrategyName, TrainConfig
from ringexp.data import check_data
from ringexp.errors import ConfigError
from ringexp.models import build_model, check_model
from ringexp.parallel.ddp import ALGORITHM


def checked(cfg, nodes: int | None = None) -> TrainConfig:
    """Hydra's composed DictConfig as a TrainConfig: fields checked, launcher resolved, groups checked together.
    `nodes`: the real nodes of the job it is for (default: this one's, job_nodes)."""
    unknown = list(unknown_keys(cfg, TrainConfig))
    if unknown:
        raise ConfigError(f"unknown key {unknown[0]} (misspelt?); `+key=value` adds keys, but only keys of "
                          "ringexp's schema mean anything: see ringexp/config.py for the valid ones")
    try:
        config = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as e:  # e.g. a mandatory value deleted with ~key
        raise ConfigError(f"{getattr(e, 'full_key', None) or 'config'}: {str(e).splitlines()[0]}") from None
    resolve_launcher(config)
    resolve_nodes(config, nodes)
    check(config)
    return config


def compose_config(overrides: list, nodes: int | None = None) -> TrainConfig:
    """Compose and check the config without Hydra's app (no run directory): for other ranks and scripts, and inside
    another tool's Hydra app (the planner's), whose search path is the same conf/. `nodes`: as for checked (the
    planner's: the cluster's). Every option file goes through conffiles' gate."""
    return checked(conffiles.compose(overrides), nodes)


def unknown_keys(node, schema, prefix: str = ""):
    """Keys that `+key=value` forced into the config although the schema has no such field."""
    fields = {f.name: f.type for f in dataclasses.fields(schema)}
    for key in node:
        if key not in fields:
            yield f"{prefix}{key}"
        elif dataclasses.is_dataclass(fields[key]):
            yield from unknown_keys(node[key], fields[key], f"{prefix}{key}.")


def resolve_launcher(cfg: TrainConfig) -> None:
    """Make `launcher.device` and `launcher.nproc_per_node` concrete, in place: the only place that looks at the
    machine, so workers and records see the resolved values."""
    cfg.launcher.device = resolve_device(cfg.launcher.device)
    if cfg.launcher.nproc_per_node is None:
        cfg.launcher.nproc_per_node = torch.cuda.device_count() if cfg.launcher.device == Device.cuda else 2


def resolve_nodes(cfg: TrainConfig, nodes: int | None = None) -> None:
    """`parallel.nodes` made concrete where the config leaves it to the job: on one real node (`nodes`, default
    job_nodes()), the `parallel.emulate_nodes` a hierarchical preset asks for; across real nodes, null (the
    launcher's own)."""
    p = cfg.parallel
    real = job_nodes() if nodes is None else nodes
    if p.strategy == StrategyName.hierarchical and p.nodes is None and p.emulate_nodes > 1 and real == 1:
        p.nodes = p.emulate_nodes


def job_nodes() -> int:
    """The real nodes of the job: an external launcher's (torchrun: world / local world size; Slurm: its node
    count), else this one."""
    if "WORLD_SIZE" in os.environ and "LOCAL_WORLD_SIZE" in os.environ:
        return max(1, int(os.environ["WORLD_SIZE"]) // max(1, int(os.environ["LOCAL_WORLD_SIZE"])))
    return int(os.environ.get("SLURM_JOB_NUM_NODES", os.environ.get("SLURM_NNODES", "1")))


def job_world(cfg: TrainConfig) -> int:
    """The world size the job will really have: an external launcher's (torchrun, on any number of nodes) or
    Slurm's, else the local workers this process will start."""
    for var in ("WORLD_SIZE", "SLURM_NTASKS"):
        if var in os.environ:
            return int(os.environ[var])
    return cfg.launcher.nproc_per_node


def check(cfg: TrainConfig) -> None:
    n = job_world(cfg)
    check_device(cfg)
    if cfg.parallel.nodes is not None and n % cfg.parallel.nodes:
        raise ConfigError(f"parallel.nodes={cfg.parallel.nodes} does not divide the {n} workers into equal nodes; "
                          f"use a divisor of {n}")
    parallel.check(cfg, n)
    check_compression(cfg, n)
    check_amp(cfg.amp.mode, cfg.launcher.device)
    pr = cfg.profile
    if pr.enabled and pr.start_step + pr.steps - 1 > cfg.steps:
        raise ConfigError(f"profile.start_step={pr.start_step} + profile.steps={pr.steps} runs past the last step "
                          f"({cfg.steps}); lower profile.start_step or raise steps")
    check_model(cfg.model.name)
    check_data(cfg.data, n)
    check_memory(cfg, n)


def state_copies(cfg: TrainConfig) -> int:
    """Float32 copies of the parameters a rank holds: the parameters, their gradients, the optimizer's state."""
    optimizer = 2 if cfg.optim.name == OptimName.adamw else 1 if cfg.optim.momentum else 0
    return 2 + optimizer


def check_memory(cfg: TrainConfig, world: int) -> None:
    """The model with its gradients and optimizer state, and one input batch, against the memory a rank has here (a
    GPU's own; on CPUs this machine's, shared by its local ranks): refused before any worker starts when they
    cannot fit (a run that passes may still run out: activations come on top). The model is built on the meta
    device: shapes only, no memory."""
    try:
        with torch.device("meta"):
            numel = sum(p.numel() for p in build_model(cfg.model, cfg.data.num_labels).parameters())
    except (RuntimeError, ValueError, TypeError, OverflowError) as e:  # a size torch cannot even describe
        raise ConfigError(f"model.name={cfg.model.name} with model.width={cfg.model.width} and data.num_labels="
                          f"{cfg.data.num_labels} cannot be built ({str(e).splitlines()[0][:120]})") from None
    shards = world if parallel.STRATEGIES[cfg.parallel.strategy].sharded else 1
    d = cfg.data
    need = numel * 4 * state_copies(cfg) // shards + d.batch_size * 3 * d.image_size ** 2 * 4
    cuda = cfg.launcher.device == Device.cuda
    have = torch.cuda.get_device_properties(0).total_memory if cuda else os.sysconf("SC_PHYS_PAGES") * \
        os.sysconf("SC_PAGE_SIZE")
    ranks = 1 if cuda else int(os.environ.get("LOCAL_WORLD_SIZE", cfg.launcher.nproc_per_node))
    if need * ranks > have:
        where = "a GPU here has" if cuda else f"the {ranks} ranks on this machine share"
        raise ConfigError(f"the model ({numel / 1e6:.1f} M parameters) with its gradients and {cfg.optim.name} "
                          f"state, and a batch of {d.batch_size} x 3 x {d.image_size} x {d.image_size}, need "
                          f"{need / 2**30:.1f} GiB per rank, and {where} {have / 2**30:.1f} GiB; lower "
                          "data.batch_size or data.image_size, or use a smaller model (or +parallel=fsdp)")


def check_device(cfg: TrainConfig) -> None:
    n = int(os.environ.get("LOCAL_WORLD_SIZE", cfg.launcher.nproc_per_node))  # ranks on this node
    check_gpus(cfg.launcher.device, n, "launcher.nproc_per_node")


def check_gpus(device: Device, ranks: int, key: str) -> None:
    """A CUDA job needs a visible GPU for each of its `ranks` on this node: NCCL cannot run two ranks on one."""
    visible = torch.cuda.device_count() if device == Device.cuda else 0
    if device == Device.cuda and visible == 0:
        raise ConfigError("launcher.device=cuda but no GPU is visible; use launcher.device=cpu or auto")
    if device == Device.cuda and ranks > visible:
        raise ConfigError(f"{key}={ranks} asks for more GPUs than the {visible} visible (NCCL runs one rank per "
                          f"GPU); use {key}<={visible}")


def resolve_device(device: Device) -> Device:
    """auto: cuda where a GPU is visible, else cpu."""
    if device == Device.auto:
        return Device.cuda if torch.cuda.is_available() else Device.cpu
    return device


def check_compression(cfg: TrainConfig, world: int) -> None:
    """What a compressor needs from the strategy, the optimizer and the `world` ranks (conf/compression/ lists the
    names)."""
    c, strategy = cfg.compression, cfg.parallel.strategy
    if c.name not in compress.COMPRESSORS:
        raise ConfigError(f"compression.name={c.name}: unknown; choose from {', '.join(compress.COMPRESSORS)}")
    if c.name == "powersgd" and strategy != StrategyName.ddp:
        raise ConfigError(f"compression=powersgd runs PyTorch's PowerSGD hook, which the {strategy} strategy "
                          "cannot carry; use +parallel=ddp_powersgd")
    if c.name != "none" and c.momentum_correction and cfg.optim.name != OptimName.sgd:
        raise ConfigError(compress.MOMENTUM_RULE)
    # (the averaging strategies compress their periodic exchange, through parallel.averaging's collective)
    algorithm = str(cfg.parallel.averaging) if strategy in AVERAGING else ALGORITHM.get(strategy, strategy)
    problem = compress.refusal(c, algorithm, f"+parallel={strategy}")
    if problem:
        raise ConfigError(problem)
    if c.collective == "two_phase" and world < 2:
        raise ConfigError(f"compression.collective=two_phase reduces between ranks, and this job has {world}; run "
                          "2 or more workers (launcher.nproc_per_node), or use collective=auto")


def check_amp(mode: AmpMode, device: Device) -> None:
    if mode == AmpMode.off:
        return
    dtype = torch.float16 if mode == AmpMode.fp16 else torch.bfloat16
    if device == Device.cuda:
        if mode == AmpMode.bf16 and not torch.cuda.is_bf16_supported():
            raise ConfigError("amp=bf16 but this GPU has no bfloat16 support; use amp=fp16 or amp=off")
        return
    try:  # CPU autocast for this dtype needs a torch build that supports it
        with torch.autocast("cpu", dtype=dtype):
            torch.ones(2, 2) @ torch.ones(2, 2)
        if mode == AmpMode.fp16:
            torch.amp.GradScaler("cpu")
    except (RuntimeError, AssertionError) as e:
        raise ConfigError(f"amp={mode} is not supported on {device} by this torch build ({e}); "
                          "use amp=bf16 or amp=off") from None
