"""Where the time went: the step's parts add up, a slowed collective shows up as exposed communication, and
the profiler writes a trace with the collectives in it."""

import json
import os
import statistics
import time
from pathlib import Path

import pytest
from helpers.processes import run_cli, workers
from helpers.runs import TINY, strategy_cfg
from helpers.wandb_log import wandb_records

from ringexp import comm, timing
from ringexp.launch import run_worker
from ringexp.parallel import STRATEGIES
from ringexp.records import read_rows, read_summary
from ringexp.timing import union_length, verdict
from ringexp.validate import compose_config

# Steps long enough (tens of ms) that logging is a small part of them; small buckets so that some
# communication can overlap backward.
STEADY = ["steps=24", "eval_every=24", "throughput_warmup=4", "data.train_size=4096", "data.val_size=128",
          "logger=none", "logger.log_every=1", "parallel.bucket_cap_mb=0.05"]


def test_union_length_counts_overlapping_spans_once():
    assert union_length([]) == 0
    assert union_length([(0, 2), (1, 3), (5, 6), (5.5, 5.7)]) == pytest.approx(4.0)


def test_the_advice_depends_on_what_was_run():
    def tips(*overrides):
        cfg = compose_config(list(overrides))
        return STRATEGIES[cfg.parallel.strategy].tips(cfg)
    assert "+parallel=ring" not in tips("+parallel=ring") and "hierarchical" in tips("+parallel=ring")
    assert "+parallel=ring (rank 0 of the parameter server" in tips("+parallel=naive")
    fp16 = tips("+parallel=ring_fp16")
    assert "compression=int8 or topk" in fp16 and "fp16 or bf16" not in fp16
    assert "compression" not in tips("+parallel=ddp_topk")
    assert tips("+parallel=ddp", "accumulation.steps=4").endswith("or accumulation.steps=8 (now 4)")
    assert tips("+parallel=fsdp", "parallel.reshard_after_forward=false", "amp=bf16", "parallel.forward_prefetch=1") \
        == "accumulation.steps=2 (now 1)"


def test_verdict_is_computed_from_the_measured_parts():
    t = {"step_s": 0.2, "comm_s": 0.084, "exposed_comm_s": 0.0546, "overlap": 0.35, "data_s": 0.0}
    ddp, fsdp = STRATEGIES["ddp"].tips(strategy_cfg("ddp", 2)), STRATEGIES["fsdp"].tips(strategy_cfg("fsdp", 2))
    assert verdict(t, ddp) == ("communication is 42% of step time, overlap 35% (< 60%): try parallel.bucket_cap_mb "
                               "(now 25), compression=fp16 or bf16 or accumulation.steps=2 (now 1)")
    assert "reshard_after_forward=false" in verdict(t, fsdp) and "amp=bf16" in verdict(t, fsdp)
    assert "amp=bf16" not in verdict(t, STRATEGIES["fsdp"].tips(compose_config(["+parallel=fsdp", "amp=bf16"])))
    hidden = t | {"exposed_comm_s": 0.0168, "overlap": 0.8}
    assert verdict(hidden, ddp) == ("communication is 42% of step time, overlap 80% (>= 60%): communication is "
                                      "mostly hidden behind compute")
    assert "little to gain" in verdict(t | {"comm_s": 0.008, "exposed_comm_s": 0.006, "overlap": 0.25}, ddp)
    assert verdict(t | {"data_s": 0.05}, ddp).endswith("; data loading is 25% of step time: raise data.num_workers")
    assert verdict({"step_s": 0.1, "comm_s": 0.0}, ddp) == "no communication measured"
    assert "not measured on this device" in verdict(t | {"overlap": None, "exposed_comm_s": None}, fsdp)


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["ddp", "ring", "fsdp"])
def test_step_time_breakdown_adds_up(tmp_path, preset):
    r = run_cli(tmp_path, *STEADY, f"+parallel={preset}")
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [row for row in read_rows(tmp_path) if "time/compute_s" in row][4:]
    assert len(rows) >= 15
    for row in rows:
        for part in ("data_s", "compute_s", "comm_s", "exposed_comm_s", "optimizer_s"):
            assert row[f"time/{part}"] >= 0, (part, row)
        assert row["time/compute_s"] > 0 and row["time/comm_s"] > 0
        assert 0 <= row["time/overlap"] <= 1
    # data + compute + exposed communication + optimizer explain the measured step time within 10%
    gaps = [abs(row["time/other_s"]) / row["train/step_time_s"] for row in rows]
    assert statistics.median(gaps) < 0.10, gaps
    t = read_summary(tmp_path)["time"]
    assert t["step_s"] > 0 and t["comm_s"] > 0 and "communication is" in t["verdict"]
    share = round(100 * t["comm_s"] / t["step_s"])
    assert f"communication is {share}% of step time" in t["verdict"]  # computed from the numbers


