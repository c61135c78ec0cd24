"""`python -m ringexp.compare PATH...`: the runs of one or more sweeps as one table and a few plots.

PATHs are sweep directories or run directories (anything holding `summary.json` files below it), from local
or Slurm runs; `--wandb ENTITY/PROJECT --group NAME` reads the same numbers from the W&B API instead. One
row per run: the overrides that differ between the runs, median throughput with its p10-p90 spread, the
speed-up against a baseline row (`--baseline TEXT`: the first row whose label contains TEXT; default: the
`ddp` row, else the first), the step time split, bytes per step, final/best macro-AUROC and F1, peak memory.
Failed runs are listed with their error; a run whose records cannot be used (a file that is not a run's record, a
FIFO, a symlink, a summary lacking or mistyping what the table reads) as unreadable, with the file and why, and
the other runs are reported as before. Every file compare writes replaces what is at its name (records.write_file):
a symlink planted there is replaced, never written through. Every sweep of `ringexp.train -m` ends with this report
written into its directory (`SweepReport`, a Hydra callback), so the numbers are there even with W&B offline.

Seed groups (ringexp.compare.groups; always where a group has several seeds, else with `--groups`): the completed
runs whose overrides are the same but for `seed=` (a run without one has the schema's default seed), one row each
with the mean and sample standard deviation over its runs, the speed-up of its mean throughput and its time to each
eval.targets macro-AUROC against the group holding the baseline row, and its quality verdict against that group
(ringexp.quality: *equivalent*, *better*, *worse*, *not equivalent* or *inconclusive*, with the 95% interval of the
difference; `--quality-budget`, 0.02, is the margin): over the seeds both share when they share two or more, else on
the validation set from one run of each. The table goes into compare.md, its numbers into groups.csv and the
verdicts into quality.json (what the planner's `predict` reads); with `--wandb` each run's verdict goes into its W&B
summary too.
`--fastest CHOICE` prints only the value of choice CHOICE (summary `choices`, e.g. `parallel`) of the group with
the highest mean throughput, for a shell script to use; it writes nothing.
"""

import argparse
import csv
import io
import json
import os
import sys
from pathlib import Path

import yaml
from hydra.experimental.callback import Callback
from omegaconf.errors import OmegaConfBaseException

from ringexp import backend, predict, records
from ringexp.cluster import files as clusters
from ringexp.compare import groups as seeds
from ringexp.compare.cells import aligned, fmt, is_text
from ringexp.config import TrainConfig
from ringexp.errors import ConfigError, print_error, print_warning
from ringexp.plotting import pyplot, save, short
from ringexp.records import yaml_text

OUTPUTS = ("compare.md", "compare.csv", "throughput.png", "auroc.png", "comm_share.png")
GROUP_OUTPUTS = ("groups.csv", seeds.QUALITY_FILE)  # with seed groups
HEAD = ["run", "ranks", "samples/s", "p10-p90", "speed-up", "step ms", "compute ms", "exposed comm ms",
        "comm share", "overlap", "wire kB/step", "final AUROC", "best AUROC", "final F1", "peak MB"]
PREDICTED = ["predicted comm ms", "predicted step ms", "step error"]  # runs on a calibrated cluster only
HYDRA_OVERRIDES = Path(".hydra", "overrides.yaml")
YAML_LIMIT = 64 << 10  # the most a YAML file compare reads may hold: a run's hold a few kilobytes
BIG = 1e300  # a number beyond it (or an integer too big for a float) would overflow the table's arithmetic


def _text_map(v) -> bool:
    return isinstance(v, dict) and all(is_text(x) for item in v.items() for x in item)


def _backend_record(v) -> bool:
    """What backend.chosen reads: `env` and `from`, text to text (`from` may be left out when `env` is empty)."""
    return (isinstance(v, dict) and _text_map(v.get("env", {}))
            and _text_map(v.get("from", None if v.get("env") else {})))


