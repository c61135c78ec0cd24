"""The GPU checks, as one table (run by scripts/gpu_check.sh, which sets up the environment first).

Every row is a check, its result and its figure; on a machine without the GPUs a row needs, the row says
"skipped" and why. Rows:
- the `gpu`-marked tests (tests/test_gpu.py), run while the training runs below run beside them (both only
  check correctness; the figures that are speed goals run alone afterwards);
- training runs on CUDA: the default experiment, model=resnet18 with amp=bf16 and amp=fp16 (GradScaler),
  +parallel=fsdp_bf16 on one GPU, backend=nccl_debug (2 GPUs: the algorithm and protocol NCCL logged choosing),
  and a profile.enabled=true run whose trace must hold CUDA kernels;
- ResNet-50 (bf16 autocast, channels_last, synthetic data, batch 256): ringexp's loop against a plain PyTorch
  loop on the same GPU (scripts/bench_overhead.py, target >= 0.97), and images/s against NVIDIA's published
  single-GPU figure (DeepLearningExamples ResNet-50 v1.5, AMP: 2,470 images/s on one A100-80GB);
- each compressor's encode and decode of 256 MB (four times an H100/H200's L2) on the GPU, as a share of the
  memory bandwidth the device reports (a cast reads 4 bytes and writes 2 per element; target >= 0.5 for the
  casts and int8), beside a plain device-to-device copy's share;
- with 2 GPUs or more: ringexp.bench (NCCL's all-reduce against ring and hierarchical).

    python scripts/gpu_check.py [OUT]      (default outputs/gpu-check; the table also goes to OUT/table.md)

A failed row's command and the end of its error output go to OUT/failures.log; the table is rewritten after
every row, so a check stopped at its time limit still leaves the rows it finished.
"""

import re
import subprocess
import sys
import time
from pathlib import Path

import torch

from ringexp import records

ROOT = Path(__file__).resolve().parent.parent
A100_AMP_IMAGES_S = 2470  # DeepLearningExamples, PyTorch ResNet-50 v1.5, AMP, 1 x A100-80GB, batch 256
CODEC_SHARE = 0.5  # encode throughput / memory bandwidth the casts and int8 should reach (one pass, or close)
GPUS = torch.cuda.device_count()
NAME = torch.cuda.get_device_name(0) if GPUS else "none"
rows = []


def row(out: Path, check: str, result: str, figure: str = "") -> None:
    rows.append((check, result, figure))
    print(f"| {check} | {result} | {figure} |", flush=True)
    table = "\n".join(f"| {c} | {r} | {f} |" for c, r, f in rows)
    (out / "table.md").write_text(f"{GPUS} GPU(s): {NAME}; torch {torch.__version__}, CUDA {torch.version.cuda}\n\n"
                                  f"| check | result | figure |\n|---|---|---|\n{table}\n")


def needs(out: Path, n: int, check: str) -> bool:
    if GPUS >= n:
        return True
    row(out, check, "skipped", f"needs {n} GPU(s), {GPUS} visible")
    return False


def failed(out: Path, check: str, r: subprocess.CompletedProcess, why: str = "", run_dir: Path | None = None) -> None:
    """A FAILED row, its reason the last line of the command's errors; the command, the end of its output and of
    its run's logs (a worker's traceback is in its rank<N>.log) to OUT/failures.log, to read without the run."""
    err = (r.stderr or "").strip()
    row(out, check, "FAILED", (why or (err.splitlines() or ["no output"])[-1])[:200])
    logs = sorted(run_dir.glob("*.log")) if run_dir and run_dir.is_dir() else []
    with open(out / "failures.log", "a") as f:
        f.write(f"## {check}\n$ {' '.join(map(str, r.args))}\nexit {r.returncode}\n"
                f"{(r.stdout or '')[-2000:]}\n{err[-6000:]}\n")
        for log in logs:
            f.write(f"### {log.name}\n{log.read_text(errors='replace')[-4000:]}\n")
        f.write("\n")


def text(b) -> str:
    return b.decode(errors="replace") if isinstance(b, bytes) else b or ""


def run(args: list, timeout: int = 300) -> subprocess.CompletedProcess:
    """The command's result; one that outlives `timeout` is killed and returns exit code 124."""
    try:
        return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        return subprocess.CompletedProcess(args, 124, text(e.stdout), text(e.stderr) + f"\ntimed out after {timeout} s")


def start_tests(out: Path) -> subprocess.Popen | None:
    """The gpu-marked tests, started in the background (their whole output to OUT/gpu-tests.log)."""
    if not GPUS:
        return None
    log = open(out / "gpu-tests.log", "w")
    return subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-rfE", "-m", "gpu", "-p", "no:cacheprovider",
                             "tests/test_gpu.py"], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, text=True)


