"""`python -m ringexp.plan predict`: every conf/parallel preset's predicted step on a cluster, for a training config.
Each number comes from ringexp.predict (the preset's strategy: `step_cost`, `traffic`); the command ranks the rows,
recommends and writes them out."""

import dataclasses
import json
from functools import partial
from pathlib import Path

from ringexp import parallel, quality, records
from ringexp.cluster.files import file_name
from ringexp.config import plain
from ringexp.errors import ConfigError
from ringexp.models import build_model
from ringexp.plan.config import PlanConfig
from ringexp.plan.report import plot, report
from ringexp.predict import (
    ELIGIBLE,
    compute_times,
    decisive,
    judged,
    over_steps,
    preset_config,
    presets,
    quality_of,
    row,
)
from ringexp.verdicts.groups import margins_of


def predict(pc: PlanConfig, train: list) -> None:
    cl = dataclasses.replace(pc.cluster, nodes=pc.nodes or pc.cluster.nodes,
                             ranks_per_node=pc.ranks_per_node or pc.cluster.ranks_per_node)
    rest = [a for a in train if not a.lstrip("+").startswith("parallel=")]
    one = [a.split("=", 1)[1] for a in train if a.lstrip("+").startswith("parallel=")]
    bad = [p for p in pc.presets if p not in presets()]
    if bad:
        raise ConfigError(f"presets: no preset {bad[0]}; choose from {', '.join(presets())}")
    configs = {n: preset_config(n, rest, cl.nodes) for n in one or pc.presets or presets()}
    base = configs.get("ddp") or preset_config("ddp", rest, cl.nodes)
    task = quality.task_of(base, cl.nodes * cl.ranks_per_node)  # the verdicts must be of it
    # checked before anything is measured or written
    verdicts, written = quality_of(pc.quality, task) if pc.quality else ({}, {"metrics": list(quality.DECIDING)})
    margins = margins_of(pc.quality_budget, pc.f1_budget)
    model = build_model(base.model, base.data.num_labels)
    shapes = [p.shape for p in model.parameters() if p.requires_grad]
    given = {k: getattr(pc, k) for k in ("forward_s", "backward_s", "optimizer_s")}
    compute, source = compute_times(given, base, model, cl)
    here = source.startswith("measured")
    rows = [row(n, c, cl, shapes, compute, here) for n, c in configs.items()]
    ddp = row("ddp", base, cl, shapes, compute, here)
    for r, cfg in zip(rows, configs.values(), strict=True):  # the headline: the whole run (PowerSGD's first steps)
        r["whole_samples_s"] = over_steps(r["preset"], cfg, cl, shapes, compute, here, 1, cfg.steps)["samples_s"]
        r["speedup"] = r["whole_samples_s"] / ddp["samples_s"]
    best, family = recommended(rows, configs, verdicts, margins, pc.error)
    best = best or ddp  # (none: the baseline, exact by definition)
    command = " ".join(["python -m ringexp.train", f"+parallel={best['preset']}", *rest])
    out = out_dir(pc.out, cl.name, base.model.name)
    plotted = {n: c for n, c in (configs | {"ddp": base}).items() if n in pc.plot_presets}
    plot(cl, {n: partial(step_at, cfg=c, shapes=shapes, compute=compute) for n, c in plotted.items()},
         out / "plan.png")
    on = {m: margins[m] for m in written["metrics"]}
    bound = {"error": pc.error, "family": family, "alpha": pc.error / max(family, 1), "written": written}
    text = report(cl, base, rows, compute, source, command, on, pc.quality, rest, bound)
    records.write_file(out / "plan.md", text)
    records.write_file(out / "plan.json", json.dumps({"cluster": plain(cl), "compute": compute,
                                                      "compute_source": source, "rows": rows,
                                                      "recommended": command, "quality": pc.quality,
                                                      "decided_on": on, "bound": bound,
                                                      "task": task}, indent=1) + "\n")
    print(text, end="")
    print(f"ringexp: wrote {out}/plan.md, plan.json and plan.png")


def recommended(rows: list, configs: dict, verdicts: dict, margins: dict, error: float) -> tuple:
    """(the fastest row of `rows` (`configs`' predictions, in order) whose quality is eligible, or None; the family)
    with each row judged: the family is the presets here with decisive verdicts, any of which a verdict could make
    the one recommended, and each of their tests is read at error / family (Bonferroni, as the tune's over its
    slots), so that a preset worse than a margin is recommended with chance at most `error` (predict's error=)."""
    family = sum(decisive(verdicts.get(n)) for n in configs)
    alpha = error / max(family, 1)
    for r, cfg in zip(rows, configs.values(), strict=True):
        r["quality"], r["auroc_diff"], r["decided_on"] = judged(r["preset"], cfg, verdicts, margins, alpha)
    ok = [r for r in rows if r["quality"] in ELIGIBLE]
    return (max(ok, key=lambda r: r["whole_samples_s"]) if ok else None), family


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
