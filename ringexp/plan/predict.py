"""`python -m ringexp.plan predict`: every conf/parallel preset's predicted step on a cluster, for a training config.
Each number comes from the preset's strategy (ringexp.parallel: `step_cost`, `traffic`); the planner measures or
takes the compute, ranks the rows and writes them out."""

import dataclasses
import json
import time
from functools import partial
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ringexp import dist as rdist
from ringexp import parallel, quality, records
from ringexp.compress import powersgd
from ringexp.config import CONF_DIR, PlanConfig, plain
from ringexp.errors import ConfigError
from ringexp.models import build_model
from ringexp.optim import build_optimizer
from ringexp.plan.clusters import file_name
from ringexp.plan.report import plot, report
from ringexp.validate import compose_config

# The quality verdicts the planner judges presets by: compare's record of the slow-link story
# (scripts/cluster_story.sh, docs/results/cluster-story.md)
QUALITY_RECORD = Path(CONF_DIR).parent / "docs" / "results" / "cluster-story-quality.json"


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
    opt, _ = build_optimizer(model, cfg.optim, b, 100)
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


def compute_times(pc: PlanConfig, cfg, model, cl) -> tuple:
    """(forward, backward, optimizer seconds, where they come from): given, or measured on one rank here times
    the cluster's compute slowdown."""
    given = {k: getattr(pc, k) for k in ("forward_s", "backward_s", "optimizer_s")}
    if all(v is not None for v in given.values()):
        return given, "given on the command line"
    threads = cl.cpu_threads or rdist.threads(cl.ranks_per_node)  # as the slowdown was measured
    got = {k: v * cl.compute_slowdown for k, v in measure_compute(cfg, model, threads).items()}
    where = "a GPU" if torch.cuda.is_available() else f"{threads} CPU thread(s)"
    return got | {k: v for k, v in given.items() if v is not None}, \
        f"measured here on one rank ({where}) x compute_slowdown {cl.compute_slowdown:.2f}"


def row(name: str, cfg, cl, shapes: list, compute: dict, here: bool) -> dict:
    """One preset's prediction. `here`: compute was measured on this machine, so PowerSGD's arithmetic is too."""
    c = cfg.compression
    on = powersgd.measured(cl, c, shapes) if here and c.name == "powersgd" else cl
    got = parallel.step_cost(on, cfg, shapes, compute)
    return {"preset": name, "strategy": str(cfg.parallel.strategy), "compression": c.name,
            "accumulation": cfg.accumulation.steps, **got,
            "sent_bytes": parallel.traffic(cfg, parallel.World.of_cluster(cl), shapes)}


def predict(pc: PlanConfig, train: list) -> None:
    cl = dataclasses.replace(pc.cluster, nodes=pc.nodes or pc.cluster.nodes,
                             ranks_per_node=pc.ranks_per_node or pc.cluster.ranks_per_node)
    rest = [a for a in train if not a.lstrip("+").startswith("parallel=")]
    one = [a.split("=", 1)[1] for a in train if a.lstrip("+").startswith("parallel=")]
    bad = [p for p in pc.presets if p not in presets()]
    if bad:
        raise ConfigError(f"presets: no preset {bad[0]}; choose from {', '.join(presets())}")
    if pc.quality and not Path(pc.quality).is_file():
        raise ConfigError(f"quality={pc.quality}: no such file (give compare's quality.json, or leave it out for "
                          f"{QUALITY_RECORD.relative_to(QUALITY_RECORD.parents[2])})")
    verdicts = quality_of(pc.quality or QUALITY_RECORD)  # checked before anything is measured or written
    configs = {n: preset_config(n, rest, cl.nodes) for n in one or pc.presets or presets()}
    base = configs.get("ddp") or preset_config("ddp", rest, cl.nodes)
    model = build_model(base.model, base.data.num_labels)
    shapes = [p.shape for p in model.parameters() if p.requires_grad]
    compute, source = compute_times(pc, base, model, cl)
    here = source.startswith("measured")
    rows = [row(n, c, cl, shapes, compute, here) for n, c in configs.items()]
    ddp = row("ddp", base, cl, shapes, compute, here)
    for r in rows:
        r["speedup"] = r["samples_s"] / ddp["samples_s"]
    for r, cfg in zip(rows, configs.values(), strict=True):
        r["quality"], r["auroc_diff"] = judged(r["preset"], cfg, verdicts, pc.quality_budget)
    ok = [r for r in rows if r["quality"] in ELIGIBLE] or rows
    best = max(ok, key=lambda r: r["samples_s"])
    command = " ".join(["python -m ringexp.train", f"+parallel={best['preset']}", *rest])
    out = out_dir(pc.out, cl.name, base.model.name)
    plotted = {n: c for n, c in (configs | {"ddp": base}).items() if n in pc.plot_presets}
    plot(cl, {n: partial(step_at, cfg=c, shapes=shapes, compute=compute) for n, c in plotted.items()},
         out / "plan.png")
    text = report(cl, base, rows, compute, source, best, command, pc.quality_budget, pc.quality or QUALITY_RECORD)
    records.write_file(out / "plan.md", text)
    records.write_file(out / "plan.json", json.dumps({"cluster": plain(cl), "compute": compute,
                                                      "compute_source": source, "rows": rows,
                                                      "recommended": command}, indent=1) + "\n")
    print(text, end="")
    print(f"ringexp: wrote {out}/plan.md, plan.json and plan.png")


