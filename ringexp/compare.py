"""`python -m ringexp.compare PATH...`: the runs of one or more sweeps as one table and a few plots.

PATHs are sweep directories or run directories (anything holding `summary.json` files below it), from local
or Slurm runs; `--wandb ENTITY/PROJECT --group NAME` reads the same numbers from the W&B API instead. One
row per run: the overrides that differ between the runs, median throughput with its p10-p90 spread, the
speed-up against a baseline row (`--baseline TEXT`: the first row whose label contains TEXT; default: the
`ddp` row, else the first), the step time split, bytes per step, final/best macro-AUROC and F1, peak memory.
Failed runs are listed with their error. Every sweep of `ringexp.train -m` ends with this report written
into its directory (`SweepReport`, a Hydra callback), so the numbers are there even with W&B offline.
"""

import argparse
import csv
import io
import json
import sys
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ringexp import backend, compress, costmodel, records
from ringexp.config import CONF_DIR, ClusterConfig, TrainConfig, load_yaml
from ringexp.errors import ConfigError, print_error, print_warning
from ringexp.models import build_model

OUTPUTS = ("compare.md", "compare.csv", "throughput.png", "auroc.png", "comm_share.png")
HEAD = ["run", "ranks", "samples/s", "p10-p90", "speed-up", "step ms", "compute ms", "exposed comm ms",
        "comm share", "overlap", "wire kB/step", "final AUROC", "best AUROC", "final F1", "peak MB"]
PREDICTED = ["predicted comm ms", "predicted step ms", "step error"]  # runs on a calibrated cluster only
BACKWARD_SHARE = 2 / 3  # of forward + backward: backward costs twice forward (Kaplan et al. 2020, 6N = 2N + 4N)


def load_local(paths) -> list:
    """Every run below `paths`: {"dir", "summary", "rows"}, in path order (a sweep's jobs by number)."""
    runs, seen = [], set()
    for p in map(Path, paths):
        if not p.exists():
            raise FileNotFoundError(f"{p}: no such directory")
        files = [p / "summary.json"] if (p / "summary.json").exists() else sorted(
            p.rglob("summary.json"), key=lambda f: [int(x) if x.isdigit() else x for x in f.parent.parts])
        for f in files:
            if f.parent in seen:
                continue
            seen.add(f.parent)
            rows = records.read_rows(f.parent)  # a line cut short by a killed run is dropped, the run kept
            summary = readable_summary(f)
            hydra_overrides = f.parent / ".hydra" / "overrides.yaml"
            if "overrides" not in summary and hydra_overrides.exists():  # a run that failed before it started
                summary["overrides"] = list(OmegaConf.load(hydra_overrides))
            runs.append({"dir": str(f.parent), "summary": summary, "rows": rows})
    return runs


