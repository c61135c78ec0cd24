"""What a tune leaves in its directory: playbook.md (the checklist, every trial predicted and measured, the
verification's verdicts, the choice and the time per phase), best.yaml, trials.jsonl (written as it goes) and two
plots: predicted against measured step time (before and after the refit) and throughput against quality."""

from collections import defaultdict

from omegaconf import OmegaConf

from ringexp import records
from ringexp.config import plain
from ringexp.plotting import pyplot, save, short
from ringexp.tune import verify
from ringexp.verdicts.cells import lr_rule, markdown_table

PHASES = ("diagnose", "predict", "try", "verify")
BEST = "best.yaml"  # a +experiment file: copy it to conf/experiment/ (docs/tune.md)


def write(t, checks: list, argv: list, note: str = "") -> str:
    """playbook.md, best.yaml and the plots of Tune `t`; the chosen command line (or the baseline's)."""
    chosen = command(t, t.chosen)
    rep = verify.report(t)  # once: each verdict on one seed is a 2000-resample bootstrap
    parts = [f"# Tune playbook: {t.out.name}", "", f"Tune: `python -m ringexp.tune {' '.join(argv)}`", "",
             f"Chosen: `{chosen}`" if t.chosen else f"Kept the baseline: `{chosen}` (no candidate was verified as "
             "equivalent)", *(["", note] if note else []), "", "## Time per phase (machine seconds)", "",
             *markdown_table(["phase", "seconds", "trials"], phase_rows(t)), "", "## Checklist (seed article 004)",
             "", *markdown_table(["check", "numbers", "verdict"], [list(c) for c in checks]), "",
             *planner_part(t), "", "## Trials", "", *markdown_table(TRIAL_HEAD, trial_rows(t)), "",
             *left_out_part(t), "## Verification (full length, over seeds)", "", *verify_part(t, rep)]
    records.write_file(t.out / "playbook.md", "\n".join(parts) + "\n")
    if t.chosen:
        records.write_file(t.out / BEST, best_yaml(t))
    if rep is not None:
        rep.write(t.out)  # groups.csv and quality.json, as compare writes them (the planner reads quality=)
    records.write_json(t.out / "result.json", result(t, chosen, rep))
    plots(t, rep)
    return chosen


def result(t, chosen: str, rep) -> dict:
    """The tune's outcome in numbers (result.json): what docs/results tables are made from."""
    spent = defaultdict(float)
    for r in t.log.done.values():
        spent[r["phase"]] += r.get("wall_s", 0.0)
    fit = t.fit and {k: v for k, v in t.fit.items() if k not in ("cluster", "compute")}
    rows = [{k: v for k, v in r.items() if not k.startswith("_")} for r in rep.rows] if rep else []
    return {"chosen": t.chosen and t.chosen.name, "command": chosen, "machine_s": sum(spent.values()),
            "phases": dict(spent), "budget_s": t.budget.total_s, "refit": fit, "groups": rows,
            "verified": [{"candidate": c.name, "verdict": v and v[0] and v[0].record(), "note": v and v[1]}
                         for c, v in t.verified], "skipped": [[c.name, why] for c, why in t.skipped]}


def command(t, c) -> str:
    """The training command of candidate `c` at full length (None: the user's own)."""
    steps, every = (t.base.steps, t.base.eval_every) if c is None else t.full_steps(c)
    over = t.base_overrides if c is None else [*t.rest, *c.overrides]
    return " ".join(["python -m ringexp.train", *over, f"steps={steps}", f"eval_every={every}"])


def best_yaml(t) -> str:
    """The chosen candidate's groups that a tune varies, resolved: `+experiment=best` once in conf/experiment/."""
    cfg = plain(t.chosen.cfg)
    body = {k: cfg[k] for k in ("parallel", "compression", "accumulation", "amp")}
    steps, every = t.full_steps(t.chosen)
    head = (f"# @package _global_\n# chosen by python -m ringexp.tune in {t.out} ({t.chosen.name}); the task's own\n"
            f"# overrides still go on the command line: {command(t, t.chosen)}\n")
    return head + OmegaConf.to_yaml(OmegaConf.create(body | {"steps": steps, "eval_every": every}))


def phase_rows(t) -> list:
    spent, n = defaultdict(float), defaultdict(int)
    for r in t.log.done.values():
        spent[r["phase"]] += r.get("wall_s", 0.0)
        n[r["phase"]] += "candidate" in r
    rows = [[p, f"{spent[p]:.0f}", str(n[p])] for p in PHASES]
    return rows + [["total", f"{sum(spent.values()):.0f} of {t.budget.total_s:.0f} budgeted", str(sum(n.values()))]]


