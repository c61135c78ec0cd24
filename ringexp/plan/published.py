"""Published measurements of real clusters as the planner's check (`python -m ringexp.plan accuracy cases=FILE`):
a YAML of clusters written from the papers' hardware and of cases (a model, a batch, one GPU's measured step as
the compute, and measured runs at several shapes and settings, every number with its source). Each run is
predicted as `predict` would (the strategy's `step_cost` on that cluster and training config) and put beside its
measurement; a run naming a `baseline` is also judged as a ratio: did the model see which of the two is faster.

The file, in short (ringexp/plan/published.yaml is the shipped one):

    clusters: {NAME: a conf/cluster mapping (ClusterConfig)}
    cases:
      - name, source, cluster: NAME, model: timm name (or params: count), batch: per GPU
        compute: {step_s, source}: one GPU's forward, backward and optimizer step at that batch
        train: [training overrides], env: {NCCL_ALGO: ..., NCCL_PROTO: ...}  (both optional)
        runs: [{name, nodes, ranks_per_node, step_s or samples_s, source, train, baseline, input}]

`input: true` marks the run the compute was taken from: predicted exactly by construction, so not scored."""

import dataclasses
import math
import statistics

import torch
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ringexp import parallel, records
from ringexp.config import NCCL_CHOICES, ClusterConfig, ModelConfig, nccl_list_error, yaml_text
from ringexp.errors import ConfigError, one_line
from ringexp.models import build_model
from ringexp.validate import compose_config

CASE_KEYS = {"name": str, "source": str, "cluster": str, "batch": int, "compute": dict, "runs": list}
RUN_KEYS = {"name": str, "nodes": int, "ranks_per_node": int, "source": str}
MEASURES = ("step_s", "samples_s")  # what a run's measurement may be: seconds per optimizer step, or throughput


def load(path: str) -> tuple:
    """({cluster name: ClusterConfig}, [case]) of a published-cases file, every field checked; ConfigError naming
    the file, the case and the field otherwise."""
    try:
        doc = OmegaConf.to_container(OmegaConf.create(yaml_text(path, records.read_bytes(path, follow=True))))
    except OSError as e:
        raise ConfigError(f"cases={path}: cannot read it ({e.strerror or e}); give a published-cases YAML") from None
    except OmegaConfBaseException as e:
        raise ConfigError(f"cases={path}: {one_line(str(e))}") from None
    if not isinstance(doc.get("clusters"), dict) or not isinstance(doc.get("cases"), list) or not doc["cases"]:
        raise ConfigError(f"cases={path}: needs a `clusters` mapping and a non-empty `cases` list")
    clusters = {name: cluster(path, name, c) for name, c in doc["clusters"].items()}
    cases = [checked(path, i, c, clusters) for i, c in enumerate(doc["cases"])]
    return clusters, cases


def cluster(path: str, name: str, body) -> ClusterConfig:
    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ClusterConfig), {"name": name, **body}))
    except (OmegaConfBaseException, ConfigError, TypeError) as e:
        raise ConfigError(f"cases={path}: cluster {name}: {one_line(str(e))}") from None


def checked(path: str, i: int, case, clusters: dict) -> dict:
    """The case as read, or ConfigError `cases=FILE: case NAME: FIELD ...`."""
    name = case.get("name", f"#{i}") if isinstance(case, dict) else f"#{i}"

    def wrong(field: str, why: str):
        raise ConfigError(f"cases={path}: case {name}: {field}: {why}")

    if not isinstance(case, dict):
        wrong("case", "not a mapping")
    for key, kind in CASE_KEYS.items():
        if not isinstance(case.get(key), kind) or isinstance(case.get(key), bool):
            wrong(key, "missing" if key not in case else f"{case[key]!r} is not a {kind.__name__}")
    if case["cluster"] not in clusters:
        wrong("cluster", f"{case['cluster']!r} is none of the file's clusters ({', '.join(clusters)})")
    if ("model" in case) == ("params" in case):
        wrong("model", "give a timm model name or a parameter count (params), one of them")
    number(case["compute"], "step_s", wrong, "compute.")
    if not case["compute"].get("source"):
        wrong("compute.source", "every number needs its source")
    for key, value in (case.get("env") or {}).items():
        if key not in NCCL_CHOICES or key == "NCCL_DEBUG":
            wrong(f"env.{key}", "only NCCL_ALGO and NCCL_PROTO restrict the model")
        if bad := nccl_list_error(key, str(value)):
            wrong(f"env.{key}", f"{value}: {bad}")
    names = [r.get("name") for r in case["runs"] if isinstance(r, dict)]
    for j, run in enumerate(case["runs"]):
        check_run(run, j, names, wrong)
    return case


