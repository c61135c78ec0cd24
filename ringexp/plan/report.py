"""What predict writes: the table of presets (plan.md) and the plot of step time against the inter-node link
(plan.png)."""

import dataclasses
from pathlib import Path

from ringexp import quality
from ringexp.cluster import costmodel
from ringexp.plotting import pyplot, save, short
from ringexp.predict import ELIGIBLE, NO_VERDICT

BANDWIDTHS_GBIT = (0.1, 0.25, 0.5, 1, 2.5, 10, 25, 50, 100, 200, 400)
# the seeds of the sweep the report suggests: nine harmless presets judged at 5% / 9 (the bound) are recommended
# 99.9% of the time over 7 seeds, 5% over 3 (tests/test_plan_error.py's simulation, docs/plan.md)
SWEEP_SEEDS = 7


def report(cl, base, rows: list, compute: dict, source: str, command: str, on: dict, record, rest: list,
           bound: dict) -> str:
    """plan.md; `on`: {metric: margin} a verdict-based recommendation is decided on; `bound`: its error, the family
    of presets judged on verdicts and each test's alpha (plan/predict.recommended)."""
    ranks, nccl = cl.nodes * cl.ranks_per_node, cl.backend == "nccl"
    lines = [f"# Predicted by ringexp's cost model (not measured): {base.model.name}, batch {base.data.batch_size} "
             f"per rank, on {cl.name}: {cl.nodes} node(s) x {cl.ranks_per_node} = {ranks} ranks", "",
             level_line("intra-node", cl.intra, ""), level_line("inter-node", cl.inter, " per node"),
             f"- compute per rank: forward {compute['forward_s'] * 1e3:.1f} ms, backward "
             f"{compute['backward_s'] * 1e3:.1f} ms, optimizer {compute['optimizer_s'] * 1e3:.1f} ms ({source})",
             "", "| preset | strategy | compression | accum | all-reduce s | exposed s | step s | samples/s | "
             "whole run samples/s | x ddp (whole run) | MB sent/rank/step | quality (AUROC vs ddp) |"
             + (" NCCL's choice (model) |" if nccl else ""), "|" + "---|" * (12 + nccl)]
    for r in sorted(rows, key=lambda r: -r["whole_samples_s"]):
        diff = "" if r["auroc_diff"] is None else f" ({r['auroc_diff']:+.3f})"
        if r["decided_on"] not in (None, next(iter(on))):  # (stopped by another metric than the one shown)
            diff += f", decided on {r['decided_on']}"
        lines.append(f"| {r['preset']} | {r['strategy']} | {r['compression']} | {r['accumulation']} | "
                     f"{r['comm_s']:.3f} | {r['exposed_s']:.3f} | {r['step_s']:.3f} | {r['samples_s']:.1f} | "
                     f"{r['whole_samples_s']:.1f} | {r['speedup']:.2f}x | {r['sent_bytes'] / 1e6:.2f} | "
                     f"{r['quality']}{diff} |"
                     + (f" {r['nccl'] or 'its own p2p messages'} |" if nccl else ""))
    return "\n".join(lines + quality_lines(rows, command, on, record, rest, ranks, bound)) + "\n"


