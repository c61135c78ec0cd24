"""The tune's candidate ordering replayed offline on the recorded exhaustive sweep, against random order and Optuna
(issue 41, "measured, not argued"): the seconds of trials each order spends before it has tried the sweep's best
*equivalent* candidate.
    python -m studies.tune_replay [PATH.json]   -> docs/results/tune-replay.md (and prints it)
PATH.json (default docs/results/tune-story-sweep.json) is docs/results/tune-story.md's exhaustive sweep as data:
every candidate run once at full length, seed 0, with its verdict against DDP and its wall seconds. A trial of a
candidate costs that recorded run; an order stops once it has tried the best equivalent (the highest whole-run
samples/s among the candidates judged equivalent or better). The orders:

    planner   the tune's ranking (tune.search=planner): predicted samples/s of each candidate's full-length run,
              those predicted slower than the baseline by more than tune.prune left out, computed with the tune's
              own functions (space.candidates, space.ranked, ranking.predicted) on the story's cluster file and one
              rank's compute measured here, as the tune measures it
    prior     the planner's ranking with the compressor that another experiment measured beyond the margin
              (top-k: docs/results/compression-quality.md, not this sweep) moved to the end
    random    the candidates shuffled (tune.search=random), SHUFFLES times
    optuna    TPE over one categorical of the candidates, and over preset x knob, the objective the whole-run
              samples/s where the recorded verdict is equivalent or better, else PENALTY; multi-objective TPE over
              (whole-run samples/s, final AUROC); STUDIES seeds each. A candidate suggested again costs nothing:
              its run is recorded
"""

import math
import random
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
from hydra import initialize_config_dir

from ringexp import predict, records
from ringexp.cluster import files as clusters
from ringexp.config import CONF_DIR
from ringexp.errors import one_line, print_error
from ringexp.models import build_model
from ringexp.quality import CHOOSES  # the verdicts the tune may choose (its verification's)
from ringexp.tune import ranking, space
from ringexp.tune.loop import COMPUTE
from ringexp.validate import compose_config
from ringexp.verdicts.cells import markdown_table

ROOT = Path(CONF_DIR).parent
SWEEP = ROOT / "docs" / "results" / "tune-story-sweep.json"
OUT = ROOT / "docs" / "results" / "tune-replay.md"
SHUFFLES, STUDIES, SEED = 2000, 200, 0
PENALTY = 0.0  # Optuna's objective for a candidate the tune could not choose (worse), or a combination that is none
MAX_ASKS = 2000  # an Optuna study that has not suggested the best by then never reaches it (inf seconds)
LAUNCH_S = 22.0  # one run's launch, which wall_s leaves out (the median the story's tunes measured)
SCALES = (0.5, 2.0)  # one rank's compute scaled so: does the planner's ranking depend on this machine's noise?


# -- the sweep ---------------------------------------------------------------------------------------------------
def load(path) -> dict:
    """The sweep's task and its candidate rows (the two rows that are no candidate and the baseline left out);
    ValueError where a row lacks a number the replay needs or names a candidate twice."""
    doc = records.read_json(path)
    rows = [r for r in doc["rows"] if not r["not_candidate"] and r["verdict"] != "baseline"]
    for r in rows:
        bad = [k for k in ("whole_s", "wall_s", "final_auroc") if not isinstance(r.get(k), int | float)]
        if bad or r["wall_s"] < 0:
            raise ValueError(f"{path}: row {r.get('candidate')!r}: {bad or 'wall_s'} not a number of seconds")
    names = [r["candidate"] for r in rows]
    if len(set(names)) != len(names):
        raise ValueError(f"{path}: a candidate appears twice")
    return {"task": doc["task"], "rows": rows, "source": doc.get("source", "")}


def best(rows: list) -> dict:
    """The best equivalent: the highest whole-run samples/s among rows the tune could choose."""
    ok = [r for r in rows if r["verdict"] in CHOOSES]
    if not ok:
        raise ValueError("no candidate is equivalent or better: there is no best to reach")
    return max(ok, key=lambda r: r["whole_s"])