def readable_summary(f: Path) -> dict:
    """The summary, or one that lists the run as unreadable with its path and why (cut-off text, `[]`, `null`):
    one broken file must not cost the report of every other run."""
    try:
        summary = json.loads(f.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        return {"status": "unreadable", "error": f"{f}: unreadable ({type(e).__name__}: {e})"}
    if not isinstance(summary, dict):
        return {"status": "unreadable", "error": f"{f}: unreadable (holds {type(summary).__name__}, not a summary)"}
    return summary


def load_wandb(path: str, group: str) -> list:
    """The same records from the W&B API (online): summaries are stored flattened with '.' separators."""
    import wandb  # only for --wandb: importing it costs about a second

    runs = []
    for r in wandb.Api().runs(path, filters={"group": group}, order="+created_at"):
        summary = unflatten({k: v for k, v in r.summary.items() if not k.startswith("_")})
        summary.setdefault("status", "completed" if r.state == "finished" else r.state)
        summary.setdefault("overrides", (r.name or "").split(","))
        rows = [{"step": h.get("_step"), **h} for h in r.scan_history()]
        runs.append({"dir": r.url, "summary": summary, "rows": rows})
    return runs


def unflatten(flat: dict) -> dict:
    out = {}
    for key, value in flat.items():
        node, parts = out, key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return out


def labels(runs) -> list:
    """Each run's overrides that are not shared by every run (what the sweep varied)."""
    over = [[o for o in r["summary"].get("overrides", []) if not o.startswith(("name=", "hydra."))] for r in runs]
    common = set.intersection(*map(set, over)) if over else set()
    return [" ".join(o for o in ov if o not in common) or "(all the same)" for ov in over]


def table(runs, baseline: str | None = None):
    """(rows for completed runs, [(label, error)] for the others, index of the baseline row)."""
    done, failed = [], []
    for run, label in zip(runs, labels(runs), strict=True):
        s = run["summary"]
        if s.get("status") == "completed":
            done.append((label, run))
        else:
            failed.append((label or run["dir"], s.get("error") or s.get("status") or "unknown"))
    if not done:
        return [], failed, None
    base = next((i for i, (label, _) in enumerate(done) if baseline and baseline in label), None)
    if base is None:
        base = next((i for i, (_, r) in enumerate(done) if r["summary"].get("job_type") == "ddp"), 0)
    base_tp = done[base][1]["summary"]["throughput"]["median"]
    rows, clusters = [], calibrations()
    for label, run in done:
        s = run["summary"]
        tp, t, m = s["throughput"], s.get("time", {}), s.get("memory", {})
        step, comm = t.get("step_s"), t.get("comm_s")
        rows.append({
            "run": label, "ranks": s.get("world_size"), "samples/s": tp["median"],
            "p10-p90": f"{tp['p10']:.0f}-{tp['p90']:.0f}" if tp.get("p10") is not None else None,
            "speed-up": tp["median"] / base_tp if base_tp else None,
            "step ms": _ms(step), "compute ms": _ms(t.get("compute_s")),
            "exposed comm ms": _ms(t.get("exposed_comm_s")),
            "comm share": comm / step if comm is not None and step else None, "overlap": t.get("overlap"),
            "wire kB/step": s.get("wire_bytes_per_rank_per_step", 0) / 1e3,
            "final AUROC": s["final"].get("auroc_macro"), "best AUROC": s["best"].get("auroc_macro"),
            "final F1": s["final"].get("f1_macro"),
            "peak MB": (m.get("peak_bytes") or s.get("peak_memory_bytes") or 0) / 1e6,
            "verdict": t.get("verdict"), "backend env": backend_env(s),
        } | predicted(run, clusters))
    return rows, failed, base


def backend_env(summary) -> str:
    """The backend's variables a run had in force (ringexp.backend), as KEY=value ..."""
    return " ".join(f"{k}={v}" for k, v in backend.chosen(summary.get("backend_env")).items()) or "-"


def calibrations() -> dict:
    """{(nodes, ranks per node, link): ClusterConfig} of the readable conf/cluster/ files: where runs may have
    run (a run records the same three in its summary)."""
    out = {}
    for path in sorted(Path(CONF_DIR, "cluster").glob("*.yaml")):
        try:
            cl = load_yaml(ClusterConfig, path)
        except (OmegaConfBaseException, ConfigError, OSError):
            continue
        out.setdefault((cl.nodes, cl.ranks_per_node, cl.link), cl)
    return out


def predicted(run: dict, clusters: dict) -> dict:
    """The cost model's communication and step time for a run whose cluster has a calibration, from its
    config and its own measured compute (forward + backward split 1:2, optimizer, data and the rest): what
    the model adds is the communication and how much of it backward hides."""
    s, t = run["summary"], run["summary"].get("time", {})
    cl = clusters.get((s.get("nodes"), s.get("ranks_per_node"), s.get("link")))
    cfg_file = Path(run["dir"]) / "config.yaml"
    if cl is None or not cfg_file.exists() or t.get("compute_s") is None:
        return {}
    try:
        cfg = load_yaml(TrainConfig, cfg_file)
        shapes = [p.shape for p in build_model(cfg.model, cfg.data.num_labels).parameters() if p.requires_grad]
        micro = cfg.accumulation.steps
        fb = t["compute_s"] / micro
        # a CPU cluster is this kind of machine: PowerSGD's arithmetic is measured here for the run's shapes
        psgd = (compress.powersgd.arithmetic_s(shapes, cfg.compression) * cl.compute_slowdown
                if cfg.compression.name == "powersgd" and cl.backend == "gloo" else None)
        got = costmodel.predict_step(cl, cfg, shapes, (1 - BACKWARD_SHARE) * fb, BACKWARD_SHARE * fb,
                                     t.get("optimizer_s", 0.0), psgd)
    except (OmegaConfBaseException, ConfigError, ValueError, OSError):
        return {}
    step = got["step_s"] + t.get("data_s", 0.0) + t.get("other_s", 0.0)
    return {"predicted comm ms": 1e3 * got["comm_s"], "predicted step ms": 1e3 * step,
            "step error": step / t["step_s"] - 1 if t.get("step_s") else None}


def _ms(seconds):
    return None if seconds is None else 1e3 * seconds


def fmt(key: str, value) -> str:
    if value is None:
        return "-"
    if key in ("comm share", "overlap"):
        return f"{value:.0%}"
    if key == "step error":
        return f"{value:+.0%}"
    if key == "speed-up":
        return f"{value:.2f}x"
    if key.endswith("AUROC") or key.endswith("F1"):
        return f"{value:.3f}"
    if isinstance(value, float):
        return f"{value:.1f}" if abs(value) < 100 else f"{value:.0f}"
    return str(value)


def columns(rows) -> list:
    """HEAD, the backend's variables where the runs differ in them, the predictions where there are any."""
    differ = len({r.get("backend env") for r in rows}) > 1
    return HEAD + (["backend env"] if differ else []) + (PREDICTED if any("predicted step ms" in r for r in rows)
                                                         else [])


def markdown(rows, failed, base) -> str:
    head = columns(rows)
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(fmt(k, r.get(k)) + (" (baseline)" if k == "run" and i == base else "") for k in head)
            + " |" for i, r in enumerate(rows)]
    verdicts = [f"- `{r['run']}`: {r['verdict']}" for r in rows if r.get("verdict")]
    if verdicts:  # what each run's own record concluded about its step time (ringexp.timing.verdict)
        out += ["", "Verdicts:", ""] + verdicts
    if failed:
        out += ["", "Failed runs:", ""] + [f"- `{label}`: {error.splitlines()[0] if error else ''}"
                                           for label, error in failed]
    return "\n".join(out) + "\n"


