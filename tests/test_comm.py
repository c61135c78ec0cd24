"""Every collective against torch.distributed.all_reduce on random inputs, in real gloo process groups.

Hypothesis draws a batch of cases (size including 0, 1, primes and sizes not divisible by the world size;
float and integer dtypes; contiguous, strided and transposed views and leaves that require grad; segment size;
algorithm options) per world size; one multi-process job checks the whole batch,
since starting processes costs seconds and a case costs microseconds."""

import time

import pytest
import torch
import torch.distributed as dist
from helpers.processes import workers
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from ringexp import comm
from ringexp import dist as rdist

DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16, "bfloat16": torch.bfloat16,
          "int32": torch.int32, "int64": torch.int64}
# relative tolerance against the exact (float64) sum; low precision is summed in float32 and rounded once
RTOL = {"float32": 1e-6, "float64": 1e-13, "float16": 1e-3, "bfloat16": 8e-3}
LAYOUTS = ("contiguous", "every_other", "transposed", "leaf_requires_grad")

sizes = st.one_of(st.sampled_from([0, 1, 2, 3, 5, 7, 11, 13, 97, 101, 1009, 65537]), st.integers(0, 300_000))
case = st.fixed_dictionaries({
    "numel": sizes,
    "dtype": st.sampled_from(list(DTYPES)),
    "layout": st.sampled_from(LAYOUTS),
    "segment_bytes": st.sampled_from([4, 100, 4096, 1 << 20, 4 << 20]),
    "seed": st.integers(0, 2**16),
})


def make_input(c, rank):
    """(the tensor to reduce, the storage it is a view of): random values, integers over the whole int32 range
    or up to 2**40 (sums that float32 cannot hold), in the case's layout."""
    g = torch.Generator().manual_seed(c["seed"] * 101 + rank)
    dtype, n = DTYPES[c["dtype"]], c["numel"]
    if dtype.is_floating_point:
        full = (torch.randn(2 * n, generator=g) * 10).to(dtype)
    else:
        high = 2**31 - 1 if dtype == torch.int32 else 2**40
        full = torch.randint(-high, high, (2 * n,), generator=g, dtype=torch.int64).to(dtype)
    if c["layout"] == "every_other":
        return full[::2], full
    x = full[:n]
    if c["layout"] == "transposed":  # a (rows, cols) matrix seen through .t(): strided in both dimensions
        rows = max(d for d in range(1, int(n**0.5) + 1) if n % d == 0) if n else 1
        return x.view(rows, -1).t(), full
    if c["layout"] == "leaf_requires_grad" and dtype.is_floating_point:
        x = x.clone().requires_grad_()
        return x, x
    return x, full