TRIAL_HEAD = ["trial", "candidate", "steps", "predicted ms", "refitted ms", "measured ms", "samples/s",
              "p10-p90", "lr rule", "outcome"]


def trial_rows(t) -> list:
    out = []
    for r in t.log.done.values():
        if r["phase"] not in ("diagnose", "try"):
            continue
        pred = t.at_trial(r) if t.cluster else None
        after = t.at_trial(r, t.fit["cluster"], t.fit["compute"]) if t.fit else None
        ok = r["status"] == "completed"
        out.append([r["key"], r["candidate"], str(r["steps"]), ms(pred), ms(after), ms(r.get("step_s")),
                    f"{r['samples_s']:.1f}" if ok else "-",
                    f"{r['samples_s_p10']:.1f}-{r['samples_s_p90']:.1f}" if ok else "-", lr_rule(r) or "-",
                    "completed" if ok else f"{r['status']}: {r['reason']}"])
    return out


def ms(s) -> str:
    return "-" if s is None else f"{s * 1e3:.0f}"


def planner_part(t) -> list:
    if t.cluster is None:
        return ["## Planner", "", "Not reached."]
    out = ["## Planner", "", f"Cluster `{t.cluster.name}` ({t.cluster.nodes} x {t.cluster.ranks_per_node}, link "
           f"{t.cluster.link}): {t.cluster.source or 'no source given'}.", "",
           f"{len(t.cands)} candidates; {len(t.order)} in the search ({t.tc.search} order), "
           f"{len(t.left_out)} left out, {len(t.refused)} refused."]
    if t.fit:
        f = t.fit
        held = "n/a (under 4 trials)" if f["held_out"] is None else f"{f['held_out']:.1%}"
        out += ["", f"Refit on the trials: compute x{f['factors']['compute']:.2f}, intra-node seconds per byte "
                f"x{f['factors']['intra_beta']:.2f}, inter-node x{f['factors']['inter_beta']:.2f}. Median error "
                f"of the predicted step: {f['before']:.1%} before, {f['after']:.1%} after, {held} held out (each "
                "trial predicted by a fit on the others)."]
    return out


def left_out_part(t) -> list:
    rows = [[c.name, why] for c, why in t.left_out] + [[name, f"refused: {why}"] for name, why in t.refused]
    return (["## Left out", "", *markdown_table(["candidate", "why"], rows), ""]) if rows else []


def verify_part(t, rep) -> list:
    if rep is None:
        return ["Not reached."]
    lines = [f"- {c.name}: {v[0].text() if v and v[0] else 'no verdict'}" + (f" ({v[1]})" if v and v[1] else "")
             for c, v in t.verified] + [f"- {c.name}: not verified ({why})" for c, why in t.skipped]
    return [*rep.markdown().splitlines(), "", "Candidates verified, fastest trial first:", "", *lines]


def plots(t, rep) -> None:
    plt = pyplot()
    done = [r for r in t.log.done.values() if r["phase"] in ("diagnose", "try") and r["status"] == "completed"]
    if t.cluster and done:
        meas = [r["step_s"] for r in done]
        fig, ax = plt.subplots(figsize=(5, 5))
        ax.scatter(meas, [t.at_trial(r) for r in done], label="planner")
        if t.fit:
            ax.scatter(meas, [t.at_trial(r, t.fit["cluster"], t.fit["compute"]) for r in done], marker="x",
                       label="after the refit")
        lo, hi = min(meas) / 2, max(meas) * 2
        ax.plot([lo, hi], [lo, hi], color="grey", lw=0.8)
        ax.set(xscale="log", yscale="log", xlabel="measured step (s)", ylabel="predicted step (s)",
               title="Predicted against measured")
        ax.legend(fontsize=8)
        fig.tight_layout()
        save(fig, t.out / "predicted_vs_measured.png")
    quality_plot(t, rep, plt)


def quality_plot(t, rep, plt) -> None:
    if rep is None or rep.base is None:
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for row in rep.rows:
        v = row["_verdicts"].get("final AUROC")
        (lo, hi), _ = v.decided_on() if v else ((0.0, 0.0), None)
        d, err = (v.diff, [[v.diff - lo], [hi - v.diff]]) if v else (0.0, None)
        ax.errorbar([row["samples/s"]], [d], yerr=err, fmt="o", capsize=4, label=short(row["group"], 40))
    ax.axhspan(-t.tc.quality_budget, t.tc.quality_budget, color="tab:green", alpha=0.15, label="quality budget")
    ax.set(xlabel="samples/s (mean over seeds)", ylabel="final macro-AUROC - baseline (the verdict's interval)",
           title="Throughput against quality")
    ax.legend(fontsize=6)
    fig.tight_layout()
    save(fig, t.out / "throughput_quality.png")
