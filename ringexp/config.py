"""The typed schema of every config group: the one place where defaults and value ranges live.

conf/ names the choices (which option files exist, and what each sets apart from these defaults); Hydra merges
them into these dataclasses, so a misspelt key or a wrong type fails at composition with Hydra's own message.
`OmegaConf.to_object` then builds the dataclasses themselves, and each checks its own fields in `__post_init__`
(ConfigError: one line, exit code 2), whether or not the group that reads a field is in use. What spans several
groups (combinations, data files, the machine) is checked by ringexp.validate. Workers and records get these
dataclasses, with enums where a field has a fixed set of values.
"""

import os
import re
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Dict, List, Optional

import torch
from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from ringexp.errors import ConfigError

CONF_DIR = str(Path(__file__).resolve().parent.parent / "conf")
# The tools share conf/: the bench composes only its logger group; plan, train and the tune compose the training
# groups, and only plan the cluster group (what each one's --help lists, conf/hydra/help/ringexp.yaml).
BENCH_GROUPS = ("logger",)
PLAN_ONLY = "cluster"


def help_groups(app: str) -> str:
    """`app`'s config groups and their options, one "group: a, b" line each, as Hydra's --help lists them."""
    own = BENCH_GROUPS if app == "bench" else sorted(
        d.name for d in Path(CONF_DIR).iterdir() if d.is_dir() and d.name != "hydra" and (d.name != PLAN_ONLY
                                                                                       or app == "plan"))
    return "\n".join(f"{g}: {', '.join(sorted(f.stem for f in Path(CONF_DIR, g).glob('*.yaml')))}" for g in own)


OmegaConf.register_new_resolver("ringexp_groups", help_groups, replace=True)


def need(ok: bool, key: str, value, rule: str) -> None:
    """Raise ConfigError `key=value: rule` unless `ok`."""
    if not ok:
        raise ConfigError(f"{key}={value}: {rule}")


class StrategyName(StrEnum):
    ddp = "ddp"  # DDP with the builtin all-reduce
    ring = "ring"  # DDP with ringexp's ring as its communication hook
    hierarchical = "hierarchical"
    naive = "naive"
    fsdp = "fsdp"  # PyTorch FSDP2 (fully_shard per block, then the root)
    single = "single"
    local_sgd = "local_sgd"  # post-local SGD: DDP for parallel.warmup_steps, then models averaged every period steps
    diloco = "diloco"  # DiLoCo: inner steps, then an outer Nesterov step on the averaged pseudo-gradient


AVERAGING = (StrategyName.local_sgd, StrategyName.diloco)  # the strategies that synchronise models every period
# ParallelConfig's keys that only they read
AVERAGING_KEYS = ("period", "warmup_steps", "within_node", "averaging", "outer_lr", "outer_momentum", "fragments")


class AveragingCollective(StrEnum):  # the collective a periodic averaging runs (ringexp.comm's)
    builtin = "builtin"
    ring = "ring"
    hierarchical = "hierarchical"


class HierarchicalVariant(StrEnum):
    two_level = "two_level"
    leader = "leader"


class CompressionScope(StrEnum):
    all = "all"
    inter_node = "inter_node"  # hierarchical: compress only the traffic between nodes


class CompressionCollective(StrEnum):
    auto = "auto"  # two_phase from 3 ranks up (and for scope=inter_node), else all_gather
    two_phase = "two_phase"  # compressed all-to-all, the owner's sum compressed again, all-gather (comm/two_phase.py)
    all_gather = "all_gather"  # every rank's payload to every rank: (p-1) payloads per rank, growing with p


class AmpMode(StrEnum):
    off = "off"
    bf16 = "bf16"
    fp16 = "fp16"


# The dtype each AMP mode computes in (autocast's, and FSDP's parameter dtype); off: none, float32 throughout.
AMP_DTYPES = {AmpMode.bf16: torch.bfloat16, AmpMode.fp16: torch.float16}


class OptimName(StrEnum):
    adamw = "adamw"
    sgd = "sgd"


class LrRule(StrEnum):
    """How optim.lr follows the samples behind one optimizer update against plain DDP's (ringexp.optim.lr_factor)."""
    none = "none"
    linear = "linear"
    sqrt = "sqrt"
    auto = "auto"  # linear for SGD, sqrt for AdamW