def quality_lines(rows: list, command: str, on: dict, record, rest: list, ranks: int, bound: dict) -> list:
    """What the recommendation was chosen from, whose verdicts, what was left out, and how to get the verdicts this
    task lacks (`record`: the quality= file, or None; `rest`: the user's training overrides; `ranks`: the task's
    world size)."""
    ok = [r for r in rows if r["quality"] in ELIGIBLE]
    lines = ["", (f"Recommended (the fastest preset that is exact, or equivalent or better than ddp on "
                  f"{quality.deciding_text(on, on)}, each by a decisive verdict: {quality.MIN_SEEDS} paired seeds "
                  f"or more; {bound_text(bound)}): `{command}`") if ok else
             (f"Recommended: `{command}`, the baseline: no preset predicted here is exact or has a decisive verdict "
              "on this task"),
             (f"Quality: the verdicts of {record}, measured on this task (the same model, data, optimizer, world "
              "size, samples and evaluation spacing), each test written at "
              f"{bound['written'].get('alpha', 0):.2%} over {bound['written'].get('family')} configurations and "
              "read again at the level above, judged at quality_budget and f1_budget; a verdict "
              f"on one seed is shown as {quality.INDICATIVE} and not acted on" if record else
              "Quality: no record of verdicts given (quality=PATH), so none is known for this task") +
             "; exact: every step's gradients summed uncompressed at one micro-step, the same arithmetic as ddp"]
    wanting = [r for r in rows if r["quality"] in (NO_VERDICT, quality.INDICATIVE)]
    if judged := [r for r in rows if r["quality"] not in (*ELIGIBLE, NO_VERDICT, quality.INDICATIVE)]:
        lines.append("Left out for quality: " + ", ".join(f"{r['preset']} ({r['quality']} on {r['decided_on']})"
                                                          for r in judged))
    if wanting:
        named = ", ".join(r["preset"] + (" (one seed only)" if r["quality"] == quality.INDICATIVE else "")
                          for r in wanting)
        exact_only = all(r["quality"] == "exact" for r in ok)
        lines.append(("Compressed or averaging presets (and those with accumulation or autocast) need a decisive "
                      f"verdict on this task to be recommended; none for: {named}") if exact_only else
                     f"Left out, no decisive verdict on this task: {named}")
        presets = ",".join(["ddp", *(r["preset"] for r in wanting)])
        seeds = ",".join(map(str, range(SWEEP_SEEDS)))
        sweep = " ".join(["python -m ringexp.train -m", f"+parallel={presets}", f"seed={seeds}", *rest])
        lines.append(f"To get a verdict for this task: a seed sweep of it on {ranks} ranks, `{sweep}`, whose "
                     "report writes quality.json into the sweep directory (or `python -m ringexp.compare "
                     "SWEEP_DIRS`, docs/sweeps.md), then quality=SWEEP/quality.json; or `python -m ringexp.tune`, "
                     "whose tune.out gets one for what it verifies (docs/tune.md)")
    return lines


def bound_text(bound: dict) -> str:
    """What a recommendation on a verdict may get wrong, and over how many presets."""
    if not bound["family"]:
        return "no preset here is judged on a verdict"
    return (f"at most {bound['error']:.0%} chance that a preset recommended on a verdict is worse than a margin: "
            f"each test of the {bound['family']} preset{'s' * (bound['family'] > 1)} judged on verdicts at "
            f"{bound['alpha']:.2%}, error / {bound['family']}")


def level_line(name: str, link, per: str) -> str:
    """A level's constants: alpha, line rate, what the transport reaches of it, and their source."""
    reach = costmodel.efficiency(link)
    share = f", {link.transport} reaches {reach:.0%} of it" if reach < 1 else ""
    return (f"- {name}: alpha {link.alpha_s * 1e6:.1f} us, {8 / link.beta_s_per_byte / 1e9:.3g} Gbit/s{per}{share} "
            f"({link.source or 'no source given'})")


def with_bandwidth(cl, gbit: float):
    return dataclasses.replace(cl, inter=dataclasses.replace(cl.inter, beta_s_per_byte=8 / (gbit * 1e9)))


def plot(cl, step_s: dict, path: Path) -> None:
    """Predicted step time of the main presets (`step_s`: name -> seconds on a cluster) against the bandwidth of
    a node's link (alpha kept)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, step in sorted(step_s.items()):
        ax.plot(BANDWIDTHS_GBIT, [step(with_bandwidth(cl, g)) for g in BANDWIDTHS_GBIT], marker="o",
                label=short(name))
    # a name is shown short: matplotlib lays out every character (a cluster named with 900 KB took minutes)
    ax.axvline(8 / cl.inter.beta_s_per_byte / 1e9, color="grey", linestyle=":", label=f"{short(cl.name)}'s link")
    ax.set(xscale="log", yscale="log", xlabel="inter-node bandwidth per node (Gbit/s)", ylabel="step time (s)",
           title=f"predicted (cost model): {cl.nodes} x {cl.ranks_per_node} ranks")
    ax.legend(fontsize=8)
    fig.tight_layout()
    save(fig, path, 110)
