"""What predict writes: the table of presets (plan.md) and the plot of step time against the inter-node link
(plan.png)."""

import dataclasses
from pathlib import Path

from ringexp.cluster import costmodel
from ringexp.plotting import pyplot, save, short

BANDWIDTHS_GBIT = (0.1, 0.25, 0.5, 1, 2.5, 10, 25, 50, 100, 200, 400)


def report(cl, base, rows: list, compute: dict, source: str, best: dict, command: str, budget: float,
           record) -> str:
    ranks, nccl = cl.nodes * cl.ranks_per_node, cl.backend == "nccl"
    lines = [f"# Predicted by ringexp's cost model (not measured): {base.model.name}, batch {base.data.batch_size} "
             f"per rank, on {cl.name}: {cl.nodes} node(s) x {cl.ranks_per_node} = {ranks} ranks", "",
             level_line("intra-node", cl.intra, ""), level_line("inter-node", cl.inter, " per node"),
             f"- compute per rank: forward {compute['forward_s'] * 1e3:.1f} ms, backward "
             f"{compute['backward_s'] * 1e3:.1f} ms, optimizer {compute['optimizer_s'] * 1e3:.1f} ms ({source})",
             "", "| preset | strategy | compression | accum | all-reduce s | exposed s | step s | samples/s | "
             "x ddp | MB sent/rank/step | quality (AUROC vs ddp) |" + (" NCCL's choice (model) |" if nccl else ""),
             "|" + "---|" * (11 + nccl)]
    for r in sorted(rows, key=lambda r: -r["samples_s"]):
        diff = "" if r["auroc_diff"] is None else f" ({r['auroc_diff']:+.3f})"
        lines.append(f"| {r['preset']} | {r['strategy']} | {r['compression']} | {r['accumulation']} | "
                     f"{r['comm_s']:.3f} | {r['exposed_s']:.3f} | {r['step_s']:.3f} | {r['samples_s']:.1f} | "
                     f"{r['speedup']:.2f}x | {r['sent_bytes'] / 1e6:.2f} | {r['quality']}{diff} |"
                     + (f" {r['nccl'] or 'its own p2p ring'} |" if nccl else ""))
    left = [r for r in rows if r["quality"] not in ("exact", "equivalent", "better")]
    lines += ["", f"Recommended (the fastest preset that is exact or equivalent to ddp within quality_budget={budget} "
              f"macro-AUROC): `{command}`",
              f"Quality: verdicts of {record} (measured on its own task: they vary with model and optimizer); "
              "exact: uncompressed gradients at one micro-step, the same arithmetic as ddp"]
    if left:
        named = [f"{r['preset']} ({r['quality']})" for r in left]
        lines.append(f"Left out for quality: {', '.join(named)}")
    return "\n".join(lines) + "\n"


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