class WandbMode(StrEnum):
    offline = "offline"
    online = "online"
    disabled = "disabled"


class Device(StrEnum):
    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


@dataclass
class ModelConfig:
    name: str = "small_cnn"  # "small_cnn" (built in, fast on CPU) or any timm model name
    width: int = 16  # small_cnn: channels of the first stage (doubled per stage)
    drop_rate: float = 0.0
    channels_last: bool = False  # NHWC weights: faster convolutions on GPUs' tensor cores under amp

    def __post_init__(self):
        need(self.width >= 1, "model.width", self.width, "must be >= 1")
        need(0 <= self.drop_rate < 1, "model.drop_rate", self.drop_rate, "must be in [0, 1)")


@dataclass
class DataConfig:
    name: str = "synthetic"  # synthetic | image_folder
    batch_size: int = 64  # per rank, per micro-step
    num_workers: int = 0
    image_size: int = 32
    # synthetic: K label motifs (plus distractors) stamped at random places on noise, generated by index
    num_labels: int = 8
    train_size: int = 16384
    val_size: int = 2048
    motif_size: int = 5
    label_prob: float = 0.3  # chance that each label's motif is present in an image
    distractors: int = 4  # how many non-label motifs exist; each image gets 0..distractors of them
    motif_contrast: float = 1.0
    noise: float = 0.72
    seed: int = 0
    # image_folder: a folder of images and a CSV of multi-hot labels
    root: Optional[str] = None
    csv: Optional[str] = None  # relative to root unless absolute; default: root/labels.csv
    path_column: str = "path"
    label_columns: List[str] = field(default_factory=list)  # empty: every column but path_column
    val_fraction: float = 0.1
    skip_bad: bool = False  # image_folder: skip unreadable images (counted in data/skipped_bad) instead of failing

    def __post_init__(self):
        need(self.batch_size >= 1, "data.batch_size", self.batch_size, "need at least 1 sample per batch")
        need(self.num_workers >= 0, "data.num_workers", self.num_workers, "must be >= 0 (0: load in the worker)")
        need(self.image_size >= 1, "data.image_size", self.image_size, "must be >= 1 pixel")
        for key in ("num_labels", "train_size", "val_size", "motif_size"):
            need(getattr(self, key) >= 1, f"data.{key}", getattr(self, key), "must be >= 1")
        need(0 <= self.label_prob <= 1, "data.label_prob", self.label_prob, "must be in [0, 1]")
        need(self.distractors >= 0 and self.noise >= 0, "data.distractors, data.noise",
             f"{self.distractors}, {self.noise}", "must be >= 0")
        need(0 < self.val_fraction < 1, "data.val_fraction", self.val_fraction, "must be between 0 and 1")


@dataclass
class CompressionConfig:
    name: str = "none"  # none, fp16, bf16, int8, topk, randomk, sign, powersgd (conf/compression/)
    ratio: float = 0.01  # topk / randomk: fraction of elements sent, in (0, 1]
    error_feedback: Optional[bool] = None  # null: on for topk, randomk, sign, powersgd; off for casts and int8
    block: int = 4096  # int8: elements per float32 scale
    stochastic: bool = False  # int8: stochastic rounding (unbiased) instead of round-to-nearest
    rank: int = 4  # powersgd: rank of the approximation
    start_step: int = 2  # powersgd: uncompressed all-reduce before this step (>= 2)
    warmup_steps: int = 0  # topk / randomk: DGC sparsity warm-up, ratio falls from warmup_ratio to ratio
    warmup_ratio: float = 0.25
    momentum_correction: bool = False  # topk / randomk with optim=sgd: DGC's momentum correction
    scope: CompressionScope = CompressionScope.all  # hierarchical: all or inter_node
    # how payloads that cannot be summed on the wire (sign, topk, int8 on builtin) are reduced (two_phase: casts too);
    # named where no compressed bucket would take it, refused (compress.unchosen). docs/compression.md
    collective: CompressionCollective = CompressionCollective.auto

    def __post_init__(self):
        need(0 < self.ratio <= 1, "compression.ratio", self.ratio, "must be in (0, 1], e.g. 0.01 for 1%")
        need(self.block >= 1, "compression.block", self.block, "int8 needs at least 1 element per scale")
        need(self.rank >= 1, "compression.rank", self.rank, "PowerSGD needs rank >= 1")
        need(self.start_step >= 2, "compression.start_step", self.start_step,
             "PowerSGD needs >= 2 uncompressed steps first")
        need(self.warmup_steps >= 0, "compression.warmup_steps", self.warmup_steps, "must be >= 0")
        # the sparsity warm-up starts at warmup_ratio and falls to ratio
        low_ok = self.ratio <= self.warmup_ratio if self.warmup_steps else self.warmup_ratio > 0
        need(low_ok and self.warmup_ratio <= 1, "compression.warmup_ratio", self.warmup_ratio,
             "must be in [ratio, 1] (the sparsity warm-up starts there and falls to ratio)")


