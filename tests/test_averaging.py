"""Periodic model averaging (parallel.strategy=local_sgd, diloco) on real gloo groups: against a plain reference
written here at 2, 3 and 4 ranks and hierarchical (2 x 2), against DDP at period 1, and the traps users of
PyTorch's averagers hit (frozen parameters, several parameter groups, the outer step's sign, resumption)."""

import copy
import dataclasses

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from helpers.processes import run_cli, workers
from helpers.runs import KILL_CASES, TINY, kill_and_resume, reference_losses, strategy_cfg
from torch import nn

from ringexp import compress, parallel, records
from ringexp import dist as rdist
from ringexp.config import CompressionConfig
from ringexp.errors import ConfigError
from ringexp.models import small_cnn
from ringexp.parallel.base import unwrap
from ringexp.validate import compose_config

references = pytest.fixture(scope="module")(lambda tmp_path_factory: reference_losses(
    lambda: tmp_path_factory.mktemp("averaging-refs")))


def batch(step: int, rank: int):
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(4, 3, 12, 12, generator=g), torch.randint(0, 2, (4, 5), generator=g).float()


def config(strategy: str, world: int, steps: int, compression: str = "none", **parallel_overrides):
    cfg = strategy_cfg(strategy, world, **parallel_overrides)
    return dataclasses.replace(cfg, steps=steps, compression=CompressionConfig(name=compression))