def finish_tests(out: Path, proc: subprocess.Popen | None) -> None:
    """The tests' row: how many passed, failed and were skipped, and the failing ones' names."""
    if proc is None:  # no GPU: run them here, to show each skips with its reason
        r = run([sys.executable, "-m", "pytest", "-q", "-rs", "-m", "gpu", "-p", "no:cacheprovider",
                 "tests/test_gpu.py"])
        (out / "gpu-tests.log").write_text(r.stdout + r.stderr)
        code, log = r.returncode, r.stdout
    else:
        try:
            code = proc.wait(timeout=300)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
        log = (out / "gpu-tests.log").read_text(errors="replace")
    counts = dict((k, int(v)) for v, k in re.findall(r"(\d+) (passed|failed|skipped|errors?)", log))
    ok = code in (0, 5) and not counts.get("failed") and not counts.get("error") and not counts.get("errors")
    failing = re.findall(r"^(?:FAILED|ERROR) \S+::(\S+)", log, re.M)
    figure = ", ".join(f"{v} {k}" for k, v in counts.items()) or f"exit {code}: {log.strip()[-150:]}"
    row(out, "gpu-marked tests", "ok" if ok else "FAILED", figure + (f" ({', '.join(failing)})" if failing else ""))


def train(out: Path, name: str, *overrides: str, gpus: int = 1) -> dict | None:
    if not needs(out, gpus, name):
        return None
    run_dir = out / re.sub(r"[^A-Za-z0-9_.-]", "_", name)
    r = run([sys.executable, "-m", "ringexp.train", "launcher.device=cuda", f"launcher.nproc_per_node={gpus}",
             "logger=none", *overrides, f"hydra.run.dir={run_dir}"])
    if r.returncode != 0 or not (run_dir / records.SUMMARY).exists():
        failed(out, name, r, run_dir=run_dir)
        return None
    s = records.read_summary(run_dir)
    row(out, name, "ok", f"{s['throughput']['median']:.0f} samples/s (beside the tests), "
                         f"val macro-AUROC {s['final']['auroc_macro']:.3f}")
    return {"summary": s, "dir": run_dir}


def training_runs(out: Path) -> None:
    train(out, "default experiment on cuda")
    for amp in ("bf16", "fp16"):
        train(out, f"resnet18 amp={amp}", "model=resnet18", f"amp={amp}", "steps=60")
    train(out, "+parallel=fsdp_bf16 (1 GPU)", "+parallel=fsdp_bf16", "steps=60")
    got = train(out, "backend=nccl_debug (NCCL's log)", "backend=nccl_debug", "steps=12", gpus=2)
    if got:  # NCCL logs a choice only for a collective of 2 ranks or more (one rank copies)
        chose = got["summary"]["backend_env"]["nccl_chose"]
        row(out, "NCCL's algorithm/protocol, from its log", "ok" if chose else "none logged",
            ", ".join(f"{k}: {n}" for k, n in (chose or {}).items()) or "no 'Best tuning' lines (NCCL too old?)")
    got = train(out, "profile.enabled=true", "profile.enabled=true", "steps=12")
    if got:
        traces = list(got["dir"].glob("trace_rank*.json"))
        kernels = sum(1 for t in traces for e in records.read_trace(t).get("traceEvents", [])
                      if e.get("cat") == "kernel")
        row(out, "profile trace holds CUDA kernels", "ok" if kernels else "FAILED", f"{kernels} kernel events")


def resnet50(out: Path) -> None:
    check = "ResNet-50 step: ringexp / plain loop"
    if not needs(out, 1, check):
        return
    path = out / "overhead.json"
    path.unlink(missing_ok=True)  # a figure of an earlier check must not pass for this one's
    # 12 loader workers of 16 cores: a 224 px synthetic image costs about 1 ms of CPU, so they make about 8k
    # images/s, above what one GPU trains on (both loops read the same data the same way).
    # 4 rounds (ABBA twice): on the H200 two rounds' ratios were 0.88 and 1.06 (a drift over the minutes)
    r = run([sys.executable, "scripts/bench_overhead.py", "--steps", "60", "--rounds", "4", "--warmup", "20",
             "--json", str(path), "launcher.device=cuda", "launcher.nproc_per_node=1", "model.name=resnet50",
             "model.channels_last=true", "amp=bf16", "data.batch_size=256", "data.image_size=224",
             "data.num_workers=12", "data.train_size=65536", "data.val_size=512", "logger=none",
             "logger.log_every=10", "eval_every=60"])
    try:
        ratio, target, images = overhead(path)
    except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError) as e:
        failed(out, check, r, "" if r.returncode else f"{path}: {type(e).__name__} {e}")
        return
    row(out, check, "ok" if ratio >= target else f"BELOW {target}", f"{ratio:.3f}")
    row(out, "ResNet-50 images/s (bf16, channels_last, batch 256)",
        "ok" if images >= A100_AMP_IMAGES_S else "below A100",
        f"{images:.0f} (A100-80GB, NVIDIA: {A100_AMP_IMAGES_S}) on {NAME}")


