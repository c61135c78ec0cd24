"""The run directory's files: a full disk while writing tensors says so, in the file system's own words; a run's
summary keeps the keys and types its readers rely on; scripts read what they and ringexp wrote through records."""

import argparse
import errno
import importlib.util
import subprocess
import time

import pytest
import torch
from helpers.processes import ROOT, workers
from helpers.runs import TINY
from torch import nn

from ringexp import dist as rdist
from ringexp import parallel, records, timing
from ringexp.metrics import state_bytes
from ringexp.models import param_bytes
from ringexp.recorder import Recorder
from ringexp.validate import compose_config


@pytest.fixture
def full_disk(tmp_path):
    """A 64 KiB tmpfs."""
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(tmp_path)], capture_output=True,
                             text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {mounted.stderr.strip()}")
    yield tmp_path
    subprocess.run(["umount", "-l", str(tmp_path)], check=False)


def test_tensors_on_a_full_disk_fail_with_no_space_left(full_disk):
    """torch.save alone reports a zip position mismatch ('unexpected pos'); the user must read what to fix."""
    with pytest.raises(OSError) as failed:
        records.save_tensors(full_disk / "model.pt", {"x": torch.randn(100_000)})
    assert failed.value.errno == errno.ENOSPC


# --- summary.json: its keys and their types, as readers (compare, W&B, users' scripts) rely on ---------------

def typed(kind: str, *keys: str) -> dict:
    return dict.fromkeys(keys, kind)


SPREAD = ("median", "p10", "p90", "min", "max")
METRICS = ("auroc_macro", "auroc_micro", "f1_macro", "f1_micro", "loss")
# their keys are the run's: only their own type is fixed
OPEN = {"choices", "overrides", "backend_env", "versions", "task"}
# Recorder.summary's part of a real 2-worker run of TINY (tests/helpers/runs.py), as written before summary() was built
# from parts: a dotted key lies inside the mapping before it.
SUMMARY_SHAPE = {
    **typed("str", "status", "run_dir", "name", "group", "job_type", "strategy"), "choices": "dict",
    "overrides": "list", "world_size": "int", "device": "str", "backend": "str", "nodes": "int",
    "ranks_per_node": "int", "link": "str", "backend_env": "dict",
    **typed("int", "steps", "global_batch_size", "accumulation_steps"),
    "throughput": "dict", **typed("float", *(f"throughput.{k}" for k in SPREAD)),
    **typed("int", "throughput.n", "throughput.warmup_steps_excluded"),
    **typed("float", "throughput.whole_run", "throughput.train_s"), "task": "dict",
    "step_time_s": "dict", **typed("float", *(f"step_time_s.{k}" for k in SPREAD)), "step_time_s.n": "int",
    "loss": "dict", "loss.first": "float", "loss.last": "float",
    **{k: v for part in ("final", "best") for k, v in
       {part: "dict", **typed("float", *(f"{part}.{m}" for m in METRICS)), f"{part}.step": "int"}.items()},
    "val_samples": "int", "targets": "list",  # (its items: test_a_run_records_when_it_first_reached_each_target)
    "time": "dict", **typed("float", *(f"time.{k}" for k in ("step_s", *timing.PARTS))), "time.verdict": "str",
    "peak_memory_bytes": "int", "memory": "dict",
    **typed("int", *(f"memory.{k}" for k in ("peak_bytes", "params_bytes", "grads_bytes", "optimizer_bytes",
                                             "state_bytes"))),
    "grad_bytes": "int", "wire_bytes_per_rank_per_step": "int", "wire_bytes_basis": "str",
    "compression": "dict", "compression.name": "str", "compression.ratio_vs_fp32_allreduce": "float",
    "wall_time_s": "float", "versions": "dict",
}


def shape(value: dict, prefix: str = "") -> dict:
    """{dotted key: type name} of a summary, mappings included (those in OPEN without their keys)."""
    out = {}
    for k, v in value.items():
        out[prefix + k] = type(v).__name__
        if isinstance(v, dict) and prefix + k not in OPEN:
            out |= shape(v, f"{prefix}{k}.")
    return out


AUROC = {6: 0.86, 12: 0.81}  # the evaluations' macro-AUROC by step (TINY evaluates at steps 6 and 12)


def recorder_worker(run_dir):
    """A short run's records without its data: a real DDP model (the strategy's timed hook) and optimizer, the
    recorder's rows, evaluations (their metrics given) and finish, on every rank as the trainer calls them."""
    env = rdist.init("cpu")
    cfg = compose_config([*TINY, "logger=none"])
    strategy = parallel.build(cfg, env)
    torch.manual_seed(0)
    model = nn.Linear(8, 5)
    meta = {"name": "shape", "group": "shape", "job_type": "ddp", "choices": {"parallel": "ddp"}, "overrides": [],
            "backend_env": {"preset": "default"}}
    rec = Recorder(cfg, env, run_dir, meta, strategy, param_bytes(model),
                   strategy.wire_bytes([p.shape for p in model.parameters()]), time.perf_counter())
    model = strategy.wrap(model, rec.comm_timer)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rec.open(0, None)
    for step in range(1, cfg.steps + 1):
        t0 = rec.begin_step()
        loss = model(torch.randn(4, 8)).square().mean()
        loss.backward()
        t1 = rec.clock.now()
        opt.step()
        opt.zero_grad()
        evaluates = step % cfg.eval_every == 0 or step == cfg.steps
        row = rec.record(step, loss.detach(), 0.1, (t0, t1, rec.clock.now()), 0.001, 0, 0, due=evaluates)
        if evaluates:
            scores = torch.rand(101, 5), (torch.rand(101, 5) < 0.3).to(torch.uint8)
            row |= rec.evaluation(step, dict.fromkeys(METRICS, AUROC[step]) | {"samples": 101}, scores)
        rec.write(row, step)
        rec.step_done(excluded=evaluates)
    summary = rec.finish(state_bytes(model, opt), {})
    rdist.cleanup()
    return summary


