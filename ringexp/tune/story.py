"""The tune story's report (scripts/tune_story.sh): the exhaustive sweep of the search space judged candidate by
candidate against plain DDP, and the planner-guided and random-order tunes against it.
    python -m ringexp.tune.story outputs/tune-story [outputs/cluster-story]
                                                -> outputs/tune-story/report.md (and prints it)
The exhaustive sweep's first part is the slow-link story's seed-0 runs (outputs/cluster-story); each candidate is
judged on the validation set against DDP's seed-0 run (one run each: compare's validation-set bootstrap)."""

import random
import statistics
import sys
from pathlib import Path

from ringexp import quality, records
from ringexp.compare import load_local
from ringexp.compare.cells import markdown_table
from ringexp.compare.groups import QUALITY, judge, seed_groups

STORY = ["presets", "accumulation"]  # the story's seed-0 parts that are candidates of the space
EXTRA = {"compression.rank=2,compression.start_step=10": "two knobs at once: not a candidate",
         "compression.rank=8,compression.start_step=60": "the preset again: drift since the story"}


def exhaustive(out: Path, story: Path) -> tuple:
    runs = load_local([story / p for p in STORY] + [out / "exhaustive"])
    runs = [r for r in runs if r["summary"].get("status") == "completed"]
    groups = seed_groups(runs)
    base = next(g for g in groups if g.runs[0]["dir"] == str(story / "presets" / "0"))
    rows = []
    for g in groups:
        s = g.runs[0]["summary"]
        extra = next((why for k, why in EXTRA.items() if all(o in s["name"] for o in k.split(","))), None)
        v = None if g is base else judge(g, base, quality.MARGIN)[0][QUALITY[0]]
        train_s = g.runs[0]["rows"][-1]["train/train_s"]
        to90 = next((t["train_s"] for t in s.get("targets") or [] if t["auroc"] == 0.9), None)
        rows.append({"candidate": label(s), "samples_s": s["throughput"]["median"],
                     "whole_s": s["global_batch_size"] * s["steps"] / train_s, "to90": to90,
                     "auroc": s["final"]["auroc_macro"], "verdict": "baseline" if g is base else v.word,
                     "interval": v and v.ci95, "wall_s": s["wall_time_s"], "extra": extra, "dir": g.runs[0]["dir"]})
    return rows


def label(s: dict) -> str:
    over = [o for o in s["overrides"] if not o.startswith(("model.", "data.", "logger=", "steps=", "eval_every=",
                                                           "hydra"))]
    return " ".join(over)


def tune(path: Path) -> dict | None:
    if not (path / "result.json").exists():
        return None
    r = records.read_json(path / "result.json")
    recs = [x for _, x in records.read_jsonl(path / "trials.jsonl") if isinstance(x, dict)]
    overhead = [x["wall_s"] - x["run_wall_s"] for x in recs if x.get("run_wall_s")]
    return r | {"trials": recs, "overhead_s": statistics.median(overhead) if overhead else 0.0}


def report(out: Path, story: Path) -> str:
    rows = exhaustive(out, story)
    cands = [r for r in rows if not r["extra"]]
    tunes = {k: tune(out / k) for k in ("planner", "random")}
    overhead = statistics.median([t["overhead_s"] for t in tunes.values() if t] or [0.0])
    ex_s = sum(r["wall_s"] for r in cands) + overhead * len(cands)
    ok = [r for r in cands if r["verdict"] in ("equivalent", "better")]
    best = max(ok, key=lambda r: r["whole_s"]) if ok else None
    base = next(r for r in rows if r["verdict"] == "baseline")
    lines = [f"## Exhaustive sweep: {len(cands) - 1} candidates and the baseline, full length, seed 0", "",
             "samples/s: the median over logged intervals (ringexp's throughput); whole run: samples over training "
             "seconds, which counts PowerSGD's uncompressed first steps; ranked by the whole run.", "",
             *markdown_table(["candidate", "samples/s", "whole run", "x ddp", "to 0.90 s", "final AUROC",
                              "vs ddp (validation set, 95%)", "run wall s"],
                             [[r["candidate"] + (f" ({r['extra']})" if r["extra"] else ""), f"{r['samples_s']:.1f}",
                               f"{r['whole_s']:.1f}", f"{r['whole_s'] / base['whole_s']:.2f}x",
                               "never" if r["to90"] is None else f"{r['to90']:.1f}", f"{r['auroc']:.3f}",
                               r["verdict"] + (f" [{r['interval'][0]:+.3f}, {r['interval'][1]:+.3f}]"
                                               if r["interval"] else ""), f"{r['wall_s']:.0f}"]
                              for r in sorted(rows, key=lambda r: -r["whole_s"])]), "",
             f"Machine time of the candidates and the baseline: {ex_s:.0f} s ({sum(r['wall_s'] for r in cands):.0f} s "
             f"of runs, plus {overhead:.0f} s of launch per run as the tunes measured it). Best equivalent: "
             f"{best['candidate'] if best else 'none'} at {best['whole_s'] if best else 0:.1f} samples/s over the "
             "whole run.", ""]
    for name, t in tunes.items():
        lines += tune_lines(name, t, ex_s, best, base)
    if tunes["planner"]:
        lines += replay(tunes["planner"], cands, base)
    return "\n".join(lines) + "\n"