def slowed_worker(cfg, run_dir, meta, delay_s: float):
    """The test harness's slow network: every collective of the ring hook first sleeps `delay_s`."""
    original = comm.all_reduce

    def slow(*args, **kwargs):
        time.sleep(delay_s)
        return original(*args, **kwargs)
    comm.all_reduce = slow
    return run_worker(cfg, run_dir, meta)


def run_in_harness(run_dir: Path, delay_s: float) -> dict:
    cfg = compose_config([*TINY, "+parallel=ring", "logger=none", "steps=16", "throughput_warmup=4"])
    run_dir.mkdir()
    meta = {"name": f"delay={delay_s}", "group": "slowed", "job_type": "ring", "choices": {}, "overrides": []}
    workers(slowed_worker, 2, cfg, str(run_dir), meta, delay_s)
    return read_summary(run_dir)["time"]


@pytest.mark.slow
def test_a_slowed_collective_shows_as_exposed_communication(tmp_path):
    normal = run_in_harness(tmp_path / "normal", 0.0)
    slowed = run_in_harness(tmp_path / "slowed", 0.1)
    # 100 ms more per step, all of it after backward has handed over its only bucket; with other tests beside it
    # on 2 cores a step's compute varies by tens of ms, so the step's own growth is asked for at 60 ms
    assert slowed["exposed_comm_s"] > normal["exposed_comm_s"] + 0.08, (normal, slowed)
    assert slowed["comm_s"] > normal["comm_s"] + 0.08, (normal, slowed)
    assert slowed["step_s"] > normal["step_s"] + 0.06, (normal, slowed)



def counting_worker(cfg, run_dir, meta):
    """A rank that counts how often the step clock waits for the device (Clock.sync: a no-op on CPU, a device
    synchronisation on CUDA) and leaves the count beside the run."""
    calls = []
    original = timing.Clock.sync

    def sync(self):
        calls.append(1)
        return original(self)
    timing.Clock.sync = sync
    try:
        return run_worker(cfg, run_dir, meta)
    finally:
        Path(run_dir, f"syncs-{os.environ['RANK']}.txt").write_text(str(len(calls)))


def test_the_step_clock_waits_for_the_device_only_on_logged_steps(tmp_path):
    """On CUDA every wait is a host synchronisation: a row every 4 steps must cost one wait every 4 steps, not one
    per step (marks are CUDA events, read only when a row is due)."""
    cfg = compose_config([*TINY, "+parallel=ring", "logger=none", "steps=12", "eval_every=12", "logger.log_every=4"])
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    meta = {"name": "count", "group": "count", "job_type": "ring", "choices": {}, "overrides": []}
    workers(counting_worker, 2, cfg, str(run_dir), meta)
    logged = [row for row in read_rows(run_dir) if "time/compute_s" in row]
    assert [row["step"] for row in logged] == [4, 8, 12]
    assert [int((run_dir / f"syncs-{r}.txt").read_text()) for r in (0, 1)] == [len(logged)] * 2

@pytest.mark.slow
def test_profiler_writes_a_trace_with_communication_events(tmp_path):
    r = run_cli(tmp_path, *TINY, "logger=wandb", "profile.enabled=true", "profile.start_step=3", "profile.steps=2",
                "profile.top=5")
    assert r.returncode == 0, r.stderr[-3000:]
    s = read_summary(tmp_path)
    assert s["profile"]["steps"] == [3, 4] and len(s["profile"]["top_ops"]) == 5
    assert all(op["self_ms"] >= 0 and op["calls"] >= 1 for op in s["profile"]["top_ops"])
    for rank in (0, 1):
        trace = json.loads((tmp_path / f"trace_rank{rank}.json").read_text())  # valid JSON
        names = {e.get("name", "") for e in trace["traceEvents"]}
        assert any("all_reduce" in n or "allreduce" in n for n in names), sorted(names)[:50]
    assert "profile of steps 3-4" in (tmp_path / "rank0.log").read_text()
    # attached to the W&B run as an artifact
    wandb_file = next(tmp_path.glob("wandb/offline-run-*/run-*.wandb"))
    kinds = [rec.WhichOneof("record_type") for rec in wandb_records(wandb_file)]
    assert "artifact" in kinds
