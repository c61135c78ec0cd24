"""The GPU checks, as one table (run by scripts/gpu_check.sh, which sets up the environment first).

Every row is a check, its result and its figure; on a machine without the GPUs a row needs, the row says
"skipped" and why. Rows:
- the `gpu`-marked tests (tests/test_gpu.py);
- training runs on CUDA: the default experiment, model=resnet18 with amp=bf16 and amp=fp16 (GradScaler),
  +parallel=fsdp_bf16 (2 GPUs), backend=nccl_debug (2 GPUs: the algorithm and protocol NCCL logged choosing), and a
  profile.enabled=true run whose trace must hold CUDA kernels;
- ResNet-50 (bf16 autocast, channels_last, synthetic data, batch 256): ringexp's loop against a plain PyTorch
  loop on the same GPU (scripts/bench_overhead.py, target >= 0.97), and images/s against NVIDIA's published
  single-GPU figure (DeepLearningExamples ResNet-50 v1.5, AMP: 2,470 images/s on one A100-80GB);
- each compressor's encode and decode of 64 MB on the GPU, as a fraction of its memory bandwidth (the clock
  and bus width the device reports; a cast reads 4 bytes and writes 2 per element);
- with 2 GPUs or more: ringexp.bench (NCCL's all-reduce against ring and hierarchical).

    python scripts/gpu_check.py [OUT]      (default outputs/gpu-check; the table also goes to OUT/table.md)
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
GPUS = torch.cuda.device_count()
rows = []


def row(check: str, result: str, figure: str = "") -> None:
    rows.append((check, result, figure))
    print(f"| {check} | {result} | {figure} |", flush=True)


def needs(n: int, check: str) -> bool:
    if GPUS >= n:
        return True
    row(check, "skipped", f"needs {n} GPU(s), {GPUS} visible")
    return False


def run(args: list, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def tests(out: Path) -> None:
    """The gpu-marked tests; their whole output goes to OUT/gpu-tests.log, the failing ones' names to the row."""
    r = run([sys.executable, "-m", "pytest", "-q", "-rfE", "-m", "gpu", "-p", "no:cacheprovider", "tests/test_gpu.py"])
    (out / "gpu-tests.log").write_text(r.stdout + r.stderr)
    counts = dict((k, int(v)) for v, k in re.findall(r"(\d+) (passed|failed|skipped|error)", r.stdout))
    ok = r.returncode in (0, 5) and not counts.get("failed") and not counts.get("error")
    failing = re.findall(r"^(?:FAILED|ERROR) \S+::(\S+)", r.stdout, re.M)
    row("gpu-marked tests", "ok" if ok else "FAILED", ", ".join(f"{v} {k}" for k, v in counts.items()) +
        (f" ({', '.join(failing)})" if failing else "") or r.stdout[-200:])


def train(name: str, out: Path, *overrides: str, gpus: int = 1) -> dict | None:
    if not needs(gpus, name):
        return None
    run_dir = out / re.sub(r"[^A-Za-z0-9_.-]", "_", name)
    r = run([sys.executable, "-m", "ringexp.train", "launcher.device=cuda", f"launcher.nproc_per_node={gpus}",
             "logger=none", *overrides, f"hydra.run.dir={run_dir}"])
    if r.returncode != 0 or not (run_dir / records.SUMMARY).exists():
        row(name, "FAILED", (r.stderr.strip().splitlines() or ["no output"])[-1][:200])
        return None
    s = records.read_summary(run_dir)
    row(name, "ok", f"{s['throughput']['median']:.0f} samples/s, val macro-AUROC {s['final']['auroc_macro']:.3f}")
    return {"summary": s, "dir": run_dir}


def training_runs(out: Path) -> None:
    train("default experiment on cuda", out)
    for amp in ("bf16", "fp16"):
        train(f"resnet18 amp={amp}", out, "model=resnet18", f"amp={amp}", "steps=60")
    train("+parallel=fsdp_bf16", out, "+parallel=fsdp_bf16", "steps=60", gpus=2)
    got = train("backend=nccl_debug (NCCL's log)", out, "backend=nccl_debug", "steps=12", gpus=2)
    if got:  # NCCL logs a choice only for a collective of 2 ranks or more (one rank copies)
        chose = got["summary"]["backend_env"]["nccl_chose"]
        row("NCCL's algorithm/protocol, from its log", "ok" if chose else "none logged",
            ", ".join(f"{k}: {n}" for k, n in (chose or {}).items()) or "no 'Best tuning' lines (NCCL too old?)")
    got = train("profile.enabled=true", out, "profile.enabled=true", "steps=12")
    if got:
        traces = list(got["dir"].glob("trace_rank*.json"))
        kernels = sum(1 for t in traces for e in records.read_trace(t).get("traceEvents", [])
                      if e.get("cat") == "kernel")
        row("profile trace holds CUDA kernels", "ok" if kernels else "FAILED", f"{kernels} kernel events")


