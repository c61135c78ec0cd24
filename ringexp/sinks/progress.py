"""A tqdm bar on rank 0: steps, loss, samples/s. Silent when stderr is not a terminal (logs, CI)."""

import sys

from tqdm import tqdm


class ProgressSink:
    best_effort = True  # cosmetic

    def __init__(self, total_steps: int, start: int = 0):
        self.bar = tqdm(total=total_steps, initial=start, unit="step", dynamic_ncols=True,
                        disable=not sys.stderr.isatty())

    def log(self, row: dict, step: int) -> None:
        if self.bar.disable:
            return
        self.bar.n = step
        post = {"loss": f"{row['train/loss']:.4f}", "samples/s": f"{row['train/samples_per_s']:.0f}"}
        if "val/auroc_macro" in row:
            post["auroc"] = f"{row['val/auroc_macro']:.3f}"
        self.bar.set_postfix(post, refresh=False)
        self.bar.refresh() if step == self.bar.total else self.bar.update(0)

    def summary(self, summary: dict) -> None:
        pass

    def close(self, ok: bool = True) -> None:
        self.bar.close()