@dataclass
class AccumulationConfig:
    steps: int = 1  # micro-batches per optimizer step; gradients are synchronised on the last one only

    def __post_init__(self):
        need(self.steps >= 1, "accumulation.steps", self.steps, "need at least 1 micro-batch per step")


@dataclass
class AmpConfig:
    mode: AmpMode = AmpMode.off


@dataclass
class OptimConfig:
    name: OptimName = OptimName.adamw
    lr: float = 3e-3
    weight_decay: float = 1e-4
    momentum: float = 0.9  # sgd only
    warmup_steps: int = 20
    min_lr_ratio: float = 0.05  # cosine decays to lr * min_lr_ratio
    scale_lr: bool = False  # linear scaling rule: lr * global_batch / base_batch_size
    base_batch_size: int = 128
    lr_rule: LrRule = LrRule.none  # lr x (samples per update / plain DDP's), linear or its square root
    grad_clip: Optional[float] = None  # max global grad norm; null disables

    def __post_init__(self):
        need(self.lr > 0, "optim.lr", self.lr, "must be > 0")
        need(self.weight_decay >= 0, "optim.weight_decay", self.weight_decay, "must be >= 0")
        need(0 <= self.momentum < 1, "optim.momentum", self.momentum, "must be in [0, 1)")
        need(self.warmup_steps >= 0, "optim.warmup_steps", self.warmup_steps, "must be >= 0")
        need(0 <= self.min_lr_ratio <= 1, "optim.min_lr_ratio", self.min_lr_ratio, "must be in [0, 1]")
        need(self.base_batch_size >= 1, "optim.base_batch_size", self.base_batch_size, "must be >= 1")
        if self.scale_lr and self.lr_rule != LrRule.none:
            raise ConfigError(f"optim.scale_lr=true with optim.lr_rule={self.lr_rule}: both would scale the learning "
                              "rate; keep one (optim.scale_lr=false, or optim.lr_rule=none)")
        need(self.grad_clip is None or self.grad_clip > 0, "optim.grad_clip", self.grad_clip,
             "must be > 0, or null to disable")


@dataclass
class LoggerConfig:
    mode: WandbMode = WandbMode.offline
    project: str = "ringexp"
    entity: Optional[str] = None
    # Steps between rows in metrics.jsonl / W&B. A row costs an all-reduce and W&B's CPU (3% of a default step
    # when every step writes one, on 2 cores: docs/results/overhead.md); the steps between rows do neither.
    log_every: int = 10
    init_timeout_s: float = 60.0  # online: how long to try reaching W&B before falling back to offline records

    def __post_init__(self):
        need(self.log_every >= 1, "logger.log_every", self.log_every, "must be >= 1")
        need(self.init_timeout_s > 0, "logger.init_timeout_s", self.init_timeout_s, "must be > 0 seconds")