def check_worker(cases):
    env = rdist.init("cpu")
    n, failures = env.world_size, []
    divisors = [d for d in range(1, n + 1) if n % d == 0]
    for c in cases:
        x, storage = make_input(c, env.rank)
        exact = x.detach().to(torch.float64 if x.is_floating_point() else torch.int64, copy=True).contiguous()
        magnitude = exact.abs()
        if n > 1 and c["numel"]:
            dist.all_reduce(exact)  # the reference: torch's own all-reduce, in a dtype that holds the exact sum
            dist.all_reduce(magnitude)
        if not x.is_floating_point():
            exact = exact.to(x.dtype)  # wrapped around as torch's own sum in that dtype wraps
        # tiny segments are for pipelining edge cases; keep the message count of big tensors sane
        seg = {"segment_bytes": max(c["segment_bytes"], c["numel"] * 8 // 200)}
        # paired: the schedule NCCL needs (each receive batched with its send), run here on gloo
        variants = [("ring", seg), ("ring", seg | {"paired": True}), ("naive", {})] + [
            ("hierarchical", seg | {"nodes": k, "variant": v}) for k in divisors for v in ("two_level", "leader")] + [
            ("hierarchical", seg | {"nodes": k, "paired": True}) for k in divisors]
        if x.is_floating_point():  # the ring's mean: each rank divides the chunk it finishes
            variants.append(("ring", seg | {"divisor": n}))
        for algo, opts in variants:
            if storage is x:  # a leaf of its own
                y, outside = x.detach().clone().requires_grad_(x.requires_grad), None
            else:  # the same view of a copy of its storage
                outside = storage.clone()
                y = outside.as_strided(x.shape, x.stride(), x.storage_offset())
            out = comm.all_reduce(y, algo, **opts)
            scale = opts.get("divisor", 1)
            failures += [(c, algo, opts, e)
                         for e in errors(x, y, out, exact / scale, magnitude / scale, storage, outside, c)]
    rdist.cleanup()
    return failures


def errors(x, y, out, exact, magnitude, storage, outside, c) -> list:
    """What is wrong with `y` (reduced in place from `x`; a view of `outside`, a copy of `storage`, or a leaf of its
    own if `outside` is None) against the reference sum `exact`."""
    if out is not y or y.dtype != x.dtype or y.shape != x.shape:
        return ["not in place"]
    if outside is not None:  # what lies outside the view in its storage is untouched
        mask = torch.ones(storage.numel(), dtype=torch.bool)
        mask[torch.arange(storage.numel()).as_strided(x.shape, x.stride(), x.storage_offset()).reshape(-1)] = False
        if not torch.equal(outside[mask], storage[mask]):
            return ["wrote outside the view"]
    if not x.is_floating_point():
        return [] if torch.equal(y, exact) else [f"integer sum off by up to {(y - exact).abs().max()}"]
    # Summed in float32 (or float64) and rounded once to the dtype: within the dtype's relative
    # precision of the exact sum, scaled by the sum of magnitudes (cancellation) and one unit.
    # (gloo's builtin sums low precision hop by hop in that precision and would not pass for fp16.)
    err = (y.detach().double() - exact).abs()
    if c["numel"] and not bool((err <= RTOL[c["dtype"]] * (magnitude + 1)).all()):
        return [float(err.max())]
    return []


@pytest.mark.parametrize("world", [pytest.param(1, marks=pytest.mark.slow), 2, 3,
                                   pytest.param(4, marks=pytest.mark.slow)])
# no shrinking: every example is a multi-process job (seconds), and a failure lists each failing case already
@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture],
          phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(cases=st.lists(case, min_size=4, max_size=8))
def test_every_algorithm_matches_builtin(world, cases):
    results = workers(check_worker, world, cases)
    assert all(r == [] for r in results.values()), results


def test_low_precision_is_summed_in_float32():
    """fp16 values whose fp16 running sum would lose the small ones."""
    results = workers(low_precision_worker, 4)
    assert all(results.values()), results


def low_precision_worker():
    env = rdist.init("cpu")
    # rank 0 holds 2048, the others 0.5 each: fp16 hop-by-hop sums would round 2048 + 0.5 to 2048
    x = torch.full((1000,), 2048.0 if env.rank == 0 else 0.5, dtype=torch.float16)
    # 2048 + 3 x 0.5 = 2049.5, which fp16 rounds to 2050 (its spacing at 2048 is 2); summing in fp16 hop
    # by hop gives 2048 + 0.5 -> 2048 at every hop instead
    ok = True
    for algo, opts in (("ring", {}), ("naive", {}), ("hierarchical", {"nodes": 2})):
        y = comm.all_reduce(x.clone(), algo, **opts)
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


SAFETY_ALGOS = [("ring", {}), ("naive", {}), ("hierarchical", {"nodes": 2}),
                ("hierarchical", {"nodes": 2, "variant": "leader"}), ("builtin", {})]


def user_inputs(rank: int) -> dict:
    """What users pass that the collectives once got wrong: strided views, leaves that require grad, integers
    whose sums float32 cannot hold (int32 wraps around)."""
    m = torch.arange(12.0).view(3, 4) + rank
    return {"every_other": (torch.arange(11.0) + rank)[::2], "columns": m[:, ::2], "transposed": m.t(),
            "leaf32": torch.full((5,), 1.5 + rank, requires_grad=True),
            "leaf16": torch.full((5,), 1.5 + rank, dtype=torch.float16, requires_grad=True),
            "int64": torch.full((3,), 2**40 + 1, dtype=torch.int64), "int32": torch.full((3,), 2**30 + 1 + rank,
                                                                                       dtype=torch.int32),
            "complex": torch.full((4,), 1 + 2j * rank, dtype=torch.complex64)}


def safety_worker():
    """3 ranks, subgroup [0, 2] (rank 1 outside): every algorithm on user_inputs against dist.all_reduce; then the
    mistakes that must raise the same error on every rank and leave the group usable."""
    env = rdist.init("cpu")
    sub, spare = dist.new_group([0, 2]), dist.new_group([0, 2])
    out, inside = {}, env.rank != 1
    for algo, opts in SAFETY_ALGOS:
        name = algo + opts.get("variant", "")
        for what, x in user_inputs(env.rank).items():
            before = x.detach().clone()
            ref = x.detach().clone().contiguous()
            if inside:
                dist.all_reduce(ref, group=sub)
            y = comm.all_reduce(x, algo, group=sub, **opts)
            expected = ref if inside else before  # outside the group: untouched, as torch's own
            same = torch.equal(y, expected) if not y.is_floating_point() else torch.allclose(y.detach(), expected)
            out[f"{name} {what}"] = y is x and same
    # later group creation by every rank is not desynchronised by the hierarchical calls on a subgroup
    g = dist.new_group()
    t = torch.ones(1)
    dist.all_reduce(t, group=g)
    out["new_group after"] = float(t) == 3.0
    if inside:
        out["mismatch"] = raised(lambda: comm.all_reduce(torch.ones(10 + env.rank), "ring", group=sub))
        out["bool on one rank"] = raised(lambda: comm.all_reduce(
            torch.ones(4, dtype=torch.bool if env.rank == 2 else torch.float32), "naive", group=sub))
        out["usable after"] = float(comm.all_reduce(torch.ones(3), "ring", group=sub).sum()) == 6.0
        out["unknown option"] = raised(lambda: comm.all_reduce(torch.ones(3), "ring", group=sub, nodes=2))
        out["nodes on one rank"] = raised(lambda: comm.all_reduce(torch.ones(4), "hierarchical", group=sub,
                                                                  nodes=1 + env.rank // 2))
        out["usable after all"] = float(comm.all_reduce(torch.ones(3), "hierarchical", group=sub).sum()) == 6.0
        if env.rank == 0:  # rank 2 never joins: the error says the group is spent
            out["part-way"] = raised(lambda: comm.all_reduce(torch.ones(8), "ring", group=spare, check=False,
                                                             timeout_s=2))
        else:
            time.sleep(4)
    rdist.cleanup()
    return out


def raised(call) -> str:
    try:
        call()
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return "no error"


def test_collectives_are_safe_on_what_users_pass():
    results = workers(safety_worker, 3)
    for rank, out in results.items():
        wrong = [k for k, v in out.items() if v is False]
        assert not wrong, (rank, wrong)
    for rank in (0, 2):
        out = results[rank]
        assert out["mismatch"].startswith("ValueError: ring all-reduce: every rank must pass the same size"), out
        assert "rank 0: ring of 10 x float32, rank 2: ring of 12 x float32" in out["mismatch"], out
        assert out["unknown option"].startswith("TypeError: ring all-reduce takes no option 'nodes'"), out
        assert out["nodes on one rank"].startswith("ValueError: hierarchical all-reduce: every rank must pass"), out
    # the rank that passed a bool hears its own error; the other, which rank did
    assert results[0]["bool on one rank"] == ("ValueError: naive all-reduce: rank 2: bool tensors have no sum here: "
                                              "convert to an integer dtype"), results[0]
    assert results[2]["bool on one rank"].startswith("ValueError: naive all-reduce: bool tensors have no sum"), \
        results[2]
    assert "nothing from rank 2" in results[0]["part-way"], results[0]
    assert "do not use the group again" in results[0]["part-way"], results[0]
