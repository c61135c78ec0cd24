"""Seed groups: the completed runs whose overrides are the same but for `seed=`, one row each, judged against the
baseline's group.

    seed_groups(runs)                     the groups, in the order of each one's first run
    judge(group, base, margin, alpha)     {metric: Verdict} on QUALITY, from the seeds both share (two or more:
                                          paired over seeds), else from one run each on the validation set (an
                                          indication only: quality.Verdict.decisive); only over the runs of the
                                          baseline's task and code versions, one per seed (ringexp.verdicts.members)
    margins_of(margin, f1_margin)         {metric: its equivalence margin}
    report(groups, base, margin)          Report: the rows, the verdict lines, the text and markdown tables; its
                                          write() makes groups.csv and quality.json (what the planner reads)

A verdict on the validation set comes only from scores that are the runs' own: val_scores.pt of the shape
records.write_scores gives it, whose final (and best) macro-AUROC and F1, recomputed as the trainer computes them,
are the ones the run's summary.json records; else the group gets no verdict and its note says which file disagrees.

Time to target is the training seconds (steps only: evaluation and checkpoints left out) to the first evaluation at
or above each eval.targets level, from each run's summary `targets`; a group's is the mean over the seeds that
reached it. Its ratio (the baseline group's mean over it; above 1: reached sooner) is given only where every seed
of both groups reached the target: a mean over the seeds that got there would leave out the ones that did not
(censored), so otherwise the cell says how many of how many reached it and there is no ratio.

A group's speed-up is over the whole run (samples over training seconds, `throughput.whole_run`), where every run
recorded it: a configuration that changes phase (PowerSGD's uncompressed first steps) is as fast as its whole run,
not its fastest intervals; the median over intervals stays beside it.
"""

import csv
import io
import pickle
import statistics
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
import torch

from ringexp import metrics, quality, records
from ringexp.config import TrainConfig
from ringexp.errors import one_line
from ringexp.summary import is_text
from ringexp.verdicts.cells import aligned, fmt, markdown_table
from ringexp.verdicts.members import admitted, reference, stopped, where

# What a seed group averages: its column, and where a completed run's summary holds it
# (ringexp.summary.COMPLETED checks it).
GROUP_METRICS = {"samples/s": "throughput.median", "whole run": "throughput.whole_run",
                 "final AUROC": "final.auroc_macro", "best AUROC": "best.auroc_macro", "final F1": "final.f1_macro",
                 "best F1": "best.f1_macro"}
QUALITY = ("final AUROC", "best AUROC", "final F1", "best F1")  # judged against the baseline; the first is the headline
HEAD = ["group", "seeds", "seed values", "samples/s", "whole run", "speed-up", "final AUROC", "AUROC vs baseline",
        "quality", "interval", "best AUROC", "final F1"]
SPREAD = ("mean ± sample standard deviation (n - 1) over a group's runs (one run: its value alone); samples/s: the "
          "median over logged intervals, whole run: samples over training seconds; speed-up (whole run), AUROC vs "
          "baseline and time-to-target ratios compare the means; time to target in training seconds, its ratio only "
          "where every seed of both groups reached it; interval: the one the verdict was decided on, with its level")
DEFAULT_SEED = str(next(f.default for f in fields(TrainConfig) if f.name == "seed"))  # a run without seed=
QUALITY_FILE = quality.FILE  # (its format is Report.write's; quality.read_record is its one reader)
AGREE = 1e-4  # how far a metric recomputed from val_scores.pt may lie from the summary's: both are torchmetrics'
# on the same float32 probabilities (a GPU's sums against a CPU's: about 1e-7); a replaced file is off by far more


