"""Print a Markdown table of the summary.json files under the given directories (a stopgap until
`python -m ringexp.compare` lands): one row per run, sorted by the order found.

    python scripts/summaries_table.py outputs/multirun/compression-table
    python scripts/summaries_table.py --time outputs/multirun/time-table     # where the step time went
"""

import json
import sys
from pathlib import Path


def row(s: dict) -> list:
    over = dict(o.split("=", 1) for o in s.get("overrides", []) if "=" in o)
    c = s.get("compression", {})
    ef = over.get("compression.error_feedback", "default")
    dgc_keys = ("compression.warmup_steps", "compression.momentum_correction")
    dgc = ", ".join(k.split(".")[1] + "=" + over[k] for k in dgc_keys if k in over) or "-"
    return [c.get("name", "none"), over.get("compression.ratio", "-"), ef, s["choices"].get("optim", "?"), dgc,
            f"{c.get('ratio_vs_fp32_allreduce') or 0:.4f}", f"{s['final']['auroc_macro']:.3f}",
            f"{s['final']['f1_macro']:.3f}", f"{s['throughput']['median']:.0f}"]


def time_row(s: dict) -> list:
    over = [o for o in s.get("overrides", []) if not o.startswith(("name=", "steps=", "eval_every="))]
    t, m = s["time"], s["memory"]

    def ms(key):
        return "-" if t.get(key) is None else f"{1e3 * t[key]:.1f}"
    return [" ".join(over), str(s["world_size"]), ms("step_s"), ms("compute_s"), ms("comm_s"), ms("exposed_comm_s"),
            "-" if t.get("overlap") is None else f"{t['overlap']:.0%}", ms("data_s"), ms("optimizer_s"),
            ms("other_s"), f"{m['state_bytes'] / 1e3:.0f}", f"{s['wire_bytes_per_rank_per_step'] / 1e3:.0f}",
            f"{s['throughput']['median']:.0f}"]


TIME_HEAD = ["run", "ranks", "step ms", "compute", "comm", "exposed", "overlap", "data", "optimizer", "other",
             "state kB/rank", "wire kB/step", "samples/s"]


def main(paths):
    if paths and paths[0] == "--time":
        return print_table(TIME_HEAD, paths[1:], time_row)
    return print_table(["compressor", "ratio", "error feedback", "optimizer", "DGC", "wire / fp32", "macro-AUROC",
                        "macro-F1", "samples/s"], paths, row)


def print_table(head, paths, make_row):
    rows = []
    for p in paths:
        for f in sorted(Path(p).rglob("summary.json")):
            s = json.loads(f.read_text())
            if s.get("status") == "completed":
                rows.append(make_row(s))
            else:
                print(f"<!-- {f.parent}: {s.get('status')}: {s.get('error')} -->")
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for r in rows:
        print("| " + " | ".join(r) + " |")


if __name__ == "__main__":
    main(sys.argv[1:] or ["outputs/multirun"])