@dataclass
class ParallelConfig:
    strategy: StrategyName = StrategyName.ddp
    bucket_cap_mb: float = 25.0
    gradient_as_bucket_view: bool = False
    static_graph: bool = False
    find_unused_parameters: bool = False
    segment_kb: Optional[int] = None  # ring / hierarchical: pipeline segment size; null = half a chunk, 1-16 MiB
    nodes: Optional[int] = None  # hierarchical: emulated nodes; null = real nodes (world / local world size)
    emulate_nodes: int = 1  # hierarchical with nodes null, when the job runs on one real node: nodes to emulate
    variant: HierarchicalVariant = HierarchicalVariant.two_level  # hierarchical: two_level or leader
    timeout_s: float = 300.0  # every collective wait of ring / hierarchical / naive
    reshard_after_forward: bool = True  # fsdp: free gathered parameters after forward, gather again in backward
    forward_prefetch: int = 0  # fsdp: blocks whose all-gather is issued ahead in forward (0: none, FSDP2's default)
    backward_prefetch: int = 1  # fsdp: blocks prefetched ahead in backward (1: FSDP2's own implicit prefetch)
    # local_sgd, diloco (docs/averaging.md): optimizer steps between two synchronisations of the models
    period: int = 1
    warmup_steps: int = 0  # local_sgd, diloco: plain DDP steps before the first local step
    within_node: bool = False  # local_sgd, diloco: gradients all-reduced inside each node every step (hierarchical)
    averaging: AveragingCollective = AveragingCollective.builtin  # the averaging's collective (compression applies)
    outer_lr: float = 0.7  # diloco: the outer SGD's learning rate on the averaged pseudo-gradient
    outer_momentum: float = 0.9  # diloco: the outer SGD's Nesterov momentum (0: plain SGD)
    fragments: int = 1  # local_sgd, diloco: parts of the model synchronised at staggered steps (Streaming DiLoCo)

    def __post_init__(self):
        need(self.bucket_cap_mb > 0, "parallel.bucket_cap_mb", self.bucket_cap_mb, "must be > 0")
        need(self.segment_kb is None or self.segment_kb >= 1, "parallel.segment_kb", self.segment_kb,
             "the ring's segments need at least 1 KiB")
        need(self.nodes is None or self.nodes >= 1, "parallel.nodes", self.nodes, "must be >= 1, or null")
        need(self.emulate_nodes >= 1, "parallel.emulate_nodes", self.emulate_nodes, "must be >= 1")
        need(self.timeout_s > 0, "parallel.timeout_s", self.timeout_s, "must be > 0 seconds")
        need(self.period >= 1, "parallel.period", self.period, "synchronise at least every step: must be >= 1")
        need(self.warmup_steps >= 0, "parallel.warmup_steps", self.warmup_steps, "must be >= 0")
        need(self.outer_lr > 0, "parallel.outer_lr", self.outer_lr, "must be > 0")
        need(0 <= self.outer_momentum < 1, "parallel.outer_momentum", self.outer_momentum, "must be in [0, 1)")
        need(self.fragments >= 1, "parallel.fragments", self.fragments, "must be >= 1")
        need(self.forward_prefetch >= 0 and self.backward_prefetch >= 0, "parallel.forward_prefetch, backward_prefetch",
             f"{self.forward_prefetch}, {self.backward_prefetch}", "count blocks: must be >= 0")


@dataclass
class ProfileConfig:
    enabled: bool = False  # a torch.profiler trace of steps start_step .. start_step + steps - 1
    start_step: int = 5
    steps: int = 3
    top: int = 10  # operators listed in the summary and the log

    def __post_init__(self):
        need(min(self.start_step, self.steps, self.top) >= 1, "profile.start_step, steps, top",
             f"{self.start_step}, {self.steps}, {self.top}", "must be >= 1")


@dataclass
class LauncherConfig:
    nproc_per_node: Optional[int] = None  # null: one per visible GPU, else 2 CPU workers
    device: Device = Device.auto
    threads_per_worker: int = 0  # CPU only; 0 = cores / workers on this node
    max_restarts: int = 0  # local workers: restarts of the whole job after a worker dies (each resumes)
    # Bit-identical reruns and resumptions on GPUs: deterministic cuDNN/cuBLAS algorithms (dist.deterministic)
    deterministic: bool = False

    def __post_init__(self):
        need(self.nproc_per_node is None or self.nproc_per_node >= 1, "launcher.nproc_per_node", self.nproc_per_node,
             "need at least 1 worker")
        need(self.threads_per_worker >= 0, "launcher.threads_per_worker", self.threads_per_worker,
             "must be >= 0 (0: cores / workers)")
        need(self.max_restarts >= 0, "launcher.max_restarts", self.max_restarts, "must be >= 0")


