"""Every collective against torch.distributed.all_reduce on random inputs, in real gloo process groups.

Hypothesis draws a batch of cases (size including 0, 1, primes and sizes not divisible by the world size;
dtype; segment size; algorithm options) per world size; one multi-process job checks the whole batch,
since starting processes costs seconds and a case costs microseconds."""

import pytest
import torch
import torch.distributed as dist
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ringexp import comm
from ringexp import dist as rdist
from ringexp.launch import elastic

DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16, "bfloat16": torch.bfloat16}
# relative tolerance against the exact (float64) sum; low precision is summed in float32 and rounded once
RTOL = {"float32": 1e-6, "float64": 1e-13, "float16": 1e-3, "bfloat16": 8e-3}

sizes = st.one_of(st.sampled_from([0, 1, 2, 3, 5, 7, 11, 13, 97, 101, 1009, 65537]), st.integers(0, 300_000))
case = st.fixed_dictionaries({
    "numel": sizes,
    "dtype": st.sampled_from(list(DTYPES)),
    "segment_bytes": st.sampled_from([4, 100, 4096, 1 << 20, 4 << 20]),
    "seed": st.integers(0, 2**16),
})


def check_worker(cases):
    env = rdist.init("cpu")
    n, failures = env.world_size, []
    divisors = [d for d in range(1, n + 1) if n % d == 0]
    for c in cases:
        g = torch.Generator().manual_seed(c["seed"] * 101 + env.rank)
        x = (torch.randn(c["numel"], generator=g) * 10).to(DTYPES[c["dtype"]])
        exact = x.to(torch.float64, copy=True)
        magnitude = exact.abs()
        if n > 1 and c["numel"]:
            dist.all_reduce(exact)
            dist.all_reduce(magnitude)
        variants = [("ring", {}), ("naive", {})] + [
            ("hierarchical", {"nodes": k, "variant": v}) for k in divisors for v in ("two_level", "leader")]
        for algo, opts in variants:
            y = x.clone()
            # tiny segments are for pipelining edge cases; keep the message count of big tensors sane
            seg = max(c["segment_bytes"], c["numel"] * 8 // 200)
            out = comm.all_reduce(y, algo, segment_bytes=seg, **opts)
            if out is not y or y.dtype != x.dtype or y.shape != x.shape:
                failures.append((c, algo, opts, "not in place"))
                continue
            # Summed in float32 (or float64) and rounded once to the dtype: within the dtype's relative
            # precision of the exact sum, scaled by the sum of magnitudes (cancellation) and one unit.
            # (gloo's builtin sums low precision hop by hop in that precision and would not pass for fp16.)
            err = (y.double() - exact).abs()
            if c["numel"] and not bool((err <= RTOL[c["dtype"]] * (magnitude + 1)).all()):
                failures.append((c, algo, opts, float(err.max())))
    rdist.cleanup()
    return failures


@pytest.mark.parametrize("world", [pytest.param(1, marks=pytest.mark.slow), 2, 3,
                                   pytest.param(4, marks=pytest.mark.slow)])
@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cases=st.lists(case, min_size=4, max_size=8))
def test_every_algorithm_matches_builtin(world, cases):
    results = elastic(check_worker, world, cases)
    assert all(r == [] for r in results.values()), results


def test_low_precision_is_summed_in_float32():
    """fp16 values whose fp16 running sum would lose the small ones."""
    results = elastic(low_precision_worker, 4)
    assert all(results.values()), results


def low_precision_worker():
    env = rdist.init("cpu")
    # rank 0 holds 2048, the others 0.5 each: fp16 hop-by-hop sums would round 2048 + 0.5 to 2048
    x = torch.full((1000,), 2048.0 if env.rank == 0 else 0.5, dtype=torch.float16)
    # 2048 + 3 x 0.5 = 2049.5, which fp16 rounds to 2050 (its spacing at 2048 is 2); summing in fp16 hop
    # by hop gives 2048 + 0.5 -> 2048 at every hop instead
    ok = True
    for algo in ("ring", "naive", "hierarchical"):
        y = comm.all_reduce(x.clone(), algo, nodes=2)
        ok &= bool((y == 2050).all())
    rdist.cleanup()
    return ok


def test_wire_bytes_follow_each_algorithm():
    mb = 1 << 20
    assert comm.wire_bytes("ring", 64 * mb, 4) == 96 * mb  # 2(n-1)/n
    assert comm.wire_bytes("builtin", 64 * mb, 1) == 0
    assert comm.wire_bytes("naive", 64 * mb, 4) == 3 * 64 * mb  # rank 0 sends the sum to n-1 ranks
    # two_level on 2 nodes x 2: 2(m-1)/m intra + a ring over 1/m of the data between nodes
    assert comm.wire_bytes("hierarchical", 64 * mb, 4, nodes=2) == 64 * mb + 32 * mb
