"""The two-phase compressed all-reduce (ringexp.comm.two_phase through ringexp.compress) against a plain reference
written here: the same compression applied chunk by chunk, every rank's and every owner's error feedback kept by
hand, bit for bit, on real gloo groups."""

import dataclasses
import os
import signal

import pytest
import torch
import torch.distributed as dist
from helpers.processes import run_cli, workers
from helpers.runs import RUN, losses, start, strategy_cfg, wait_for_step
from torch import nn

import ringexp
from ringexp import compress, parallel, validate
from ringexp import dist as rdist
from ringexp.config import CompressionConfig, StrategyName
from ringexp.errors import ConfigError
from ringexp.parallel.hooks import compressor

M = compress.COMPRESSORS


def cfg(name, **kw):
    return CompressionConfig(name=name, collective="two_phase", ratio=0.05, block=64, error_feedback=True, **kw)


def chunks(numel: int, p: int) -> list:
    base, extra = divmod(numel, p)
    sizes = [base + (q < extra) for q in range(p)]
    starts = [sum(sizes[:q]) for q in range(p)]
    return [(s, s + n) for s, n in zip(starts, sizes, strict=True)]


def clip(layout, lo, hi):
    if layout is None:
        return None
    out, start = [], 0
    for size in layout:
        if min(start + size, hi) > max(start, lo):
            out.append(min(start + size, hi) - max(start, lo))
        start += size
    return out


def grad(rank: int, step: int, numel: int, dtype):
    g = torch.Generator().manual_seed(7919 * rank + 104729 * step + numel)
    return (torch.randn(numel, generator=g) * (1 + rank)).to(dtype)


def reference(name, c, p: int, numel: int, dtype, steps: int, layout=None) -> list:
    """Every step's result for rank r's input grad(r, step), cast to the gradients' dtype."""
    inputs = [[grad(r, step, numel, dtype).float() for r in range(p)] for step in range(steps)]
    return [out.to(dtype) for out in phases(name, c, inputs, layout)]


def phases(name, c, inputs: list, layout=None, offset: int = 0) -> list:
    """The two phases by hand over inputs[step][rank] (float32): rank r adds its residual, encodes each chunk,
    keeps what that lost; owner q sums the p decoded payloads of chunk q in rank order, adds its residual, encodes
    again, keeps what that lost; every rank decodes every owner's payload. No residual is kept from step 0 (DDP
    may rebuild its buckets there). `offset`: where the inputs start in the bucket `layout` describes."""
    m, p, numel = M[name], len(inputs[0]), inputs[0][0].numel()
    bounds = chunks(numel, p)
    worker, owner, results = [None] * p, [None] * p, []
    for step, xs in enumerate(inputs):
        ctxs = [compress.context(c, step, 0, clip(layout, offset + b, offset + e)) for b, e in bounds]
        xs = [x if worker[r] is None else x + worker[r] for r, x in enumerate(xs)]
        payloads = [[m.encode(x[b:e], c, ctxs[q]) for q, (b, e) in enumerate(bounds)] for x in xs]
        out = torch.empty(numel)
        for q, (b, e) in enumerate(bounds):
            total = torch.zeros(e - b)
            for r in range(p):
                m.add_into(payloads[r][q], total, c) if hasattr(m, "add_into") else \
                    total.add_(m.decode(payloads[r][q], e - b, c, ctxs[q]))
            total = total if owner[q] is None else total + owner[q]
            final = m.encode(total, c, ctxs[q])
            out[b:e] = m.decode(final, e - b, c, ctxs[q])
            owner[q] = total - out[b:e] if step else None
        for r in range(p):
            sent = torch.cat([m.decode(payloads[r][q], e - b, c, ctxs[q]) for q, (b, e) in enumerate(bounds)])
            worker[r] = xs[r] - sent if step else None
        results.append(out)
    return results