# -- one order -----------------------------------------------------------------------------------------------------
def time_to(order: list, target: dict) -> tuple:
    """(trial seconds, trials) spent by `order` (rows, each tried once) up to and including `target`; (inf, all the
    trials) where the order leaves it out (the planner's prune can)."""
    spent = 0.0
    for i, r in enumerate(order):
        spent += r["wall_s"]
        if r["candidate"] == target["candidate"]:
            return spent, i + 1
    return math.inf, len(order)


def first_is_best(order: list, target: dict) -> bool:
    """Whether the first equivalent candidate of `order` is the best: what a tune that stops at its first
    equivalent one (as the tune's verification does) would choose."""
    first = next((r for r in order if r["verdict"] in CHOOSES), None)
    return first is not None and first["candidate"] == target["candidate"]


def shuffles(rows: list, target: dict, n: int = SHUFFLES, seed: int = SEED) -> list:
    """[(seconds, trials, first_is_best)] of `n` random orders of every row (random search prunes none)."""
    rng, out = random.Random(seed), []
    for _ in range(n):
        order = list(rows)
        rng.shuffle(order)
        out.append((*time_to(order, target), first_is_best(order, target)))
    return out


def study(rows: list, target: dict, seed: int, params: dict, pick, multi: bool = False) -> tuple:
    """(seconds, trials, first_is_best) of one Optuna study (TPE; `multi`: over whole-run samples/s and final
    AUROC) asking for `params` ({name: choices}) until `pick(params)` -> row is `target`. pick -> None: a
    combination that is no candidate, known before any run (PENALTY, no cost)."""
    import optuna  # only the replay needs Optuna (pyproject's dev extra), not ringexp itself

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    dist = {k: optuna.distributions.CategoricalDistribution(v) for k, v in params.items()}
    sampler = optuna.samplers.TPESampler(seed=seed)
    s = optuna.create_study(directions=["maximize"] * (2 if multi else 1), sampler=sampler)
    spent, tried, first = 0.0, set(), None
    for _ in range(MAX_ASKS):
        trial = s.ask(dist)
        r = pick(trial.params)
        if r is not None and r["candidate"] not in tried:  # a candidate suggested again is already recorded
            tried.add(r["candidate"])
            spent += r["wall_s"]
            first = first or (r if r["verdict"] in CHOOSES else None)
        s.tell(trial, objective(r, multi))
        if r is not None and r["candidate"] == target["candidate"]:
            return spent, len(tried), first["candidate"] == target["candidate"]
    return math.inf, len(tried), first is not None and first["candidate"] == target["candidate"]


def objective(r, multi: bool):
    if multi:
        return [r["whole_s"], r["final_auroc"]] if r is not None else [PENALTY, 0.0]
    return r["whole_s"] if r is not None and r["verdict"] in CHOOSES else PENALTY


def studies(rows: list, target: dict, params: dict, pick, multi: bool = False, n: int = STUDIES) -> list:
    return [study(rows, target, SEED + i, params, pick, multi) for i in range(n)]


# -- the planner's ranking -------------------------------------------------------------------------------------------
def planner(task: dict, rows: list) -> dict:
    """The tune's planner ranking of the sweep's candidates, by the tune's own functions: {"order": [(Candidate,
    row)] tried, "left_out": [(Candidate, row, why)], "names": {row candidate: the tune's name}, "compute", "where",
    "base_samples_s", "scaled": {factor: [row]}}. Every candidate of the tune's space must be one row of the sweep and
    the reverse."""
    cl = clusters.read(clusters.path_of(task["cluster"]))
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):  # one Hydra for every composition
        base = compose_config([*task["overrides"], task["baseline"], f"steps={task['steps']}",
                               f"eval_every={task['eval_every']}"], cl.nodes)
        model = build_model(base.model, base.data.num_labels)
        compute, where = predict.compute_times(dict.fromkeys(COMPUTE), base, model, cl)
        # the tune's Ranking before `rank` fills it: what ranking.predicted reads
        r = ranking.Ranking(base, cl, tuple(p.shape for p in model.parameters() if p.requires_grad), compute)
        cands, refused = space.candidates(task["overrides"], task["presets"], space.knobs(task["knobs"]),
                                          lambda cfg: ranking.predicted(r, cfg), cl.nodes, space.fingerprint(base))
        row_of = matched(cands, rows, task["overrides"], cl.nodes)
    if refused:
        raise ValueError(f"the tune's space refuses {refused[0][0]}: {refused[0][1]}")
    order, left = space.ranked(cands, ranking.predicted(r, base)["samples_s"], "planner", task["prune"], 0)
    scaled = {f: reranked(cands, r, f, task["prune"]) for f in SCALES}
    return {"order": [(c, row_of[c.name]) for c in order], "left_out": [(c, row_of[c.name], w) for c, w in left],
            "names": {row_of[c.name]["candidate"]: c.name for c in cands}, "compute": compute, "where": where,
            "base_samples_s": ranking.predicted(r, base)["samples_s"],
            "scaled": {f: [row_of[c.name] for c in o] for f, o in scaled.items()}}