# The kinds of value a summary's keys may hold, and what table(), plots() and predicted() read from a summary:
# checked once, when a run is loaded, so that the report can rely on them. A key may be absent or null unless
# REQUIRED.
KINDS = {
    "text": is_text,
    "a number": lambda v: type(v) in (int, float) and -BIG < v < BIG,  # not bool, NaN or infinite
    "a number >= 0": lambda v: type(v) in (int, float) and 0 <= v < BIG,
    "a count >= 1": lambda v: type(v) is int and 1 <= v < BIG,
    "a mapping": lambda v: isinstance(v, dict),
    "a list of text": lambda v: isinstance(v, list) and all(map(is_text, v)),
    "a backend record": _backend_record,
    "a list of targets": lambda v: isinstance(v, list) and all(_target(t) for t in v),
}


def _target(t) -> bool:
    """One entry of a summary's `targets` (ringexp.recorder.reached): a level in (0, 1] and, once reached, its
    step, samples and seconds."""
    return (isinstance(t, dict) and type(t.get("auroc")) in (int, float) and 0 < t["auroc"] <= 1
            and all(t.get(k) is None or KINDS["a number >= 0"](t[k]) for k in ("step", "samples", "train_s",
                                                                              "elapsed_s")))
EVERY_RUN = {"status": "text", "error": "text", "overrides": "a list of text"}
COMPLETED = {
    "throughput": "a mapping", **{f"throughput.{k}": "a number >= 0" for k in ("median", "p10", "p90")},
    "final": "a mapping", "final.auroc_macro": "a number >= 0", "final.f1_macro": "a number >= 0",
    "best": "a mapping", "best.auroc_macro": "a number >= 0", "best.f1_macro": "a number >= 0",
    "targets": "a list of targets",
    "time": "a mapping", "time.verdict": "text", "time.other_s": "a number",  # what the parts leave unexplained
    **{f"time.{k}": "a number >= 0" for k in ("step_s", "data_s", "compute_s", "comm_s", "exposed_comm_s",
                                              "optimizer_s", "overlap")},
    "memory": "a mapping", "memory.peak_bytes": "a number >= 0", "peak_memory_bytes": "a number >= 0",
    "wire_bytes_per_rank_per_step": "a number >= 0", "world_size": "a count >= 1", "job_type": "text",
    "nodes": "a count >= 1", "ranks_per_node": "a count >= 1", "link": "text", "backend_env": "a backend record",
}
REQUIRED = {"status", "throughput", "final", "best"}


def shape_error(summary) -> str | None:
    """What makes `summary` one the report cannot use (the first key missing or of the wrong kind), or None."""
    if not isinstance(summary, dict):
        return f"holds {_described(summary)}, not a summary"
    for key, kind in (EVERY_RUN | (COMPLETED if summary.get("status") == "completed" else {})).items():
        value = summary
        for part in key.split("."):  # a key's mapping comes before it in the table: a dict or absent here
            value = value.get(part) if value is not None else None
        if value is None and key in REQUIRED:
            return f"no {key}, which must be {kind}"
        if value is not None and not KINDS[kind](value):
            return f"{key} is {_described(value)}, not {kind}"
    return None


def _described(value) -> str:
    """A value in a message: short, and never the repr of a container (which may be nested deep)."""
    if isinstance(value, list) and value:
        return f"a list of {', '.join(sorted({type(x).__name__ for x in value}))}"
    return ascii(value)[:40] if isinstance(value, str | int | float) else f"a {type(value).__name__}"


def load_local(paths) -> list:
    """Every run below `paths`: {"dir", "summary", "rows"}, in path order (a sweep's jobs by number)."""
    runs, seen = [], set()
    for p in map(Path, paths):
        if not p.exists():
            raise FileNotFoundError(f"{p}: no such directory")
        for f in summaries(p):
            if f.parent not in seen:
                seen.add(f.parent)
                runs.append(load_run(f.parent))
    return runs


def summaries(p: Path) -> list:
    """The summary.json of run directory `p`, or every one below `p`: jobs by number (2 before 10), then runs by
    name (a sweep's `0` beside a `baseline`: a part is compared as a number only with another number)."""
    if os.path.lexists(p / records.SUMMARY):
        return [p / records.SUMMARY]
    return sorted(p.rglob(records.SUMMARY),
                  key=lambda f: [(0, int(x), "") if x.isdecimal() else (1, 0, x) for x in f.parent.parts])