def overhead(path: Path) -> tuple:
    """(throughput ratio ringexp / plain loop, its target, ringexp's images/s) from the JSON that
    scripts/bench_overhead.py --json wrote: the median over rounds of each; KeyError or TypeError if it holds
    other figures."""
    result = records.read_json(path)
    ratio, target = result["ratio"]["median"], result["target"]
    images = result["global_batch_size"] / result["step_s"]["candidate"]
    if not all(type(v) in (int, float) for v in (ratio, target, images)):
        raise TypeError(f"not numbers: ratio {ratio!r}, target {target!r}")
    return ratio, target, images


def bandwidth_gbs() -> float | None:
    """Peak memory bandwidth from what the device reports (double data rate x bus width), GB/s; None where this
    torch does not report them."""
    p = torch.cuda.get_device_properties(0)
    clock, bus = getattr(p, "memory_clock_rate", 0), getattr(p, "memory_bus_width", 0)
    return 2 * clock * 1e3 * bus / 8 / 1e9 if clock and bus else None


def codecs(out: Path) -> None:
    if not needs(out, 1, "compressors on the GPU"):
        return
    from ringexp import compress
    from ringexp.config import CompressionConfig
    from ringexp.timing import median_time

    x = torch.randn(64 << 20, device="cuda")  # 256 MB: four times the L2, so each pass reads memory
    copy = 2 * x.numel() * 4 / median_time(x.clone, 20, torch.cuda.synchronize) / 1e9  # read + write, GB/s
    peak = bandwidth_gbs() or copy
    row(out, "device-to-device copy, 256 MB", "ok", f"{copy:.0f} GB/s, {copy / peak:.0%} of {peak:.0f} GB/s")
    for name in ("fp16", "bf16", "int8", "topk", "randomk", "sign"):
        try:
            enc, dec, payload = compress.codec_seconds(CompressionConfig(name=name, error_feedback=False), x, 20,
                                                       torch.cuda.synchronize)
        except Exception as e:  # (a kernel that does not build here: the row says why, the others still run)
            row(out, f"{name} encode / decode, 256 MB", "FAILED", f"{type(e).__name__}: {e}"[:200])
            continue
        rate = (x.numel() * 4 + payload) / enc / 1e9  # read the float32 tensor, write the payload
        judged = name in ("fp16", "bf16", "int8")
        verdict = "ok" if not judged or rate >= CODEC_SHARE * peak else f"BELOW {CODEC_SHARE}"
        row(out, f"{name} encode / decode, 256 MB", verdict,
            f"{rate:.0f} GB/s, {rate / peak:.0%} of {peak:.0f} GB/s{'' if judged else ' (not judged)'}; "
            f"decode {dec * 1e3:.2f} ms")


def bench(out: Path) -> None:
    if not needs(out, 2, "ringexp.bench on NCCL"):
        return
    r = run([sys.executable, "-m", "ringexp.bench", "launcher.device=cuda", f"nprocs=[{min(GPUS, 8)}]",
             "sizes=[1048576,67108864]", "algorithms=[builtin,ring,hierarchical]", "compressors=[none,fp16]",
             "logger=none", f"hydra.run.dir={out / 'bench'}"])
    if r.returncode != 0:
        failed(out, "ringexp.bench on NCCL", r)
        return
    for b in records.read_bench(out / "bench" / records.BENCH):
        row(out, f"bench {b['algorithm']} {b['size_bytes'] >> 20} MB", "ok" if b["wrong"] == 0 else "WRONG",
            f"{b['busbw_GBps']:.1f} GB/s busbw, {b['vs_builtin'] or 1:.2f}x NCCL")


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else ROOT / "outputs" / "gpu-check")
    out.mkdir(parents=True, exist_ok=True)
    (out / "failures.log").unlink(missing_ok=True)
    t0 = time.time()
    print(f"# ringexp GPU check: {GPUS} GPU(s) ({NAME}), torch {torch.__version__}, CUDA {torch.version.cuda}\n")
    print("| check | result | figure |\n|---|---|---|", flush=True)
    tests = start_tests(out)  # correctness only: beside the training runs, which are correctness checks too
    try:
        training_runs(out)
    finally:
        finish_tests(out, tests)
    for step in (resnet50, codecs, bench):  # the speed goals, each alone on the GPU
        step(out)
    print(f"\n{time.time() - t0:.0f} s; table in {out / 'table.md'}")
    sys.exit(1 if any(r.startswith(("FAILED", "WRONG", "BELOW")) for _, r, _ in rows) else 0)


if __name__ == "__main__":
    main()