@dataclass(frozen=True)
class Group:
    """Completed runs whose configurations differ only in their seed. `label`: the overrides that differ between
    the groups compared; `overrides`: the group's own (without seed=, name=, hydra.*), in its first run's order;
    `runs`: load_local's dicts, in path order; `seeds`: each run's seed, as text (its override's value);
    `left_out`: (run, seed, why) of the runs with its overrides that are not in it (members.admitted): at first
    those that did not complete."""

    label: str
    overrides: tuple
    runs: tuple
    seeds: tuple
    left_out: tuple = ()

    def values(self, column: str) -> list:
        """The runs' numbers of a GROUP_METRICS column; a run that did not record it (no evaluation) left out."""
        return [v for r in self.runs if (v := value(r, column)) is not None]

    def mean(self, column: str):
        v = self.values(column)
        return statistics.mean(v) if v else None

    def sd(self, column: str):
        """The sample standard deviation (n - 1); None for fewer than two values."""
        v = self.values(column)
        return statistics.stdev(v) if len(v) > 1 else None

    def by_seed(self) -> dict:
        """{seed: its first run}."""
        out = {}
        for run, seed in zip(self.runs, self.seeds, strict=True):
            out.setdefault(seed, run)
        return out

    def reached(self, target: float) -> tuple:
        """(training seconds to `target` of the runs that reached it, how many runs recorded targets at all)."""
        got, recorded = [], 0
        for r in self.runs:
            entry = next((t for t in r["summary"].get("targets") or [] if t["auroc"] == target), None)
            recorded += entry is not None
            if entry is not None and entry.get("train_s") is not None:
                got.append(entry["train_s"])
        return got, recorded


def value(run: dict, column: str):
    outer, inner = GROUP_METRICS[column].split(".")
    return run["summary"][outer].get(inner)


def is_seed(override: str) -> bool:
    """seed=N, also as Hydra's +seed=N or ++seed=N."""
    return override.lstrip("+").split("=", 1)[0] == "seed"


def seed_groups(runs) -> list:
    """The completed runs as seed groups, in the order of each group's first run; a run with a group's overrides
    that did not complete (failed, interrupted, no summary.json) in its left_out. A run's overrides are compared
    as a set: Hydra records them in command-line order, which two sweeps of one configuration may not share."""
    by, stops = {}, []
    for run in runs:
        s = run["summary"]
        if s.get("status") != "completed" and not isinstance(s.get("overrides"), list):
            continue  # (unreadable: no group to name it in; the runs' table lists it)
        own = [o for o in s.get("overrides") or [] if not o.startswith(("name=", "hydra."))]
        seed = next((o.split("=", 1)[1] for o in own if is_seed(o)), DEFAULT_SEED)
        rest = [o for o in own if not is_seed(o)]
        if s.get("status") == "completed":
            by.setdefault(tuple(sorted(rest)), (rest, [], []))[1].append((run, seed))
        else:
            stops.append((tuple(sorted(rest)), (run, seed, stopped(s))))
    for key, entry in stops:
        if key in by:
            by[key][2].append(entry)
    common = set.intersection(*map(set, by)) if by else set()
    return [Group(" ".join(o for o in rest if o not in common) or "(all the same)", tuple(rest),
                  tuple(run for run, _ in members), tuple(seed for _, seed in members), tuple(out))
            for rest, members, out in by.values()]


def margins_of(margin: float, f1_margin: float = quality.F1_MARGIN) -> dict:
    """{metric of QUALITY: its equivalence margin}: `margin` for macro-AUROC, `f1_margin` for macro-F1."""
    return {m: f1_margin if m.endswith("F1") else margin for m in QUALITY}


def group_of(groups, run) -> int | None:
    """The index of the group holding `run` (None for a run in none: not completed)."""
    return next((i for i, g in enumerate(groups) if any(r is run for r in g.runs)), None)