def load_run(run_dir: Path) -> dict:
    """{"dir", "summary", "rows"} of one run directory. A file of it that cannot be read, or that holds what no
    run wrote, makes the run unreadable, that file and why in its summary's place: one broken run must not cost
    the report of every other run."""
    path = run_dir / records.SUMMARY  # the file being read: the one to name if it cannot be
    try:
        summary = records.read_summary(run_dir)
        if (bad := shape_error(summary)) is not None:
            raise ValueError(bad)
        path = run_dir / records.METRICS
        rows = records.read_rows(run_dir)  # a line cut short by a killed run is dropped, the run kept
        path = run_dir / HYDRA_OVERRIDES
        if "overrides" not in summary and os.path.lexists(path):  # a run that failed before it started
            summary["overrides"] = hydra_overrides(path)
    except (OSError, ValueError) as e:
        return {"dir": str(run_dir), "summary": unreadable(path, e), "rows": []}
    return {"dir": str(run_dir), "summary": summary, "rows": rows}


def unreadable(path, e: Exception) -> dict:
    """The summary of a run listed as unreadable: the file and why (an OSError's own words, without the path;
    records names the line of metrics.jsonl)."""
    why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
    if why.startswith(f"{path}:"):
        why = "line " + why[len(f"{path}:"):]
    elif isinstance(e, json.JSONDecodeError | UnicodeDecodeError):
        why = f"{type(e).__name__}: {why}"
    return {"status": "unreadable", "error": f"{printable_path(path)}: unreadable ({why})"}


def printable_path(path) -> str:
    """A path as text that can be printed and written anywhere: a name's bytes that are not UTF-8 as \\xNN."""
    return str(path).encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def hydra_overrides(path) -> list:
    """.hydra/overrides.yaml: Hydra's list of the command line's overrides; ValueError if it holds anything else."""
    try:
        value = yaml.safe_load(yaml_text(path, records.read_bytes(path, YAML_LIMIT), mapping=False))
    except ConfigError as e:
        raise ValueError(str(e).removeprefix(f"{path}: ")) from None
    if not KINDS["a list of text"](value):
        raise ValueError(f"holds {_described(value)}; Hydra writes a list of text")
    return value


def load_wandb(path: str, group: str) -> list:
    """The same records from the W&B API (online): summaries are stored flattened with '.' separators."""
    import wandb  # only for --wandb: importing it costs about a second

    runs = []
    for r in wandb.Api().runs(path, filters={"group": group}, order="+created_at"):
        summary = unflatten({k: v for k, v in r.summary.items() if not k.startswith("_")})
        summary.setdefault("status", "completed" if r.state == "finished" else r.state)
        summary.setdefault("overrides", (r.name or "").split(","))
        if (bad := shape_error(summary)) is not None:
            runs.append({"dir": r.url, "summary": unreadable(r.url, ValueError(bad)), "rows": []})
            continue
        rows = [{"step": h.get("_step"), **h} for h in r.scan_history()]
        runs.append({"dir": r.url, "summary": summary, "rows": rows, "api": r})
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
    """Each run's overrides that are not shared by every run (what the sweep varied); a run without any (one that
    could not be read) is named by its directory, and takes no part in what the others share."""
    over = [None if "overrides" not in r["summary"] else
            [o for o in r["summary"]["overrides"] if not o.startswith(("name=", "hydra."))] for r in runs]
    known = [set(ov) for ov in over if ov is not None]
    common = set.intersection(*known) if known else set()
    return [printable_path(r["dir"]) if ov is None else " ".join(o for o in ov if o not in common) or "(all the same)"
            for r, ov in zip(runs, over, strict=True)]


