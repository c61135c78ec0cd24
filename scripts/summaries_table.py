"""Print a Markdown table of the summary.json files under the given directories (a stopgap until
`python -m ringexp.compare` lands): one row per run, sorted by the order found.

    python scripts/summaries_table.py outputs/multirun/compression-table
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


def main(paths):
    rows = []
    for p in paths:
        for f in sorted(Path(p).rglob("summary.json")):
            s = json.loads(f.read_text())
            if s.get("status") == "completed":
                rows.append(row(s))
            else:
                print(f"<!-- {f.parent}: {s.get('status')}: {s.get('error')} -->")
    head = ["compressor", "ratio", "error feedback", "optimizer", "DGC", "wire / fp32", "macro-AUROC", "macro-F1",
            "samples/s"]
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for r in rows:
        print("| " + " | ".join(r) + " |")


if __name__ == "__main__":
    main(sys.argv[1:] or ["outputs/multirun"])
