"""What a run records: one row per logged step, the evaluations, and the summary at the end.

Every rank takes part in the recorder's all-reduces (the loss and data wait of a logged step, as means over
ranks; the busiest rank's memory at the end); rank 0 alone writes, through its sinks. A step that logs nothing
costs the recorder nothing but two clock marks: no reduction, no device sync, no row.
"""

import json
import logging
import time
from pathlib import Path

import torch
import torch.distributed as dist

from ringexp import comm, quality, records, timing
from ringexp import dist as rdist
from ringexp.config import hidden, plain
from ringexp.metrics import median, peak_memory_bytes, spread
from ringexp.sinks import open_sinks
from ringexp.versions import versions

log = logging.getLogger("ringexp")
METRIC_KEYS = ("auroc_macro", "auroc_micro", "f1_macro", "f1_micro", "loss")


class Recorder:
    def __init__(self, cfg, env, run_dir, meta: dict, strategy, grad_bytes: int, wire: int, t_start: float):
        """`t_start`: when the run (set-up included) began, on the host clock (time.perf_counter)."""
        self.cfg, self.env, self.run_dir, self.meta, self.strategy = cfg, env, Path(run_dir), meta, strategy
        # The step's clock (CUDA events on GPUs) and the strategy's collectives' timer (strategy.wrap reports to it)
        self.clock = timing.Clock(env.device)
        self.comm_timer = timing.CommTimer(self.clock, strategy.exposure)
        self.grad_bytes, self.wire = grad_bytes, wire
        dense = comm.wire_bytes("builtin", grad_bytes, env.world_size)  # float32 all-reduce of the same gradients
        self.wire_ratio = wire / dense if dense else None
        self.global_batch = cfg.data.batch_size * cfg.accumulation.steps * env.world_size
        pr = cfg.profile
        self.profiled = range(pr.start_step, pr.start_step + pr.steps) if pr.enabled else range(0)
        # intervals: the steps between two rows, {"first", "last", "step_s" (their mean time), "own" (the logged
        # step's time) and "parts" (its split)}; the interval in progress: seconds and steps so far
        self.history, self.evals, self.intervals = [], [], []
        self.interval_s, self.interval_n = 0.0, 0
        # train_s: seconds of training steps so far (evaluations and checkpoints left out), what time to target counts
        self.skipped_bad, self.elapsed0, self.train_s, self.sinks = 0, 0.0, 0.0, None
        self.best_scores = None  # the best evaluation's scores (probabilities and step) kept in val_scores.pt
        # each step's end: on the host (intervals) and on the step's clock (the logged step's own time)
        self.t_start, self.t_prev, self.t_end = t_start, time.perf_counter(), time.perf_counter()
        self.m_prev = self.m_end = self.clock.now()

    def open(self, start: int, source, wandb_id=None) -> None:
        """Rank 0: open the sinks; a resumed run (`source`: the run directory its checkpoint came from) first takes
        back the rows up to its checkpoint's step `start` and drops those of the attempt it redoes."""
        if not self.env.is_main:
            return
        if source is not None:
            rows = records.rewind(self.run_dir, source, start)
            self.resume_from(rows)
        self.sinks = open_sinks(self.hidden(plain(self.cfg)), self.run_dir, self.hidden(self.meta), self.cfg.steps,
                                start, wandb_id)

    def resume_from(self, rows: list) -> None:
        """What the summary needs of the steps before the checkpoint, from their metrics.jsonl rows."""
        self.history = [r["train/loss"] for r in rows if "train/loss" in r]
        self.evals = [{"step": r["step"]} | {k[4:]: v for k, v in r.items() if k.startswith("val/")}
                      | {"train_s": r.get("train/train_s"), "elapsed_s": r.get("train/elapsed_s")}
                      for r in rows if "val/auroc_macro" in r]
        first = 1
        for r in rows:
            if "train/step_time_s" in r:
                parts = {name: r.get(f"time/{name}") for name in timing.PARTS}
                self.intervals.append({"first": first, "last": r["step"], "step_s": r["train/step_time_s"],
                                       "own": r.get("time/step_s", r["train/step_time_s"]), "parts": parts})
                first = r["step"] + 1
        self.elapsed0 = rows[-1].get("train/elapsed_s", 0.0) if rows else 0.0
        self.train_s = (rows[-1].get("train/train_s") or 0.0) if rows else 0.0

    def hidden(self, value):
        """`value` with every credential the config read from the environment written as its interpolation
        (config.hidden): what the run's records get."""
        return hidden(value, self.meta.get("credentials"))

    def logs(self, step: int, due: bool = False) -> bool:
        """Every logger.log_every steps, and every step that is `due` to evaluate or checkpoint (the last among
        them): no interval's time then holds an evaluation, and a resumed run's rows continue from its checkpoint's."""
        return due or step % self.cfg.logger.log_every == 0

    def begin_step(self):
        """A step starts: its collectives are timed afresh; returns the clock's mark of its start."""
        self.comm_timer.reset()
        return self.clock.now()

    def record(self, step: int, loss, lr: float, marks: tuple, data_s: float, skipped: int, skipped_steps,
               due: bool = False):
        """The row of a logged step, None for any other (collective: every rank calls it on every step). `marks`
        are the clock's marks at the step's start, after backward and after the optimizer; `skipped` counts the
        samples this rank's loader dropped as unreadable since the run began; `due`: the step evaluates or
        checkpoints.

        Step time is end to end (data, compute, communication, logging), evaluation and checkpoints left out; a
        row gives the mean over the steps since the previous row (measured on the host once the device is done:
        right on GPUs too) and the split of its own step."""
        if not self.logs(step, due):
            self.add_step()
            return None
        stats = torch.tensor([data_s, skipped], device=loss.device, dtype=torch.float64)
        stats = torch.cat([loss.double().reshape(1), stats])
        if self.env.world_size > 1:
            dist.all_reduce(stats)
        loss_sum, wait_sum, skipped_bad = stats.tolist()  # (the one host sync of a logged step)
        n = self.env.world_size
        self.add_step()
        first, step_s, steps = step - self.interval_n + 1, self.interval_s / self.interval_n, self.interval_n
        self.interval_s, self.interval_n = 0.0, 0
        self.skipped_bad = int(skipped_bad)
        self.history.append(loss_sum / n)
        self.clock.sync()
        t0, t1, t2 = marks
        own = self.clock.since(self.m_prev, self.m_end)  # this step alone, from the previous step's end
        comm = self.comm_timer.measure(t0, t1)
        # a periodic averaging (local_sgd, diloco) after the optimizer: this step's own taken out, the interval's
        # spread over its steps instead (timing.CommTimer.keep)
        mine, spread = comm["after_s"], self.comm_timer.taken_between() / steps
        comm |= {"comm_s": comm["comm_s"] - mine + spread, "after_s": spread}
        own += spread - mine  # (the step's time as its parts count it: what they are a share of)
        split = timing.breakdown(own, data_s, self.clock.since(t0, t1), self.clock.since(t1, t2) - mine, comm)
        self.intervals.append({"first": first, "last": step, "step_s": step_s, "own": own, "parts": split})
        return {"train/loss": loss_sum / n, "train/lr": lr, "train/data_wait_s": wait_sum / n,
                "train/peak_memory_bytes": peak_memory_bytes(self.env.device), "comm/wire_bytes_per_rank": self.wire,
                "comm/compression_ratio": self.wire_ratio, "train/skipped_steps": int(skipped_steps),
                "data/skipped_bad": self.skipped_bad, "train/step_time_s": step_s,
                "train/samples_per_s": self.global_batch / step_s,
                "train/elapsed_s": self.elapsed(), "train/train_s": self.train_s,
                "time/step_s": own} | {f"time/{k}": v for k, v in split.items()}

    def add_step(self) -> None:
        """Count the step that ends now into the interval in progress."""
        self.t_end, self.m_end = time.perf_counter(), self.clock.now()
        self.interval_s += self.t_end - self.t_prev
        self.train_s += self.t_end - self.t_prev
        self.interval_n += 1

    def elapsed(self) -> float:
        """Wall seconds from the run's start (set-up, evaluations and earlier attempts included) to the last step."""
        return self.elapsed0 + self.t_end - self.t_start

    def evaluation(self, step: int, val: dict, scores: tuple) -> dict:
        """An evaluation after step `step`: its row entries; rank 0 keeps its scores (probabilities, labels) as the
        final ones, and as the best ones too when its macro-AUROC is the run's best so far."""
        best = not self.evals or val["auroc_macro"] > max(e["auroc_macro"] for e in self.evals)
        self.evals.append({"step": step, **val, "train_s": self.train_s, "elapsed_s": self.elapsed()})
        if self.env.is_main:
            self.keep_scores(step, scores, best)
        return {f"val/{k}": v for k, v in val.items()}

    def keep_scores(self, step: int, scores: tuple, best: bool) -> None:
        """val_scores.pt with this evaluation as the final one; the best held in memory, read back from the file
        once where a resumed run's best came before its checkpoint."""
        probs, labels = scores
        ours = {"step": step, "probs": probs}
        if best or self.best_scores is None:
            kept = None if best else records.read_scores(self.run_dir)
            self.best_scores = ours if kept is None else kept["best"]
        records.write_scores(self.run_dir, {"labels": labels, "final": ours, "best": self.best_scores})

    def write(self, row: dict, step: int) -> None:
        if self.sinks:
            self.sinks.log(row, step)

    def step_done(self, excluded: bool) -> None:
        """The next step's time starts now; after evaluation or a checkpoint (`excluded`) it starts afresh."""
        if excluded:
            self.t_prev, self.m_prev = time.perf_counter(), self.clock.now()
        else:
            self.t_prev, self.m_prev = self.t_end, self.m_end

    def close(self, ok: bool) -> None:
        if self.sinks:
            self.sinks.close(ok=ok)

    def finish(self, state: dict, extra: dict, profile=None):
        """The summary (rank 0; None elsewhere), written to summary.json and the sinks (collective: the busiest
        rank's memory is agreed on by all). `state`: this rank's bytes of parameters, gradients, optimizer state."""
        memory = torch.tensor([peak_memory_bytes(self.env.device), *state.values()], device=self.env.device,
                              dtype=torch.float64)
        if self.env.world_size > 1:
            dist.all_reduce(memory, op=dist.ReduceOp.MAX)
        if not self.env.is_main:
            return None
        memory = dict(zip(["peak_bytes", *state], (int(v) for v in memory.tolist()), strict=True))
        summary = self.hidden(self.summary(memory) | extra)
        if profile:
            summary["profile"] = profile
            self.sinks.artifact(self.run_dir / profile["trace"], "profile")
        log.info("time: %s", summary["time"]["verdict"])
        records.write_summary(self.run_dir, summary)
        self.sinks.summary(summary)
        self.close(ok=True)
        log.info("done: %s", json.dumps(summary["throughput"]))
        return summary

    def steady(self) -> tuple:
        """(the intervals the statistics are taken over, how many steps were left out as warm-up): intervals that
        begin after throughput_warmup (all, if none does), the profiler's (and its overhead's) left out."""
        usable = [iv for iv in self.intervals if not self.profiled or iv["last"] < self.profiled.start
                  or iv["first"] > self.profiled[-1]]
        steady = [iv for iv in usable if iv["first"] > self.cfg.throughput_warmup] or usable
        return steady, sum(iv["last"] - iv["first"] + 1 for iv in usable if iv not in steady)

    def summary(self, memory: dict) -> dict:
        """summary.json (W&B gets the same): its sections in order, each from one part below. What readers rely on
        (its schema, ringexp.summary) and the keys of a real run's summary (tests/test_records.py) stay fixed."""
        steady, warmup = self.steady()
        return (self.identity() | self.placement() | self.workload()
                | speed(steady, warmup, self.global_batch, self.cfg.steps * self.global_batch, self.train_s)
                | outcome(self.history, self.evals) | {"targets": reached(self.evals, self.cfg.eval.targets,
                                                                       self.global_batch)}
                # medians over the steady steps; ringexp.timing says how each part is measured
                | {"time": time_split(steady, self.strategy.tips(self.cfg))}
                | {"peak_memory_bytes": memory["peak_bytes"], "memory": memory} | self.wire_section()
                | {"wall_time_s": self.elapsed0 + time.perf_counter() - self.t_start, "versions": versions()})

    def identity(self) -> dict:
        """Which run: its directory, its W&B name, group and job type, its strategy and the command's choices."""
        meta = self.meta
        return {"status": "completed", "run_dir": str(self.run_dir), "name": meta["name"], "group": meta["group"],
                "job_type": meta["job_type"], "strategy": str(self.cfg.parallel.strategy), "choices": meta["choices"],
                "overrides": meta["overrides"]}

    def placement(self) -> dict:
        """Where it ran: ranks, device, backend, nodes and link, and the backend's variables in force in the workers
        (ringexp.backend) with where each came from."""
        env = self.env
        return {"world_size": env.world_size, "device": str(env.device), "backend": env.backend,
                **rdist.topology(env), "backend_env": self.meta.get("backend_env")}

    def workload(self) -> dict:
        cfg = self.cfg
        return {"steps": cfg.steps, "global_batch_size": self.global_batch,
                "accumulation_steps": cfg.accumulation.steps, "task": quality.task_of(cfg, self.env.world_size)}

    def wire_section(self) -> dict:
        """Bytes per step: the gradients', what one rank sends and what that counts, and the compression's ratio:
        wire bytes / those of a float32 ring all-reduce of the same gradients (1.0 uncompressed on a ring)."""
        syncs = self.strategy.synchronizations()  # periodic averaging: how often, and the bytes of one
        return {"grad_bytes": self.grad_bytes, "wire_bytes_per_rank_per_step": self.wire,
                "wire_bytes_basis": self.strategy.wire_note(),
                "compression": {"name": self.cfg.compression.name, "ratio_vs_fp32_allreduce": self.wire_ratio}} | \
            ({"synchronizations": syncs} if syncs else {})


