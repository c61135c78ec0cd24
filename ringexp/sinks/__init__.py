"""Where rank 0's records go: metrics.jsonl (never lost), W&B (best effort) and a progress bar."""

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


def open_sinks(cfg, run_dir, meta, total_steps: int) -> Sinks:
    return Sinks([JsonlSink(run_dir), WandbSink.open(cfg, run_dir, meta), ProgressSink(total_steps)])


__all__ = ["Sinks", "open_sinks"]