# What the backend group may set: the communication backends' and torch.distributed's own variables
BACKEND_PREFIXES = ("NCCL_", "GLOO_", "TORCH_NCCL_", "TORCH_GLOO_", "TORCH_DISTRIBUTED_", "UCC_", "TORCH_UCC_")
# Values NCCL documents for the variables ringexp checks (docs.nvidia.com, NCCL's environment variables); NCCL_ALGO
# and NCCL_PROTO take a comma-separated list, "^" in front excludes it instead, and "func:list;..." per collective.
NCCL_CHOICES = {"NCCL_ALGO": ("tree", "ring", "collnetdirect", "collnetchain", "nvls", "nvlstree", "pat"),
                "NCCL_PROTO": ("ll", "ll128", "simple"),
                "NCCL_DEBUG": ("version", "warn", "info", "abort", "trace")}
NCCL_COUNTS = ("NCCL_NSOCKS_PERTHREAD", "NCCL_SOCKET_NTHREADS", "NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS")
# The most NCCL takes of each (src/transport/net_socket.cc MAX_THREADS 16 and MAX_SOCKETS 64, the product of the
# two socket variables; src/include/device.h MAXCHANNELS 64): beyond, NCCL only warns and lowers them, so a value
# there is a typo ringexp refuses rather than a setting whose run would differ from its plan.
NCCL_MAX = {"NCCL_SOCKET_NTHREADS": 16, "NCCL_NSOCKS_PERTHREAD": 64, "NCCL_MIN_NCHANNELS": 64,
            "NCCL_MAX_NCHANNELS": 64, "sockets": 64}
# Variables naming a library or a file the backend loads or parses (NCCL's net, tuner, profiler and env plugins and
# the libibverbs it opens; its config, topology and graph files; the example tuner plugin's config; the headers torch's
# NCCL EP extension compiles at run time): one in a config runs that code in every worker, as LD_PRELOAD would.
LOADS_CODE = ("NCCL_CONF_FILE", "NCCL_TOPO_FILE", "NCCL_GRAPH_FILE", "NCCL_TUNER_CONFIG_FILE", "NCCL_IBVERBS_LIB",
              "NCCL_HOME", "NCCL_EP_HOME")