def judge(group: Group, base: Group, margin: float, alpha: float = quality.ALPHA, margins: dict | None = None) -> tuple:
    """({metric of QUALITY: Verdict or None}, a note or None) of `group` against `base` (as seed_groups made them),
    over their runs of the baseline's task and code versions, one per seed (members.admitted): paired over the
    seeds both have when they share two or more (each one-sided test at `alpha`), else on the validation set from
    one run of each (the note says so: an indication, never a decision). Each metric at `margin`, or at its own in
    `margins` ({metric: margin}). A baseline whose runs disagree on their task or versions (members.reference)
    gives no verdict."""
    at = {m: (margins or {}).get(m, margin) for m in QUALITY}
    ref, why = reference(base)
    if ref is None:
        return dict.fromkeys(QUALITY), why
    group, base = admitted(group, ref), admitted(base, ref)
    if not group.runs or not base.runs:
        return dict.fromkeys(QUALITY), f"no run of {'it' if not group.runs else 'the baseline'} left to judge"
    shared = [s for s in group.seeds if s in base.seeds]
    mine, theirs = group.by_seed(), base.by_seed()
    if len(shared) >= quality.MIN_SEEDS:
        out = {}
        for m in QUALITY:  # (on every shared seed or none: a verdict's count is the seeds both groups list)
            d = [a - b for s in shared if None not in (a := value(mine[s], m), b := value(theirs[s], m))]
            out[m] = quality.paired_seeds(d, at[m], alpha) if len(d) == len(shared) else None
        return out, None
    seed, other = (shared[0], shared[0]) if shared else (group.seeds[0], base.seeds[0])
    why = f"one shared seed ({seed})" if shared else f"no seed shared with the baseline (seed {seed} against {other})"
    verdicts, missing = on_validation_set(mine[seed], theirs[other], margin, f"seed {seed} vs {other}", len(shared))
    verdicts = {m: v and quality.at_margin(v, at[m]) for m, v in verdicts.items()}
    return verdicts, (f"{why}: tested on the validation set, an indication only (it leaves out the seeds' "
                      "variance)" + (f" ({missing})" if missing else ""))


def on_validation_set(run: dict, base: dict, margin: float, what: str, seeds: int) -> tuple:
    """({metric: Verdict or None}, what was missing or '') from the two runs' val_scores.pt: the final scores for
    the final metrics, the best ones for the best metrics where they are those of the summary's best step. Scores
    that do not give the macro-AUROC and F1 their run's summary records (a file replaced, or copied from another
    run) give no verdict: a verdict from them would be on some other model."""
    out = dict.fromkeys(QUALITY)
    try:
        mine, theirs = records.read_scores(run["dir"]), records.read_scores(base["dir"])
    except (OSError, ValueError, RuntimeError, EOFError, pickle.UnpicklingError) as e:
        return out, f"validation scores unreadable: {one_line(str(e))}"  # (torch's refusals run to paragraphs)
    if mine is None or theirs is None:
        return out, "a run kept no validation scores (val_scores.pt)"
    for r, got in ((run, mine), (base, theirs)):
        if bad := scores_error(got) or disagreement(r, got):
            return out, f"{r['dir']}/{records.SCORES} {bad}; no validation-set verdict"
    labels = mine["labels"].numpy()
    if labels.shape != theirs["labels"].shape or not np.array_equal(labels, theirs["labels"].numpy()):
        return out, "the runs were validated on different samples"
    for when in ("final", "best"):
        if when == "best" and not all(best_is_kept(r, got) for r, got in ((run, mine), (base, theirs))):
            continue  # (a resumed run whose kept best came from the attempt it redid)
        auroc, f1 = quality.validation_set(mine[when]["probs"].numpy(), theirs[when]["probs"].numpy(), labels,
                                           margin, what, seeds)
        out[f"{when} AUROC"], out[f"{when} F1"] = auroc, f1
    return out, ""


def best_is_kept(run: dict, scores: dict) -> bool:
    """The best scores in val_scores.pt are those of the summary's best evaluation (the same step)."""
    return scores["best"]["step"] == run["summary"]["best"].get("step")