def bytegrad(name, c, world: int, nodes: int, numel: int, steps: int, layout, variant: str) -> list:
    """hierarchical with the two phases between nodes, by hand: node sums exact (the inputs are small integers, so
    any order gives the same sum); two_level: local rank i's shard is chunk (i + 1) mod m of its node's sum (where
    the node's ring reduce-scatter leaves it), and the ranks with the same local index run the two phases on it;
    leader: the node's first ranks run them on the whole node sum."""
    m = world // nodes
    sums = [[sum(small(k * m + i, step, numel) for i in range(m)) for k in range(nodes)] for step in range(steps)]
    if variant == "leader":
        return phases(name, c, sums, layout)
    out = [torch.empty(numel) for _ in range(steps)]
    for i in range(m):
        b, e = chunks(numel, m)[(i + 1) % m]
        shard = phases(name, c, [[s[b:e] for s in node] for node in sums], layout, offset=b)
        for step in range(steps):
            out[step][b:e] = shard[step]
    return out


def small(rank: int, step: int, numel: int):
    g = torch.Generator().manual_seed(31 * rank + 1009 * step + numel)
    return torch.randint(-8, 9, (numel,), generator=g).float()


def bytegrad_worker(cases):
    env = rdist.init("cpu")
    failures = []
    for name, nodes, numel, steps, layout, variant in cases:
        c = cfg(name, scope="inter_node")
        state = compress.State(c)
        got = [compress.all_reduce(small(env.rank, step, numel), "hierarchical", state, 0, None, layout,
                                   nodes=nodes, variant=variant) for step in range(steps)]
        if env.rank == 0:
            want = bytegrad(name, c, env.world_size, nodes, numel, steps, layout, variant)
            if not all(torch.equal(g, w) for g, w in zip(got, want, strict=True)):
                failures.append((name, nodes, numel, variant))
        if not all(torch.equal(g, h) for g, h in zip(got, [broadcast(g) for g in got], strict=True)):
            failures.append((name, nodes, numel, variant, "ranks differ"))
    rdist.cleanup()
    return failures


def broadcast(t):
    t = t.clone()
    dist.broadcast(t, 0)
    return t


@pytest.mark.parametrize("world,nodes", [(4, 2), (6, 3)])
def test_hierarchical_runs_the_two_phases_between_nodes_only(world, nodes):
    """ByteGrad's shape (+parallel=hierarchical_bytegrad): exact inside a node, the two phases with both error
    feedbacks between nodes, bit for bit against the reference; both variants, sign with a layout."""
    cases = [(name, nodes, numel, 3, None, "two_level") for name in LOSSY for numel in (5, 2001)]
    cases += [("sign", nodes, 2001, 3, [700, 1300, 1], v) for v in ("two_level", "leader")]
    cases += [("int8", nodes, 2001, 3, None, "leader")]
    results = workers(bytegrad_worker, world, cases)
    assert all(r == [] for r in results.values()), results


def case_worker(cases):
    env = rdist.init("cpu")
    failures = []
    for name, numel, dname, members, steps, layout in cases:
        dtype, c = getattr(torch, dname), cfg(name)
        group = None if members is None else dist.new_group(members)
        if members is not None and env.rank not in members:
            continue
        me = env.rank if members is None else members.index(env.rank)
        p = env.world_size if members is None else len(members)
        state = compress.State(c)
        got = [compress.all_reduce(grad(me, step, numel, dtype), "builtin", state, 0, group, layout)
               for step in range(steps)]
        everyone = [[torch.empty_like(g) for _ in range(p)] for g in got]
        for mine, theirs in zip(got, everyone, strict=True):
            dist.all_gather(theirs, mine, group=group)
        if me == 0:  # the reference once, against every rank's results
            want = reference(name, c, p, numel, dtype, steps, layout)
            bad = [(step, r) for step in range(steps) for r in range(p)
                   if not torch.equal(everyone[step][r], want[step])]
            if bad:
                failures.append((name, numel, dname, members, "step, rank differing:", bad[:3]))
    rdist.cleanup()
    return failures


