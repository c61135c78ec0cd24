"""metrics.jsonl: one JSON object per logged row, flushed as written, so a crash loses nothing logged."""

import json
from pathlib import Path


class JsonlSink:
    def __init__(self, run_dir):
        self.f = open(Path(run_dir) / "metrics.jsonl", "a", buffering=1)

    def log(self, row: dict, step: int) -> None:
        self.f.write(json.dumps({"step": step, **row}) + "\n")

    def summary(self, summary: dict) -> None:
        pass

    def close(self, ok: bool = True) -> None:
        self.f.close()