def scores_error(scores) -> str:
    """What makes `scores` no val_scores.pt that records.write_scores wrote ('' when nothing does): labels (samples x
    labels) and, for the final and the best evaluation, its step and float probabilities of the labels' shape."""
    if not isinstance(scores, dict) or not isinstance(scores.get("labels"), torch.Tensor) or \
            scores["labels"].dim() != 2 or scores["labels"].is_floating_point() or not scores["labels"].numel():
        return "holds no validation labels (samples x labels) as a run writes them"
    for when in ("final", "best"):
        kept = scores.get(when)
        if not (isinstance(kept, dict) and type(kept.get("step")) is int and isinstance(kept.get("probs"), torch.Tensor)
                and kept["probs"].is_floating_point() and kept["probs"].shape == scores["labels"].shape):
            return f"holds no {when} probabilities of the labels' shape with their step, as a run writes them"
    return ""


def disagreement(run: dict, scores: dict) -> str:
    """'' when the scores give the final (and, where they are the summary's best step's, the best) macro-AUROC
    and macro-F1 that the run's summary.json records, recomputed as the trainer computed them (ringexp.metrics);
    else the first that differs, both numbers."""
    labels = scores["labels"].int()
    for when in ("final", "best"):
        if when == "best" and not best_is_kept(run, scores):
            continue
        got = metrics.quality(scores[when]["probs"].float(), labels, labels.shape[1])
        for key, name in (("auroc_macro", "macro-AUROC"), ("f1_macro", "macro-F1")):
            said, have = run["summary"][when].get(key), float(got[key])
            if said is None or not abs(have - said) <= AGREE:  # (NaN from the scores disagrees too)
                recorded = "none" if said is None else f"{said:.3f}"
                return (f"disagrees with {records.SUMMARY} ({have:.3f} vs {recorded}: {when} {name} from the "
                        "scores against the one recorded)")
    return ""


@dataclass
class Report:
    """The seed groups' rows (dicts of numbers and verdicts), their verdict lines, and `targets` (the eval.targets
    levels any run recorded)."""

    rows: list
    lines: list
    targets: list
    base: int | None
    margin: float
    task: dict | None = None  # the baseline's (quality.task_of), which every verdict is on
    margins: dict | None = None  # {metric: its margin} (margins_of)
    metrics: list | None = None  # what the quality column's decision is over
    alpha: float = quality.ALPHA  # each one-sided test's level: error / family (Bonferroni)
    family: int = 1  # the configurations whose verdicts a decision may choose among (compare --family, tune.verify)

    def head(self) -> list:
        return HEAD + [k for t in self.targets for k in (f"to {t:g} s", f"to {t:g} x")]

    def cells(self, row: dict, mark: str) -> list:
        return [cell(row, k) + (mark if k == "group" and row is self.rows[self.base] else "") for k in self.head()]

    def text(self) -> str:
        cells = [self.head()] + [self.cells(r, "*") for r in self.rows]
        return "\n".join(aligned(cells) + [f"* baseline; {SPREAD}", *self.lines]) + "\n"

    def markdown(self) -> str:
        table = markdown_table(self.head(), [self.cells(r, " (baseline)") for r in self.rows])
        return "\n".join(table + ["", SPREAD, "", *self.lines]) + "\n"

    def write(self, out: Path) -> None:
        """groups.csv (every number: the verdicts' intervals and tests, spreads, seeds reached) and quality.json."""
        head = [k for k in dict.fromkeys(k for r in self.rows for k in r) if not k.startswith("_")]
        buf = io.StringIO()
        csv.writer(buf).writerows([head] + [[r.get(k) for k in head] for r in self.rows])
        records.write_file(out / "groups.csv", buf.getvalue())
        records.write_json(out / QUALITY_FILE, {"format": quality.FORMAT, "task": self.task, "margin": self.margin,
                                                "metrics": self.metrics, "margins": self.margins,
                                                "alpha": self.alpha, "family": self.family, "groups": [
            {"group": r["group"], "baseline": i == self.base, "overrides": r["_overrides"], "choices": r["_choices"],
             "seeds": r["_seeds"], "samples_s": r["samples/s"], "speed_up": r["speed-up"],
             "verdicts": {m: v and v.record() for m, v in r["_verdicts"].items()}, "note": r["_note"],
             "left_out": [{"dir": where(run), "seed": seed, "why": why} for run, seed, why in r["_left_out"]]}
            for i, r in enumerate(self.rows)]})


