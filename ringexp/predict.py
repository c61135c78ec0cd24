"""What a configuration costs on a cluster, for every program that predicts (the planner's table, compare's
predicted columns, the tune's ranking): one function per question, so that no two of them answer it apart.

    presets(), preset_config(name, train, nodes)   the conf/parallel presets, and one composed with a task
    measure_compute, compute_times, of_run  one rank's compute: measured here, given, or a run's own
    row(name, cfg, cl, shapes, compute, here)       one configuration's predicted step on one cluster (its strategy's
                                                    step_cost and traffic; PowerSGD's arithmetic measured here where
                                                    `here` says this machine is the cluster's kind)
    over_steps(..., first, last)                    the same over a run's steps, its uncompressed first ones included
    quality_of(path, task), judged(...)             the quality verdicts a configuration is judged by: a record's,
                                                    only of the same task (quality.task_of), only decisive ones
    differences(theirs, ours, both)                 the fields two tasks differ in, with both values
"""

import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ringexp import dist as rdist
from ringexp import parallel, quality
from ringexp.compress import powersgd
from ringexp.config import AVERAGING, AVERAGING_KEYS, CONF_DIR
from ringexp.errors import ConfigError
from ringexp.models import build_model
from ringexp.optim import build_optimizer
from ringexp.validate import compose_config

BACKWARD_SHARE = 2 / 3  # of forward + backward: backward costs twice forward (Kaplan et al. 2020, 6N = 2N + 4N)


def presets() -> list:
    return sorted(p.stem for p in Path(CONF_DIR, "parallel").glob("*.yaml") if p.stem != "single")


def preset_config(name: str, train: list, nodes: int | None = None):
    """The training config of conf/parallel preset `name` with the user's training overrides, resolved for a job on
    `nodes` real nodes (the cluster's; default: this machine's)."""
    if name == "single":
        raise ConfigError("+parallel=single runs one rank: there is no communication to predict; pick a "
                          f"multi-rank preset ({', '.join(presets())})")
    if name not in presets():
        raise ConfigError(f"preset {name}: no such conf/parallel preset; choose from {', '.join(presets())}")
    averaging = [o for o in train if o.split("=", 1)[0].lstrip("+~") in {f"parallel.{k}" for k in AVERAGING_KEYS}]
    if averaging:  # (parallel.period and the like: for the presets that average, as a knob is for those it changes)
        cfg = compose_config([*(o for o in train if o not in averaging), f"+parallel={name}"], nodes)
        if cfg.parallel.strategy not in AVERAGING:
            return cfg
    return compose_config([*train, f"+parallel={name}"], nodes)


def measure_compute(cfg, model, threads: int) -> dict:
    """One rank's forward, backward and optimizer step on this machine (random inputs of the config's batch and
    image size), medians of 5 after 2 warm-up steps."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    sync = partial(rdist.sync, device)
    torch.set_num_threads(threads)
    model = model.to(device)
    b, s = cfg.data.batch_size, cfg.data.image_size
    x, y = torch.randn(b, 3, s, s, device=device), (torch.rand(b, cfg.data.num_labels, device=device) < 0.3).float()
    opt, _ = build_optimizer(model, cfg.optim, cfg.optim.lr, 100)  # (timed: the rate does not matter)
    marks = []
    for _ in range(7):
        t = [time.perf_counter()]
        loss = F.binary_cross_entropy_with_logits(model(x).float(), y)
        sync()
        t.append(time.perf_counter())
        loss.backward()
        sync()
        t.append(time.perf_counter())
        opt.step()
        opt.zero_grad()
        sync()
        t.append(time.perf_counter())
        marks.append(np.diff(t))
    f, bw, o = np.median(np.array(marks[2:]), axis=0)
    return {"forward_s": float(f), "backward_s": float(bw), "optimizer_s": float(o)}


def compute_times(given: dict, cfg, model, cl) -> tuple:
    """(forward, backward, optimizer seconds, where they come from): `given` ({key: seconds or None}: the planner's
    forward_s, backward_s, optimizer_s), or measured on one rank here times the cluster's compute slowdown."""
    if all(v is not None for v in given.values()):
        return given, "given on the command line"
    threads = cl.cpu_threads or rdist.threads(cl.ranks_per_node)  # as the slowdown was measured
    got = {k: v * cl.compute_slowdown for k, v in measure_compute(cfg, model, threads).items()}
    where = "a GPU" if torch.cuda.is_available() else f"{threads} CPU thread(s)"
    return got | {k: v for k, v in given.items() if v is not None}, \
        f"measured here on one rank ({where}) x compute_slowdown {cl.compute_slowdown:.2f}"


