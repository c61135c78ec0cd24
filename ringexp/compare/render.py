"""The report's files and terminal table from the runs' table (ringexp.compare.table): the markdown of compare.md,
the aligned text printed, compare.csv, and the plots (throughput.png, auroc.png, comm_share.png).
"""

import csv
import io
from pathlib import Path

from ringexp import records
from ringexp.compare.table import columns
from ringexp.plotting import pyplot, save, short
from ringexp.summary import KINDS
from ringexp.verdicts.cells import aligned, fmt


def markdown(rows, failed, base) -> str:
    head = columns(rows)
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(fmt(k, r.get(k)) + (" (baseline)" if k == "run" and i == base else "") for k in head)
            + " |" for i, r in enumerate(rows)]
    verdicts = [f"- `{r['run']}`: {r['verdict']}" for r in rows if r.get("verdict")]
    if verdicts:  # what each run's own record concluded about its step time (ringexp.timing.verdict)
        out += ["", "Verdicts:", ""] + verdicts
    if failed:
        out += ["", "Failed runs:", ""] + [f"- `{label}`: {error.splitlines()[0] if error else ''}"
                                           for label, error in failed]
    return "\n".join(out) + "\n"


def text(rows, failed, base) -> str:
    head = columns(rows)
    cells = [head] + [[fmt(k, r.get(k)) + ("*" if k == "run" and i == base else "") for k in head]
                      for i, r in enumerate(rows)]
    lines = aligned(cells)
    lines.append("* baseline of the speed-up column")
    lines += [f"FAILED {label}: {error.splitlines()[0] if error else ''}" for label, error in failed]
    return "\n".join(lines) + "\n"


def write_csv(rows, failed, path: Path) -> None:
    buf = io.StringIO()
    w = csv.writer(buf)
    head = columns(rows)
    w.writerow(head + ["status", "error"])
    w.writerows([[r.get(k) for k in head] + ["completed", ""] for r in rows])
    w.writerows([[label] + [""] * (len(head) - 1) + ["failed", error] for label, error in failed])
    records.write_file(path, buf.getvalue())


def plots(runs, rows, out: Path) -> None:
    plt = pyplot()
    done = [r for r in runs if r["summary"].get("status") == "completed"]
    names = [short(r["run"]) for r in rows]  # a label is as long as the overrides: matplotlib lays out each character
    ticks = range(len(rows))
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(rows)), 4))
    tps = [r["summary"]["throughput"] for r in done]
    medians = [t.get("median") or 0 for t in tps]
    # p10 <= median <= p90 in every summary ringexp writes; a bar is drawn whatever another one holds
    ax.bar(ticks, medians, color="tab:blue", capsize=4,
           yerr=[[max(0, m - (t.get("p10") or m)) for m, t in zip(medians, tps, strict=True)],
                 [max(0, (t.get("p90") or m) - m) for m, t in zip(medians, tps, strict=True)]])
    ax.set_xticks(list(ticks), names, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("samples/s (median, p10-p90)")
    ax.set_title("Throughput")
    fig.tight_layout()
    save(fig, out / "throughput.png", 100)

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    for run, name in zip(done, names, strict=True):
        # rows hold whatever a run logged (read_rows checks `step` only): only numbers are plotted
        vals = [r for r in run["rows"] if all(KINDS["a number"](r.get(k)) for k in ("step", "val/auroc_macro"))]
        a1.plot([r["step"] for r in vals], [r["val/auroc_macro"] for r in vals], marker="o", label=name)
        if vals and all(KINDS["a number"](r.get("train/elapsed_s")) for r in vals):
            a2.plot([r["train/elapsed_s"] for r in vals], [r["val/auroc_macro"] for r in vals], marker="o", label=name)
    a1.set(xlabel="step", ylabel="validation macro-AUROC", title="AUROC against step")
    a2.set(xlabel="training time (s)", ylabel="validation macro-AUROC", title="AUROC against wall-clock")
    a1.legend(fontsize=7)
    fig.tight_layout()
    save(fig, out / "auroc.png", 100)

    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(rows)), 4))
    share = [r["comm share"] or 0 for r in rows]
    exposed = [(r["exposed comm ms"] or 0) / r["step ms"] if r["step ms"] else 0 for r in rows]
    ax.bar(ticks, exposed, color="tab:red", label="exposed")
    ax.bar(ticks, [max(0, s - e) for s, e in zip(share, exposed, strict=True)], bottom=exposed, color="tab:orange",
           label="hidden behind compute")
    ax.set_xticks(list(ticks), names, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("communication / step time")
    ax.set_title("Communication share")
    ax.legend(fontsize=8)
    fig.tight_layout()
    save(fig, out / "comm_share.png", 100)