def check_run(run, j: int, names: list, wrong) -> None:
    label = f"runs[{j}]" if not isinstance(run, dict) or "name" not in run else f"run {run['name']!r}"
    if not isinstance(run, dict):
        wrong(label, "not a mapping")
    for key, kind in RUN_KEYS.items():
        if not isinstance(run.get(key), kind) or isinstance(run.get(key), bool):
            wrong(f"{label}: {key}", "missing" if key not in run else f"{run[key]!r} is not a {kind.__name__}")
    given = [m for m in MEASURES if m in run]
    if len(given) != 1:
        wrong(f"{label}: step_s", "give the measured step_s or samples_s, one of them")
    number(run, given[0], wrong, f"{label}: ")
    if run.get("baseline") is not None and run["baseline"] not in names:
        wrong(f"{label}: baseline", f"{run['baseline']!r} is no run of this case")


def number(d: dict, key: str, wrong, prefix: str) -> None:
    v = d.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v > 0):
        wrong(f"{prefix}{key}", "missing" if key not in d else f"{v!r} must be a finite number > 0")


def shapes_of(case: dict) -> list:
    """The gradient shapes: the timm model's, built on the meta device (nothing allocated), or `params` split into
    tensors of at most 4M parameters (a stand-in for a model timm lacks; DDP's buckets follow sizes only)."""
    if "model" in case:
        with torch.device("meta"):
            model = build_model(ModelConfig(name=case["model"]), 1000)
        return [p.shape for p in model.parameters() if p.requires_grad]
    n, piece = int(case["params"]), 1 << 22
    return [torch.Size([piece])] * (n // piece) + ([torch.Size([n % piece])] if n % piece else [])


def predicted(clusters: dict, case: dict) -> list:
    """Every run of `case` beside the model's prediction: [{case, run, measured, predicted, error, unit, ...}]."""
    shapes = shapes_of(case)
    step = case["compute"]["step_s"]  # forward : backward = 1 : 2, as compare splits a run's compute
    compute = {"forward_s": step / 3, "backward_s": 2 * step / 3, "optimizer_s": 0.0}
    env = [f"+backend.env.{k}={v}" for k, v in (case.get("env") or {}).items()]
    out = []
    for run in case["runs"]:
        cl = dataclasses.replace(clusters[case["cluster"]], nodes=run["nodes"], ranks_per_node=run["ranks_per_node"])
        train = [*env, *case.get("train", []), *run.get("train", [])]
        default = [] if any(a.startswith("+parallel=") for a in train) else ["+parallel=ddp"]
        cfg = compose_config([*default, f"data.batch_size={case['batch']}", *train], run["nodes"])
        got = parallel.step_cost(cl, cfg, shapes, compute)
        unit = "step_s" if "step_s" in run else "samples_s"
        out.append({"case": case["name"], "run": run["name"], "unit": unit, "measured": run[unit],
                    "predicted": got[unit], "error": got[unit] / run[unit] - 1, "input": bool(run.get("input")),
                    "baseline": run.get("baseline"), "chosen": got.get("nccl", ""), "source": run["source"]})
    return out


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