def of_run(compute_s: float, optimizer_s: float | None, micro_steps: int) -> dict:
    """One rank's compute as a run measured it (its summary's time split: forward and backward together per
    optimizer step, over `micro_steps` micro-batches), forward and backward apart as the cost model needs them."""
    fb = compute_s / micro_steps
    return {"forward_s": (1 - BACKWARD_SHARE) * fb, "backward_s": BACKWARD_SHARE * fb,
            "optimizer_s": optimizer_s or 0.0}


def gradient_shapes(cfg) -> list:
    """The shapes of the gradients a config's model has (what every strategy's step_cost and traffic take)."""
    return [p.shape for p in build_model(cfg.model, cfg.data.num_labels).parameters() if p.requires_grad]


def row(name: str, cfg, cl, shapes: list, compute: dict, here: bool) -> dict:
    """One preset's prediction. `here`: compute was measured on this machine, so PowerSGD's arithmetic is too."""
    c = cfg.compression
    on = powersgd.measured(cl, c, shapes) if here and c.name == "powersgd" else cl
    got = parallel.step_cost(on, cfg, shapes, compute)
    return {"preset": name, "strategy": str(cfg.parallel.strategy), "compression": c.name,
            "accumulation": cfg.accumulation.steps, **got,
            "sent_bytes": parallel.traffic(cfg, parallel.World.of_cluster(cl), shapes)}


def over_steps(name: str, cfg, cl, shapes: list, compute: dict, here: bool, first: int, last: int) -> dict:
    """`row` of `cfg` over its steps first..last: the steps before its compressor's first compressed one (PowerSGD's
    start_step) at the uncompressed config's step, the rest at its own. The headline of a configuration that changes
    phase (a run's `throughput.whole_run` is what it is compared with); `row` itself is the steady compressed step."""
    got = row(name, cfg, cl, shapes, compute, here)
    start, before = parallel.first_steady(cfg)  # (a late compressor's, or an averaging's DDP warm-up)
    if start <= first:
        return got
    plain = row(name, before, cl, shapes, compute, here)
    f = max(0, last - start + 1) / (last - first + 1)
    step = f * got["step_s"] + (1 - f) * plain["step_s"]
    return got | {"step_s": step, "samples_s": got["samples_s"] * got["step_s"] / step}


ELIGIBLE = ("exact", "equivalent", "better")  # what the recommendation may choose from (the words of decisive verdicts)
NO_VERDICT = "no verdict for this task"  # a preset that is not exact, with no decisive verdict of its own task
SHOWN = 3  # differing fields of two tasks a message names (then how many more)
_ABSENT = object()  # a task's field that one side lacks


def quality_of(path, task: dict) -> tuple:
    """({conf/parallel preset: {metric: its verdict's record}}, the file's "metrics" its decisions are on, "alpha"
    each test's level and "family" the configurations that was divided among) from
    compare's quality.json at `path` (quality=, the user's): the groups whose overrides are the baseline's but for
    `+parallel=NAME` (seeds apart). Every group and verdict of the file is checked first (quality.read_record: a
    reversed interval, a word its numbers do not give or a format of another version is refused, naming the group
    and the entry), then its task against `task` (quality.task_of of the config predicted): verdicts of another
    task are no verdicts on this one. Any of these is a ConfigError naming the file."""
    if not Path(path).exists():
        raise ConfigError(f"quality={path}: no such file (give the quality.json compare or the tune wrote for this "
                          "task, or leave quality= out)")
    try:
        record = quality.read_record(path)
    except OSError as e:
        raise ConfigError(f"quality={path}: cannot read it ({e.strerror or e}); give compare's quality.json") from None
    except ValueError as e:
        raise ConfigError(f"quality={path}: {e}; give compare's quality.json as compare wrote it") from None
    if differ := task_differences(record["task"], task):
        raise ConfigError(f"quality={path}: its verdicts are of another task ({differ}); measure this one with a seed "
                          "sweep (docs/sweeps.md) or python -m ringexp.tune, or leave quality= out")
    base = next(set(g["overrides"]) for g in record["groups"] if g["baseline"])
    out, by = {}, {}
    for g in record["groups"]:
        extra = set(g["overrides"]) - base
        if len(extra) == 1 and (name := extra.pop()).startswith("+parallel=") and \
                base - set(g["overrides"]) <= {"+parallel=ddp"}:
            preset = name.removeprefix("+parallel=")
            if preset in by:  # (else the last would win: a verdict planted after the measured one)
                raise ConfigError(f"quality={path}: two verdicts for preset {quality.named(preset)} (groups "
                                  f"{quality.named(by[preset])} and {quality.named(g['group'])}); give compare's "
                                  "quality.json as compare wrote it")
            out[preset], by[preset] = {m: g["verdicts"].get(m) for m in record["metrics"]}, g["group"]
    return out, {k: record[k] for k in ("metrics", "alpha", "family")}


