"""The CUDA path, on a machine with GPUs (marked `gpu`; skipped elsewhere; scripts/gpu_check.sh runs them): a
hook's worker thread works on the bucket's own device and waits for the bucket on the device, timing marks from
that thread compare with the training thread's, every compressor encodes on the GPU as on the CPU, and every hooked
strategy reduces like NCCL's own DDP, and a CUDA run killed mid-way resumes from its checkpoint (CUDA RNG state;
FSDP's distributed checkpoint on NCCL) with the losses of a run never interrupted."""

import threading

import pytest
import torch
from helpers.runs import kill_and_resume, reference_losses, strategy_cfg
from torch import nn

from ringexp import compress, parallel
from ringexp import dist as rdist
from ringexp.config import CompressionConfig
from ringexp.launch import elastic
from ringexp.timing import Clock

GPUS = torch.cuda.device_count()
pytestmark = pytest.mark.gpu
one_gpu = pytest.mark.skipif(GPUS < 1, reason="needs a CUDA GPU")
two_gpus = pytest.mark.skipif(GPUS < 2, reason="needs 2 CUDA GPUs (NCCL cannot run two ranks on one)")


@one_gpu
def test_a_worker_thread_waits_on_the_device_for_the_bucket_it_was_handed():
    """The bucket is still being written when the hook hands it over (a long queue of kernels, then the write):
    the thread's side stream must wait for it, on the device, without the host waiting."""
    dev = torch.device("cuda", GPUS - 1)
    torch.cuda.set_device(dev)
    x = torch.zeros(1 << 24, device=dev)
    a = torch.randn(4096, 4096, device=dev)
    for _ in range(30):
        a = torch.tanh(a @ a)  # about 100 ms of queued work before the write below
    x.add_(1.0)
    ready = rdist.handover(dev)
    seen = {}

    def worker():
        with rdist.on_device(dev, ready, {}):
            seen["sum"] = x.sum()
            seen["device"] = torch.cuda.current_device()
            seen["side"] = torch.cuda.current_stream(dev) != torch.cuda.default_stream(dev)

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    torch.cuda.synchronize(dev)
    assert float(seen["sum"]) == x.numel() and seen["device"] == dev.index and seen["side"], seen


@one_gpu
@pytest.mark.parametrize("name", ["fp16", "bf16", "int8", "topk", "sign"])
def test_each_compressor_encodes_on_the_gpu_as_on_the_cpu(name):
    """The same tensor (an awkward size, a few large values) through encode and decode on both devices: the same
    result, to the float32 rounding a GPU's reductions may differ by."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1_000_003, generator=g)
    x[::9973] *= 50
    c = CompressionConfig(name=name, error_feedback=False)
    cpu, gpu = compress.roundtrip(x, c), compress.roundtrip(x.cuda(), c).cpu()
    assert gpu.shape == cpu.shape and torch.allclose(gpu, cpu, rtol=1e-5, atol=1e-6), (
        name, float((gpu - cpu).abs().max()))


@two_gpus
def test_timing_marks_from_a_thread_on_another_current_device_compare_with_the_training_thread_s():
    """A new thread's current device is cuda:0; a rank on cuda:1 marks the end of a collective from it."""
    dev = torch.device("cuda", 1)
    torch.cuda.set_device(dev)
    clock = Clock(dev)
    start = clock.now()
    torch.randn(2048, 2048, device=dev) @ torch.randn(2048, 2048, device=dev)
    marks = []
    t = threading.Thread(target=lambda: marks.append(clock.now()))
    t.start()
    t.join()
    torch.cuda.synchronize(dev)
    assert clock.since(start, marks[0]) >= 0


def nccl_equivalence_worker():
    env = rdist.init("cuda")
    out = {}
    for strategy in ("ddp", "ring", "hierarchical", "naive"):
        cfg = strategy_cfg(strategy, env.world_size, bucket_cap_mb=0.01, segment_kb=1)  # several buckets
        torch.manual_seed(0)
        strat = parallel.build(cfg, env)
        model = strat.wrap(nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                                         nn.Linear(256, 10)))
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        grads = []
        for step in range(3):
            g = torch.Generator(device=env.device).manual_seed(100 * step + env.rank)
            x = torch.randn(32, 64, device=env.device, generator=g)
            model(x).square().mean().backward()
            grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]).cpu())
            opt.step()
            opt.zero_grad()
        out[strategy] = grads
        strat.close()
    rdist.cleanup()
    return {s: max(float((a - b).abs().max()) for a, b in zip(g, out["ddp"], strict=True))
            for s, g in out.items() if s != "ddp"}


@two_gpus
def test_every_hooked_strategy_reduces_like_nccl_s_own_ddp():
    for rank, diffs in elastic(nccl_equivalence_worker, 2, start_method="spawn").items():
        assert set(diffs) == {"ring", "hierarchical", "naive"}
        assert all(d < 1e-5 for d in diffs.values()), (rank, diffs)


@one_gpu
@pytest.mark.parametrize("preset", ["ddp_powersgd+cuda", "fsdp+cuda"])
def test_a_killed_cuda_run_resumes_with_the_losses_of_an_uninterrupted_one(tmp_path, preset):
    """The whole job killed after step 8 (one rank per GPU), resumed from step 5's checkpoint: PowerSGD's factors
    and error feedback (loaded on the CPU) back on the GPU, FSDP's shards through DCP on NCCL. (Two presets, for
    gpu_check's 8 minutes; top-k's residuals take the same path as PowerSGD's state.)"""
    kill_and_resume(tmp_path / "run", preset, "job", True, reference_losses(lambda: tmp_path / "ref"))
