"""What a tune leaves in its directory: playbook.md (the checklist, every trial predicted and measured, the
verification's verdicts, the choice and the time per phase), best.yaml, trials.jsonl (written as it goes) and two
plots: predicted against measured step time (before and after the refit) and throughput against quality."""

from collections import defaultdict
from dataclasses import dataclass

from omegaconf import OmegaConf

from ringexp import quality, records
from ringexp.config import plain
from ringexp.plotting import pyplot, save, short
from ringexp.tune import collapse, ranking, verify
from ringexp.tune.budget import FULL
from ringexp.tune.loop import Job
from ringexp.tune.ranking import Ranking
from ringexp.verdicts.cells import lr_rule, markdown_table

PHASES = ("diagnose", "predict", "try", "verify")
BEST = "best.yaml"  # a +experiment file: copy it to conf/experiment/ (docs/tune.md)


@dataclass(frozen=True)
class Outcome:
    """What a tune did, as its playbook tells it: its Job (directory, overrides, trial records), its budget, and
    each phase's record so far (None where the tune stopped before it)."""
    job: Job
    budget_s: float
    ranking: Ranking | None
    verification: verify.Verification
    fit: dict | None

    @property
    def chosen(self):
        return self.verification.chosen

    def at_trial(self, rec: dict, fitted: bool = False) -> float:
        """The predicted step of trial record `rec`, on the planner's cluster or on the refitted one."""
        if fitted:
            return ranking.at_trial(self.ranking, rec, self.fit["cluster"], self.fit["compute"])
        return ranking.at_trial(self.ranking, rec)


def write(o, checks: list, argv: list, note: str = "") -> str:
    """playbook.md, best.yaml and the plots of Outcome `o`; the chosen command line (or the baseline's)."""
    chosen = command(o, o.chosen)
    rep = verify.report(o.job.tc, o.job.log.done)  # once: each verdict on one seed is a 2000-resample bootstrap
    parts = [f"# Tune playbook: {o.job.out.name}", "", f"Tune: `python -m ringexp.tune {' '.join(argv)}`", "",
             f"Chosen: `{chosen}`" if o.chosen else f"Kept the baseline: `{chosen}` (no candidate was verified as "
             "equivalent)", *(["", note] if note else []), "", "## Time per phase (machine seconds)", "",
             *markdown_table(["phase", "seconds", "trials"], phase_rows(o)), "", "## Checklist (seed article 004)",
             "", *markdown_table(["check", "numbers", "verdict"], [list(c) for c in checks]), "",
             *planner_part(o), "", "## Trials", "", *markdown_table(TRIAL_HEAD, trial_rows(o)), "",
             *left_out_part(o), "## Verification (full length, over seeds)", "", *verify_part(o, rep)]
    records.write_file(o.job.out / "playbook.md", "\n".join(parts) + "\n")
    if o.chosen:
        records.write_file(o.job.out / BEST, best_yaml(o))
    if rep is not None:
        rep.write(o.job.out)  # groups.csv and quality.json, as compare writes them (the planner reads quality=)
    records.write_json(o.job.out / "result.json", result(o, chosen, rep))
    plots(o, rep)
    return chosen


def result(o, chosen: str, rep) -> dict:
    """The tune's outcome in numbers (result.json): what docs/results tables are made from."""
    spent = defaultdict(float)
    for r in o.job.log.done.values():
        spent[r["phase"]] += r.get("wall_s", 0.0)
    fit = o.fit and {k: v for k, v in o.fit.items() if k not in ("cluster", "compute")}
    rows = [{k: v for k, v in r.items() if not k.startswith("_")} for r in rep.rows] if rep else []
    return {"chosen": o.chosen and o.chosen.name, "command": chosen, "machine_s": sum(spent.values()),
            "decided_on": {m: o.job.tc.margins()[m] for m in o.job.tc.metrics}, "level": verify.alpha(o.job.tc),
            "phases": dict(spent), "budget_s": o.budget_s, "refit": fit, "groups": rows,
            "verified": [{"candidate": c.name, "verdict": v and v[0] and v[0].record(), "note": v and v[1]}
                         for c, v in o.verification.verified],
            "skipped": [[c.name, why] for c, why in o.verification.skipped]}


