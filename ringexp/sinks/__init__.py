"""Where rank 0's records go: metrics.jsonl (never lost), W&B (best effort) and a progress bar."""

import json
import os
from pathlib import Path

from ringexp.sinks.jsonl import JsonlSink
from ringexp.sinks.progress import ProgressSink
from ringexp.sinks.wandb import WandbSink


class Sinks:
    """Fan one row out to every sink; a sink that fails warns and drops out, the others carry on."""

    def __init__(self, sinks):
        self.sinks = [s for s in sinks if s is not None]

    def log(self, row: dict, step: int) -> None:
        for s in self.sinks:
            s.log(row, step)

    def summary(self, summary: dict) -> None:
        for s in self.sinks:
            s.summary(summary)

    def artifact(self, path, kind: str) -> None:
        for s in self.sinks:
            if hasattr(s, "artifact"):
                s.artifact(path, kind)

    def close(self, ok: bool = True) -> None:
        for s in self.sinks:
            s.close(ok)

    @property
    def wandb_id(self):
        """The W&B run's id (a resumed run continues it), or None without W&B."""
        return next((s.run.id for s in self.sinks if isinstance(s, WandbSink) and s.run is not None), None)


def open_sinks(cfg, run_dir, meta, total_steps: int, start: int = 0, wandb_id=None) -> Sinks:
    """Rank 0's sinks; a run resumed at step `start` appends to metrics.jsonl and continues W&B run `wandb_id`."""
    return Sinks([JsonlSink(run_dir), WandbSink.open(cfg, run_dir, meta, wandb_id),
                  ProgressSink(total_steps, start)])


def read_rows(run_dir) -> list:
    """metrics.jsonl as a list of rows ([] when there is none yet); a line cut short by a kill is dropped."""
    path = Path(run_dir) / "metrics.jsonl"
    rows = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows


def rewind(run_dir, source, step: int) -> list:
    """metrics.jsonl of `run_dir` made the rows of `source` (the run a checkpoint came from, often the same) up to
    `step`, rewritten atomically; a resumed run then appends without duplicate steps. Returns those rows."""
    rows = [r for r in read_rows(source) if r["step"] <= step]
    tmp = Path(run_dir) / "metrics.jsonl.tmp"
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    os.replace(tmp, Path(run_dir) / "metrics.jsonl")
    return rows


__all__ = ["Sinks", "open_sinks", "read_rows", "rewind"]
