"""The runs compare reads: local run directories (every one below the paths given, in path order) or a W&B group
through its API. A run is {"dir", "summary", "rows"}: its summary checked against the summary's schema
(ringexp.summary) and its metrics.jsonl rows; a run whose files cannot be read, or hold what no run wrote, is
listed as unreadable, the file and why in its summary's place; a run without summary.json (killed before it wrote
one, or still running) as UNFINISHED. Also Hydra's overrides.yaml of a run that failed before it started or
never finished, W&B's flattened keys unflattened, and paths as printable text.
"""

import json
import os
from pathlib import Path

import yaml

from ringexp import records
from ringexp.errors import ConfigError
from ringexp.records import yaml_text
from ringexp.summary import KINDS, described, shape_error

HYDRA_OVERRIDES = Path(".hydra", "overrides.yaml")
CONFIG = "config.yaml"  # with HYDRA_OVERRIDES, what ringexp.train writes into a run directory once it accepts a run
UNFINISHED = {"status": "unfinished",
              "error": f"no {records.SUMMARY}: the run was killed before it finished, or is still running"}
YAML_LIMIT = 64 << 10  # the most a YAML file compare reads may hold: a run's hold a few kilobytes


def load_local(paths) -> list:
    """Every run below `paths`: {"dir", "summary", "rows"}, in path order (a sweep's jobs by number)."""
    runs, seen = [], set()
    for p in map(Path, paths):
        if not p.exists():
            raise FileNotFoundError(f"{p}: no such directory")
        for d in run_dirs(p):
            if d not in seen:
                seen.add(d)
                runs.append(load_run(d))
    return runs


def is_run(d: Path) -> bool:
    """A run directory: it holds summary.json, or what ringexp.train writes before it launches (CONFIG and
    HYDRA_OVERRIDES), so that a run killed before its summary is listed rather than lost."""
    return os.path.lexists(d / records.SUMMARY) or all(os.path.lexists(d / f) for f in (CONFIG, HYDRA_OVERRIDES))


def run_dirs(p: Path) -> list:
    """Run directory `p`, or every one below `p`: jobs by number (2 before 10), then runs by name (a sweep's `0`
    beside a `baseline`: a part is compared as a number only with another number)."""
    if is_run(p):
        return [p]
    found = {f.parent for f in p.rglob(records.SUMMARY)} | {f.parent for f in p.rglob(CONFIG) if is_run(f.parent)}
    return sorted(found, key=lambda d: [(0, int(x), "") if x.isdecimal() else (1, 0, x) for x in d.parts])


def load_run(run_dir: Path) -> dict:
    """{"dir", "summary", "rows"} of one run directory. A file of it that cannot be read, or that holds what no
    run wrote, makes the run unreadable, that file and why in its summary's place: one broken run must not cost
    the report of every other run."""
    path = run_dir / records.SUMMARY  # the file being read: the one to name if it cannot be
    try:
        summary = records.read_summary(run_dir) if os.path.lexists(path) else dict(UNFINISHED)
        if (bad := shape_error(summary)) is not None:
            raise ValueError(bad)
        path = run_dir / records.METRICS
        rows = records.read_rows(run_dir)  # a line cut short by a killed run is dropped, the run kept
        path = run_dir / HYDRA_OVERRIDES
        if "overrides" not in summary and os.path.lexists(path):  # a run that failed before it started
            summary["overrides"] = hydra_overrides(path)
    except (OSError, ValueError) as e:
        return {"dir": str(run_dir), "summary": unreadable(path, e), "rows": []}
    return {"dir": str(run_dir), "summary": summary, "rows": rows}


def unreadable(path, e: Exception) -> dict:
    """The summary of a run listed as unreadable: the file and why (an OSError's own words, without the path;
    records names the line of metrics.jsonl)."""
    why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
    if why.startswith(f"{path}:"):
        why = "line " + why[len(f"{path}:"):]
    elif isinstance(e, json.JSONDecodeError | UnicodeDecodeError):
        why = f"{type(e).__name__}: {why}"
    return {"status": "unreadable", "error": f"{printable_path(path)}: unreadable ({why})"}


def printable_path(path) -> str:
    """A path as text that can be printed and written anywhere: a name's bytes that are not UTF-8 as \\xNN."""
    return str(path).encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def hydra_overrides(path) -> list:
    """.hydra/overrides.yaml: Hydra's list of the command line's overrides; ValueError if it holds anything else."""
    try:
        value = yaml.safe_load(yaml_text(path, records.read_bytes(path, YAML_LIMIT), mapping=False))
    except ConfigError as e:
        raise ValueError(str(e).removeprefix(f"{path}: ")) from None
    if not KINDS["a list of text"](value):
        raise ValueError(f"holds {described(value)}; Hydra writes a list of text")
    return value


def load_wandb(path: str, group: str) -> list:
    """The same records from the W&B API (online): summaries are stored flattened with '.' separators."""
    import wandb  # only for --wandb: importing it costs about a second

    runs = []
    for r in wandb.Api().runs(path, filters={"group": group}, order="+created_at"):
        summary = unflatten({k: v for k, v in r.summary.items() if not k.startswith("_")})
        summary.setdefault("status", "completed" if r.state == "finished" else r.state)
        summary.setdefault("overrides", (r.name or "").split(","))
        if (bad := shape_error(summary)) is not None:
            runs.append({"dir": r.url, "summary": unreadable(r.url, ValueError(bad)), "rows": []})
            continue
        rows = [{"step": h.get("_step"), **h} for h in r.scan_history()]
        runs.append({"dir": r.url, "summary": summary, "rows": rows, "api": r})
    return runs


def unflatten(flat: dict) -> dict:
    """W&B's flattened summary keys ("time.step_s") as the nested mappings summary.json holds."""
    out = {}
    for key, value in flat.items():
        node, parts = out, key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return out