def task_differences(theirs, ours: dict) -> str:
    """How the task a record's verdicts were measured on (`theirs`: its "task", or None where its runs did not
    record one) differs from `ours` (quality.task_of): the first SHOWN differing fields with both values, '' when
    they are the same task. Leaves are compared as JSON writes them (1 is not 1.0, nor true)."""
    if theirs is None:
        return "the record names none: its runs are from before runs recorded their task"
    return differences(theirs, _as_written(ours), lambda a, b: f"{a} in the record, {b} here")


def differences(theirs: dict, ours: dict, both) -> str:
    """The first SHOWN leaves where two tasks (or two runs' versions) differ, each as 'key: ' and both(their value,
    our value) shown ('' where they are the same): the planner's record against its task, and compare's runs
    against their baseline's."""
    differ = list(_differing(theirs, ours, ""))
    said = "; ".join(f"{key}: {both(_shown(a), _shown(b))}" for key, a, b in differ[:SHOWN])
    return said + (f"; and {len(differ) - SHOWN} more" if len(differ) > SHOWN else "")


def _differing(theirs: dict, ours: dict, prefix: str):
    """(dotted key, their value, our value) of every leaf where the two differ (_ABSENT where a side lacks it)."""
    for key in dict.fromkeys([*ours, *theirs]):
        a, b = theirs.get(key, _ABSENT), ours.get(key, _ABSENT)
        name = prefix + (key if len(key) <= 40 else key[:39] + "~")
        if isinstance(a, dict) and isinstance(b, dict):
            yield from _differing(a, b, name + ".")  # (as deep as ours goes: a record's own nesting is not followed)
        elif a is _ABSENT or b is _ABSENT or not _same(a, b):
            yield name, a, b


def _as_written(x):
    """`x` (quality.task_of's plain values) as a record holds it once written: str keys, lists, enums as text."""
    if isinstance(x, dict):
        return {str(k): _as_written(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_as_written(v) for v in x]
    return str(x) if isinstance(x, str) else x


def _same(a, b) -> bool:
    """Equal values of equal kinds (1 is not 1.0, nor true), lists and mappings item by item."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(map(_same, a, b))
    return a == b


def _shown(x) -> str:
    """A task's value in a message: short, and never a whole container of the record's."""
    if x is _ABSENT:
        return "absent"
    if x is None or isinstance(x, bool):
        return {None: "null", True: "true", False: "false"}[x]
    if isinstance(x, str | int | float):
        return ascii(x)[:40]
    text = ascii(x)
    return text if len(text) <= 40 else f"a {'list' if isinstance(x, list) else 'mapping'} of {len(x)}"


def decisive(v) -> bool:
    """Whether a preset's verdicts ({metric: record or None}, quality_of's) may decide it: one on every metric the
    record decides on, each over quality.MIN_SEEDS paired seeds or more."""
    return bool(v) and all(x is not None and x["seeds"] >= quality.MIN_SEEDS for x in v.values())


def judged(name: str, cfg, verdicts: dict, margins: dict, alpha: float = quality.ALPHA) -> tuple:
    """(quality word, measured difference in the first metric or None, the metric whose verdict the decision took
    or None) of preset `name`, each metric at its margin in `margins`: where its verdicts are decisive, the decision
    over them (quality.decision: equivalent only where each is) judged again from their records' intervals, each
    test read at `alpha` (quality.at_alpha: the level the reader's bound needs); else "exact" for a preset that
    sends the gradients uncompressed at one micro-step with no autocast and whose strategy sums every step's
    gradients (the same arithmetic up to the order of a sum); else quality.INDICATIVE where the record's verdict is
    on one seed (shown, never acted on), or NO_VERDICT."""
    v = verdicts.get(name) or {}
    head = next(iter(v.values()), None)
    if decisive(v):
        at = {m: quality.at_alpha(quality.Verdict.of(x, margins[m]), alpha) for m, x in v.items()}
        metric, deciding = quality.decision(at, list(v))
        return deciding.word, head["diff"], metric
    same_sums = parallel.STRATEGIES[cfg.parallel.strategy].exact  # (local_sgd, diloco: models drift between syncs)
    if same_sums and cfg.compression.name == "none" and cfg.accumulation.steps == 1 and cfg.amp.mode == "off":
        return "exact", None, None
    return (NO_VERDICT, None, None) if head is None else (quality.INDICATIVE, head["diff"], None)


def calibrate_here(path: Path, ranks: int) -> None:
    """This machine's cluster file, into `path`: the planner's calibrate on `ranks` local workers (at least 2), run
    as its command (it starts worker processes of its own)."""
    got = subprocess.run([sys.executable, "-m", "ringexp.plan", "calibrate", f"nprocs={max(2, ranks)}",
                          f"out={path}"], capture_output=True, text=True)
    if got.returncode != 0:
        said = (got.stderr or got.stdout).strip().splitlines() or ["no output"]
        raise ConfigError(f"calibrating this machine failed: {said[-1]}")