def trained(cfg, env, model, steps: int, groups: int = 1):
    """`steps` steps of SGD with momentum through the strategy, as the trainer takes them; the strategy."""
    strat = parallel.build(cfg, env)
    wrapped = strat.wrap(model)
    params = list(wrapped.parameters())
    opt = torch.optim.SGD([{"params": params[i::groups]} for i in range(groups)], lr=0.1, momentum=0.9,
                          weight_decay=1e-4)
    for step in range(1, steps + 1):
        x, y = batch(step, env.rank)
        with strat.no_sync(wrapped, True):
            F.binary_cross_entropy_with_logits(wrapped(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        strat.after_step(step)
    return strat, wrapped


def reference(cfg, env, model, steps: int, nodes: int = 1):
    """The same steps written plainly: DDP's averaged gradients during the warm-up (and inside a node with
    within_node), each fragment's pseudo-gradient (anchor - local) averaged at its staggered step, an outer SGD step
    (Nesterov) on the anchors, floating-point buffers averaged with fragment 0; every fragment at the last step."""
    p, world = cfg.parallel, env.world_size
    per = world // nodes
    node_groups = [dist.new_group(list(range(n * per, (n + 1) * per))) for n in range(nodes)]
    mine = node_groups[env.rank // per]
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=1e-4)
    parts = fragments(params, p.fragments)
    outer_lr, outer_m = (p.outer_lr, p.outer_momentum) if cfg.parallel.strategy == "diloco" else (1.0, 0.0)
    anchors = [q.detach().clone() for q in params]
    moms = [torch.zeros_like(q) for q in params]
    buffers = [b for b in model.buffers() if b.is_floating_point()]
    for step in range(1, steps + 1):
        x, y = batch(step, env.rank)
        F.binary_cross_entropy_with_logits(model(x), y).backward()
        if step <= p.warmup_steps or p.within_node:
            group = None if step <= p.warmup_steps else mine
            for q in params:
                dist.all_reduce(q.grad, group=group)
                q.grad /= world if group is None else per
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step == p.warmup_steps:
            anchors = [q.detach().clone() for q in params]
        local = step - p.warmup_steps
        for i, part in enumerate(parts):
            if local <= 0 or not (step == steps or local % p.period == i * p.period // len(parts)):
                continue
            for k in part:
                g = anchors[k] - params[k].detach()
                dist.all_reduce(g)
                g /= world
                moms[k] = outer_m * moms[k] + g
                anchors[k] -= outer_lr * (g + outer_m * moms[k] if outer_m else g)
                params[k].data.copy_(anchors[k])
            if i == 0:
                for b in buffers:
                    dist.all_reduce(b)
                    b /= world
    return model


def fragments(params: list, n: int) -> list:
    """Parameter indices in n contiguous parts of about equal size (the same rule as the strategy's)."""
    total, parts, part, filled = sum(q.numel() for q in params), [], [], 0
    for k, q in enumerate(params):
        part.append(k)
        filled += q.numel()
        if n - len(parts) - 1 and (filled >= total * (len(parts) + 1) / n or len(params) - k - 1 == n - len(parts) - 1):
            parts.append(part)
            part = []
    return [*parts, part] if part else parts


def against_reference_worker(strategy: str, steps: int, nodes: int, overrides: dict):
    env = rdist.init("cpu")
    cfg = config(strategy, env.world_size, steps, nodes=nodes if nodes > 1 else None, **overrides)
    torch.manual_seed(0)
    model = small_cnn(5, width=8)
    plain = copy.deepcopy(model)
    strat, wrapped = trained(cfg, env, model, steps)
    ref = reference(cfg, env, plain, steps, nodes)
    got = dict(unwrap(wrapped).state_dict())
    worst = max(float((got[k].float() - v.float()).abs().max()) for k, v in ref.state_dict().items())
    syncs = strat.synchronizations()["count"]
    strat.close()
    rdist.cleanup()
    return worst, syncs


CASES = [  # (strategy, ranks, nodes, parallel overrides)
    ("local_sgd", 2, 1, {"period": 2, "warmup_steps": 2}),
    ("diloco", 3, 1, {"period": 3, "fragments": 2, "warmup_steps": 0}),
    ("diloco", 4, 1, {"period": 2, "fragments": 3, "outer_lr": 0.5, "outer_momentum": 0.8, "averaging": "ring"}),
    ("local_sgd", 4, 2, {"period": 3, "warmup_steps": 1, "within_node": True}),  # hierarchical: 2 nodes x 2
    ("diloco", 4, 2, {"period": 2, "averaging": "hierarchical"}),
]


@pytest.mark.parametrize("strategy,ranks,nodes,overrides", CASES)
def test_averaging_matches_a_plain_reference(strategy, ranks, nodes, overrides):
    out = workers(against_reference_worker, ranks, strategy, 7, nodes, overrides)
    for worst, syncs in out.values():
        assert worst < 1e-5 and syncs > 0, (worst, syncs)


def period_one_worker():
    """local_sgd and diloco (outer_lr 1, momentum 0) at period 1 against DDP: the same weights."""
    env = rdist.init("cpu")
    weights = {}
    for name, extra in [("ddp", {}), ("local_sgd", {"period": 1, "warmup_steps": 0}),
                        ("diloco", {"period": 1, "outer_lr": 1.0, "outer_momentum": 0.0})]:
        torch.manual_seed(0)
        strat, wrapped = trained(config(name, env.world_size, 5, **extra), env, small_cnn(5, width=8), 5)
        weights[name] = torch.cat([q.detach().flatten() for q in wrapped.parameters()])
        strat.close()
    rdist.cleanup()
    return {k: float((w - weights["ddp"]).abs().max()) for k, w in weights.items()}


def test_period_one_without_an_outer_optimizer_gives_ddp_s_weights():
    for diffs in workers(period_one_worker, 2).values():
        assert diffs["local_sgd"] < 1e-5 and diffs["diloco"] < 1e-5, diffs


class Quadratic(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(6))
        self.frozen = nn.Parameter(torch.ones(3), requires_grad=False)
        self.unused = nn.Parameter(torch.full((2,), 5.0))


def quadratic_worker():
    """Two ranks pull w towards targets of their own (their mean: 1). An outer Nesterov step must bring the
    global model closer to the mean than the anchor was (downhill); frozen and unused parameters never move."""
    env = rdist.init("cpu")
    cfg = config("diloco", 2, 4, period=4, outer_lr=0.7, outer_momentum=0.9)
    strat = parallel.build(cfg, env)
    wrapped = strat.wrap(Quadratic())
    model = unwrap(wrapped)
    target = torch.full((6,), 0.5 + env.rank)
    opt = torch.optim.SGD([q for q in model.parameters() if q.requires_grad], lr=0.1)
    before = float(((model.w.detach() - 1) ** 2).sum())
    for step in range(1, 5):
        with strat.no_sync(wrapped, True):
            ((model.w - target) ** 2).sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        strat.after_step(step)
    after = float(((model.w.detach() - 1) ** 2).sum())
    out = before, after, model.frozen.tolist(), model.unused.tolist(), float(model.w[0])
    strat.close()
    rdist.cleanup()
    return out


def test_the_outer_step_goes_downhill_and_leaves_frozen_and_unused_parameters_alone():
    out = workers(quadratic_worker, 2)
    (before, after, frozen, unused, w0), (_, _, _, _, w0_other) = out[0], out[1]
    assert after < 0.1 * before, (before, after)
    assert frozen == [1.0] * 3 and unused == [5.0] * 2
    assert w0 == w0_other  # synchronised: every rank holds the same model


def groups_worker():
    """Two parameter groups: the schedule counts optimizer steps, not groups (pytorch#74737)."""
    env = rdist.init("cpu")
    torch.manual_seed(0)
    strat, _ = trained(config("local_sgd", 2, 8, period=2, warmup_steps=0), env, small_cnn(5, width=8), 8, groups=2)
    count = strat.synchronizations()["count"]
    strat.close()
    rdist.cleanup()
    return count


def test_several_parameter_groups_synchronise_once_per_period():
    assert set(workers(groups_worker, 2).values()) == {4}


@pytest.mark.slow
def test_a_killed_diloco_run_with_a_compressed_outer_gradient_resumes_bit_for_bit(tmp_path, references):
    """Period 3, two fragments, sign with error feedback: by the checkpoint at step 5 the anchors, the outer
    momentum, the residuals and the local weights all differ from their start; the resumed run's every loss is the
    uninterrupted one's."""
    assert ("diloco+fast", "rank1", True) not in KILL_CASES
    kill_and_resume(tmp_path / "run", "diloco+fast", "rank1", True, references)


@pytest.mark.parametrize("override,says", [
    ("parallel.period=0", "parallel.period=0: synchronise at least every step"),
    ("parallel.outer_lr=0", "parallel.outer_lr=0.0: must be > 0"),
    ("parallel.outer_momentum=1", "parallel.outer_momentum=1.0: must be in [0, 1)"),
    ("parallel.fragments=500", "parallel.fragments=500: the model has 20 trainable tensors"),
    ("parallel.period=500", "parallel.period=500 is longer than the 30 local steps"),
])
def test_bad_averaging_settings_are_refused_in_one_line(override, says):
    with pytest.raises(ConfigError) as e:
        compose_config(["+parallel=diloco", "steps=30", override])
    assert says in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_averaging_settings_on_fsdp_are_refused():
    with pytest.raises(ConfigError) as e:
        compose_config(["+parallel=fsdp", "parallel.period=4"])
    assert "only local_sgd and diloco synchronise models periodically" in str(e.value)


def test_a_run_records_its_synchronizations_and_times_them_as_exposed_communication(tmp_path):
    """local_sgd at period 3 for 12 steps with fp16 pseudo-gradients: 4 synchronizations (steps 3, 6, 9, 12), the
    bytes of one as the compressor sends them, a third of that per step; rows logged at steps 5 and 10, neither of
    which synchronized, still show the synchronizations since the previous row as exposed communication."""
    run = tmp_path / "run"
    r = run_cli(run, *TINY, "+parallel=local_sgd", "parallel.period=3", "parallel.warmup_steps=0", "compression=fp16",
                "logger.log_every=5", "eval_every=12")
    assert r.returncode == 0, r.stderr[-3000:]
    s = records.read_summary(run)
    cfg = compose_config(["+parallel=local_sgd", "compression=fp16"])
    numel = s["grad_bytes"] // 4
    one = compress.wire_bytes(cfg.compression, "builtin", numel, 2)
    assert s["synchronizations"] | {"bytes_per_sync": one} == s["synchronizations"]
    assert s["synchronizations"]["count"] == 4 and s["wire_bytes_per_rank_per_step"] == one // 3, s
    rows = {row["step"]: row for row in records.read_rows(run)}
    for step in (5, 10):  # (the step's time holds its share of them: the parts add up to it, the share is < 100%)
        assert rows[step]["time/exposed_comm_s"] > 0 and rows[step]["time/comm_s"] > 0, rows[step]
        parts = sum(rows[step][f"time/{k}"] for k in ("data_s", "compute_s", "exposed_comm_s", "optimizer_s"))
        assert rows[step]["time/exposed_comm_s"] < rows[step]["time/step_s"] == pytest.approx(
            parts + rows[step]["time/other_s"]) and rows[step]["time/other_s"] > -1e-6, rows[step]
