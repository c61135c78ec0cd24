"""`python -m ringexp.plan accuracy bench=[bench.json,...]`: every row of ringexp.bench run on the cluster against the
cost model's prediction from the cluster file (the row's collective and compressor answer for it:
ringexp.compress.seconds), as a table, the median and worst relative errors, and a plot."""

import dataclasses
import json
import math
import statistics
from pathlib import Path

import torch

from ringexp import compress, records
from ringexp.config import CompressionConfig
from ringexp.errors import ConfigError
from ringexp.plan import heldout, published, rules, scoring
from ringexp.plan.config import PlanConfig
from ringexp.plotting import pyplot, save, short

# what `accuracy` reads of a bench.json row, and its type
BENCH_KEYS = {"algorithm": str, "link": str, "size_bytes": int, "count": int, "nodes": int, "ranks_per_node": int,
              "time_us": (int, float)}
# read where a row has it (ringexp.bench since 22aaada): the mean over rounds, what a run pays, a link's tail
# included (costmodel.call), rather than the median
BENCH_MEAN = "time_us_mean"


def accuracy(pc: PlanConfig, train: list = ()) -> None:
    rows = [(path, r) for path in pc.bench for r in bench_rows(path)]
    loaded = [(path, *published.load(path)) for path in pc.cases]  # every file checked before anything is predicted
    if not rows and not loaded:
        raise ConfigError("accuracy needs bench=[PATH,...] (bench.json files of ringexp.bench run on the cluster) "
                          "or cases=[PATH,...] (published cases: ringexp/plan/published.yaml)")
    # every prediction made (a case's run refused, naming it) before anything is written
    cases = [case(pc, path, r) for path, r in rows]
    combinations = rules.combinations()
    changes = tuple(rules.change(c) for c in combinations)
    each = [scoring.predicted(path, clusters, c, changes) for path, clusters, found in loaded for c in found]
    by_combination = [(c, [r for case in each for r in case[i]]) for i, c in enumerate(combinations)]
    text = bench_report(pc, cases) if rows else ""
    if loaded:
        text += ("\n" if text else "") + published_report(pc, by_combination)
    print(text, end="")


def published_report(pc: PlanConfig, by_combination: list) -> str:
    """The published cases' table in sample (the model's own rules: `by_combination`'s first, the runs as
    scoring.predicted gives them), their ratios and the summary, then leave-one-source-out's (heldout.py), the
    headline (and accuracy-published.md/json under `out`)."""
    got, held = by_combination[0][1], heldout.held_out(by_combination)
    rats = scoring.ratios(got)
    lines = ["# Published cases against the cost model", "", *([heldout.headline(held), ""] if held else []),
             "| case | run | measured | predicted | error | NCCL's choice (model) |", "|" + "---|" * 6]
    lines += [f"| {r['case']} | {r['run']} | {fmt(r['unit'], r['measured'])} | {fmt(r['unit'], r['predicted'])} | "
              f"{'(compute from it)' if r['input'] else format(r['error'], '+.1%')} | {r['chosen'] or '-'} |"
              for r in got]
    lines += ["", "| case | variant / baseline | measured ratio | predicted ratio | direction |", "|" + "---|" * 5]
    lines += [f"| {r['case']} | {r['run']} / {r['baseline']} | {r['measured']:.3f} | {r['predicted']:.3f} | "
              f"{'right' if r['right'] else 'WRONG'} |" for r in rats]
    text = "\n".join(lines + ["", "In sample: " + scoring.summary(got, rats), "", *heldout.report(got, held)])
    text += "\n"
    if pc.out:
        Path(pc.out).mkdir(parents=True, exist_ok=True)  # the user's directory; what goes in it never through a link
        records.write_file(Path(pc.out, "accuracy-published.md"), text)
        records.write_file(Path(pc.out, "accuracy-published.json"),
                           json.dumps({"runs": got, "ratios": rats, "held_out": {
                               s: {"rules": c, "runs": r} for s, (c, r) in held.items()}},
                               indent=1) + "\n")
    return text


def fmt(unit: str, v: float) -> str:
    return f"{v * 1e3:.1f} ms/step" if unit == "step_s" else f"{v:,.0f} samples/s"


def bench_report(pc: PlanConfig, out: list) -> str:
    """The bench rows' table beside the model (`out`: case() of each), the errors' summary (and accuracy.md, .json
    and .png under `out`)."""
    errors = sorted(abs(o["error"]) for o in out)
    lines = [f"# {pc.cluster.name}: ringexp.bench times (the mean over rounds where a row has it, else the median) "
             "against the cost model", "",
             "| nodes x ranks | link | algorithm | size | measured ms | predicted ms | error |", "|" + "---|" * 7]
    lines += [f"| {o['nodes']} x {o['ranks_per_node']} | {o['link']} | {o['algorithm']} | {o['size_bytes'] >> 20} MB | "
              f"{o['measured_s'] * 1e3:.1f} | {o['predicted_s'] * 1e3:.1f} | {o['error']:+.0%} |" for o in out]
    lines += ["", f"{len(out)} cases: median |error| {statistics.median(errors):.1%}, worst {errors[-1]:.1%}; "
              f"within 10%: {sum(e <= 0.10 for e in errors)}, within 25%: {sum(e <= 0.25 for e in errors)}"]
    text = "\n".join(lines) + "\n"
    if pc.out:
        Path(pc.out).mkdir(parents=True, exist_ok=True)
        records.write_file(Path(pc.out, "accuracy.md"), text)
        records.write_file(Path(pc.out, "accuracy.json"), json.dumps(out, indent=1) + "\n")
        accuracy_plot(pc.cluster.name, out, Path(pc.out, "accuracy.png"))
    return text


