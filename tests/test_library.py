"""ringexp used from someone else's code: the public hook API, and the recipes in examples/ run for real (torchrun,
gloo, Lightning on CPU) against the builtin all-reduce they replace."""

import re
import sys
import threading
from contextlib import nullcontext

import pytest
import torch
from helpers.processes import ROOT, run_torchrun, workers
from helpers.runs import train_steps
from torch.nn.parallel import DistributedDataParallel as DDP

import ringexp
from ringexp import dist as rdist
from ringexp.config import CompressionConfig
from ringexp.models import small_cnn


def torchrun(tmp_path, nproc: int, script: str, *args: str) -> str:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           str(ROOT / "examples" / script), *args]
    r = run_torchrun(cmd, tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


def params(path) -> dict:
    return torch.load(path, weights_only=True)


def max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


@pytest.mark.parametrize("bad, error", [
    ({"algorithm": "rign"}, "unknown algorithm 'rign'"),
    ({"algorithm": "ring", "nodes": 2}, "ring: no option 'nodes' (it takes segment_bytes, timeout_s;"),
    ({"algorithm": "ring", "wire": "fp16"}, "no option 'wire'"),
    ({"compression": "powersgd"}, "powersgd is PyTorch's own hook"),
    ({"compression": "fp8"}, "unknown compression 'fp8'"),
    ({"compression": {"name": "topk", "ratio": 2.0}}, "compression.ratio=2.0: must be in (0, 1]"),
    ({"compression": {"name": "topk", "momentum_correction": True}}, "pass compression={..., 'momentum'"),
    ({"compression": {"name": "fp16", "momentum_correction": True, "momentum": 0.9}}, "needs topk or randomk"),
    ({"compression": {"name": "topk", "momentum": 0.9}}, "momentum is for momentum_correction=True only"),
    ({"compression": {"name": "int8", "error_feedback": True}}, "error_feedback=true with int8 on algorithm ring"),
    ({"compression": {"name": "int8", "scope": "inter_node"}}, "scope=inter_node needs hierarchical"),
    ({"compression": {"name": "topk", "ratoi": 0.1}}, "unexpected keyword argument 'ratoi'"),
    ({"algorithm": "hierarchical", "variant": "tree"}, "variant='tree': choose two_level or leader"),
    ({"algorithm": "ring", "segment_bytes": 0}, "segment_bytes=0: must be an integer >= 1"),
])
def test_the_hook_api_refuses_what_it_cannot_do_at_once(bad, error):
    with pytest.raises((ValueError, TypeError)) as e:
        ringexp.ddp_comm_hook(**bad)
    assert error in str(e.value)


def test_no_compression_by_any_name_is_no_compressor():
    for none in (None, "none", {"name": "none"}, {"ratio": 0.5}, CompressionConfig()):
        state, _ = ringexp.ddp_comm_hook("ring", compression=none)
        assert state.compressor is None, none
    state, _ = ringexp.ddp_comm_hook("hierarchical", compression={"name": "int8", "scope": "inter_node"})
    assert state.options["scope"] == "inter_node"  # the compressor's scope reaches the collective


def test_a_hook_state_is_built_without_a_process_group():
    """Lightning builds the state before it starts the process group: nothing is created until the first bucket."""
    assert not torch.distributed.is_initialized()
    state, hook = ringexp.ddp_comm_hook("hierarchical", compression={"name": "topk", "ratio": 0.1}, nodes=1)
    assert state.group is None and state.executor is None and callable(hook)
    state.close()  # harmless before any use


def resume_worker(tmp):
    """6 steps with top-k and error feedback through the public hook; then 3 steps, save the hook state with the
    model, a fresh DDP and state loaded from the files (weights_only), settled buckets, 3 more steps: the same
    parameters, bit for bit."""
    env = rdist.init("cpu")

    def run(steps, saved=None):
        torch.manual_seed(0)
        model = DDP(small_cnn(5, width=8))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        state, hook = ringexp.ddp_comm_hook("ring", compression={"name": "topk", "ratio": 0.1})
        if saved is not None:
            model.load_state_dict(saved["model"])
            opt.load_state_dict(saved["opt"])
            state.load_state_dict(saved["hook"])
            # residuals are kept per bucket: let DDP pack its buckets as the saved run had them, before the hook
            ringexp.settle_buckets(model, torch.zeros(4, 3, 12, 12))
        model.register_comm_hook(state, hook)
        first = 0 if saved is None else 3
        for step in range(first, first + steps):  # train_steps seeds batches by step; keep them the same
            train_steps(model, opt, env.rank + 10 * step, 1, 1, lambda _sync: nullcontext())
        threads = [t for t in threading.enumerate() if t.name.startswith("ringexp-ring")]
        out = {"model": model.state_dict(), "opt": opt.state_dict(), "hook": state.state_dict()}
        state.close()
        state.close()  # idempotent
        for t in threads:
            t.join(timeout=10)
        return out, len(threads), [t for t in threads if t.is_alive()], state.buckets

    straight, started, alive, buckets = run(6)
    half, *_ = run(3)
    torch.save(half, f"{tmp}/half-{env.rank}.pt")
    resumed, *_ = run(3, torch.load(f"{tmp}/half-{env.rank}.pt", weights_only=True))
    rdist.cleanup()
    diff = max(float((a - b).abs().max()) for a, b in zip(straight["model"].values(), resumed["model"].values(),
                                                         strict=True))
    return diff, bool(half["hook"]["compressor"]["residual"]), started, len(alive), buckets


def test_a_hook_state_saves_resumes_and_closes(tmp_path):
    for rank, (diff, residuals, started, alive, buckets) in workers(resume_worker, 2, str(tmp_path)).items():
        assert residuals, rank  # error feedback's residuals are part of the saved state
        assert diff == 0.0, (rank, diff)  # resumed from files: bit-for-bit the uninterrupted run
        assert started == 1 and alive == 0, (rank, started, alive)  # close() ended the hook's thread
        assert buckets == 6, (rank, buckets)  # one bucket per step (the small CNN fits one)


@pytest.mark.slow  # three torchrun jobs of ResNet-18
def test_recipe_plain_ddp_script_with_ring_and_fp16(tmp_path):
    """examples/ddp_hook.py under torchrun, 2 gloo ranks, ResNet-18: the ring gives builtin DDP's parameters
    exactly; ring+fp16 close to them (fp16 on the wire, float32 sums)."""
    torchrun(tmp_path, 2, "ddp_hook.py", "--steps", "3", "--out", "builtin.pt")
    out = torchrun(tmp_path, 2, "ddp_hook.py", "--steps", "3", "--algorithm", "ring", "--out", "ring.pt")
    assert "rank 0: the hook reduced" in out and "reduced 0 buckets" not in out, out
    torchrun(tmp_path, 2, "ddp_hook.py", "--steps", "3", "--algorithm", "ring", "--compression", "fp16",
             "--out", "fp16.pt")
    builtin = params(tmp_path / "builtin.pt")
    assert max_diff(params(tmp_path / "ring.pt"), builtin) == 0.0
    assert 0 < max_diff(params(tmp_path / "fp16.pt"), builtin) < 0.05


@pytest.mark.slow
def test_recipe_lightning_on_cpu_calls_the_hook(tmp_path):
    """examples/lightning_ring.py: Lightning on CPU (where its own ddp_comm_hook= is never called) with the
    recipe's strategy: the hook runs for every step and the parameters are Lightning's plain DDP's."""
    pytest.importorskip("pytorch_lightning", reason="the lightning extra: pip install -e '.[lightning]'")
    torchrun(tmp_path, 2, "lightning_ring.py", "--out", "plain.pt")
    out = torchrun(tmp_path, 2, "lightning_ring.py", "--algorithm", "ring", "--out", "ring.pt")
    assert "rank 0: the hook reduced 6 buckets" in out and "rank 1: the hook reduced 6 buckets" in out, out
    assert max_diff(params(tmp_path / "ring.pt"), params(tmp_path / "plain.pt")) == 0.0


def test_recipe_all_reduce_on_a_subgroup(tmp_path):
    out = torchrun(tmp_path, 3, "subgroup_all_reduce.py")  # ranks' lines may be interleaved: look for each
    # ranks 0 and 2 summed the strided columns only; rank 1, outside the pair, kept its own
    assert "rank 0: grads [[2.0, 1.0, 6.0, 3.0], [10.0, 5.0, 14.0, 7.0], [18.0, 9.0, 22.0, 11.0]] " \
           "counts [2199023255554, 2199023255554]" in out, out
    assert "rank 1: grads [[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0], [9.0, 10.0, 11.0, 12.0]] " \
           "counts [1099511627777, 1099511627777]" in out, out
    for rank in (0, 2):
        assert f"rank {rank}: ring all-reduce: every rank must pass the same size, dtype" in out, out
        assert f"rank {rank}: still usable: [2.0, 2.0, 2.0]" in out, out


def test_recipe_diloco_in_your_own_loop(tmp_path):
    """examples/diloco_loop.py: ringexp.Averager without DDP, int8 pseudo-gradients through the ring: a
    synchronisation every 8 of 40 steps, the ranks end on the same model, and the loss falls."""
    out = torchrun(tmp_path, 2, "diloco_loop.py")
    said = re.findall(r"rank (\d): (\d+) synchronisations, models agree: (\w+), loss ([\d.]+) -> ([\d.]+)", out)
    assert sorted(r for r, *_ in said) == ["0", "1"], out  # (the ranks' lines may share one: found anywhere)
    for _, syncs, agree, first, last in said:
        assert syncs == "5" and agree == "True" and float(last) < 0.5 * float(first), out