def replay(t, cands: list, base: dict, draws: int = 2000) -> list:
    """The trial phase replayed from the planner tune's measured trials (their cost and order): with T seconds for
    trials, which candidates each order gets to try, and the best whole-run samples/s among the tried ones that the
    exhaustive sweep judged equivalent; random order over `draws` shuffles (median, and how often it tried the
    exhaustive sweep's best equivalent)."""
    tried = [x for x in t["trials"] if x["phase"] == "try"]
    by = {r["candidate"]: r for r in cands}
    key = {x["candidate"]: f"+parallel={x['candidate'].split()[0]}" + "".join(f" {o}" for o in x["overrides"][1:])
           for x in tried}
    ok = {k: by[v]["whole_s"] for k, v in key.items() if v in by and by[v]["verdict"] in ("equivalent", "better")}
    top = max(ok, key=ok.get) if ok else None
    rng = random.Random(0)
    rows = []
    for budget in (100, 200, 300, 400, 600, 900):
        got = prefix(tried, budget)
        mine = max((ok.get(x["candidate"], 0.0) for x in got), default=0.0)
        rand = [prefix(rng.sample(tried, len(tried)), budget) for _ in range(draws)]
        best = [max((ok.get(x["candidate"], 0.0) for x in r), default=0.0) for r in rand]
        hit = sum(any(x["candidate"] == top for x in r) for r in rand) / draws
        rows.append([str(budget), str(len(got)), f"{mine / base['whole_s']:.2f}x",
                     "yes" if any(x["candidate"] == top for x in got) else "no",
                     f"{statistics.median(best) / base['whole_s']:.2f}x", f"{hit:.0%}"])
    return ["## Planner order against random order (replayed from the measured trials)", "",
            f"The exhaustive sweep's best equivalent among the trials: {top}. Budget: seconds of trials.", "",
            *markdown_table(["trial budget s", "planner: trials", "planner: best equivalent tried",
                             "planner tried the best", "random: median best equivalent tried",
                             "random tried the best"], rows), ""]


def prefix(trials: list, budget: float) -> list:
    out, spent = [], 0.0
    for x in trials:
        if spent + x["wall_s"] > budget:
            break
        spent += x["wall_s"]
        out.append(x)
    return out


def tune_lines(name: str, t, ex_s: float, best, base) -> list:
    if t is None:
        return [f"## Tune, {name} order: not run", ""]
    groups = {g["group"]: g for g in t["groups"]}
    chosen = next((g for g in t["groups"] if g.get("quality") in ("equivalent", "better")
                   and t["chosen"] and all(p in g["group"] for p in t["chosen"].split()[1:])), None)
    b = next(g for g in t["groups"] if g.get("quality") == "baseline")
    ratio = chosen and chosen["samples/s"] / b["samples/s"]
    to90 = chosen and chosen.get("to 0.9 x")
    tried = [x for x in t["trials"] if x["phase"] == "try"]
    fit = t["refit"] or {}
    return [f"## Tune, {name} order", "", f"Chosen: `{t['command']}`", "",
            f"- machine time {t['machine_s']:.0f} s ({t['machine_s'] / ex_s:.2f} of the exhaustive sweep's), phases "
            + ", ".join(f"{k} {v:.0f} s" for k, v in t["phases"].items()),
            f"- trials {len(tried)} ({sum(x['status'] != 'completed' for x in tried)} failed); verified "
            + ", ".join(f"{v['candidate']}: {v['verdict']['word'] if v['verdict'] else 'no verdict'}"
                        for v in t["verified"]),
            f"- chosen over the tune's own baseline seeds: {ratio:.2f}x samples/s, {to90:.2f}x sooner to 0.90"
            if chosen and to90 else f"- chosen: {t['chosen']}",
            f"- median samples/s against the exhaustive sweep's best equivalent ({best['candidate']}, "
            f"{best['samples_s']:.1f}): {chosen['samples/s'] / best['samples_s']:.2f}" if chosen and best
            else "- no comparison",
            f"- planner median error {fit['before']:.1%} before the refit, {fit['after']:.1%} after, "
            f"{fit['held_out']:.1%} held out" if fit.get("held_out") is not None else "- no refit",
            f"- groups: {', '.join(groups)}", ""]


if __name__ == "__main__":
    out = Path(sys.argv[1])
    text = report(out, Path(sys.argv[2] if len(sys.argv) > 2 else "outputs/cluster-story"))
    records.write_file(out / "report.md", text)
    print(text, end="")