def case(pc: PlanConfig, path: str, r: dict) -> dict:
    """One bench row beside the model's prediction for its shape of cluster, collective and compressor."""
    try:  # the cluster's own checks (nodes and ranks in range), naming the bench file whose row failed them
        cl = dataclasses.replace(pc.cluster, nodes=r["nodes"], ranks_per_node=r["ranks_per_node"])
    except ConfigError as e:
        raise ConfigError(f"bench={path}: {e}") from None
    algorithm, options, c = compress.parse(r["algorithm"])
    predicted = compress.seconds(cl, c or CompressionConfig(name="none"), algorithm, [torch.Size([r["count"]])],
                                 **options)
    measured = r.get(BENCH_MEAN, r["time_us"]) / 1e6
    return {"algorithm": r["algorithm"], "size_bytes": r["size_bytes"], "nodes": r["nodes"],
            "ranks_per_node": r["ranks_per_node"], "link": r["link"], "measured_s": measured,
            "predicted_s": predicted, "error": predicted / measured - 1}


def bench_rows(path: str) -> list:
    """The rows of one bench.json of ringexp.bench, each with what accuracy reads, of the type it needs (numbers
    finite and in range, an algorithm and compressor the bench runs); ConfigError naming the file and row."""
    try:
        rows = records.read_bench(path)
    except (OSError, ValueError) as e:
        raise ConfigError(f"bench={path}: cannot read it ({e}); give bench.json files of ringexp.bench") from None
    if not isinstance(rows, list):
        raise ConfigError(f"bench={path}: not a list of rows; give bench.json files of ringexp.bench")
    for i, r in enumerate(rows):
        wrong = bench_row_error(r)
        if wrong:
            raise ConfigError(f"bench={path}: row {i}: {wrong}; give bench.json files of ringexp.bench")
    return rows


def bench_row_error(r) -> str:
    """What keeps a bench.json row from being predicted ('' when nothing does)."""
    if not isinstance(r, dict):
        return f"a {type(r).__name__}, not a row (an object)"
    missing = [k for k in BENCH_KEYS if k not in r]
    if missing:
        return f"no {missing[0]!r}"
    for key, kind in (BENCH_KEYS | ({BENCH_MEAN: (int, float)} if BENCH_MEAN in r else {})).items():
        v = r[key]
        if isinstance(v, bool) or not isinstance(v, kind):  # (True is an int to Python)
            return f"{key}={v!r} is not {'a string' if kind is str else 'an integer' if kind is int else 'a number'}"
        if kind is not str and not (math.isfinite(v) and v > 0):
            return f"{key}={v!r} must be a finite number > 0"
    try:
        compress.parse(r["algorithm"])
    except ValueError as e:
        return f"algorithm {r['algorithm']!r} is none ringexp.bench runs ({e})"
    return ""


def accuracy_plot(name: str, out: list, path: Path) -> None:
    """Measured against predicted, one point per bench case (colour: compressor, marker: algorithm), with the
    line where they are equal and the 25% band around it."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 5))
    algorithms = list(dict.fromkeys(o["algorithm"].partition("+")[0] for o in out))  # as the bench named them
    markers = dict(zip(algorithms, "osD^v<>ph*", strict=False))
    colours = {"none": "tab:blue", "fp16": "tab:orange", "int8": "tab:green"}
    for o in out:
        algo, _, comp = o["algorithm"].partition("+")
        comp = comp.split(":")[0] or "none"
        ax.scatter(o["measured_s"] * 1e3, o["predicted_s"] * 1e3, marker=markers.get(algo, "x"),
                   color=colours.get(comp, "tab:grey"), s=30, alpha=0.8)
    lo = min(min(o["measured_s"], o["predicted_s"]) for o in out) * 1e3 / 1.5
    hi = max(max(o["measured_s"], o["predicted_s"]) for o in out) * 1e3 * 1.5
    ax.plot([lo, hi], [lo, hi], color="black", linewidth=1)
    ax.fill_between([lo, hi], [lo * 0.75, hi * 0.75], [lo * 1.25, hi * 1.25], color="grey", alpha=0.15,
                    label="within 25%")
    for label, m in markers.items():
        ax.scatter([], [], marker=m, color="black", label=short(label))
    for label, c in colours.items():
        ax.scatter([], [], marker="s", color=c, label=label)
    ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), xlabel="measured median (ms)",
           ylabel="predicted (ms)", title=f"{short(name)}: all-reduce, model against ringexp.bench")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    save(fig, path, 110)