def out_dir(out: str | None, cluster: str, model: str) -> Path:
    """Where predict writes: out= (the user's directory, which may be a link they made), else
    outputs/plan/<cluster>/<model>/, made by ringexp (records.make_dir: never a symlink planted there), each name
    as one bounded plain name (clusters.file_name: a cluster's name may be any length)."""
    path = Path(out) if out else Path("outputs", "plan", file_name(cluster), file_name(model))
    try:
        if out:
            path.mkdir(parents=True, exist_ok=True)
            return path
        return records.make_dir(path)
    except OSError as e:
        raise ConfigError(f"{e.filename or path}: cannot write the plan there ({e.strerror or e}); remove it, or "
                          "give out=DIR") from None


def step_at(cl, cfg, shapes: list, compute: dict) -> float:
    """Predicted step time of `cfg` on cluster `cl` (the plot's: the cluster's file costs, no measured PowerSGD)."""
    return parallel.step_cost(cl, cfg, shapes, compute)["step_s"]


ELIGIBLE = ("exact", "equivalent", "better")  # what the recommendation may choose from


def quality_of(path) -> dict:
    """{conf/parallel preset: the verdict's record on the file's headline metric (final macro-AUROC)} from
    compare's quality.json: the groups whose overrides are the baseline's but for `+parallel=NAME` (seeds apart);
    {} where the file is missing. Every group and verdict of the file is checked first (quality.read_record): a
    reversed interval or a word its numbers do not give is refused, naming the group and the entry."""
    if not Path(path).is_file():
        return {}
    try:
        record = quality.read_record(path)
    except OSError as e:
        raise ConfigError(f"quality={path}: cannot read it ({e.strerror or e}); give compare's quality.json") from None
    except ValueError as e:
        raise ConfigError(f"quality={path}: {e}; give compare's quality.json as compare wrote it") from None
    base = next(set(g["overrides"]) for g in record["groups"] if g["baseline"])
    out = {}
    for g in record["groups"]:
        extra = set(g["overrides"]) - base
        if len(extra) == 1 and (name := extra.pop()).startswith("+parallel=") and \
                base - set(g["overrides"]) <= {"+parallel=ddp"}:
            out[name.removeprefix("+parallel=")] = g["verdicts"].get(record["metric"])
    return out


def judged(name: str, cfg, verdicts: dict, budget: float) -> tuple:
    """(verdict, measured difference or None) of preset `name` at margin `budget`, from its record's intervals:
    "exact" for a preset that sends the gradients uncompressed at one micro-step (the same arithmetic up to the
    order of a sum), "unmeasured" where the record has no verdict for it."""
    v = verdicts.get(name)
    if v is not None:
        return quality.decide(v["diff"], tuple(v["ci95"]), tuple(v["ci90"]), budget), v["diff"]
    exact = cfg.compression.name == "none" and cfg.accumulation.steps == 1 and cfg.amp.mode == "off"
    return ("exact" if exact else "unmeasured"), None