def command(o, c) -> str:
    """The training command of candidate `c` at full length (None: the user's own)."""
    steps, every = ranking.full_steps(o.job.base, c)
    over = list(o.job.base_overrides) if c is None else [*o.job.rest, *c.overrides]
    return " ".join(["python -m ringexp.train", *over, f"steps={steps}", f"eval_every={every}"])


def best_yaml(o) -> str:
    """The chosen candidate's groups that a tune varies, resolved: `+experiment=best` once in conf/experiment/."""
    cfg = plain(o.chosen.cfg)
    body = {k: cfg[k] for k in ("parallel", "compression", "accumulation", "amp")}
    steps, every = ranking.full_steps(o.job.base, o.chosen)
    head = (f"# @package _global_\n# chosen by python -m ringexp.tune in {o.job.out} ({o.chosen.name}); the task's "
            "own\n"
            f"# overrides still go on the command line: {command(o, o.chosen)}\n")
    return head + OmegaConf.to_yaml(OmegaConf.create(body | {"steps": steps, "eval_every": every}))


def phase_rows(o) -> list:
    spent, n = defaultdict(float), defaultdict(int)
    for r in o.job.log.done.values():
        spent[r["phase"]] += r.get("wall_s", 0.0)
        n[r["phase"]] += "candidate" in r
    rows = [[p, f"{spent[p]:.0f}", str(n[p])] for p in PHASES]
    return rows + [["total", f"{sum(spent.values()):.0f} of {o.budget_s:.0f} budgeted", str(sum(n.values()))]]


TRIAL_HEAD = ["trial", "candidate", "steps", "predicted ms", "refitted ms", "measured ms", "samples/s",
              "p10-p90", "lr rule", "outcome"]


def trial_rows(o) -> list:
    out = []
    for r in o.job.log.done.values():
        if r["phase"] not in ("diagnose", "try"):
            continue
        pred = o.at_trial(r) if o.ranking else None
        after = o.at_trial(r, fitted=True) if o.fit else None
        ok = r["status"] == "completed"
        out.append([r["key"], r["candidate"], str(r["steps"]), ms(pred), ms(after), ms(r.get("step_s")),
                    f"{r['samples_s']:.1f}" if ok else "-",
                    f"{r['samples_s_p10']:.1f}-{r['samples_s_p90']:.1f}" if ok else "-", lr_rule(r) or "-",
                    "completed" if ok else f"{r['status']}: {r['reason']}"])
    return out


def ms(s) -> str:
    return "-" if s is None else f"{s * 1e3:.0f}"


def planner_part(o) -> list:
    if o.ranking is None:
        return ["## Planner", "", "Not reached."]
    cl = o.ranking.cluster
    out = ["## Planner", "", f"Cluster `{cl.name}` ({cl.nodes} x {cl.ranks_per_node}, link {cl.link}): "
           f"{cl.source or 'no source given'}.", "",
           f"{len(o.ranking.cands)} candidates; {len(o.ranking.order)} in the search ({o.job.tc.search} order), "
           f"{len(o.ranking.left_out)} left out, {len(o.ranking.refused)} refused."]
    if o.fit:
        f = o.fit
        held = "n/a (under 4 trials)" if f["held_out"] is None else f"{f['held_out']:.1%}"
        out += ["", f"Refit on the trials: compute x{f['factors']['compute']:.2f}, intra-node seconds per byte "
                f"x{f['factors']['intra_beta']:.2f}, inter-node x{f['factors']['inter_beta']:.2f}. Median error "
                f"of the predicted step: {f['before']:.1%} before, {f['after']:.1%} after, {held} held out (each "
                "trial predicted by a fit on the others)."]
    return out


