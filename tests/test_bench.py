"""`python -m ringexp.bench`: a real multi-process run of the nccl-tests style table, every row checked."""

import csv
import glob
import logging
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
import torch
from helpers.processes import ROOT, error_line, run_cli, workers
from helpers.wandb_log import history_and_summary
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from ringexp import bench, records
from ringexp import dist as rdist
from ringexp.bench.config import BenchConfig
from ringexp.config import Device
from ringexp.errors import ConfigError


@pytest.mark.slow
def test_bench_table_checks_every_algorithm_against_builtin(tmp_path):
    run_dir = tmp_path / "bench"
    r = subprocess.run([sys.executable, "-m", "ringexp.bench", "sizes=[1000,65536]", "nprocs=[2,3]", "nodes=1",
                        "compressors=[none,fp16,topk]", "iters=2", "warmup=1", "min_time_s=0",
                        f"hydra.run.dir={run_dir}"], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "busbw" in r.stdout and "#wrong" in r.stdout
    rows = list(csv.DictReader(open(run_dir / "bench.csv")))
    assert len(rows) == 5 * 3 * 2 * 2  # algorithms x compressors x sizes x world sizes
    algos = {"builtin", "ring", "hierarchical", "hierarchical:leader", "naive"}
    assert {row["algorithm"] for row in rows} == algos | {f"{a}+{c}" for a in algos for c in ("fp16", "topk")}
    assert all(int(row["wrong"]) == 0 for row in rows)
    for row in rows:
        n, size, t = int(row["nprocs"]), int(row["size_bytes"]), float(row["time_us"])
        assert float(row["busbw_GBps"]) == pytest.approx(size / t / 1e3 * 2 * (n - 1) / n, rel=1e-6)
        if row["algorithm"] == "builtin":
            assert float(row["vs_builtin"]) == 1.0
    history, _, _ = history_and_summary(glob.glob(str(run_dir / "wandb" / "offline-run-*" / "*.wandb"))[0])
    assert len(history) == len(rows)


@pytest.mark.slow
def test_a_credential_the_bench_config_reads_is_recorded_as_its_interpolation(tmp_path):
    """name=${oc.env:MY_API_TOKEN} names the bench's W&B run: its offline records hold the interpolation, never the
    value (as a training run's records: tests/test_survive.py)."""
    run_dir, secret = tmp_path / "bench", "tok-5f3e1d2c3b4a59687"
    r = run_cli(run_dir, "sizes=[1000]", "nprocs=[2]", "algorithms=[builtin]", "iters=1", "warmup=0", "min_time_s=0",
                "name=${oc.env:MY_API_TOKEN}", module="ringexp.bench", env={"MY_API_TOKEN": secret})
    assert r.returncode == 0, r.stderr[-3000:]
    _, _, run = history_and_summary(glob.glob(str(run_dir / "wandb" / "offline-run-*" / "*.wandb"))[0])
    assert run.run_group == run.display_name == "${oc.env:MY_API_TOKEN}", run
    assert not [p for p in run_dir.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]


def test_bench_refuses_nodes_that_do_not_divide(tmp_path):
    r = subprocess.run([sys.executable, "-m", "ringexp.bench", "nprocs=[3]", "nodes=2",
                        f"hydra.run.dir={tmp_path / 'b'}"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.startswith("ringexp: error: bench: nodes=2 does not divide nprocs=3")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without GPUs")
def test_bench_on_cuda_without_a_gpu_says_so_in_one_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "ringexp.bench", "launcher.device=cuda",
                        f"hydra.run.dir={tmp_path / 'b'}"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and error_line(r.stderr).startswith(
        "ringexp: error: launcher.device=cuda but no GPU is visible; use launcher.device=cpu or auto")
    assert not (tmp_path / "b" / "bench.json").exists()


@pytest.mark.parametrize("fields, words", [
    ({"codec": True, "sizes": [3]}, "bench: sizes=[3]: codec=true times float32 tensors"),
    ({"sizes": [3]}, "bench: sizes=[3]: 3 bytes hold no float32 element; every size must be >= 4 bytes"),
    ({"sizes": [1024, 4], "dtypes": ["float32", "float64"]}, "bench: sizes=[1024, 4]: 4 bytes hold no float64"),
    ({"min_bytes": 1, "dtypes": ["float16"]}, "bench: min_bytes=1, max_bytes=268435456: 1 bytes hold no float16"),
])
def test_a_size_too_small_for_its_dtype_is_refused_before_launch(fields, words):
    """codec=true sizes=[3] timed an empty tensor (ZeroDivisionError); a float32 row of 3 bytes timed 4."""
    with pytest.raises(ConfigError) as e:
        bench.check(BenchConfig(**fields))
    assert str(e.value).startswith(words), e.value


def test_a_message_the_machine_cannot_hold_is_refused_before_launch(monkeypatch):
    """Every rank holds the message once per row and a few times more: 10**12 bytes on 4 ranks, or the default
    256 MB on a GPU of 1 GB (10 rows and 4 more), is refused with what it needs; a size that fits is not."""
    with pytest.raises(ConfigError) as e:
        bench.check(BenchConfig(sizes=[10**12], nprocs=[2, 4]))
    assert str(e.value).startswith("bench: sizes=[1000000000000]: a 931.323GB message needs about 33527.6GB of "
                                   "memory (4 ranks x 9 buffers of its size), more than this machine has"), e.value
    with pytest.raises(ConfigError, match=r"needs about 3725.29GB of memory \(4 buffers of its size\)"):  # one process
        bench.check(BenchConfig(codec=True, sizes=[10**12]))
    bench.check(BenchConfig(sizes=[1 << 20], nprocs=[2]))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(total_memory=1 << 30))
    cfg = BenchConfig(compressors=["none", "fp16"])
    cfg.launcher.device = Device.cuda
    with pytest.raises(ConfigError, match=r"a 256MB message needs about 3.5GB of memory \(14 buffers of its "
                                          r"size\), more than each GPU has \(1GB\)"):
        bench.check_sizes(cfg, 4)


def test_a_worker_that_dies_is_one_line_and_exit_1_not_a_traceback(tmp_path, monkeypatch, capsys):
    """The bench's own main, in this process, with a job whose rank 1 the kernel killed (as for memory): the
    agent's ChildFailedError came back through Hydra as a traceback; now train's one line, also in summary.json."""
    def killed(fn, n, *args, **kwargs):
        raise ChildFailedError("bench_worker", {1: ProcessFailure(1, 4242, -9, str(tmp_path / "no-error.json"))})

    monkeypatch.setattr(bench, "elastic", killed)
    monkeypatch.setattr(sys, "argv", ["ringexp.bench", "nprocs=[2]", "sizes=[1024]", f"hydra.run.dir={tmp_path / 'b'}"])
    handlers, level = list(logging.root.handlers), logging.root.level  # Hydra configures logging for its job
    try:
        with pytest.raises(SystemExit) as e:
            bench.main()
    finally:
        for h in set(logging.root.handlers) - set(handlers):
            logging.root.removeHandler(h)
            h.close()
        logging.root.setLevel(level)
    words = "worker rank 1 failed: Signal 9 (SIGKILL) received by PID 4242"
    assert e.value.code == 1 and error_line(capsys.readouterr().err) == f"ringexp: error: {words}"
    assert records.read_summary(tmp_path / "b") == {"status": "failed", "error": words}


@pytest.mark.slow
@pytest.mark.parametrize("overrides, words", [
    (["codec=true", "sizes=[3]"], "ringexp: error: bench: sizes=[3]: codec=true times float32 tensors"),
    (["sizes=[1000000000000]"], "ringexp: error: bench: sizes=[1000000000000]: a 931.323GB message needs about"),
])
def test_the_command_line_refuses_a_size_before_any_worker_starts(tmp_path, overrides, words):
    r = run_cli(tmp_path / "b", *overrides, module="ringexp.bench", timeout=120)
    assert r.returncode == 2 and error_line(r.stderr).startswith(words), r.stderr
    assert not (tmp_path / "b" / "bench.json").exists() and not list((tmp_path / "b").glob("workers-n*"))


def test_one_parser_reads_every_row_name_the_bench_writes():
    """Row names are the all-reduce as users name it, + a compressor: ringexp.compress.parse reads each back to the
    very collective, options and compressor the row ran (the planner's accuracy reads rows with it), and refuses
    a name the bench would not run in words that say what to write instead."""
    from ringexp import comm, compress
    from ringexp.bench import row_specs
    from ringexp.bench.config import BenchConfig

    cfg = BenchConfig(algorithms=["builtin", "ring:256", "hierarchical", "hierarchical:leader", "naive"],
                      compressors=["none", "int8", "topk", "fp16:inter"], ratio=0.05)
    specs = row_specs(cfg)
    assert len(specs) == 5 * 3 + 2  # fp16:inter on the hierarchical rows only
    assert specs["ring:256+topk"] == ("ring", {"segment_bytes": 256 << 10}, compress.parse("ring+topk", ratio=0.05)[2])
    assert specs["hierarchical:leader+fp16:inter"][:2] == ("hierarchical", {"variant": "leader"})
    assert specs["hierarchical:leader+fp16:inter"][2].scope == "inter_node" and specs["ring:256+topk"][2].ratio == 0.05
    for name, spec in specs.items():
        assert compress.parse(name, ratio=0.05) == spec
    for bad, words in (("leader", "unknown algorithm 'leader'; choose from"), ("ring:fast", "ring takes a segment"),
                       ("naive:2", "naive takes no option")):
        with pytest.raises(ValueError, match=words):
            comm.parse(bad)
    with pytest.raises(ValueError, match="on hierarchical only"):
        compress.parse("ring+int8:inter")


def gap_worker(gap_s: float) -> tuple:
    """timed_rounds of two no-op runs, 3 timed rounds after 2 warm-up ones, in a real 2-rank gloo group: (its
    wall seconds, the longest time it recorded)."""
    rdist.init("cpu")
    cfg = BenchConfig(gap_s=gap_s, iters=3, warmup=2, min_time_s=0.0)
    t0 = time.perf_counter()
    times = bench.timed_rounds(cfg, torch.zeros(4), {"a": lambda b: None, "b": lambda b: None})
    wall = time.perf_counter() - t0
    rdist.cleanup()
    assert all(len(t) == 3 for t in times.values())
    return wall, max(max(t) for t in times.values())


def test_gap_s_idles_before_every_timed_run_and_is_not_timed():
    """6 timed runs of 0.15 s idle each: at least 0.9 s of wall time, none of it in the times recorded; the warm-up
    rounds and gap_s=0 idle not at all."""
    wall, longest = workers(gap_worker, 2, 0.15)[0]
    assert wall >= 6 * 0.15 and longest < 0.1, (wall, longest)
    wall, _ = workers(gap_worker, 2, 0.0)[0]
    assert wall < 0.5, wall
