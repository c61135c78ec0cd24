"""The published cases predicted (`python -m ringexp.plan accuracy cases=FILE`, the file read and checked by
published.py): each run as `predict` would predict it (the strategy's `step_cost` on that cluster and training
config) beside its measurement, each run naming a `baseline` as a ratio (did the model see which of the two is
faster), and the summary of both. A run whose configuration Hydra or ringexp refuses is named with the field: one
line, `cases=FILE: case NAME: run NAME: FIELD: WHY`."""

import dataclasses
import functools
import statistics

import torch
from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from ringexp import parallel
from ringexp.config import ModelConfig
from ringexp.errors import ConfigError, one_line
from ringexp.models import build_model
from ringexp.plan import rules
from ringexp.plan.published import refuser
from ringexp.plotting import short
from ringexp.validate import compose_config


def shapes_of(case: dict) -> list:
    """The gradient shapes: the timm model's, built on the meta device (nothing allocated), or `params` split into
    tensors of at most 4M parameters (a stand-in for a model timm lacks; DDP's buckets follow sizes only)."""
    if "model" in case:
        with torch.device("meta"):
            model = build_model(ModelConfig(name=case["model"]), 1000)
        return [p.shape for p in model.parameters() if p.requires_grad]
    n, piece = int(case["params"]), 1 << 22
    return [torch.Size([piece])] * (n // piece) + ([torch.Size([n % piece])] if n % piece else [])


def predicted(path: str, clusters: dict, case: dict, changes: tuple = (rules.same,)) -> list:
    """Every run of `case` (of the file `path`) beside the model's prediction, once per change of its cluster in
    `changes` (rules.py: the alternatives of the rules chosen on the cases): [[{case, study, run, measured,
    predicted, error, unit, ...}] per change], each run's configuration composed once. ConfigError naming the
    file, the case, the run and its field where one is refused (an unknown preset or key in `train`, a shape the
    cluster cannot have)."""
    shapes = shapes_of(case)
    step = case["compute"]["step_s"]  # forward : backward = 1 : 2, as compare splits a run's compute
    compute = {"forward_s": step / 3, "backward_s": 2 * step / 3, "optimizer_s": 0.0}
    out = [[] for _ in changes]
    for run in case["runs"]:
        cl = shape(path, clusters, case, run)
        try:
            cfg = composed(case, run)
            costs = []  # (cluster, its step): the changes that leave this cluster as another left it cost nothing
            for rows, change in zip(out, changes, strict=True):
                c = change(cl)
                got = next((g for other, g in costs if other == c), None)
                if got is None:
                    got = parallel.step_cost(c, cfg, shapes, compute)
                    costs.append((c, got))
                rows.append(row(case, run, got))
        except (ValueError, HydraException, OmegaConfBaseException) as e:  # (ConfigError is a ValueError)
            refused(path, case, run, e)
    return out


def row(case: dict, run: dict, got: dict) -> dict:
    unit = "step_s" if "step_s" in run else "samples_s"
    return {"case": case["name"], "study": case["study"], "run": run["name"], "unit": unit, "measured": run[unit],
            "predicted": got[unit], "error": got[unit] / run[unit] - 1, "input": bool(run.get("input")),
            "baseline": run.get("baseline"), "chosen": got.get("nccl", ""), "source": run["source"]}


def shape(path: str, clusters: dict, case: dict, run: dict):
    """The run's shape of the case's cluster; ConfigError `cases=FILE: case NAME: run NAME: nodes,
    ranks_per_node: WHY` where the cluster cannot have it."""
    try:
        return dataclasses.replace(clusters[case["cluster"]], nodes=run["nodes"], ranks_per_node=run["ranks_per_node"])
    except ConfigError as e:
        refuser(path, 0, case)(f"run {ascii(short(run['name']))}: nodes, ranks_per_node", str(e))


def refused(path: str, case: dict, run: dict, e: Exception) -> None:
    """ConfigError `cases=FILE: case NAME: run NAME: train: WHY` for a run whose configuration Hydra or ringexp
    refused (the run's own train where the case's composes without it, else the case's)."""
    cause = f": {one_line(str(e.__cause__))}" if e.__cause__ else ""
    label = f"run {ascii(short(run['name']))}: train" if run.get("train") and composes(case, dict(run, train=[])) \
        else "train"  # (asked only once refused)
    refuser(path, 0, case)(label, short(one_line(str(e)) + cause, 400))


def composed(case: dict, run: dict):
    """The training config of a run: the case's env and train, then the run's own, at the case's batch."""
    env = [f"+backend.env.{k}={v}" for k, v in (case.get("env") or {}).items()]
    train = [*env, *case.get("train", []), *run.get("train", [])]
    default = [] if any(a.startswith("+parallel=") for a in train) else ["+parallel=ddp"]
    return composed_once((*default, f"data.batch_size={case['batch']}", *train), run["nodes"])


@functools.lru_cache(maxsize=256)
def composed_once(args: tuple, nodes: int):
    """compose_config, once for each set of overrides (Hydra's compose takes 0.2 s; a case's runs at one node
    count and setting share one; nothing downstream changes the config)."""
    return compose_config(list(args), nodes)


def composes(case: dict, run: dict) -> bool:
    try:
        composed(case, run)
    except (ValueError, HydraException, OmegaConfBaseException):
        return False
    return True


def ratios(rows: list) -> list:
    """[{case, run, baseline, measured, predicted, right}] for every run naming a baseline: variant over baseline,
    measured and predicted, and whether the model sees the same one faster (step_s: lower; samples_s: higher)."""
    by = {(r["case"], r["run"]): r for r in rows}
    out = []
    for r in rows:
        if r["baseline"] is None:
            continue
        b = by[(r["case"], r["baseline"])]
        m, p = r["measured"] / b["measured"], r["predicted"] / b["predicted"]
        out.append({"case": r["case"], "run": r["run"], "baseline": r["baseline"], "unit": r["unit"],
                    "measured": m, "predicted": p, "right": (m > 1) == (p > 1)})
    return out


def summary(rows: list, rats: list) -> str:
    scored = sorted(abs(r["error"]) for r in rows if not r["input"])
    right = sum(r["right"] for r in rats)
    if not scored:
        return f"no run scored: each is its case's compute (input: true); ratios right: {right} of {len(rats)}"
    return (f"{len(scored)} published runs (not counting the {len(rows) - len(scored)} the compute came from): "
            f"median |error| {statistics.median(scored):.1%}, worst {scored[-1]:.1%}, within 10%: "
            f"{sum(e <= 0.10 for e in scored)}; ratio directions right: {right} of {len(rats)}")