# Variables naming a file or folder the backend writes in every worker, following a link at that name (NCCL's log,
# its topology and graph dumps, the example profiler plugin's and the inspector's dumps; torch's flight-recorder dump
# and the pipe it makes to be asked for one): one in a config can overwrite any file the user can write. (ringexp
# sets NCCL_DEBUG_FILE itself, to a fresh file of its own, when NCCL_DEBUG is on: ringexp.backend.)
WRITES_FILE = ("NCCL_DEBUG_FILE", "NCCL_TOPO_DUMP_FILE", "NCCL_GRAPH_DUMP_FILE", "NCCL_PROFILE_DUMP_FILE",
               "NCCL_INSPECTOR_DUMP_DIR", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_PIPE_FILE")
# Any other variable of these names is taken to name a file or folder too (NCCL and torch add variables each release)
PATH_SUFFIXES = ("_FILE", "_DIR", "_PATH")


def loads_code(key: str) -> bool:
    return key.endswith(("_PLUGIN", "_PLUGIN_LIB")) or key in LOADS_CODE


def names_file(key: str) -> str:
    """Why `key` in backend.env needs backend.allow_plugins=true (it names code to load or a file to write), or ''."""
    if loads_code(key):
        return "names a library or file the backend loads, which runs its code in every worker (as LD_PRELOAD would)"
    if key in WRITES_FILE:
        return ("names a file the backend writes in every worker, following a symbolic link at that name (it can "
                "overwrite any file you can write)")
    if key.endswith(PATH_SUFFIXES):
        return "names a file or folder the backend reads or writes in every worker"
    return ""


@dataclass
class BackendConfig:
    """Environment variables of the communication backend, set in every worker before its process group starts
    (ringexp.backend); a variable already in the environment is kept unless this sets it."""
    name: str = "default"
    env: Dict[str, str] = field(default_factory=dict)
    allow_plugins: bool = False  # let env name code or files the backend loads or writes (names_file): backend.md

    def __post_init__(self):
        for key, value in self.env.items():
            need(key.startswith(BACKEND_PREFIXES), f"backend.env.{key}", value,
                 f"not a communication backend variable (only {', '.join(p + '*' for p in BACKEND_PREFIXES)})")
            need(self.allow_plugins or not names_file(key), f"backend.env.{key}", value,
                 f"{names_file(key)}; set backend.allow_plugins=true if you trust it")
            if key in NCCL_CHOICES:
                bad = nccl_list_error(key, str(value))
                need(not bad, f"backend.env.{key}", value, bad)
            bad = nccl_count_error(key, str(value))
            need(not bad, f"backend.env.{key}", value, bad)
        bad = nccl_sockets_error(self.env)
        need(not bad, "backend.env.NCCL_SOCKET_NTHREADS", self.env.get("NCCL_SOCKET_NTHREADS"), bad)


def nccl_count(value) -> int | None:
    """A count as NCCL reads its variable (src/misc/param.cc ncclLoadParam: C's strtoll(value, NULL, 0), so 0x is
    hexadecimal and a leading 0 octal: "010" is 8), or None where NCCL would not read all of it as a number: it
    stops at the first character that is none ("08" is 0 to NCCL, "12x" 12)."""
    got = re.fullmatch(r"[ \t\n\v\f\r]*([-+]?)(0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*)", str(value))
    if not got:
        return None
    sign, digits = got.groups()
    n = int(digits, 16 if digits[1:2] in ("x", "X") else 8 if digits[0] == "0" else 10)
    return -n if sign == "-" else n


def nccl_count_error(key: str, value: str) -> str:
    """What is wrong with a count NCCL reads (NCCL_COUNTS), or '' (also for other variables)."""
    if key in NCCL_COUNTS and nccl_count(value) is None:
        return ("is no number as NCCL reads it (a C integer: a leading 0 makes it octal, so 010 is 8 and 08 is 0 "
                "followed by text NCCL ignores); write it in decimal")
    if key in NCCL_COUNTS and not 1 <= nccl_count(value) <= NCCL_MAX[key]:
        return f"must be an integer in [1, {NCCL_MAX[key]}] (NCCL's most)"
    return ""


def nccl_sockets_error(env: dict) -> str:
    """NCCL's threads x sockets per thread above its MAX_SOCKETS, or ''."""
    got = [nccl_count(env.get(k, 1)) for k in ("NCCL_SOCKET_NTHREADS", "NCCL_NSOCKS_PERTHREAD")]
    if None not in got and got[0] * got[1] > NCCL_MAX["sockets"]:
        return (f"times NCCL_NSOCKS_PERTHREAD={env.get('NCCL_NSOCKS_PERTHREAD', 1)} is more than NCCL's "
                f"{NCCL_MAX['sockets']} sockets per connection; lower either")
    return ""


def nccl_list_error(key: str, value: str) -> str:
    """What NCCL would refuse in `value` for `key` (a level for NCCL_DEBUG; lists for NCCL_ALGO and NCCL_PROTO),
    or ''."""
    choices = NCCL_CHOICES[key]
    if key == "NCCL_DEBUG":
        return "" if value.lower() in choices else f"choose one of {', '.join(c.upper() for c in choices)}"
    for part in value.split(";"):
        names = part.split(":", 1)[-1].lstrip("^").split(",")
        wrong = [n for n in names if n.strip().lower() not in choices]
        if wrong:
            return (f"{wrong[0].strip()!r} is not one of NCCL's {', '.join(choices)} (a comma-separated list; "
                    "^ in front excludes)")
    return ""


@dataclass
class CheckpointConfig:
    every_steps: int = 0  # 0: only at the end
    keep: int = 2  # newest complete checkpoints kept in <run dir>/checkpoints

    def __post_init__(self):
        need(self.every_steps >= 0, "checkpoint.every_steps", self.every_steps, "must be >= 0 (0: only at the end)")
        need(self.keep >= 1, "checkpoint.keep", self.keep, "must be >= 1")


@dataclass
class EvalConfig:
    # Validation macro-AUROC levels whose first crossing each run records (summary `targets`: step, samples seen,
    # training seconds): an evaluation sees a crossing, so each is known to within eval_every steps (docs/outputs.md)
    targets: List[float] = field(default_factory=lambda: [0.80, 0.85, 0.90])

    def __post_init__(self):
        t = list(self.targets)
        need(len(t) >= 1, "eval.targets", t, "give at least one macro-AUROC level, e.g. [0.8,0.85,0.9]")
        need(all(0 < x <= 1 for x in t), "eval.targets", t, "every level must be in (0, 1] (a macro-AUROC)")
        need(all(a < b for a, b in zip(t, t[1:], strict=False)), "eval.targets", t,
             "list the levels in increasing order, each once, e.g. [0.8,0.85,0.9]")


@dataclass
class TrainConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    compression: CompressionConfig = field(default_factory=CompressionConfig)
    accumulation: AccumulationConfig = field(default_factory=AccumulationConfig)
    amp: AmpConfig = field(default_factory=AmpConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    launcher: LauncherConfig = field(default_factory=LauncherConfig)
    backend: BackendConfig = field(default_factory=BackendConfig)
    profile: ProfileConfig = field(default_factory=ProfileConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    # null: a fresh run; auto: continue from the newest complete checkpoint in the run directory (if any);
    # PATH: from that checkpoint (or the newest in that run directory)
    resume: Optional[str] = None
    name: Optional[str] = None  # experiment name; the W&B group of single runs when set
    seed: int = 0
    steps: int = 300  # optimizer steps
    eval_every: int = 100
    throughput_warmup: int = 10  # steps left out of the steady-state throughput

    def __post_init__(self):
        need(self.steps >= 1, "steps", self.steps, "need at least 1 optimizer step")
        need(self.eval_every >= 1, "eval_every", self.eval_every, "must be >= 1")
        need(self.throughput_warmup >= 0, "throughput_warmup", self.throughput_warmup, "must be >= 0")


def plain(cfg) -> dict:
    """A config dataclass as plain values (enums as their strings): for records, W&B and config.yaml."""
    return OmegaConf.to_container(OmegaConf.structured(cfg), enum_to_str=True)


# An environment variable whose name holds one of these words (any case) holds a credential: a config may read it
# through ${oc.env:NAME} and run with its value, but every record of the run writes ${oc.env:NAME} in its place.
CREDENTIAL = re.compile("KEY|TOKEN|SECRET|PASSWORD", re.IGNORECASE)
ENV_READ = re.compile(r"\boc\.env\s*:\s*['\"]?([^,}'\"\s]+)")  # the variable an ${oc.env:NAME,default} reads
# A credential this short inside longer text is replaced only where it is the whole text: so short a value is no
# secret inside other words, and replacing it there would garble them (a status "failed" holding "a").
SHORT = 6


def credentials(cfg) -> list:
    """The names of the credentials (CREDENTIAL) that `cfg`, a composed DictConfig before it is resolved, reads
    from the environment."""
    return sorted({n for n in ENV_READ.findall(OmegaConf.to_yaml(cfg)) if CREDENTIAL.search(n)})


def hidden(value, names):
    """`value` (plain values: mappings, lists, text, numbers), with the value of each environment variable in `names`
    written ${oc.env:NAME} in every text that holds it: what a record gets instead of the credential."""
    secrets = {os.environ[n]: f"${{oc.env:{n}}}" for n in names or () if os.environ.get(n)}

    def scrub(v):
        if isinstance(v, dict):
            return {k: scrub(x) for k, x in v.items()}
        if isinstance(v, list | tuple):
            return [scrub(x) for x in v]
        for secret, text in secrets.items() if isinstance(v, str) else ():
            v = v.replace(secret, text) if len(secret) >= SHORT or v == secret else v
        return v

    return scrub(value) if secrets else value


def register(name: str, schema) -> None:
    """A program's root schema: option `name` of the `schema` group, at the root, for its conf/*.yaml defaults list
    (`- schema: train`). A group, so that a program composing the training config with its own keys (plan, tune)
    swaps the root's type with `override schema: NAME` for a subclass of TrainConfig. Only the root schemas: group
    options stay the YAML files, so Hydra's list of choices is clean (each program registers its own)."""
    ConfigStore.instance().store(group="schema", name=name, node=schema, package="_global_")


register("train", TrainConfig)