def resnet50(out: Path) -> None:
    check = "ResNet-50 step: ringexp / plain loop"
    if not needs(1, check):
        return
    path = out / "overhead.json"
    path.unlink(missing_ok=True)  # a figure of an earlier check must not pass for this one's
    r = run([sys.executable, "scripts/bench_overhead.py", "--steps", "60", "--rounds", "2", "--warmup", "20",
             "--json", str(path), "launcher.device=cuda", "launcher.nproc_per_node=1", "model.name=resnet50",
             "model.channels_last=true", "amp=bf16", "data.batch_size=256", "data.image_size=224",
             "data.num_workers=8", "data.train_size=65536", "logger=none", "logger.log_every=10", "eval_every=60"],
            timeout=900)
    try:
        ratio, target, images = overhead(path)
    except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError) as e:
        why = (r.stderr.strip().splitlines() or ["?"])[-1] if r.returncode else f"{path}: {type(e).__name__} {e}"
        row(check, "FAILED", why[:200])
        return
    row(check, "ok" if ratio >= target else f"BELOW {target}", f"{ratio:.3f}")
    row("ResNet-50 images/s (bf16, channels_last, batch 256)", "ok" if images >= A100_AMP_IMAGES_S else "below A100",
        f"{images:.0f} (A100-80GB, NVIDIA: {A100_AMP_IMAGES_S}) on {torch.cuda.get_device_name(0)}")


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
    """Peak memory bandwidth from what the device reports (double data rate x bus width), GB/s."""
    p = torch.cuda.get_device_properties(0)
    clock, bus = getattr(p, "memory_clock_rate", 0), getattr(p, "memory_bus_width", 0)
    return 2 * clock * 1e3 * bus / 8 / 1e9 if clock and bus else None


def codecs() -> None:
    if not needs(1, "compressors on the GPU"):
        return
    from ringexp import compress
    from ringexp.config import CompressionConfig

    peak, x = bandwidth_gbs(), torch.randn(16 << 20, device="cuda")
    for name in ("fp16", "bf16", "int8", "topk", "randomk", "sign"):
        enc, dec, payload = compress.codec_seconds(CompressionConfig(name=name, error_feedback=False), x, 20,
                                                   torch.cuda.synchronize)
        moved = (x.numel() * 4 + payload) / 1e9  # read the float32 tensor, write the payload
        share = f", {moved / enc / peak:.0%} of {peak:.0f} GB/s" if peak else ""
        row(f"{name} encode / decode, 64 MB", "ok", f"{moved / enc:.0f} GB/s{share}; decode {dec * 1e3:.2f} ms")


def bench(out: Path) -> None:
    if not needs(2, "ringexp.bench on NCCL"):
        return
    r = run([sys.executable, "-m", "ringexp.bench", "launcher.device=cuda", f"nprocs=[{min(GPUS, 8)}]",
             "sizes=[1048576,67108864]", "algorithms=[builtin,ring,hierarchical]", "compressors=[none,fp16]",
             "logger=none", f"hydra.run.dir={out / 'bench'}"])
    if r.returncode != 0:
        row("ringexp.bench on NCCL", "FAILED", (r.stderr.strip().splitlines() or ["?"])[-1][:200])
        return
    for b in records.read_bench(out / "bench" / records.BENCH):
        row(f"bench {b['algorithm']} {b['size_bytes'] >> 20} MB", "ok" if b["wrong"] == 0 else "WRONG",
            f"{b['busbw_GBps']:.1f} GB/s busbw, {b['vs_builtin'] or 1:.2f}x NCCL")


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else ROOT / "outputs" / "gpu-check")
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    name = torch.cuda.get_device_name(0) if GPUS else "none"
    print(f"# ringexp GPU check: {GPUS} GPU(s) ({name}), torch {torch.__version__}, CUDA {torch.version.cuda}\n")
    print("| check | result | figure |\n|---|---|---|", flush=True)
    for step in (lambda: tests(out), lambda: training_runs(out), lambda: resnet50(out), codecs, lambda: bench(out)):
        step()
    table = "\n".join(f"| {c} | {r} | {f} |" for c, r, f in rows)
    (out / "table.md").write_text(f"{GPUS} GPU(s): {name}; torch {torch.__version__}\n\n| check | result | figure |\n"
                                  f"|---|---|---|\n{table}\n")
    print(f"\n{time.time() - t0:.0f} s; table in {out / 'table.md'}")
    sys.exit(1 if any(r in ("FAILED", "WRONG") for _, r, _ in rows) else 0)


if __name__ == "__main__":
    main()