def cell(row: dict, key: str) -> str:
    if key.endswith(" s") and key.startswith("to "):
        got = row.get(key)
        if got is None:
            return "-" if row.get(f"{key} recorded") == 0 else "not reached"
        sd, n, of = row.get(f"{key} sd"), row[f"{key} reached"], row[f"{key} recorded"]
        if n < of:
            return f"{n}/{of} reached"  # (a mean over the seeds that got there would leave out those that did not)
        return fmt(key, got) + ("" if sd is None else f" ± {fmt(key, sd)}")
    sd = row.get(f"{key} sd")
    return fmt(key, row.get(key)) + ("" if sd is None else f" ± {fmt(key, sd)}")


def report(groups: list, base: int | None, margin: float, alpha: float = quality.ALPHA,
           margins: dict | None = None, metrics=quality.DECIDING, family: int = 1) -> Report:
    """The rows of `groups` (seed_groups') holding only the runs of the baseline group's task and code versions, one
    per seed (members.admitted), each with its verdict against the baseline (judge, each metric at `margin` or its
    own in `margins`), the decision over `metrics` (quality.decision) and the runs it left out; `family`: how many
    configurations `alpha` was divided among (recorded with it)."""
    on, why = reference(groups[base]) if base is not None else (None, "")
    margins = margins or margins_of(margin)
    shown = [admitted(g, on) for g in groups]
    targets = sorted({t["auroc"] for g in shown for r in g.runs for t in r["summary"].get("targets") or []})
    rows = [summary_row(g, targets) for g in shown]
    ref = rows[base] if base is not None else {}
    lines = [heading(groups[base].label, margin, margins, alpha, metrics, family)] if base is not None else []
    for i, (g, row) in enumerate(zip(groups, rows, strict=True)):
        ratios(row, ref, targets)
        verdicts, note = (judge(g, groups[base], margin, alpha, margins) if base is not None and i != base
                          else ({}, why or None))
        metric, head = quality.decision(verdicts, metrics)
        row |= {"quality": "baseline" if i == base else decided(metric, head, metrics), "decided on": metric,
                "interval": head and head.interval_text(), "_verdicts": verdicts,
                "_note": note} | {f"{m} verdict": v and v.text() for m, v in verdicts.items()}
        if i == base and why:
            lines.append(f"- `{g.label}` (the baseline): {why}")
        if i != base and base is not None:
            said = "; ".join(f"{m} {v.text()}" for m, v in verdicts.items() if v) or "no verdict"
            lines.append(f"- `{g.label}`: {said}" + (f". Note: {note}" if note else ""))
    return Report(rows, lines + left_out_lines(shown), targets, base, margin, on and on["task"], margins,
                  list(metrics), alpha, family)


def heading(label: str, margin: float, margins: dict, alpha: float, metrics, family: int = 1) -> str:
    over = f": {alpha * family:.0%} over the {family} configurations beside it" if family > 1 else ""
    return (f"Quality against the baseline ({label}): difference with the interval it was decided on; equivalent "
            f"when the {1 - 2 * alpha:.1%} interval lies within ±{margin:g}{other_margins(margins, margin)} (two "
            f"one-sided tests at {alpha:.2%}{over}), worse when the 95% one lies below 0, better when it and that one "
            "lie above 0; one seed is an indication, never a decision. The quality column is the decision over "
            f"{' and '.join(metrics)}: equivalent (or better) only where each is, else the word of the metric that "
            "stops it:")


def decided(metric: str | None, head, metrics) -> str | None:
    """The quality column: the decision's word, naming the metric where another than the first stopped it."""
    if head is None:
        return None
    return head.label() + (f" ({metric})" if metric != metrics[0] else "")