LOSSY = ("sign", "topk", "int8")


@pytest.mark.parametrize("world", [2, 3, 4, 5, 8])
def test_two_phase_equals_the_chunk_by_chunk_reference_bit_for_bit(world):
    """Odd world sizes and lengths that leave chunks of unequal length (and empty ones: 3 elements over 8 ranks),
    fp32/bf16/fp16 gradients, three steps so that both residuals are used; sign with a parameter layout whose
    tensors straddle the chunks."""
    cases = [(name, numel, "float32", None, 3, None) for name in LOSSY for numel in (3, 1001, 40_000)]
    cases += [(name, 1001, dname, None, 2, None) for name in LOSSY for dname in ("bfloat16", "float16")]
    cases += [("sign", 1001, "float32", None, 3, [300, 1, 500, 200])]
    if world >= 4:  # a subgroup that is not the whole job and does not start at rank 0
        cases += [(name, 1001, "float32", list(range(1, world, 2 if world > 4 else 1)), 3, None) for name in LOSSY]
    results = workers(case_worker, world, cases)
    assert all(r == [] for r in results.values()), results
def tracking_worker(name: str, steps: int) -> list:
    env = rdist.init("cpu")
    seen = [tracking(name, ef, steps, env.rank) for ef in (True, False)]
    rdist.cleanup()
    return seen


