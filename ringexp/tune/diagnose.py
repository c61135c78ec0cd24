"""Seed article 004's checklist, on the baseline trial's summary: each check with the numbers behind it and what it
says to do. The articles' six: what a step must move against what the link carries, the backend variables in
force, the overlap (under 60%: retune), accumulation, mixed precision, and a quality check for the candidates."""

from ringexp.cluster import costmodel


def checklist(summary: dict, cluster) -> list:
    """[(check, numbers, verdict)] of the baseline's summary on the planner's `cluster`."""
    t, grad, wire = summary["time"], summary["grad_bytes"], summary["wire_bytes_per_rank_per_step"]
    level = cluster.inter if summary["nodes"] > 1 else cluster.intra
    link_s = wire * costmodel.beta(level)
    env = summary.get("backend_env") or {}
    chose = env.get("nccl_chose")
    comm = t["exposed_comm_s"] / t["step_s"] if t["step_s"] else 0.0
    final = summary.get("final") or {}
    return [
        ("gradients against the link",
         f"{grad // 4:,} parameters, {grad / 1e6:.2f} MB of gradients; each rank sends {wire / 1e6:.2f} MB per step, "
         f"{link_s * 1e3:.0f} ms at the {'inter' if summary['nodes'] > 1 else 'intra'}-node link's "
         f"{8 / costmodel.beta(level) / 1e6:.0f} Mbit/s, against a {t['step_s'] * 1e3:.0f} ms step",
         "communication-bound: compress or accumulate" if link_s > 0.5 * t["step_s"] else "compute-bound"),
        ("backend variables",
         (", ".join(f"{k}={v}" for k, v in (env.get("env") or {}).items()) or "none set")
         + (f"; NCCL chose {chose}" if chose else ""),
         f"{summary['backend']} with preset {env.get('preset', 'default')}"),
        ("overlap", f"communication {comm:.0%} of the step exposed, overlap {t['overlap']:.0%}",
         t["verdict"]),  # the run's own verdict (ringexp.timing: under 60% overlap, unless little is exposed)
        ("accumulation", f"{summary['accumulation_steps']} micro-step(s) per optimizer step",
         "on" if summary["accumulation_steps"] > 1 else "off: a candidate"),
        ("mixed precision", f"amp {(summary.get('choices') or {}).get('amp', '?')}",
         "off: a candidate where the device has it" if (summary.get("choices") or {}).get("amp") == "off" else "on"),
        ("quality check", f"validation macro-AUROC {final.get('auroc_macro', float('nan')):.3f}, macro-F1 "
         f"{final.get('f1_macro', float('nan')):.3f} on {summary.get('val_samples', '?')} samples",
         "every candidate is judged on it against the baseline over seeds"),
    ]
