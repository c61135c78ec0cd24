"""The tune story's report (scripts/tune_story.sh): the exhaustive sweep of the search space judged candidate by
candidate against plain DDP, the tune at its error bound against it, and the orders replayed.
    python -m studies.tune_story outputs/tune-story [SWEEP.json]
                                                -> outputs/tune-story/report.md (and prints it)
SWEEP.json (default docs/results/tune-story-sweep.json) is the exhaustive sweep as recorded: every candidate at
full length once, seed 0, judged on the validation set against DDP's seed-0 run (one seed each: an indication, the
tune's verification decides over seeds). The tune is outputs/tune-story/bound (its result.json and trials.jsonl);
the replayed orders are docs/results/tune-replay.md's table (python -m studies.tune_replay)."""

import statistics
import sys
from pathlib import Path

from ringexp import quality, records
from ringexp.errors import one_line, print_error
from ringexp.verdicts.cells import markdown_table
from studies.tune_replay import OUT as REPLAY
from studies.tune_replay import SWEEP

CHOOSES = ("equivalent", "better")
LAUNCH_S = 22.0  # one Slurm run's launch beyond its wall time, as the story's first tunes measured it


def exhaustive(sweep: dict) -> tuple:
    """(the rows, the candidates' machine seconds at seed 0, the best equivalent row, the baseline row)."""
    rows = sweep["rows"]
    cands = [r for r in rows if not r["not_candidate"]]
    base = next(r for r in rows if r["verdict"] == "baseline")
    ok = [r for r in cands if r["verdict"] in CHOOSES]
    best = max(ok, key=lambda r: r["whole_s"]) if ok else None
    return rows, sum(r["wall_s"] for r in cands) + LAUNCH_S * len(cands), best, base


def sweep_lines(sweep: dict) -> list:
    rows, ex_s, best, base = exhaustive(sweep)
    cells = [[r["candidate"] + (f" ({r['note']})" if r["note"] else ""), f"{r['whole_s']:.1f}", f"{r['samples_s']:.1f}",
              f"{r['whole_s'] / base['whole_s']:.2f}x", "never" if r["to90_s"] is None else f"{r['to90_s']:.1f}",
              f"{r['final_auroc']:.3f}", r["verdict"] + (f" [{r['interval'][0]:+.3f}, {r['interval'][1]:+.3f}]"
                                                         if r["interval"] else ""), f"{r['wall_s']:.0f}"]
             for r in sorted(rows, key=lambda r: -r["whole_s"])]
    return [f"## Exhaustive sweep: {len(rows) - 3} candidates and the baseline, full length, seed 0", "",
            f"As recorded ({sweep['source']}). Whole run: samples over training seconds (the headline: it counts "
            "PowerSGD's uncompressed first steps); median: over logged intervals. Each verdict is one seed's "
            "validation-set bootstrap against DDP's seed 0 (95% interval): an indication, not a decision.", "",
            *markdown_table(["candidate", "whole run samples/s", "median samples/s", "x ddp (whole run)", "to 0.90 s",
                             "final AUROC", "vs ddp (one seed, 95%)", "run wall s"], cells), "",
            f"Machine time of the candidates and the baseline at seed 0: {ex_s:.0f} s (runs plus {LAUNCH_S:.0f} s of "
            f"launch each). Best equivalent on seed 0: {best['candidate']} at {best['whole_s']:.1f} samples/s over "
            "the whole run.", ""]


def tune(path: Path):
    if not (path / "result.json").exists():
        return None
    r = records.read_json(path / "result.json")
    return r | {"trials": [x for _, x in records.read_jsonl(path / "trials.jsonl") if isinstance(x, dict)]}