def matched(cands: list, rows: list, overrides: list, nodes: int) -> dict:
    """{the tune's candidate name: its sweep row}, matched by the composed configuration (space.fingerprint: the
    sweep's labels name some knobs as their group option, e.g. accumulation=x4); ValueError where the two sets
    differ."""
    by_print = {}
    for r in rows:
        by_print.setdefault(space.fingerprint(compose_config([*overrides, *r["candidate"].split()], nodes)), r)
    out = {c.name: by_print.get(space.fingerprint(c.cfg)) for c in cands}
    missing = [n for n, r in out.items() if r is None]
    extra = [r["candidate"] for r in rows if r not in out.values()]
    if missing or extra or len(by_print) != len(rows):
        raise ValueError(f"the tune's space and the sweep differ: not in the sweep {missing}, not in the space "
                         f"{extra} (or two rows of one configuration)")
    return out


def reranked(cands: list, r: ranking.Ranking, factor: float, prune: float) -> list:
    """The planner's order with one rank's compute times `factor`."""
    compute = {k: v * factor for k, v in r.compute.items()}
    again = [replace(c, predicted=ranking.predicted(r, c.cfg, compute=compute)) for c in cands]
    return space.ranked(again, ranking.predicted(r, r.base, compute=compute)["samples_s"], "planner", prune, 0)[0]


def costly(cfg) -> bool:
    """Whether docs/results/compression-quality.md (the default experiment: 300 steps, global batch 128; not this
    sweep) measured this compression beyond the 0.02 margin: top-k, at 1% and at 10% alike (-0.14 and -0.04 AUROC
    with error feedback, AdamW), so at the knob's 5% too. Not PowerSGD: its start_step=10 falls between a start
    measured beyond the margin (step 2) and one within it (step 50, rank 8). Not accumulation: nothing outside this
    sweep (whose first part is cluster-story.md's accumulation run) measured it."""
    return cfg.compression.name == "topk"


def with_prior(order: list) -> list:
    """[(Candidate, row)] of the planner's order, the costly compressions last (their planner order kept)."""
    return [x for x in order if not costly(x[0].cfg)] + [x for x in order if costly(x[0].cfg)]


# -- the report ------------------------------------------------------------------------------------------------------
def summary(name: str, runs: list, random_median: float | None) -> list:
    """One table row of `runs` [(seconds, trials, first_is_best)]: median trials and seconds, p10 and p90 where
    there is more than one run, the ratio to random's median, how often the first equivalent was the best."""
    secs = np.array([r[0] for r in runs], dtype=float)
    med = float(np.median(secs))
    spread = [f"{np.percentile(secs, q):.0f}" for q in (10, 90)] if len(runs) > 1 else ["-", "-"]
    share = sum(r[2] for r in runs) / len(runs)
    first = f"{share:.0%}" if len(runs) > 1 else ("yes" if share else "no")
    never = sum(math.isinf(s) for s in secs)
    return [name + (f" ({never} never reached it)" if never else ""), f"{np.median([r[1] for r in runs]):.0f}",
            f"{med:.0f}", *spread, f"{med / random_median:.2f}" if random_median else "1.00", first]