def other_margins(margins: dict | None, margin: float) -> str:
    """' (final F1, best F1: ±0.05)': the metrics judged at a margin of their own, for the report's heading."""
    other = {}
    for m, x in (margins or {}).items():
        if x != margin:
            other.setdefault(x, []).append(m)
    return "".join(f" ({', '.join(ms)}: ±{x:g})" for x, ms in other.items())


def left_out_lines(groups: list) -> list:
    """The runs left out of the groups, each with why (none: no lines)."""
    said = [f"- `{g.label}`: {where(run)} (seed {seed}): {why}" for g in groups for run, seed, why in g.left_out]
    return ["", "Left out of their groups (in neither their numbers nor their verdicts):", *said] if said else []


def summary_row(g: Group, targets: list) -> dict:
    """A group's means, spreads and times to target (ratios and verdicts are added against the baseline)."""
    choices = (g.runs or [run for run, _, _ in g.left_out])[0]["summary"].get("choices")
    row = {"group": g.label, "seeds": len(g.runs), "seed values": " ".join(g.seeds),
           "left out": "; ".join(f"{where(run)} (seed {seed}): {why}" for run, seed, why in g.left_out) or None,
           "_overrides": list(g.overrides), "_choices": choices if isinstance(choices, dict) else {},
           "_runs": g.runs, "_seeds": list(g.seeds), "_left_out": g.left_out}
    row |= {k: v for col in GROUP_METRICS for k, v in ((col, g.mean(col)), (f"{col} sd", g.sd(col)))}
    if len(g.values("whole run")) < len(g.runs):
        row["whole run"] = row["whole run sd"] = None  # (a run from before it was recorded: no mean of the rest)
    for t in targets:
        got, recorded = g.reached(t)
        row |= {f"to {t:g} s": statistics.mean(got) if got else None,
                f"to {t:g} s sd": statistics.stdev(got) if len(got) > 1 else None,
                f"to {t:g} s reached": len(got), f"to {t:g} s recorded": recorded}
    return row


def ratios(row: dict, ref: dict, targets: list) -> None:
    """Speed-up, AUROC difference and time-to-target ratios of `row` against the baseline row `ref`."""
    whole = row["whole run"] is not None and ref.get("whole run") is not None
    tp, ref_tp = (row["whole run"], ref["whole run"]) if whole else (row["samples/s"], ref.get("samples/s"))
    auroc, ref_auroc = row["final AUROC"], ref.get("final AUROC")
    row["speed-up"] = tp / ref_tp if tp is not None and ref_tp else None
    row["AUROC vs baseline"] = auroc - ref_auroc if None not in (auroc, ref_auroc) else None
    for t in targets:
        ours, theirs = row[f"to {t:g} s"], ref.get(f"to {t:g} s")
        every = all(r.get(f"to {t:g} s reached") == r.get(f"to {t:g} s recorded") for r in (row, ref))
        row[f"to {t:g} x"] = theirs / ours if every and ours and theirs is not None else None


def fastest(runs, choice: str) -> str:
    """The value of choice `choice` (summary `choices`) of the seed group with the highest mean throughput (its
    first run's; the first such group on a tie)."""
    groups = [g for g in seed_groups(runs) if g.mean("samples/s") is not None]
    if not groups:
        raise ValueError("--fastest: no completed run with a throughput among the runs given")
    best = max(groups, key=lambda g: g.mean("samples/s"))
    choices = best.runs[0]["summary"].get("choices")
    value = choices.get(choice) if isinstance(choices, dict) else None
    if not is_text(value):
        known = ", ".join(sorted(k for k in choices if is_text(k))) if isinstance(choices, dict) else "none recorded"
        raise ValueError(f"--fastest {choice}: the fastest group ({best.label}) has no choice {choice} in its "
                         f"summary (its choices: {known})")
    return value
