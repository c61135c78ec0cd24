"""metrics.jsonl: one JSON object per logged row, flushed as written, so a crash loses nothing logged. Opened with
records.open_append: a symlink planted at the name is an error naming it, never written through (a resumption into
a run directory with one is refused before any worker starts: checkpoint.planted)."""

import json
from pathlib import Path

from ringexp.records import METRICS, open_append


class JsonlSink:
    best_effort = False  # the record every table is made from: a row that cannot be written stops the run

    def __init__(self, run_dir):
        self.path = Path(run_dir) / METRICS
        self.f = open_append(self.path, buffering=1)

    def log(self, row: dict, step: int) -> None:
        try:
            self.f.write(json.dumps({"step": step, **row}) + "\n")
        except (OSError, ValueError) as e:  # a full disk, a closed file
            raise RuntimeError(f"{self.path}: cannot write the row of step {step} ({e}); the run stops here, and "
                               "resume=auto continues from its last checkpoint") from e

    def summary(self, summary: dict) -> None:
        pass

    def close(self, ok: bool = True) -> None:
        self.f.close()