def results(sweep: dict, plan: dict) -> dict:
    """{order name: [(seconds, trials, first_is_best)]} of every order, random's first."""
    rows, target = sweep["rows"], best(sweep["rows"])
    by_name = {r["candidate"]: r for r in rows}
    grid = {preset_knob(plan["names"][r["candidate"]]): r for r in rows}
    presets, knobs = sorted({p for p, _ in grid}), ["none", *sorted({k for _, k in grid} - {"none"})]
    one = {"candidate": sorted(by_name)}
    order, prior = [r for _, r in plan["order"]], [r for _, r in with_prior(plan["order"])]
    return {
        f"random ({SHUFFLES} shuffles of {len(rows)}, none left out)": shuffles(rows, target),
        f"planner (tune.search=planner: {len(order)} of {len(rows)}, {len(plan['left_out'])} pruned)":
            [(*time_to(order, target), first_is_best(order, target))],
        "planner, top-k last (prior: compression-quality.md, not this sweep)":
            [(*time_to(prior, target), first_is_best(prior, target))],
        f"Optuna TPE, one categorical of {len(rows)} ({STUDIES} seeds)":
            studies(rows, target, one, lambda p: by_name[p["candidate"]]),
        f"Optuna TPE, preset x knob ({len(presets)} x {len(knobs)}; {STUDIES} seeds)":
            studies(rows, target, {"preset": presets, "knob": knobs}, lambda p: grid.get((p["preset"], p["knob"]))),
        f"Optuna multi-objective TPE over (whole-run samples/s, final AUROC) ({STUDIES} seeds)":
            studies(rows, target, one, lambda p: by_name[p["candidate"]], multi=True),
    }


def preset_knob(name: str) -> tuple:
    """(preset, knob or "none") of a tune's candidate name ("ring_int8", "ring_int8 accumulation.steps=4")."""
    preset, _, knob = name.partition(" ")
    return preset, knob or "none"


def ranking_table(plan: dict, target: dict) -> list:
    """The planner's order row by row, with what each trial adds, then the candidates its prune leaves out."""
    cells, spent = [], 0.0
    for i, (c, r) in enumerate(plan["order"], 1):
        spent += r["wall_s"]
        cells.append([str(i), c.name + (" (the best equivalent)" if r["candidate"] == target["candidate"] else ""),
                      f"{c.predicted['samples_s']:.1f}", f"{r['whole_s']:.1f}", r["verdict"], f"{r['wall_s']:.0f}",
                      f"{spent:.0f}", "yes" if costly(c.cfg) else ""])
    cells += [["pruned", c.name, f"{c.predicted['samples_s']:.1f}", f"{r['whole_s']:.1f}", r["verdict"],
               f"{r['wall_s']:.0f}", "-", "yes" if costly(c.cfg) else ""] for c, r, _ in plan["left_out"]]
    return markdown_table(["rank", "candidate (the tune's name)", "predicted samples/s", "whole-run samples/s",
                           "verdict vs ddp", "run wall s", "trial s so far", "prior: last"], cells)


def goal(res: dict) -> str:
    """Issue 41's goal, judged on the planner's order as the tune ranks it (not the prior's)."""
    rand, plan = list(res.values())[:2]
    med = float(np.median([r[0] for r in rand]))
    ratio = plan[0][0] / med
    word = "met" if ratio <= 0.5 else "missed"
    return (f"**Goal (issue 41): the tune reaches the best equivalent in at most half the median trial time random "
            f"order needs: {word}.** The planner's order needs {plan[0][0]:.0f} s, {ratio:.2f} of random's median "
            f"{med:.0f} s (the goal: 0.50 or less; {abs(0.5 - ratio) * med:.0f} s "
            f"{'to spare' if ratio <= 0.5 else 'too many'}).")


def sensitivity(plan: dict, target: dict) -> str:
    parts = []
    for f, order in plan["scaled"].items():
        s, n = time_to(order, target)
        parts.append(f"compute x {f:g}: the best equivalent at rank {n}, after {s:.0f} s")
    return "; ".join(parts)


