"""Where rank 0's records go: metrics.jsonl (the record), W&B and a progress bar (both best effort).

A sink has `log(row, step)`, `summary(summary)`, `close(ok)` and `best_effort`. metrics.jsonl is what compare,
resume and every table read: if a row cannot be written there, the run stops with one line naming the file. A
best-effort sink that fails warns once and drops out; training and the other sinks carry on.
"""

from ringexp.errors import print_warning
from ringexp.sinks.jsonl import JsonlSink
from ringexp.sinks.progress import ProgressSink
from ringexp.sinks.wandb import WandbSink


class Sinks:
    def __init__(self, sinks):
        self.sinks = [s for s in sinks if s is not None]

    def _each(self, method: str, *args) -> None:
        for s in list(self.sinks):
            try:
                getattr(s, method)(*args)
            except Exception as e:
                if not s.best_effort:
                    raise
                print_warning(f"{type(s).__name__} stopped ({type(e).__name__}: {e}); metrics.jsonl keeps every row")
                self.sinks.remove(s)

    def log(self, row: dict, step: int) -> None:
        self._each("log", row, step)

    def summary(self, summary: dict) -> None:
        self._each("summary", summary)

    def artifact(self, path, kind: str) -> None:
        """Attach a file (a profiler trace) where a sink can hold one (W&B)."""
        for s in self.sinks:
            if isinstance(s, WandbSink):
                s.artifact(path, kind)

    def close(self, ok: bool = True) -> None:
        self._each("close", ok)

    @property
    def wandb_id(self):
        """The W&B run's id (a resumed run continues it), or None without W&B."""
        return next((s.run.id for s in self.sinks if isinstance(s, WandbSink) and s.run is not None), None)


def open_sinks(cfg, run_dir, meta, total_steps: int, start: int = 0, wandb_id=None) -> Sinks:
    """Rank 0's sinks; a run resumed at step `start` appends to metrics.jsonl and continues W&B run `wandb_id`."""
    return Sinks([JsonlSink(run_dir), WandbSink.open(cfg, run_dir, meta, wandb_id), ProgressSink(total_steps, start)])


__all__ = ["Sinks", "open_sinks", "JsonlSink", "ProgressSink", "WandbSink"]