def tune_lines(got, sweep: dict, seeds: int) -> list:
    """The tune at its error bound: its cost against the exhaustive sweep at the same seeds, its choice against the
    fastest configuration the seed groups call equivalent, its verification."""
    if got is None:
        return ["## The tune at its error bound: not run", ""]
    _, ex_s, best, base = exhaustive(sweep)
    runs = [x for x in got["trials"] if "candidate" in x]
    groups = got["groups"]
    b = next(g for g in groups if g.get("quality") == "baseline")
    chosen = next((g for g in groups if got["chosen"] and own(g["group"]) == own(got["chosen"], True)), None)
    launch = statistics.median([x["wall_s"] - x["run_wall_s"] for x in runs if x.get("run_wall_s")] or [0.0])
    verified = ", ".join(f"{v['candidate']}: {said(v)}" for v in got["verified"])
    took = "Chosen" if got["chosen"] else "Kept the baseline (no candidate was verified as equivalent)"
    out = ["## The tune at its error bound", "", f"{took}: `{got['command']}`", "",
           f"- machine time {got['machine_s']:.0f} s, {got['machine_s'] / (ex_s * seeds):.2f} of the exhaustive sweep "
           f"at the same {seeds} seeds ({ex_s:.0f} s x {seeds} = {ex_s * seeds:.0f} s; the goal: at most 0.25); phases "
           + ", ".join(f"{k} {v:.0f} s" for k, v in got["phases"].items()),
           f"- runs {len(runs)} ({sum(x['status'] != 'completed' for x in runs)} failed); median launch beyond the "
           f"run's own wall time {launch:.0f} s",
           f"- decided on {quality.deciding_text(list(got['decided_on']), got['decided_on'])}, each test at "
           f"{got['level']:.2%} (tune.error / tune.verify): equivalent only where each is",
           f"- verified, fastest trial first: {verified}"]
    if got["skipped"]:
        out.append("- not verified: " + "; ".join(f"{n} ({why})" for n, why in got["skipped"]))
    if chosen:
        to90 = chosen.get("to 0.9 x")
        out += [f"- chosen over the tune's own {chosen['seeds']} baseline seeds: {chosen['speed-up']:.2f}x samples/s "
                f"over the whole run ({chosen['samples/s'] / b['samples/s']:.2f}x the median over intervals), "
                + (f"{to90:.2f}x sooner to 0.90" if to90 else f"to 0.90: {chosen.get('to 0.9 s reached')}/"
                   f"{chosen.get('to 0.9 s recorded')} seeds reached (no ratio)"),
                f"- against the fastest configuration the seed groups call equivalent ({best['candidate']}, "
                f"{best['whole_s']:.1f} samples/s over the whole run at seed 0 in the sweep): "
                f"{'the same configuration, ' if own(chosen['group']) == own(best['candidate']) else ''}"
                f"{chosen['whole run'] / best['whole_s']:.2f} of its samples/s (the goal: within 5%)"]
    return out + ["", "Seed groups of the verification (compare's, at the tune's alpha):", "",
                  *markdown_table(["group", "seeds", "whole run", "speed-up", "final AUROC", "quality", "interval",
                                   "to 0.9 s", "to 0.9 x"],
                                  [[g["group"], str(g["seeds"]), f"{g['whole run'] or 0:.1f}",
                                    f"{g['speed-up']:.2f}x" if g["speed-up"] else "-", f"{g['final AUROC']:.3f}",
                                    g["quality"] or "-", g["interval"] or "-", reached(g), fmt_x(g.get("to 0.9 x"))]
                                   for g in groups]), ""]


def said(v: dict) -> str:
    """A verified candidate's word, with the metric that decided it (its verdict's test names it first), or its
    note where it has no verdict (a collapse, a failed seed)."""
    if not v["verdict"]:
        return f"no verdict ({v.get('note') or 'none'})"
    return f"{v['verdict']['word']} on {v['verdict']['test'].split(',')[0]}"


def own(label: str, candidate: bool = False) -> set:
    """A group's label or a candidate's name as its own overrides: +parallel=, the knobs (no steps, eval_every)."""
    words = label.split()
    if candidate:
        words = [f"+parallel={words[0]}", *words[1:]]
    return {w for w in words if not w.startswith(("steps=", "eval_every="))}


def reached(g: dict) -> str:
    n, of = g.get("to 0.9 s reached"), g.get("to 0.9 s recorded")
    return f"{n}/{of} reached" if n != of else ("-" if g.get("to 0.9 s") is None else f"{g['to 0.9 s']:.1f}")


def fmt_x(x) -> str:
    return "-" if x is None else f"{x:.2f}x"


def replay_lines() -> list:
    """docs/results/tune-replay.md's table of orders (python -m studies.tune_replay writes it)."""
    if not REPLAY.exists():
        return ["## Orders replayed: not run (python -m studies.tune_replay)", ""]
    text = REPLAY.read_text().splitlines()
    start = next(i for i, line in enumerate(text) if line.startswith("## Orders against each other"))
    end = next(i for i in range(start + 1, len(text)) if text[i].startswith("## "))
    return ["## Orders replayed on the exhaustive sweep ([tune-replay.md](tune-replay.md))", *text[start + 1:end]]


def report(out: Path, sweep_path: Path) -> str:
    sweep = records.read_json(sweep_path)
    got = tune(out / "bound")
    seeds = records.read_json(out / "bound" / "tune.json")["tune"]["seeds"] if got else 0
    return "\n".join(sweep_lines(sweep) + tune_lines(got, sweep, seeds) + replay_lines()) + "\n"


def main(argv: list) -> int:
    """OUT/report.md from the tune story's directory OUT (and the sweep); 2 with one line on bad input."""
    if not argv:
        print_error("usage: python -m studies.tune_story OUT [SWEEP.json] (scripts/tune_story.sh runs it)")
        return 2
    out = Path(argv[0])
    try:
        text = report(out, Path(argv[1]) if len(argv) > 1 else SWEEP)
        out.mkdir(parents=True, exist_ok=True)
        records.write_file(out / "report.md", text)
    except (OSError, ValueError, KeyError, TypeError, StopIteration) as e:
        print_error(f"{out}: cannot report the tune story ({one_line(str(e)) or type(e).__name__})")
        return 2
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
