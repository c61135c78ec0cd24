"""The runs' table: one row per completed run, labelled by the overrides that differ between the runs, with its
speed-up against the baseline row, the step-time split, bytes on the wire, quality and memory; the failed and
unreadable runs as (label, error). Also the backend's variables a run had in force and the rule that set its
learning rate (shown where the runs differ in them), and the cost model's prediction for a run on a calibrated
cluster (ringexp.predict's row, from the cluster files of ringexp.cluster.files). A row's keys are its columns
(HEAD, PREDICTED, ...); `columns(rows)` says which of them a table shows.
"""

import os
from pathlib import Path

from omegaconf.errors import OmegaConfBaseException

from ringexp import backend, predict, records
from ringexp.cluster import files as clusters
from ringexp.config import TrainConfig
from ringexp.errors import ConfigError
from ringexp.verdicts.cells import lr_rule
from ringexp.verdicts.load import YAML_LIMIT, printable_path

HEAD = ["run", "ranks", "samples/s", "p10-p90", "whole run", "speed-up", "step ms", "compute ms", "exposed comm ms",
        "comm share", "overlap", "wire kB/step", "final AUROC", "best AUROC", "final F1", "peak MB"]
PREDICTED = ["predicted comm ms", "predicted step ms", "step error"]  # runs on a calibrated cluster only


def labels(runs) -> list:
    """Each run's overrides that are not shared by every run (what the sweep varied); a run without any (one that
    could not be read) is named by its directory, and takes no part in what the others share."""
    over = [None if "overrides" not in r["summary"] else
            [o for o in r["summary"]["overrides"] if not o.startswith(("name=", "hydra."))] for r in runs]
    known = [set(ov) for ov in over if ov is not None]
    common = set.intersection(*known) if known else set()
    return [printable_path(r["dir"]) if ov is None else " ".join(o for o in ov if o not in common) or "(all the same)"
            for r, ov in zip(runs, over, strict=True)]


def table(runs, baseline: str | None = None, clusters=()):
    """(rows for completed runs, [(label, error)] for the others, index of the baseline row)."""
    done, failed = [], []
    for run, label in zip(runs, labels(runs), strict=True):
        s = run["summary"]
        if s.get("status") == "completed":
            done.append((label, run))
        else:
            failed.append((label or run["dir"], s.get("error") or s.get("status") or "unknown"))
    if not done:
        return [], failed, None
    base = baseline_index(done, baseline)
    base_tp, base_whole = (done[base][1]["summary"]["throughput"].get(k) for k in ("median", "whole_run"))
    rows, clusters = [], calibrations(clusters)
    for label, run in done:
        s = run["summary"]
        tp, t, m = s["throughput"], s.get("time", {}), s.get("memory", {})
        step, comm, median, whole = t.get("step_s"), t.get("comm_s"), tp.get("median"), tp.get("whole_run")
        # speed-up over the whole run where both have it: a configuration that changes phase (PowerSGD's
        # uncompressed first steps) is as fast as its whole run, not its fastest intervals
        ours, theirs = (whole, base_whole) if None not in (whole, base_whole) else (median, base_tp)
        rows.append({
            "run": label, "ranks": s.get("world_size"), "samples/s": median,
            "p10-p90": f"{tp['p10']:.0f}-{tp['p90']:.0f}" if None not in (tp.get("p10"), tp.get("p90")) else None,
            "whole run": whole, "speed-up": ours / theirs if ours is not None and theirs else None,
            "step ms": _ms(step), "compute ms": _ms(t.get("compute_s")),
            "exposed comm ms": _ms(t.get("exposed_comm_s")),
            "comm share": comm / step if comm is not None and step else None, "overlap": t.get("overlap"),
            "wire kB/step": (s.get("wire_bytes_per_rank_per_step") or 0) / 1e3,
            "final AUROC": s["final"].get("auroc_macro"), "best AUROC": s["best"].get("auroc_macro"),
            "final F1": s["final"].get("f1_macro"),
            "peak MB": (m.get("peak_bytes") or s.get("peak_memory_bytes") or 0) / 1e6,
            "verdict": t.get("verdict"), "backend env": backend_env(s), "lr rule": lr_rule(s), "_run": run,
        } | predicted(run, clusters))
    return rows, failed, base


def baseline_index(done, baseline: str | None) -> int:
    """The speed-up baseline among completed (label, run) pairs: the first whose label contains `baseline`
    (ValueError if none does), else the first ddp run, else the first."""
    base = next((i for i, (label, _) in enumerate(done) if baseline and baseline in label), None)
    if base is None and baseline:
        raise ValueError(f"--baseline {baseline}: no completed run's label contains it (labels: "
                         f"{', '.join(label for label, _ in done)})")
    if base is None:
        base = next((i for i, (_, r) in enumerate(done) if r["summary"].get("job_type") == "ddp"), 0)
    return base


def backend_env(summary) -> str:
    """The backend's variables a run had in force (ringexp.backend), as KEY=value ..."""
    return " ".join(f"{k}={v}" for k, v in backend.chosen(summary.get("backend_env")).items()) or "-"


def calibrations(given=()) -> dict:
    """The cluster files runs may have run on (ringexp.cluster.files.calibrations): --cluster files first, then
    conf/cluster/; ValueError naming a --cluster file that cannot be read."""
    try:
        return clusters.calibrations(given)
    except ConfigError as e:
        raise ValueError(f"--cluster {e}") from None


def predicted(run: dict, known: dict) -> dict:
    """The cost model's communication and step time for a run whose cluster has a calibration (ringexp.predict's
    row, from the run's config and its own measured compute): what the model adds is the communication and how
    much of it backward hides. A CPU cluster is this kind of machine: PowerSGD's arithmetic is measured here."""
    s, t = run["summary"], run["summary"].get("time", {})
    cl = clusters.matching(s.get("nodes"), s.get("ranks_per_node"), s.get("link"), known)
    cfg_file = Path(run["dir"]) / "config.yaml"
    if cl is None or not os.path.lexists(cfg_file) or t.get("compute_s") is None:
        return {}
    whole = records.run_rate(s)[1] if s.get("synchronizations") else None  # (its whole run)
    try:
        cfg = records.load_yaml(TrainConfig, cfg_file, YAML_LIMIT)
        compute = predict.of_run(t["compute_s"], t.get("optimizer_s"), cfg.accumulation.steps)
        args = ("", cfg, cl, predict.gradient_shapes(cfg), compute, cl.backend == "gloo")
        got = predict.over_steps(*args, 1, cfg.steps) if whole else predict.row(*args)
    except (OmegaConfBaseException, ConfigError, ValueError, OSError):
        return {}
    step = got["step_s"] + (t.get("data_s") or 0.0) + (t.get("other_s") or 0.0)
    measured = whole or t.get("step_s")
    return {"predicted comm ms": 1e3 * got["comm_s"], "predicted step ms": 1e3 * step,
            "step error": step / measured - 1 if measured else None}



def _ms(seconds):
    return None if seconds is None else 1e3 * seconds


def columns(rows) -> list:
    """HEAD, the backend's variables and the learning rate's rule where the runs differ in them, the predictions
    where there are any, the quality verdict of each run's seed group where the groups were judged."""
    differ = [k for k in ("backend env", "lr rule") if len({r.get(k) for r in rows}) > 1]
    return (HEAD + differ + (PREDICTED if any("predicted step ms" in r for r in rows) else [])
            + (["quality"] if any("quality" in r for r in rows) else []))
