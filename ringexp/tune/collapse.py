"""Collapse: a run of a candidate that fell apart, which a paired interval over a few seeds cannot be trusted to
see. A failure that strikes 1 run in N (a compressor's or an averaging strategy's occasional divergence) is absent
from k runs with chance (1 - 1/N)^k: 0.34 for 1 in 7 over 7 seeds. So every run of a candidate is evidence, its
halving rungs' trials as well as its verification seeds, each checked against the baseline's runs at the same
number of training samples (a candidate with accumulation runs fewer steps of more samples; a trial, whose
schedule ends within its few steps, against the baseline's diagnose run at its samples or optimizer steps,
whichever came first: verify.FullRuns.baseline_at):

- a final metric of tune.metrics non-finite, or more than COLLAPSE times its margin below the lowest baseline run's
  there (the baseline's last evaluation at or before that many samples: no higher earlier, so a slow start is not
  taken for a collapse);
- a non-finite loss (a divergence).

One collapsed run keeps the candidate out of the choice, whatever its verdict; the playbook names the run.

    why(run, base, margins, metrics)   why `run` ({metric: value, "loss": ...}) collapsed against `base` (a list of
                                       the baseline's {metric: value} at its samples), or None
    unseen(k, n)                       the chance that a failure striking 1 run in `n` is in none of `k` runs
"""

import math

COLLAPSE = 5  # margins: 0.1 macro-AUROC at the default margin, against a paired seed spread of 0.008-0.015
KEYS = {"final AUROC": "auroc", "best AUROC": "best_auroc", "final F1": "f1", "best F1": "best_f1"}  # in a record


def why(run: dict, base: list, margins: dict, metrics) -> str | None:
    """Why `run` collapsed (one line), or None; `run` and each of `base` map tune.metrics' names to values."""
    loss = run.get("loss")
    if loss is not None and not math.isfinite(loss):
        return f"its loss is {loss} (a divergence)"
    for m in metrics:
        v = run.get(m)
        if v is None:
            continue  # (a record from before the metric was kept: nothing to check it on)
        if not math.isfinite(v):
            return f"its {m} is {v}"
        lowest = min((b[m] for b in base if b.get(m) is not None and math.isfinite(b[m])), default=None)
        if lowest is not None and v < lowest - COLLAPSE * margins[m]:
            return (f"its {m} {v:.3f} is {lowest - v:.3f} below the baseline's lowest at its samples ({lowest:.3f}; "
                    f"a collapse: more than {COLLAPSE} x the margin {margins[m]:g})")
    return None


def unseen(k: int, n: int) -> float:
    return (1 - 1 / n) ** k


def values(rec: dict) -> dict:
    """{metric: value, "loss": ...} of a trial record (trials.outcome's)."""
    return {m: rec.get(k) for m, k in KEYS.items()} | {"loss": rec.get("loss")}


def at_samples(rows: list, samples: int, per_step: int) -> dict | None:
    """{metric: value} of a run's last evaluation at or before `samples` training samples among its metrics.jsonl
    `rows`, `per_step` samples an optimizer step (the best ones over the evaluations up to it), or None before its
    first. Samples, not steps: a candidate with accumulation runs fewer steps of more samples each."""
    evals = [r for r in rows if r["step"] * per_step <= samples and r.get("val/auroc_macro") is not None]
    if not evals:
        return None
    last, best = evals[-1], max(evals, key=lambda r: r["val/auroc_macro"])
    return {"final AUROC": last["val/auroc_macro"], "final F1": last.get("val/f1_macro"),
            "best AUROC": best["val/auroc_macro"], "best F1": best.get("val/f1_macro")}