def tracking(name: str, ef: bool, steps: int, rank: int) -> list:
    """After steps/4 and after all steps: |sum of what the collective returned - sum of the true gradients| /
    |sum of the true gradients|, and the largest residual norm held until then."""
    c = CompressionConfig(name=name, collective="two_phase", ratio=0.05, block=64, error_feedback=ef)
    state, numel = compress.State(c), 997
    mean = torch.linspace(-1, 1, numel)  # a steady descent direction under noise, as a gradient has
    got, true, seen, biggest = torch.zeros(numel), torch.zeros(numel), [], 0.0
    for step in range(steps):
        g = mean + torch.randn(numel, generator=torch.Generator().manual_seed(step * 13 + rank))
        got += compress.all_reduce(g.clone(), "builtin", state, 0)
        true += comm_sum(g)
        biggest = max([biggest, *[float(r.norm()) for r in (*state.residual.values(), *state.owner.values())]])
        if step + 1 in (steps // 4, steps):
            seen.append((float((got - true).norm() / true.norm()), biggest))
    return seen


def comm_sum(g):
    g = g.clone()
    dist.all_reduce(g)
    return g


@pytest.mark.parametrize("name", ["sign", "topk"])
def test_with_error_feedback_the_returned_sum_tracks_the_true_sum(name):
    """Both residuals stay bounded (no larger after 240 steps than after 60), so the distance between what the
    collective returned and the true sum stays bounded and its relative error falls like 1/steps; without error
    feedback the error stays."""
    [(early, held_early), (late, held_late)], [_, (plain, _)] = workers(tracking_worker, 3, name, 240)[0]
    assert held_late < 1.25 * held_early, (held_early, held_late)
    assert late < early / 2.5, (early, late)
    assert plain > 2 * late, (plain, late)


@pytest.mark.parametrize("p", [2, 4, 8])
def test_bytes_per_rank_stay_two_payloads_while_the_all_gather_grows_with_p(p):
    """What a run records (compress.wire_bytes): through the two phases at most 2(p-1)/p of the payload of n
    elements plus a header per chunk; through the all-gather (p-1) payloads."""
    numel, layout = 1_000_003, [torch.Size([500_000]), torch.Size([500_003])]
    for name in LOSSY:
        two = compress.wire_bytes(cfg(name), "builtin", numel, p, layout)
        gather = compress.wire_bytes(CompressionConfig(name=name, collective="all_gather", ratio=0.05, block=64),
                                     "builtin", numel, p, layout)
        payload = compress.payload_bytes(cfg(name), numel, [500_000, 500_003])
        assert two <= 2 * (p - 1) / p * payload + 2 * (p - 1) * 16, (name, p, two, payload)
        assert gather == (p - 1) * payload
        assert two < gather or p == 2


def seed_worker() -> str:
    """Rank 1's compressor thinks it is three steps further (its state restored from another checkpoint)."""
    env = rdist.init("cpu")
    state = compress.State(CompressionConfig(name="randomk", ratio=0.1))
    agreed = compress.all_reduce(torch.ones(1000), "builtin", state, 0)  # step 0 on both: summed
    if env.rank == 1:
        state.steps[0] = 4
    try:
        compress.all_reduce(torch.ones(1000), "ring", state, 0)
        said = "no error"
    except RuntimeError as e:
        said = str(e)
    rdist.cleanup()
    return said if float(agreed.sum()) == 2 * 100 else f"the agreed step summed {float(agreed.sum())}"


def test_random_k_ranks_that_disagree_on_the_seed_are_stopped_not_summed():
    said = workers(seed_worker, 2)
    assert all("disagree on the shared seed" in s for s in said.values()), said


def test_auto_takes_the_two_phases_from_three_ranks_and_keeps_what_they_cannot_carry():
    c = CompressionConfig(name="sign")
    assert [compress.route(c, "builtin", p) for p in (2, 3, 8)] == ["gather", "two_phase", "two_phase"]
    assert compress.route(CompressionConfig(name="topk", momentum_correction=True), "builtin", 8) == "gather"
    assert compress.route(CompressionConfig(name="int8"), "ring", 8) == "wire"  # re-encoded at every hop
    assert compress.route(CompressionConfig(name="int8"), "builtin", 8) == "two_phase"
    assert compress.route(CompressionConfig(name="randomk"), "builtin", 8) == "sum"
    bytegrad = CompressionConfig(name="int8", scope="inter_node", collective="two_phase", error_feedback=True)
    assert compress.refusal(bytegrad, "hierarchical", "+parallel=hierarchical_bytegrad") is None
    assert "no two-phase form" in compress.refusal(CompressionConfig(name="randomk", collective="two_phase"),
                                                   "builtin", "+parallel=ddp")


@pytest.mark.slow
def test_a_killed_two_phase_run_resumes_bit_for_bit(tmp_path):
    """Sign through the two phases at 3 ranks (collective=auto), the job killed after step 8: resume=auto restores
    both residuals of every bucket from the step-5 checkpoint and every later loss is the uninterrupted run's."""
    over = [*RUN, "+parallel=ddp_sign", "launcher.nproc_per_node=3", "steps=14"]
    ref = run_cli(tmp_path / "ref", *over)
    assert ref.returncode == 0, ref.stderr[-3000:]
    proc = start(tmp_path / "run", *over)
    wait_for_step(proc, tmp_path / "run", 8)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    r = run_cli(tmp_path / "run", *over, "resume=auto")
    assert r.returncode == 0, r.stderr[-3000:]
    want, got = losses(tmp_path / "ref"), losses(tmp_path / "run")
    assert sorted(got) == sorted(want) and all(got[s] == want[s] for s in want), (want, got)


def library_worker() -> bool:
    """ringexp.all_reduce(..., compression=) on a bf16 view, twice with one State (its error feedback used)."""
    env = rdist.init("cpu")
    c = {"name": "sign", "error_feedback": True}
    state, got = compressor(c, "builtin"), []
    for step in range(2):
        t = grad(env.rank, step, 2002, torch.bfloat16)[::2]  # a strided view: 1001 elements
        ringexp.all_reduce(t, "builtin", compression=state)
        got.append(t.clone())
    one = ringexp.all_reduce(grad(env.rank, 0, 2002, torch.float32)[::2].contiguous(), "builtin", compression="sign")
    rdist.cleanup()
    inputs = [[grad(r, step, 2002, torch.bfloat16)[::2].float() for r in range(env.world_size)] for step in range(2)]
    want = phases("sign", CompressionConfig(name="sign"), inputs)
    fresh = phases("sign", CompressionConfig(name="sign"), [[grad(r, 0, 2002, torch.float32)[::2] for r in
                                                             range(env.world_size)]])
    same = all(torch.equal(g, w.to(torch.bfloat16)) for g, w in zip(got, want, strict=True))
    return same and torch.equal(one, fresh[0])


def test_the_library_all_reduce_takes_a_compressor_and_keeps_its_error_feedback():
    assert all(workers(library_worker, 3).values())


def collective_choices() -> dict:
    """Every compressor x strategy x compression.collective named, through the checks a run makes before any worker
    starts (validate.check): {(strategy, compressor, collective): its one-line refusal, or None (accepted)}."""
    out = {}
    for strategy in map(str, StrategyName):
        base = strategy_cfg(strategy, 1 if strategy == "single" else 2)
        for name in compress.COMPRESSORS:
            for collective in ("two_phase", "all_gather"):
                cfg = dataclasses.replace(base, compression=CompressionConfig(name=name, collective=collective))
                try:
                    validate.check(cfg)
                    out[strategy, name, collective] = None
                except ConfigError as e:
                    out[strategy, name, collective] = str(e)
    return out


def taken_worker(cases) -> dict:
    """The path each case's buckets really take in DDP after one backward: the route of ringexp's hook, which ran
    its compressor, or PyTorch's own hook."""
    env = rdist.init("cpu")
    bases, taken = {}, {}
    for strategy, name, collective in cases:
        base = bases.setdefault(strategy, strategy_cfg(strategy, env.world_size))
        c = CompressionConfig(name=name, collective=collective)
        strat = parallel.build(dataclasses.replace(base, compression=c), env)
        model = strat.wrap(nn.Linear(8, 4))
        model(torch.randn(2, 8)).sum().backward()
        state = strat.state_dict()
        taken[strategy, name, collective] = (compress.route(c, strat.algorithm, env.world_size)
                                             if state and state["steps"] else "PyTorch's hook")
        strat.close()
    rdist.cleanup()
    return taken


def test_a_collective_named_is_the_one_taken_or_refused_in_one_line():
    """compression.collective=two_phase is never ignored: every combination the checks accept sends its buckets in
    two phases in a real DDP step (fp16/bf16 on ddp: through ringexp's hook, not PyTorch's cast hook), and every
    other one is refused in one line before any worker starts. all_gather only forbids two phases: accepted
    everywhere (the recorded sweeps set it for every preset), it never sends a bucket in two phases."""
    choices = collective_choices()
    assert all("\n" not in why and len(why) < 300 for why in choices.values() if why), choices
    for case, words in [(("ddp", "none", "two_phase"), "nothing is compressed"),
                        (("ddp", "powersgd", "two_phase"), "PowerSGD all-reduces its factors"),
                        (("fsdp", "fp16", "two_phase"), "+parallel=fsdp reduces gradients itself"),
                        (("ddp", "randomk", "two_phase"), "randomk has no two-phase form"),
                        (("naive", "randomk", "two_phase"), "randomk has no two-phase form")]:
        assert words in (choices[case] or ""), (case, choices[case])
    assert not [why for case, why in choices.items() if case[2] == "all_gather" and "collective" in (why or "")]
    hooked = {"ddp", "ring", "hierarchical", "naive"}  # (the strategies whose buckets ringexp's hook may compress)
    accepted = [case for case, why in choices.items() if why is None and case[0] in hooked
                and case[1] not in ("none", "powersgd")]  # (nothing compressed; PyTorch's PowerSGD hook)
    assert ("ddp", "fp16", "two_phase") in accepted and ("hierarchical", "sign", "all_gather") in accepted
    for got in workers(taken_worker, 2, accepted).values():
        assert all((got[case] == "two_phase") == (case[2] == "two_phase") for case in accepted), got