def test_a_runs_summary_keeps_its_keys_and_types(tmp_path):
    """What a run's summary.json holds and of which type, as it was before Recorder.summary was split into parts:
    compare, W&B and users' scripts read these keys. From a Recorder driven as the trainer drives it, 2 ranks."""
    summary = workers(recorder_worker, 2, tmp_path)[0]
    written = records.read_summary(tmp_path)
    assert written == summary  # what the sinks (W&B) got is what summary.json holds
    assert shape(written) == SUMMARY_SHAPE
    assert written["world_size"] == 2 and written["best"]["step"] == 6 and written["val_samples"] == 101
    # the whole run: every step's samples over the training seconds (evaluations left out, the first steps in)
    tp = written["throughput"]
    assert tp["whole_run"] == pytest.approx(written["steps"] * written["global_batch_size"] / tp["train_s"])
    assert tp["train_s"] == records.read_rows(tmp_path)[-1]["train/train_s"]
    assert 0 < tp["train_s"] < written["wall_time_s"]
    assert written["task"]["samples"] == written["steps"] * written["global_batch_size"]
    # targets: per eval.targets level the first evaluation at or above it (0.8 at step 6, not 12 where it is
    # reached again; 0.9 never), its samples seen, and its training seconds, which leave the evaluations out and
    # so are less than the wall seconds; val_scores.pt keeps the final (step 12) and the best (step 6) scores
    got = {t["auroc"]: t for t in summary["targets"]}
    assert list(got) == [0.8, 0.85, 0.9]
    assert [got[t]["step"] for t in got] == [6, 6, None] and got[0.8]["samples"] == 6 * summary["global_batch_size"]
    assert 0 < got[0.8]["train_s"] < got[0.8]["elapsed_s"] < summary["wall_time_s"]
    assert got[0.9] == {"auroc": 0.9, "step": None, "samples": None, "train_s": None, "elapsed_s": None}
    rows = {r["step"]: r for r in records.read_rows(tmp_path)}
    assert rows[6]["train/train_s"] == got[0.8]["train_s"]  # a resumed run reads it back from its rows
    kept = records.read_scores(tmp_path)
    assert (kept["final"]["step"], kept["best"]["step"]) == (12, 6) and kept["labels"].shape == (101, 5)


# --- the files scripts read back -----------------------------------------------------------------------------

def script(name: str):
    """A module of scripts/ (not a package), imported from its file."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_check_reads_the_figures_bench_overhead_writes(tmp_path):
    bench, check = script("bench_overhead"), script("gpu_check")
    args = argparse.Namespace(steps=20, warmup=10, vs=None, overrides=["logger=none"])
    cfg = compose_config([*TINY, "data.batch_size=32"])  # 2 workers: 64 samples a step
    rounds = [{"base": 0.2, "cand": 0.25}, {"base": 0.3, "cand": 0.2}, {"base": 0.2, "cand": 0.2}]
    records.write_json(tmp_path / "overhead.json", bench.result(("plain DDP", "ringexp"), rounds, args, cfg))
    ratio, target, images = check.overhead(tmp_path / "overhead.json")
    assert (ratio, target) == (1.0, 0.97)  # the median of 0.8, 1.5 and 1.0
    assert images == pytest.approx(64 / 0.2)  # the median of ringexp's step times
    records.write_json(tmp_path / "other.json", {"ratio": 1.0})
    with pytest.raises(TypeError):
        check.overhead(tmp_path / "other.json")


def test_a_bench_file_may_be_a_link_a_trace_may_not(tmp_path):
    """bench.json is a file the user names (plan accuracy bench=...): a symlink to it is followed; a trace lies in
    a run directory, whose files are never symlinks."""
    records.write_json(tmp_path / "bench.json", [{"algorithm": "ring"}])
    (tmp_path / "link.json").symlink_to(tmp_path / "bench.json")
    assert records.read_bench(tmp_path / "link.json") == [{"algorithm": "ring"}]
    records.write_json(tmp_path / "trace_rank0.json", {"traceEvents": []})
    (tmp_path / "trace_rank1.json").symlink_to(tmp_path / "trace_rank0.json")
    assert records.read_trace(tmp_path / "trace_rank0.json") == {"traceEvents": []}
    with pytest.raises(OSError, match="symbolic link"):
        records.read_trace(tmp_path / "trace_rank1.json")