def table(runs, baseline: str | None = None, clusters=()):
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
    base = baseline_index(done, baseline)
    base_tp = done[base][1]["summary"]["throughput"].get("median")
    rows, clusters = [], calibrations(clusters)
    for label, run in done:
        s = run["summary"]
        tp, t, m = s["throughput"], s.get("time", {}), s.get("memory", {})
        step, comm, median = t.get("step_s"), t.get("comm_s"), tp.get("median")
        rows.append({
            "run": label, "ranks": s.get("world_size"), "samples/s": median,
            "p10-p90": f"{tp['p10']:.0f}-{tp['p90']:.0f}" if None not in (tp.get("p10"), tp.get("p90")) else None,
            "speed-up": median / base_tp if median is not None and base_tp else None,
            "step ms": _ms(step), "compute ms": _ms(t.get("compute_s")),
            "exposed comm ms": _ms(t.get("exposed_comm_s")),
            "comm share": comm / step if comm is not None and step else None, "overlap": t.get("overlap"),
            "wire kB/step": (s.get("wire_bytes_per_rank_per_step") or 0) / 1e3,
            "final AUROC": s["final"].get("auroc_macro"), "best AUROC": s["best"].get("auroc_macro"),
            "final F1": s["final"].get("f1_macro"),
            "peak MB": (m.get("peak_bytes") or s.get("peak_memory_bytes") or 0) / 1e6,
            "verdict": t.get("verdict"), "backend env": backend_env(s), "_run": run,
        } | predicted(run, clusters))
    return rows, failed, base


def baseline_index(done, baseline: str | None) -> int:
    """The speed-up baseline among completed (label, run) pairs: the first whose label contains `baseline`
    (ValueError if none does), else the first ddp run, else the first."""
    base = next((i for i, (label, _) in enumerate(done) if baseline and baseline in label), None)
    if base is None and baseline:
        raise ValueError(f"--baseline {baseline}: no completed run's label contains it (labels: "
                         f"{', '.join(label for label, _ in done)})")
    if base is None:
        base = next((i for i, (_, r) in enumerate(done) if r["summary"].get("job_type") == "ddp"), 0)
    return base


def backend_env(summary) -> str:
    """The backend's variables a run had in force (ringexp.backend), as KEY=value ..."""
    return " ".join(f"{k}={v}" for k, v in backend.chosen(summary.get("backend_env")).items()) or "-"


def calibrations(given=()) -> dict:
    """The cluster files runs may have run on (ringexp.cluster.files.calibrations): --cluster files first, then
    conf/cluster/; ValueError naming a --cluster file that cannot be read."""
    try:
        return clusters.calibrations(given)
    except ConfigError as e:
        raise ValueError(f"--cluster {e}") from None


def predicted(run: dict, known: dict) -> dict:
    """The cost model's communication and step time for a run whose cluster has a calibration (ringexp.predict's
    row, from the run's config and its own measured compute): what the model adds is the communication and how
    much of it backward hides. A CPU cluster is this kind of machine: PowerSGD's arithmetic is measured here."""
    s, t = run["summary"], run["summary"].get("time", {})
    cl = clusters.matching(s.get("nodes"), s.get("ranks_per_node"), s.get("link"), known)
    cfg_file = Path(run["dir"]) / "config.yaml"
    if cl is None or not os.path.lexists(cfg_file) or t.get("compute_s") is None:
        return {}
    try:
        cfg = records.load_yaml(TrainConfig, cfg_file, YAML_LIMIT)
        compute = predict.of_run(t["compute_s"], t.get("optimizer_s"), cfg.accumulation.steps)
        got = predict.row("", cfg, cl, predict.gradient_shapes(cfg), compute, here=cl.backend == "gloo")
    except (OmegaConfBaseException, ConfigError, ValueError, OSError):
        return {}
    step = got["step_s"] + (t.get("data_s") or 0.0) + (t.get("other_s") or 0.0)
    return {"predicted comm ms": 1e3 * got["comm_s"], "predicted step ms": 1e3 * step,
            "step error": step / t["step_s"] - 1 if t.get("step_s") else None}


def _ms(seconds):
    return None if seconds is None else 1e3 * seconds


def columns(rows) -> list:
    """HEAD, the backend's variables where the runs differ in them, the predictions where there are any, the
    quality verdict of each run's seed group where the groups were judged."""
    differ = len({r.get("backend env") for r in rows}) > 1
    return (HEAD + (["backend env"] if differ else []) + (PREDICTED if any("predicted step ms" in r for r in rows)
                                                          else []) + (["quality"] if any("quality" in r for r in rows)
                                                                      else []))


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
    lines = aligned(cells)
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
    records.write_file(path, buf.getvalue())