def text(rows, failed, base) -> str:
    head = columns(rows)
    cells = [head] + [[fmt(k, r.get(k)) + ("*" if k == "run" and i == base else "") for k in head]
                      for i, r in enumerate(rows)]
    widths = [max(len(c[j]) for c in cells) for j in range(len(head))]
    lines = ["  ".join(c.ljust(w) if j == 0 else c.rjust(w) for j, (c, w) in enumerate(zip(row, widths, strict=True)))
             for row in cells]
    lines.append("* baseline of the speed-up column")
    lines += [f"FAILED {label}: {error.splitlines()[0] if error else ''}" for label, error in failed]
    return "\n".join(lines) + "\n"


def write_csv(rows, failed, path: Path) -> None:
    buf = io.StringIO()
    w = csv.writer(buf)
    head = columns(rows)
    w.writerow(head + ["status", "error"])
    w.writerows([[r.get(k) for k in head] + ["completed", ""] for r in rows])
    w.writerows([[label] + [""] * (len(head) - 1) + ["failed", error] for label, error in failed])
    path.write_text(buf.getvalue())


def plots(runs, rows, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [r for r in runs if r["summary"].get("status") == "completed"]
    names = [r["run"] for r in rows]
    ticks = range(len(rows))
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(rows)), 4))
    tps = [r["summary"]["throughput"] for r in done]
    ax.bar(ticks, [t["median"] for t in tps], color="tab:blue",
           yerr=[[t["median"] - (t["p10"] or t["median"]) for t in tps],
                 [(t["p90"] or t["median"]) - t["median"] for t in tps]], capsize=4)
    ax.set_xticks(list(ticks), names, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("samples/s (median, p10-p90)")
    ax.set_title("Throughput")
    fig.tight_layout()
    fig.savefig(out / "throughput.png", dpi=100)
    plt.close(fig)

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    for run, name in zip(done, names, strict=True):
        vals = [r for r in run["rows"] if r.get("val/auroc_macro") is not None]
        a1.plot([r["step"] for r in vals], [r["val/auroc_macro"] for r in vals], marker="o", label=name)
        if vals and all("train/elapsed_s" in r for r in vals):
            a2.plot([r["train/elapsed_s"] for r in vals], [r["val/auroc_macro"] for r in vals], marker="o", label=name)
    a1.set(xlabel="step", ylabel="validation macro-AUROC", title="AUROC against step")
    a2.set(xlabel="training time (s)", ylabel="validation macro-AUROC", title="AUROC against wall-clock")
    a1.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "auroc.png", dpi=100)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(rows)), 4))
    share = [r["comm share"] or 0 for r in rows]
    exposed = [(r["exposed comm ms"] or 0) / r["step ms"] if r["step ms"] else 0 for r in rows]
    ax.bar(ticks, exposed, color="tab:red", label="exposed")
    ax.bar(ticks, [max(0, s - e) for s, e in zip(share, exposed, strict=True)], bottom=exposed, color="tab:orange",
           label="hidden behind compute")
    ax.set_xticks(list(ticks), names, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("communication / step time")
    ax.set_title("Communication share")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "comm_share.png", dpi=100)
    plt.close(fig)