def speed(steady: list, warmup: int, global_batch: int, samples: int, train_s: float) -> dict:
    """Median and spread of global samples/s and of step time over the steady intervals between rows (`warmup`
    steps left out), and the whole run's samples over its training seconds: the headline of a configuration that
    changes phase (PowerSGD's uncompressed first steps count there, not in the median)."""
    times = [iv["step_s"] for iv in steady]
    whole = samples / train_s if train_s > 0 else None
    return {"throughput": spread([global_batch / t for t in times]) | {"warmup_steps_excluded": warmup,
                                                                         "whole_run": whole, "train_s": train_s},
            "step_time_s": spread(times)}


def outcome(history: list, evals: list) -> dict:
    """The training loss's first and last logged values; the last and the best (by macro-AUROC) evaluation, each
    metric None before any."""
    final = evals[-1] if evals else {}
    best = max(evals, key=lambda e: e["auroc_macro"]) if evals else {}
    return {"loss": {"first": history[0] if history else None, "last": history[-1] if history else None},
            "final": evaluated(final), "best": evaluated(best), "val_samples": final.get("samples")}


def reached(evals: list, targets: list, global_batch: int) -> list:
    """Per target macro-AUROC, the first evaluation at or above it: its step, the samples seen by then, and the
    training seconds (steps only) and wall seconds (everything) to the end of that step; the times None when not
    reached."""
    out = []
    for target in targets:
        e = next((e for e in evals if e["auroc_macro"] >= target), None)
        out.append({"auroc": target, "step": e and e["step"], "samples": e and e["step"] * global_batch,
                    "train_s": e and e.get("train_s"), "elapsed_s": e and e.get("elapsed_s")})
    return out


def evaluated(e: dict) -> dict:
    return {k: e.get(k) for k in METRIC_KEYS} | {"step": e.get("step")}


def time_split(steady: list, tips: str) -> dict:
    """Medians of the logged steps' own time and of its parts (the parts are relative to it, not to the means),
    with the verdict on them; a part a step could not measure (None) is left out of its median."""
    parts = {name: [iv["parts"][name] for iv in steady if iv["parts"][name] is not None] for name in timing.PARTS}
    split = {"step_s": median([iv["own"] for iv in steady])} | {k: median(v) for k, v in parts.items()}
    return split | {"verdict": timing.verdict(split, tips)}