def plots(runs, rows, out: Path) -> None:
    plt = pyplot()
    done = [r for r in runs if r["summary"].get("status") == "completed"]
    names = [short(r["run"]) for r in rows]  # a label is as long as the overrides: matplotlib lays out each character
    ticks = range(len(rows))
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(rows)), 4))
    tps = [r["summary"]["throughput"] for r in done]
    medians = [t.get("median") or 0 for t in tps]
    # p10 <= median <= p90 in every summary ringexp writes; a bar is drawn whatever another one holds
    ax.bar(ticks, medians, color="tab:blue", capsize=4,
           yerr=[[max(0, m - (t.get("p10") or m)) for m, t in zip(medians, tps, strict=True)],
                 [max(0, (t.get("p90") or m) - m) for m, t in zip(medians, tps, strict=True)]])
    ax.set_xticks(list(ticks), names, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("samples/s (median, p10-p90)")
    ax.set_title("Throughput")
    fig.tight_layout()
    save(fig, out / "throughput.png", 100)

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    for run, name in zip(done, names, strict=True):
        # rows hold whatever a run logged (read_rows checks `step` only): only numbers are plotted
        vals = [r for r in run["rows"] if all(KINDS["a number"](r.get(k)) for k in ("step", "val/auroc_macro"))]
        a1.plot([r["step"] for r in vals], [r["val/auroc_macro"] for r in vals], marker="o", label=name)
        if vals and all(KINDS["a number"](r.get("train/elapsed_s")) for r in vals):
            a2.plot([r["train/elapsed_s"] for r in vals], [r["val/auroc_macro"] for r in vals], marker="o", label=name)
    a1.set(xlabel="step", ylabel="validation macro-AUROC", title="AUROC against step")
    a2.set(xlabel="training time (s)", ylabel="validation macro-AUROC", title="AUROC against wall-clock")
    a1.legend(fontsize=7)
    fig.tight_layout()
    save(fig, out / "auroc.png", 100)

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
    save(fig, out / "comm_share.png", 100)


def report(runs, out: Path | None, baseline: str | None = None, groups: bool | None = None, clusters=(),
           margin: float = 0.02) -> str:
    """Write compare.md, compare.csv and the plots into `out` (if given), and with seed groups (`groups`; None:
    where a group has several seeds) groups.csv and quality.json; return the terminal table (then the groups')."""
    return reported(runs, out, baseline, groups, clusters, margin)[0]


def reported(runs, out: Path | None, baseline: str | None, groups: bool | None, clusters, margin: float) -> tuple:
    """report()'s (text, the seed groups' Report or None)."""
    rows, failed, base = table(runs, baseline, clusters)
    judged = judge_groups(runs, rows, base, margin) if rows and groups is not False else None
    if judged is not None and groups is None and all(r["seeds"] < 2 for r in judged.rows):
        judged = None
    if judged is not None:
        words = {id(run): row["quality"] for row in judged.rows for run in row["_runs"]}
        for r in rows:
            r["quality"] = words.get(id(r["_run"]))
    if out is not None:
        # the directory the user named (the sweep's by default) may be a link they made; every file written in it
        # goes through records.write_file, which replaces a symlink planted at its name instead of following it
        out.mkdir(parents=True, exist_ok=True)
        records.write_file(out / "compare.md", markdown(rows, failed, base)
                           + (f"\nSeed groups:\n\n{judged.markdown()}" if judged else ""))
        write_csv(rows, failed, out / "compare.csv")
        if rows:
            plots(runs, rows, out)
        if judged is not None:
            judged.write(out)
    if judged is not None and any("api" in run for run in runs):
        to_wandb(judged)
    return text(rows, failed, base) + (f"\nSeed groups:\n{judged.text()}" if judged else ""), judged


def judge_groups(runs, rows, base: int, margin: float):
    """The seed groups' report against the group that holds the baseline row; each row also gets its group's
    runs (`_runs`), for the per-run quality column and W&B."""
    groups = seeds.seed_groups(runs)
    judged = seeds.report(groups, seeds.group_of(groups, rows[base]["_run"]), margin)
    for g, row in zip(groups, judged.rows, strict=True):
        row["_runs"] = g.runs
    return judged


def to_wandb(judged) -> None:
    """Each W&B run's group verdict into its W&B summary (compare --wandb): quality/* keys."""
    for row in judged.rows:
        head = row["_verdicts"].get(seeds.QUALITY[0])
        keys = {"quality/verdict": row["quality"], "quality/group": row["group"]}
        if head is not None:
            keys |= {"quality/diff": head.diff, "quality/ci95_low": head.ci95[0], "quality/ci95_high": head.ci95[1],
                     "quality/margin": head.margin, "quality/test": head.test}
        for run in row["_runs"]:
            if "api" in run:
                run["api"].summary.update(keys)


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


EPILOG = ("Seed groups judge each group against the baseline's on final macro-AUROC (and best AUROC, final and "
          "best F1): equivalent (the 90% interval of the difference within +-margin: two one-sided tests), worse or "
          "better (the 95% interval below or above 0), not equivalent (a difference as large as the margin), or "
          "inconclusive (with the seeds that would decide it); paired over shared seeds, else a bootstrap over the "
          "validation set. 'to T s': training seconds to the first evaluation at macro-AUROC T (eval.targets), "
          "'to T x' the baseline's over it. docs/sweeps.md")


class Parser(argparse.ArgumentParser):
    """argparse's parser, its errors (an unknown flag, a flag without its value) as ringexp's one line, exit 2."""

    def error(self, message):
        print_error(f"{message} (python -m ringexp.compare --help)")
        sys.exit(2)


def main(argv=None) -> int:
    ap = Parser(prog="python -m ringexp.compare", description=__doc__.split("\n\n")[0], epilog=EPILOG)
    ap.add_argument("paths", nargs="*", help="sweep or run directories")
    ap.add_argument("--baseline", help="the row whose label contains this text is the speed-up baseline")
    ap.add_argument("--out", help="where to write compare.md/.csv and the plots (default: the single PATH)")
    ap.add_argument("--wandb", metavar="ENTITY/PROJECT", help="read runs from the W&B API instead")
    ap.add_argument("--group", help="with --wandb: the sweep's W&B group")
    ap.add_argument("--cluster", action="append", default=[], metavar="PATH",
                    help="a cluster file (the planner's calibrate writes one) besides conf/cluster/: runs on it get "
                    "predictions")
    ap.add_argument("--groups", action="store_const", const=True, help="seed groups (runs differing only in "
                    "seed=: one row each, with time to target and the quality verdict) even where every group has "
                    "one seed; without it they are shown where a group has several")
    ap.add_argument("--quality-budget", type=float, default=0.02, metavar="MARGIN",
                    help="the equivalence margin of the quality verdicts, in macro-AUROC (and macro-F1): 0.02")
    ap.add_argument("--fastest", metavar="CHOICE", help="print only the value of choice CHOICE (e.g. parallel) of "
                    "the seed group with the highest mean throughput; nothing else is printed or written")
    args = ap.parse_args(argv)
    try:
        if not 0 <= args.quality_budget < 1:  # (NaN fails both)
            raise ValueError(f"--quality-budget {args.quality_budget}: give a margin in [0, 1), e.g. 0.02")
        if args.fastest is not None and (args.groups or not args.fastest):
            raise ValueError("--fastest CHOICE names a choice such as parallel, and prints its value alone "
                             "(without --groups)")
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
        if args.fastest is not None:
            print(seeds.fastest(runs, args.fastest))
            return 0
    except (ValueError, FileNotFoundError) as e:
        print_error(str(e))
        return 2
    out = Path(args.out) if args.out else (Path(args.paths[0]) if len(args.paths) == 1 else None)
    try:
        shown, judged = reported(runs, out, args.baseline, args.groups, args.cluster, args.quality_budget)
    except ValueError as e:  # a --cluster file that cannot be read, a --baseline no run matches: nothing written
        print_error(str(e))
        return 2
    except OSError as e:  # --out a file, a directory not ours to write, a symlink where a file goes: one line
        print_error(f"{printable_path(e.filename or out)}: cannot write the report there ({e.strerror or e}); give "
                    "--out DIR")
        return 2
    print(shown, end="")
    if out is not None:
        print(f"ringexp: wrote {', '.join(OUTPUTS + (GROUP_OUTPUTS if judged else ()))} in {out}")
    return 0