def report(runs, out: Path | None, baseline: str | None = None) -> str:
    """Write compare.md, compare.csv and the plots into `out` (if given); return the terminal table."""
    rows, failed, base = table(runs, baseline)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "compare.md").write_text(markdown(rows, failed, base))
        write_csv(rows, failed, out / "compare.csv")
        if rows:
            plots(runs, rows, out)
    return text(rows, failed, base)


class SweepReport(Callback):
    """Hydra callback: when a multirun ends, write the compare report into its sweep directory."""

    def on_multirun_end(self, config, **kwargs) -> None:
        sweep = Path(config.hydra.sweep.dir)
        try:
            runs = load_local([sweep])
            if runs:
                print(report(runs, sweep), end="")
                print(f"ringexp: compare report in {sweep}/compare.md")
        except Exception as e:  # the runs' own records are complete; a report that fails must not hide them
            print_warning(f"no compare report for {sweep} ({type(e).__name__}: {e})")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ringexp.compare", description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="*", help="sweep or run directories")
    ap.add_argument("--baseline", help="the row whose label contains this text is the speed-up baseline")
    ap.add_argument("--out", help="where to write compare.md/.csv and the plots (default: the single PATH)")
    ap.add_argument("--wandb", metavar="ENTITY/PROJECT", help="read runs from the W&B API instead")
    ap.add_argument("--group", help="with --wandb: the sweep's W&B group")
    args = ap.parse_args(argv)
    try:
        if args.wandb:
            if not args.group:
                raise ValueError("--wandb needs --group NAME (the sweep's group)")
            runs = load_wandb(args.wandb, args.group)
        elif not args.paths:
            raise ValueError("give one or more sweep or run directories (or --wandb ENTITY/PROJECT --group NAME)")
        else:
            runs = load_local(args.paths)
        if not runs:
            raise ValueError(f"no runs (summary.json) under {' '.join(args.paths) or args.group}")
    except (ValueError, FileNotFoundError, json.JSONDecodeError) as e:
        print_error(str(e))
        return 2
    out = Path(args.out) if args.out else (Path(args.paths[0]) if len(args.paths) == 1 else None)
    print(report(runs, out, args.baseline), end="")
    if out is not None:
        print(f"ringexp: wrote {', '.join(OUTPUTS)} in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
