"""Weights & Biases, offline by default. Best effort: any W&B failure prints one warning and training
carries on, because metrics.jsonl and summary.json already hold every number.

`wandb.log` costs about a millisecond of Python per call, on rank 0 only, and every other rank waits for
rank 0 at the next gradient all-reduce; so rows go through a queue to a thread that logs them while the
training thread is back in compute (which releases the GIL).
"""

import logging
import queue
import threading

from ringexp.errors import print_warning


def warn(message: str) -> None:
    print_warning(message)
    logging.getLogger("ringexp").warning(message)


def flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def init(cfg: dict, run_dir, meta, mode: str, run_id=None):
    """A W&B run for `cfg` (the run's config as plain values, its `logger` group among them)."""
    import wandb  # only where W&B is on: importing it costs about a second

    run = wandb.init(
        project=cfg["logger"]["project"], entity=cfg["logger"]["entity"], dir=str(run_dir),
        mode=mode, group=meta["group"], job_type=meta["job_type"], name=meta["name"],
        id=run_id, resume="allow" if run_id else None,
        config={**flatten(cfg), **{f"choice.{k}": v for k, v in meta["choices"].items()},
                **{f"backend_env.{k}": v for k, v in (meta.get("backend_env") or {}).get("env", {}).items()}},
        settings=wandb.Settings(console="off", silent=True, init_timeout=cfg["logger"]["init_timeout_s"]),
    )
    run.define_metric("val/auroc_macro", summary="max")
    run.define_metric("val/f1_macro", summary="max")
    run.define_metric("train/loss", summary="min")
    return run


def teardown(exit_code: int) -> None:
    import wandb

    wandb.teardown(exit_code)


class WandbSink:
    best_effort = True  # metrics.jsonl and summary.json already hold every number

    def __init__(self, run):
        self.run = run
        self.rows = queue.Queue()
        self.thread = threading.Thread(target=self._drain, name="ringexp-wandb", daemon=True)
        self.thread.start()

    def _drain(self) -> None:
        while True:
            item = self.rows.get()
            try:
                if item is None:
                    return
                self._safely(self.run.log if self.run else None, *item)
            except BaseException:  # never leave a queued row unfinished: a flush would wait for it forever
                self.run = None
            finally:
                self.rows.task_done()

    @classmethod
    def open(cls, cfg: dict, run_dir, meta, run_id=None):
        """A W&B run (continuing `run_id` when resuming). Online but W&B cannot be reached (no network, a bad key):
        one warning, then an offline run in the run directory, to `wandb sync` later. None if even that fails."""
        mode = str(cfg["logger"]["mode"])
        if mode == "disabled":
            return None
        try:
            return cls(init(cfg, run_dir, meta, mode, run_id))
        except Exception as e:  # network, key, disk: never worth losing the run over
            if mode == "online":
                first = str(e).splitlines()[0] if str(e) else ""
                warn(f"W&B online failed, logging offline to {run_dir}/wandb instead (upload later with "
                     f"scripts/sync_wandb.sh): {type(e).__name__}: {first}")
                try:
                    return cls(init(cfg, run_dir, meta, "offline", run_id))
                except Exception as e2:
                    e = e2
            warn(f"W&B disabled for this run ({type(e).__name__}: {e}); records stay in {run_dir}")
            return None

    def _safely(self, fn, *args):
        if self.run is None:
            return
        try:
            fn(*args)
        except Exception as e:
            warn(f"W&B stopped logging ({type(e).__name__}: {e}); metrics.jsonl keeps every row")
            self.run = None

    def log(self, row: dict, step: int) -> None:
        self.rows.put((row, step))

    def summary(self, summary: dict) -> None:
        self._flush()
        if self.run is not None:
            self._safely(self.run.summary.update, flatten(summary))

    def artifact(self, path, kind: str) -> None:
        """Attach a file (a profiler trace) to the run as an artifact of type `kind`."""
        self._flush()
        if self.run is not None:
            self._safely(self.run.log_artifact, str(path), f"{kind}-{self.run.id}", kind)

    def close(self, ok: bool = True) -> None:
        if not self.thread.is_alive():  # closed already
            return
        self._flush()
        if self.run is not None:
            self._safely(self.run.finish, 0 if ok else 1)
            # finish() can return before W&B's service has written the last records of the .wandb file; the
            # service is waited for only at exit, and the atexit hook that would do it never runs in a
            # multiprocessing worker (rank 0 is one).
            self._safely(teardown, 0 if ok else 1)
        self.rows.put(None)  # the drain thread ends
        self.thread.join()

    def _flush(self) -> None:
        """Wait until every row queued so far is logged; the drain thread stays, for rows logged later."""
        if self.thread.is_alive():
            self.rows.join()