def left_out_part(o) -> list:
    if o.ranking is None:
        return []
    rows = [[c.name, why] for c, why in o.ranking.left_out] + [[n, f"refused: {why}"] for n, why in o.ranking.refused]
    return (["## Left out", "", *markdown_table(["candidate", "why"], rows), ""]) if rows else []


def verify_part(o, rep) -> list:
    if rep is None:
        return ["Not reached."]
    v = o.verification
    lines = [f"- {c.name}: {x[0].text() if x and x[0] else 'no verdict'}" + (f" ({x[1]})" if x and x[1] else "")
             for c, x in v.verified] + [f"- {c.name}: not verified ({why})" for c, why in v.skipped]
    return [*rep.markdown().splitlines(), "", decided_on(o.job.tc), *unseen_line(o), "",
            "Candidates verified, fastest trial first:", "", *lines]


def decided_on(tc) -> str:
    """What a choice needs, and what its bound assumes."""
    return (f"Decided on {quality.deciding_text(tc.metrics, tc.margins())}: a candidate is chosen only where it is "
            f"equivalent or better on each, every test at tune.error / tune.verify = {verify.alpha(tc):.2%} (an "
            f"intersection-union test: at most {tc.error:.0%} chance that the chosen one is worse than a margin), and "
            f"only where none of its runs collapsed (more than {collapse.COLLAPSE} margins below the baseline at the "
            "same training samples, or non-finite). The bound assumes seed-to-seed differences close to normal; a "
            "failure on rare seeds is what it cannot see.")


def unseen_line(o) -> list:
    """What the chosen candidate's runs cannot see: a failure that strikes 1 run in N, absent from all of them."""
    if not o.chosen:
        return []
    k = sum(r.get("candidate") == o.chosen.name and r["status"] == "completed" and r["phase"] in ("try", *FULL)
            for r in o.job.log.done.values())
    odds = ", ".join(f"1 run in {n}: {collapse.unseen(k, n):.0%}" for n in (7, 20))
    return ["", f"The chosen candidate's {k} runs (its trials and verification seeds) hold no collapse; a failure "
                f"that strikes only some runs goes unseen in all {k} with chance {odds}."]


def plots(o, rep) -> None:
    plt = pyplot()
    done = [r for r in o.job.log.done.values() if r["phase"] in ("diagnose", "try") and r["status"] == "completed"]
    if o.ranking and done:
        meas = [r["step_s"] for r in done]
        fig, ax = plt.subplots(figsize=(5, 5))
        ax.scatter(meas, [o.at_trial(r) for r in done], label="planner")
        if o.fit:
            ax.scatter(meas, [o.at_trial(r, fitted=True) for r in done], marker="x",
                       label="after the refit")
        lo, hi = min(meas) / 2, max(meas) * 2
        ax.plot([lo, hi], [lo, hi], color="grey", lw=0.8)
        ax.set(xscale="log", yscale="log", xlabel="measured step (s)", ylabel="predicted step (s)",
               title="Predicted against measured")
        ax.legend(fontsize=8)
        fig.tight_layout()
        save(fig, o.job.out / "predicted_vs_measured.png")
    quality_plot(o, rep, plt)


def quality_plot(o, rep, plt) -> None:
    if rep is None or rep.base is None:
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for row in rep.rows:
        v = row["_verdicts"].get("final AUROC")
        (lo, hi), _ = v.decided_on() if v else ((0.0, 0.0), None)
        d, err = (v.diff, [[v.diff - lo], [hi - v.diff]]) if v else (0.0, None)
        ax.errorbar([row["samples/s"]], [d], yerr=err, fmt="o", capsize=4, label=short(row["group"], 40))
    ax.axhspan(-o.job.tc.quality_budget, o.job.tc.quality_budget, color="tab:green", alpha=0.15, label="quality budget")
    ax.set(xlabel="samples/s (mean over seeds)", ylabel="final macro-AUROC - baseline (the verdict's interval)",
           title="Throughput against quality")
    ax.legend(fontsize=6)
    fig.tight_layout()
    save(fig, o.job.out / "throughput_quality.png")