def report(path) -> str:
    sweep = load(path)
    target = best(sweep["rows"])
    plan = planner(sweep["task"], sweep["rows"])
    res = results(sweep, plan)
    rand_med = float(np.median([r[0] for r in next(iter(res.values()))]))
    table = [summary(name, runs, None if i == 0 else rand_med) for i, (name, runs) in enumerate(res.items())]
    comp = ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in plan["compute"].items())
    expect = target["wall_s"] + (sum(r["wall_s"] for r in sweep["rows"]) - target["wall_s"]) / 2
    return "\n".join([
        "## Orders against each other (replayed from the exhaustive sweep)", "",
        f"Best equivalent: {target['candidate']} ({target['whole_s']:.1f} samples/s over the whole run, "
        f"{target['verdict']}). A trial costs the candidate's recorded full-length seed-0 run (its wall seconds); "
        "an order stops once it has tried the best equivalent.", "",
        *markdown_table(["order", "trials (median)", "trial s to the best: median", "p10", "p90",
                         "x random's median", "first equivalent tried is the best"], table), "",
        goal(res), "", f"Random order's exact mean: {expect:.0f} s (the best's run plus half of every other's).", "",
        "## The planner's ranking, reproduced", "",
        f"The tune's functions (space.candidates, space.ranked, ranking.predicted) on {sweep['task']['cluster']}, "
        f"one rank's compute {plan['where']}: {comp}; the baseline predicted at {plan['base_samples_s']:.1f} "
        f"samples/s, tune.prune={sweep['task']['prune']}. The same ranking with one rank's compute scaled: "
        f"{sensitivity(plan, target)}.", "",
        *ranking_table(plan, target), "", *caveats(sweep, plan, target)])


def with_launch(sweep: dict, plan: dict, target: dict) -> str:
    """The planner's and random's numbers again with LAUNCH_S added to every trial: it favours fewer trials."""
    more = {r["candidate"]: r | {"wall_s": r["wall_s"] + LAUNCH_S} for r in sweep["rows"]}
    mine = time_to([more[r["candidate"]] for _, r in plan["order"]], target)[0]
    rand = float(np.median([s for s, _, _ in shuffles(list(more.values()), target)]))
    return f"planner {mine:.0f} s, random's median {rand:.0f} s ({mine / rand:.2f})"


def caveats(sweep: dict, plan: dict, target: dict) -> list:
    return [
        "## What this does not say", "",
        "- A trial here is a candidate's full-length seed-0 run, tried one after another. The tune itself first runs "
        "every candidate it keeps for tune.trial_steps (20 in the story), then verifies only the fastest it measured, "
        "at full length over tune.seeds seeds beside the baseline's: this compares orders, not the tune's machine "
        "time (tune-story.md: 2203 s, of which 708 s of trials and 1124 s of verification).",
        "- The verdicts are the sweep's: each candidate's seed 0 against DDP's seed 0 on the validation set (a "
        "bootstrap), not the tune's verdict paired over seeds. The verification's rule that a knob which made its "
        "own preset worse is not verified again on another preset is not replayed.",
        "- The planner's ranking uses nothing measured in this sweep: the cluster file's inter-node constant is the "
        "link's rate, the rest an earlier calibration (its `source`), and the refit on the trials is not used. One "
        "rank's compute is measured here, now; the tune measured it at the time, on the same kind of 2-core machine "
        "(the compute-scaled rankings above show how much that matters).",
        f"- Launch: wall_s leaves out about {LAUNCH_S:.0f} s of launch per run; counted, "
        f"{with_launch(sweep, plan, target)}.",
        "- Optuna's categorical choices have no distance between them: TPE can only learn which candidates (or "
        "presets and knobs) it has seen do well. A suggestion repeated costs nothing here (the run is recorded); a "
        "real study without that cache would pay for it again.",
        "- The prior's rule comes from docs/results/compression-quality.md (another task and length); it is given "
        "beside the goal, not used for it."]


def commit() -> str:
    def git(*args):
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return head + (" (with uncommitted changes)" if git("status", "--porcelain", "--untracked-files=no") else "")


def main(argv: list) -> int:
    """Writes docs/results/tune-replay.md; 2 with one line where the sweep cannot be read or replayed."""
    try:
        return replayed(Path(argv[0]) if argv else SWEEP)
    except (OSError, ValueError, KeyError, TypeError) as e:
        print_error(f"{argv[0] if argv else SWEEP}: cannot replay it ({one_line(str(e)) or type(e).__name__}); give "
                    "an exhaustive sweep as docs/results/tune-story-sweep.json holds one")
        return 2


def replayed(path: Path) -> int:
    shown = path.resolve().relative_to(ROOT) if path.resolve().is_relative_to(ROOT) else path
    body = report(path)
    text = "\n".join(["# The tune's order against random order and Optuna, replayed", "",
                      f"`python -m studies.tune_replay {shown}` at commit {commit()}; the sweep: "
                      f"{records.read_json(path).get('source', '')}", "", body])
    print(text)
    records.write_file(OUT, text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
