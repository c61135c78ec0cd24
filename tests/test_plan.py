"""`python -m ringexp.plan`: the cost model's formulas against hand-computed cases, DDP's real buckets, calibrate
on a real gloo job, predict's table and files, compare's predicted columns, and bad input."""

import dataclasses
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import yaml
from helpers.processes import ROOT, error_line, plan_refusal, workers
from omegaconf import OmegaConf
from torch.nn.parallel import DistributedDataParallel as DDP

from ringexp import comm, compare, compress, parallel, predict, quality, records
from ringexp import dist as rdist
from ringexp.cluster import costmodel
from ringexp.cluster import files as clusters
from ringexp.cluster.schema import ClusterConfig, LinkConfig
from ringexp.compare import table as compare_table
from ringexp.config import CONF_DIR, CompressionConfig, TrainConfig
from ringexp.errors import ConfigError
from ringexp.models import build_model
from ringexp.parallel.ddp import bucket_shapes
from ringexp.plan import rules
from ringexp.plan.cli import main
from ringexp.plan.host import CODECS
from ringexp.validate import compose_config

# 2 nodes x 2 ranks; numbers chosen so that every term is easy to add up by hand
CL = ClusterConfig(name="hand", nodes=2, ranks_per_node=2, intra=LinkConfig(1e-5, 1e-9), inter=LinkConfig(1e-4, 1e-8),
                   add_s_per_byte=1e-10)
N = 4e6  # bytes


@pytest.mark.parametrize("name, expected", [
    # 6 steps of a 1e6-byte chunk paced by the inter link (1e-4 + 1e-2); the adds (3/4 of N at 1e-10) overlap.
    # (builtin is NCCL's own choice here, on an nccl cluster: tests/test_plan_nccl.py)
    ("ring", 6 * (1e-4 + 1e-2)),
    # ring of 2 in the node on 2e6-byte chunks; ring of 2 nodes, n/N = 2e6 bytes through each node link per step
    ("hierarchical", 2 * (1e-5 + 2e-3) + 2 * (1e-4 + 2e-2)),
    # gather one whole buffer and add it, ring of the 2 leaders on N, send one back
    ("hierarchical:leader", (1e-5 + 4e-3 + N * 1e-10) + 2 * (1e-4 + 2e-2) + (1e-5 + 4e-3)),
    # rank 0 receives 1 buffer inside its node and 2 over its link, sends as many back, adds 3
    ("naive", 2 * ((1e-5 + 4e-3) + 2 * (1e-4 + 4e-2)) + 3 * N * 1e-10),
])
def test_all_reduce_formulas_match_hand_computed_cases(name, expected):
    """Each collective's own formula (ringexp.comm.*.seconds), named as users and bench rows name them."""
    algorithm, options = comm.parse(name)
    assert comm.seconds(algorithm, CL, N, **options) == pytest.approx(expected, rel=1e-12)


def test_a_wire_format_shrinks_the_bytes_and_its_codec_sets_the_time_when_slower():
    # chunks of 5e5 wire bytes: 6 steps of 1e-4 + 5e-3; the codec (3 hops encode and decode-add 1e6 bytes each,
    # the last chunk encoded once, 3 decodes) is faster, so the wire sets the time
    fast = costmodel.Wire(ratio=0.5, encode=2e-10, decode=3e-10)
    assert comm.seconds("ring", CL, N, fast) == pytest.approx(6 * (1e-4 + 5e-3), rel=1e-12)
    slow = costmodel.Wire(ratio=0.5, encode=2e-10, decode=1e-8)  # now the arithmetic is the slower of the two
    assert comm.seconds("ring", CL, N, slow) == pytest.approx(3e6 * 2e-10 + 6e6 * 1e-8 + 1e6 * 2e-10)
    # on CPUs (gloo) the arithmetic and the network stack share the cores: the two add up
    cpu = dataclasses.replace(CL, backend="gloo")
    assert comm.seconds("ring", cpu, N, fast) == pytest.approx(
        6 * (1e-4 + 5e-3) + 3e6 * 2e-10 + 3e6 * 3e-10 + 1e6 * 2e-10 + 3e6 * 3e-10)
    assert comm.seconds("builtin", cpu, N) == pytest.approx(6 * (1e-4 + 1e-2) + 0.75 * N * 1e-10)
    # 64 MB: chunks of 16 MB in 2 segments of 8 MB (ringexp.comm.ring): the arithmetic of one segment shows
    slow64 = costmodel.Wire(ratio=0.5, encode=2e-10, decode=1e-8)
    wire, arithmetic = 6 * (1e-4 + 8e-2), 2 * 48e6 * 1e-8 + 48e6 * 2e-10 + 16e6 * 2e-10
    assert comm.seconds("ring", cpu, 16 * N, slow64) == pytest.approx(max(wire, arithmetic) + min(
        wire, arithmetic) / 2)
    inter_only = comm.seconds("hierarchical", CL, N, fast, scope="inter_node")
    assert 2 * (1e-4 + 1e-2) < inter_only < comm.seconds("hierarchical", CL, N)


@pytest.mark.parametrize("nodes, k", [(2, 2), (3, 1), (1, 4), (2, 4)])
def test_a_flat_two_phase_exchange_sends_each_node_s_off_node_messages_through_its_link_in_turn(nodes, k):
    """int8 through the two phases, codec free: each phase posts every rank's p - 1 chunk payloads at once, so a
    node's link carries k(p - k) of them (one rank per node: p - 1; one node: each rank's p - 1 on its own link).
    Counting p - 1 at two ranks per node predicted the local cluster's int8 exchange 1.7x too fast."""
    cl = rules.free_codec(dataclasses.replace(CL, nodes=nodes, ranks_per_node=k, add_s_per_byte=0.0))  # codec free
    p, c = nodes * k, CompressionConfig(name="int8")
    numel = int(N // 4)
    chunk = compress.wire_of(cl, c, numel, [numel]).ratio * N / p
    in_turn = k * (p - k) * costmodel.hop(cl.inter, chunk) if nodes > 1 else (p - 1) * costmodel.hop(cl.intra, chunk)
    assert compress.route(c, "builtin", p) == "two_phase"
    got = compress.seconds(cl, c, "builtin", (torch.Size([numel]),))
    assert got == pytest.approx(2 * in_turn + cl.call_s, rel=1e-12)


def test_an_all_to_all_runs_at_its_link_s_own_share_where_it_has_one():
    """A shaped TCP link's all-to-all (4 flows at once per node on the story's cluster) reaches less of the rate
    than a ring: a level's `all_to_all_efficiency` prices the two phases' messages (flat, and between nodes in the
    hierarchical form) and nothing else; without it, the level's efficiency."""
    slow = dataclasses.replace(CL.inter, efficiency=0.86, all_to_all_efficiency=0.43)
    cl = dataclasses.replace(CL, nodes=2, ranks_per_node=2, inter=slow)
    same = dataclasses.replace(cl, inter=dataclasses.replace(slow, all_to_all_efficiency=None))
    assert costmodel.crossing(slow, 1e6) == pytest.approx(slow.alpha_s + 1e6 * slow.beta_s_per_byte / 0.43)
    assert costmodel.crossing(same.inter, 1e6) == pytest.approx(costmodel.hop(same.inter, 1e6))
    assert costmodel.all_to_all_s(cl, 1e6) == pytest.approx(4 * costmodel.crossing(slow, 1e6))
    int8, shapes = CompressionConfig(name="int8"), (torch.Size([int(N // 4)]),)
    assert compress.seconds(cl, int8, "builtin", shapes) > 1.5 * compress.seconds(same, int8, "builtin", shapes)
    sign = CompressionConfig(name="sign", scope="inter_node")  # ByteGrad's shape: the phases between nodes only
    assert compress.route(sign, "hierarchical", 4) == "two_phase"
    assert compress.seconds(cl, sign, "hierarchical", shapes) > compress.seconds(same, sign, "hierarchical", shapes)
    for algorithm in ("builtin", "ring", "hierarchical"):  # rings (one flow each way) keep the level's share
        assert comm.seconds(algorithm, cl, N) == comm.seconds(algorithm, same, N)
    with pytest.raises(ConfigError, match="cluster.inter.all_to_all_efficiency=0"):
        ClusterConfig(inter=LinkConfig(all_to_all_efficiency=0.0))
    with pytest.raises(ConfigError, match=r"cluster.inter.tail_s=-0.01: must be in \[0, 60\] seconds"):
        ClusterConfig(inter=LinkConfig(tail_s=-0.01))
    with pytest.raises(ConfigError, match="cluster.jitter_s=nan"):
        ClusterConfig(jitter_s=float("nan"))


def test_a_synchronisation_waits_for_the_slowest_rank_as_many_normal_draws_would():
    """costmodel.straggle: e(p) x sqrt(jitter_s x window), e(p) the expected largest of p standard normal draws
    (against 20,000 simulated syncs, 2 to 1,000 ranks), nothing without jitter or with one rank."""
    g = torch.Generator().manual_seed(0)
    for p in (2, 4, 16, 1000):
        cl = dataclasses.replace(CL, nodes=p, ranks_per_node=1, jitter_s=2e-3)
        drawn = torch.randn(20_000, p, generator=g, dtype=torch.float64).max(dim=1).values.mean().item()
        assert costmodel.straggle(cl, 0.1) / (2e-3 * 0.1) ** 0.5 == pytest.approx(drawn, rel=0.05)
        assert costmodel.straggle(cl, 0.4) == pytest.approx(2 * costmodel.straggle(cl, 0.1))  # variance ~ time
    assert costmodel.straggle(dataclasses.replace(CL, jitter_s=0.0), 1.0) == 0.0
    assert costmodel.straggle(dataclasses.replace(CL, nodes=1, ranks_per_node=1, jitter_s=1e-3), 1.0) == 0.0


def test_every_collective_across_nodes_pays_the_link_s_tail_and_averaging_its_wait_and_buffers():
    """inter.tail_s is added once per collective call that crosses nodes and outlasts the link's queue (none on
    one node, none for a call the queue holds); local SGD's
    synchronisation adds the buffers' builtin all-reduce (a second call) and the wait for the slowest rank after
    `period` local steps, spread over the period; DDP waits once a step."""
    tail = dataclasses.replace(CL, inter=dataclasses.replace(CL.inter, tail_s=0.02))
    assert comm.seconds("ring", tail, N) - comm.seconds("ring", CL, N) == pytest.approx(0.02)
    took = comm.seconds("ring", CL, N) - CL.call_s  # a call within the link's queue overflows nothing: no tail
    for queue, paid in ((took * 1.01, 0.0), (took * 0.99, 0.02)):
        queued = dataclasses.replace(tail, inter=dataclasses.replace(tail.inter, queue_s=queue))
        assert comm.seconds("ring", queued, N) - comm.seconds("ring", CL, N) == pytest.approx(paid)
    one = dataclasses.replace(tail, nodes=1, ranks_per_node=4)
    assert comm.seconds("ring", one, N) == comm.seconds("ring", dataclasses.replace(one, inter=CL.inter), N)
    compute = {"forward_s": 0.01, "backward_s": 0.02, "optimizer_s": 0.005}
    both = dataclasses.replace(tail, jitter_s=1e-3)
    cfg = compose_config(["+parallel=local_sgd_hierarchical_int8", "model.width=8"])
    shapes = predict.gradient_shapes(cfg)
    extra = parallel.step_cost(both, cfg, shapes, compute)["step_s"] - parallel.step_cost(CL, cfg, shapes,
                                                                                        compute)["step_s"]
    assert extra == pytest.approx((2 * 0.02 + costmodel.straggle(both, 4 * 0.035)) / 4)
    ddp = compose_config(["+parallel=ddp", "model.width=8"])
    buckets = len(bucket_shapes(ddp, shapes))
    extra = parallel.step_cost(both, ddp, shapes, compute)["step_s"] - parallel.step_cost(CL, ddp, shapes,
                                                                                        compute)["step_s"]
    assert extra == pytest.approx(buckets * 0.02 + costmodel.straggle(both, 0.035))


def test_overlap_hides_what_backward_outlasts():
    # buckets ready at 1 s and 2 s of a 2 s backward, 1 s each: the second ends at 3 s, 1 s exposed
    assert costmodel.overlap([1.0, 2.0], [1.0, 1.0], backward_s=2.0) == (3.0, 1.0)
    compute = {"forward_s": 0.5, "backward_s": 2.0, "optimizer_s": 0.25}
    assert costmodel.step(2.0, 1.0, compute) == {"comm_s": 2.0, "exposed_s": 1.0, "step_s": 0.5 + 2.0 + 1.0 + 0.25}
    _, hidden = costmodel.overlap([1.5, 2.0], [0.1, 0.1], backward_s=2.0)
    assert hidden == pytest.approx(0.1)  # only the last bucket's all-reduce sticks out
    # accumulation: 4 micro-steps of compute, communication once
    assert costmodel.step(1.0, 1.0, compute | {"optimizer_s": 0.0}, micro_steps=4)["step_s"] == pytest.approx(
        4 * 2.5 + 1.0)
    # DDP's step: its buckets become ready in proportion to the gradient bytes backward has produced
    cfg = TrainConfig()
    cfg.parallel.bucket_cap_mb = 0.001  # one bucket per parameter
    shapes = [torch.Size([1000]), torch.Size([3000])]
    got = parallel.step_cost(CL, cfg, shapes, compute)
    comm_s = [compress.seconds(CL, cfg.compression, "builtin", b) for b in bucket_shapes(cfg, shapes)]
    sizes = [sum(s.numel() for s in b) for b in bucket_shapes(cfg, shapes)]
    _, exposed = costmodel.overlap([2.0 * sizes[0] / 4000, 2.0], comm_s, 2.0)
    assert got["exposed_s"] == pytest.approx(exposed) and got["comm_s"] == pytest.approx(sum(comm_s))
    assert got["samples_s"] == pytest.approx(4 * cfg.data.batch_size / got["step_s"])


def _ddp_bucket_bytes(cap_mb):
    """The bytes of every bucket DDP's hook is handed in the second step (after the reducer rebuilt them)."""
    rdist.init("cpu")
    torch.manual_seed(0)
    cfg = TrainConfig()
    cfg.model.name, cfg.parallel.bucket_cap_mb = "resnet18", cap_mb
    model = DDP(build_model(cfg.model, 8), bucket_cap_mb=cap_mb)
    seen = []

    def hook(_, bucket):
        seen.append(bucket.buffer().numel() * 4)
        fut = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut

    model.register_comm_hook(None, hook)
    for _ in range(2):
        seen.clear()
        model(torch.randn(2, 3, 32, 32)).sum().backward()
    shapes = [p.shape for p in model.module.parameters()]
    predicted = [4 * sum(s.numel() for s in b) for b in bucket_shapes(cfg, shapes)]
    rdist.cleanup()
    return seen, predicted


@pytest.mark.parametrize("cap_mb", [25.0, 2.0])
def test_the_model_s_buckets_are_the_ones_ddp_reduces(cap_mb):
    seen, predicted = workers(_ddp_bucket_bytes, 2, cap_mb)[0]
    assert len(seen) > 1 and seen == predicted


@pytest.mark.parametrize("backend", ["gloo", "nccl"])
@pytest.mark.parametrize("nodes", [1, 2])
def test_the_planner_s_bytes_are_the_ones_a_run_records_for_every_preset(monkeypatch, backend, nodes):
    """For every conf/parallel preset on 4 ranks, on one node (hierarchical then emulates its nodes) and on two:
    the bytes per step the planner predicts for a cluster of that shape equal what the run's strategy records
    (Strategy.wire_bytes, built as a run builds it from its resolved config and its rank's environment)."""
    model = build_model(TrainConfig().model, TrainConfig().data.num_labels)
    shapes = [p.shape for p in model.parameters()]
    cl = dataclasses.replace(clusters.read(clusters.path_of("local_2x2_1gbit")),
                             backend=backend, nodes=nodes, ranks_per_node=4 // nodes)
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(4 // nodes))
    seen = set()
    for name in predict.presets():
        cfg = predict.preset_config(name, ["launcher.nproc_per_node=4"], nodes)
        env = rdist.Env(rank=0, world_size=4, local_rank=0, local_world_size=4 // nodes, device=torch.device("cpu"),
                        backend=backend)
        recorded = parallel.build(cfg, env).wire_bytes(shapes)
        planned = predict.row(name, cfg, cl, shapes, {"forward_s": 0.01, "backward_s": 0.02, "optimizer_s": 0.0},
                              here=False)["sent_bytes"]
        assert planned == recorded > 0, (name, planned, recorded)
        seen.add(recorded)
    assert len(seen) >= 8  # the presets send different amounts: the comparison sees every strategy's own count


def test_help_lists_each_tool_s_own_groups(monkeypatch, capsys):
    """--help is Hydra's page with the tool's own config groups: the planner's cluster files and the training groups
    predict composes with them, training's groups without the cluster files, the bench's logger alone."""
    from ringexp import bench, train

    for argv, has, lacks in ((["ringexp.plan", "--help"], ("cluster: ", "parallel: ddp"), "logger: wandb, none"),
                             (["ringexp.plan", "predict", "--help"], ("cluster: a100_4x8_100g, ", "model: "), "\t"),
                             (["ringexp.train", "--help"], ("parallel: ddp",), "cluster: "),
                             (["ringexp.bench", "--help"], ("logger: none, wandb",), "parallel: ")):
        monkeypatch.setattr(sys, "argv", argv)
        with pytest.raises(SystemExit) as e:
            {"plan": main, "train": train.main, "bench": bench.main}[argv[0].split(".")[1]]()
        out = capsys.readouterr().out
        assert e.value.code in (0, None) and all(h in out for h in has) and lacks not in out, out[:500]


def plan(*args, timeout=240):
    return subprocess.run([sys.executable, "-m", "ringexp.plan", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.slow
def test_calibrate_on_a_real_gloo_job_writes_a_cluster_file_that_predict_and_compare_use(tmp_path, monkeypatch):
    """calibrate (2 local gloo workers) fits alpha and beta to its own measurements; predict with that file gives
    the cost model's numbers for it; a run on that cluster gets predicted columns in compare. (Both commands in this
    process, as the other predict tests run it: calibrate still spawns its 2 workers; one timed round per
    measurement: the test reads the file's shape and signs, not its precision.)"""
    out = tmp_path / "mine.yaml"
    monkeypatch.setattr(sys, "argv", ["ringexp.plan", "calibrate", "nprocs=2", "iters=1",
                                      "sizes=[4096,262144,4194304]", f"out={out}"])
    main()
    cl = clusters.read(out)
    assert (cl.nodes, cl.ranks_per_node, cl.link) == (1, 2, "loopback")
    assert cl.intra.beta_s_per_byte > 0 and cl.intra.alpha_s >= 0 and cl.add_s_per_byte > 0
    assert 0 < cl.jitter_s < 0.1  # a step's variance over its mean: milliseconds on a shared CPU
    assert set(cl.encode_s_per_byte) == set(CODECS) and all(v > 0 for v in cl.encode_s_per_byte.values())
    assert "fit error by size 4 KB" in cl.intra.source and "not measured" in cl.inter.source  # one node: no inter level

    pred = tmp_path / "pred"
    monkeypatch.setattr(sys, "argv", ["ringexp.plan", "predict", f"cluster_file={out}", "+parallel=ring_fp16",
                                      "model.width=8", "forward_s=0.01", "backward_s=0.02", "optimizer_s=0.005",
                                      f"out={pred}"])
    main()
    got = json.loads((pred / "plan.json").read_text())
    (row,) = got["rows"]
    assert row["preset"] == "ring_fp16" and row["step_s"] >= 0.035 and (pred / "plan.png").stat().st_size > 10000
    # (no quality record: ring_fp16 has no verdict for this task, so the baseline is recommended, not it)
    assert "Recommended" in (pred / "plan.md").read_text() and "+parallel=ddp " in got["recommended"]
    assert row["quality"] == predict.NO_VERDICT


@pytest.mark.slow
def test_compare_puts_predictions_beside_runs_on_a_calibrated_cluster(tmp_path):
    """A run whose nodes, ranks per node and link match a cluster file (--cluster, or conf/cluster/) gets the model's
    communication and step time next to its measured ones (its own compute, the model's communication); a
    --cluster file that cannot be read is one line, exit 2."""
    run = tmp_path / "run"
    run.mkdir()
    cfg = TrainConfig()
    cfg.model.name, cfg.data.batch_size = "small_cnn", 16
    (run / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(cfg)))
    summary = {"status": "completed", "world_size": 4, "nodes": 3, "ranks_per_node": 7, "link": "test-plan-link",
               "overrides": [], "throughput": {"median": 100.0, "p10": 95.0, "p90": 105.0}, "final": {}, "best": {},
               "time": {"step_s": 0.5, "compute_s": 0.3, "optimizer_s": 0.05, "data_s": 0.01, "other_s": 0.0,
                        "comm_s": 0.2}}
    (run / "summary.json").write_text(json.dumps(summary))
    cluster = tmp_path / "test_plan_tmp.yaml"  # a calibrated file outside conf/cluster/, given with --cluster
    cluster.write_text(OmegaConf.to_yaml(OmegaConf.structured(ClusterConfig(
        name="test_plan_tmp", nodes=3, ranks_per_node=7, link="test-plan-link", intra=LinkConfig(1e-5, 1e-9),
        inter=LinkConfig(1e-4, 1e-8), add_s_per_byte=1e-10))))
    r = subprocess.run([sys.executable, "-m", "ringexp.compare", str(run), "--out", str(tmp_path / "cmp"),
                        "--cluster", str(cluster)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    head, row = r.stdout.splitlines()[:2]
    assert "predicted step ms" in head and "step error" in head
    shapes = [p.shape for p in build_model(cfg.model, cfg.data.num_labels).parameters()]
    cl = ClusterConfig(name="t", nodes=3, ranks_per_node=7, intra=LinkConfig(1e-5, 1e-9), inter=LinkConfig(1e-4, 1e-8),
                       add_s_per_byte=1e-10)
    step = parallel.step_cost(cl, cfg, shapes, {"forward_s": 0.1, "backward_s": 0.2, "optimizer_s": 0.05})["step_s"]
    step += 0.01
    assert f"{1e3 * step:.0f}" in row or f"{1e3 * step:.1f}" in row, (step, row)
    from ringexp.compare import main as compare_main
    assert compare_main([str(run), "--cluster", str(tmp_path / "nosuch.yaml"), "--out", str(tmp_path / "c2")]) == 2
    assert not (tmp_path / "c2").exists()




def test_an_averaging_run_s_step_error_is_against_its_whole_run(tmp_path):
    """Local SGD at period 16 logs intervals of 5 steps, most without a synchronization: its step error compares
    the model's whole-run step (synchronizations spread over the steps, the DDP warm-up at DDP's cost) with its
    whole-run step (global batch over whole-run samples/s), not with that median; a DDP run keeps its median."""
    cl = ClusterConfig(name="test_plan_avg", nodes=2, ranks_per_node=2, link="test-plan-avg",
                       intra=LinkConfig(1e-5, 1e-9), inter=LinkConfig(1e-4, 1e-7), add_s_per_byte=1e-10)
    cluster = tmp_path / "test_plan_avg.yaml"
    cluster.write_text(OmegaConf.to_yaml(OmegaConf.structured(cl)))
    known = compare_table.calibrations([str(cluster)])
    time = {"step_s": 0.03, "compute_s": 0.02, "optimizer_s": 0.001, "data_s": 0.001, "other_s": 0.0}
    got = {}
    for name, overrides in [("ddp", ["+parallel=ddp"]),
                            ("local", ["+parallel=local_sgd", "parallel.period=16", "parallel.warmup_steps=4"])]:
        run = tmp_path / name
        run.mkdir()
        cfg = compose_config([*overrides, "steps=120", "model.width=8"])
        (run / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(cfg)))
        summary = {"nodes": 2, "ranks_per_node": 2, "link": "test-plan-avg", "global_batch_size": 32,
                   "throughput": {"median": 900.0, "whole_run": 400.0}, "time": time}
        if name == "local":
            summary["synchronizations"] = {"period": 16, "warmup_steps": 4, "count": 7}
        got[name] = (compare_table.predicted({"summary": summary, "dir": str(run)}, known), cfg)
    (ddp, _), (local, cfg) = got["ddp"], got["local"]
    compute = predict.of_run(0.02, 0.001, 1)
    whole = predict.over_steps("", cfg, cl, predict.gradient_shapes(cfg), compute, False, 1, 120)["step_s"] + 0.001
    assert local["predicted step ms"] == pytest.approx(1e3 * whole)
    assert local["step error"] == pytest.approx(whole / (32 / 400.0) - 1)
    assert ddp["step error"] == pytest.approx(ddp["predicted step ms"] / 1e3 / 0.03 - 1)


def test_accuracy_sets_each_bench_row_beside_the_model_for_its_algorithm_and_compressor(tmp_path, monkeypatch, capsys):
    """bench names (hierarchical, int8 kept to the inter-node stage) map to the model's algorithm and scope; each
    row's error is predicted / measured - 1, measured the mean over rounds where the row has it, else the median;
    the summary counts the cases; the plot holds every case."""
    cases = [("hierarchical", 0.05), ("hierarchical+int8:inter", 0.02), ("builtin", 0.04),
             ("hierarchical:leader", 0.06)]
    rows = [{"algorithm": a, "size_bytes": 4 << 20, "count": 1 << 20, "nodes": 2, "ranks_per_node": 2, "link": "x",
             "time_us": 1e6 * t} for a, t in cases]
    rows[2]["time_us_mean"] = 1e6 * 0.08  # a row with its mean over rounds (what a run pays) is scored on it
    (tmp_path / "bench.json").write_text(json.dumps(rows))
    monkeypatch.setattr(sys, "argv", ["ringexp.plan", "accuracy", f"bench=[{tmp_path / 'bench.json'}]",
                                      f"out={tmp_path / 'acc'}", "cluster=local_2x2_1gbit"])
    main()
    got = json.loads((tmp_path / "acc" / "accuracy.json").read_text())
    cl = clusters.read(clusters.path_of("local_2x2_1gbit"))
    n = 4 << 20
    two_level = comm.seconds("hierarchical", cl, n)
    assert got[0]["predicted_s"] == pytest.approx(two_level) and got[0]["error"] == pytest.approx(two_level / 0.05 - 1)
    int8 = {scope: compress.seconds(cl, CompressionConfig(name="int8", error_feedback=False, scope=scope),
                                    "hierarchical", [torch.Size([1 << 20])]) for scope in ("all", "inter_node")}
    assert got[1]["predicted_s"] == pytest.approx(int8["inter_node"]) != pytest.approx(int8["all"])
    assert got[2]["predicted_s"] == pytest.approx(comm.seconds("builtin", cl, n))
    assert got[2]["measured_s"] == pytest.approx(0.08) and got[2]["error"] == pytest.approx(got[2]["predicted_s"]
                                                                                          / 0.08 - 1)
    leader = comm.seconds("hierarchical", cl, n, variant="leader")
    assert got[3]["predicted_s"] == pytest.approx(leader) != pytest.approx(two_level)
    errors = sorted(abs(o["error"]) for o in got)
    assert f"4 cases: median |error| {(errors[1] + errors[2]) / 2:.1%}" in capsys.readouterr().out
    assert (tmp_path / "acc" / "accuracy.png").stat().st_size > 10000


def test_a_cpu_rank_s_threads_follow_the_launcher_then_omp_num_threads_then_its_cpu_set(monkeypatch):
    """launcher.threads_per_worker wins; then OMP_NUM_THREADS (torchrun's, or scripts/cluster_local.sh's one per
    rank on the shared machine); then the CPUs the process may use (a Slurm or taskset CPU set) over the node's
    workers."""
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert (rdist.threads(2, given=5), rdist.threads(2)) == (5, 3)
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert rdist.threads(1) == rdist.cores() and rdist.threads(rdist.cores() * 4) == 1
    code = "from ringexp import dist; print(dist.cores(), dist.threads(1))"
    r = subprocess.run(["taskset", "-c", "0", sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       env={k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"})
    assert r.stdout.split() == ["1", "1"], r.stderr

BAD = [
    (["predict", "cluster_file=/nonexistent/c.yaml"], "cluster_file=/nonexistent/c.yaml: cannot read it"),
    (["predict", "cluster.inter.beta_s_per_byte=-1e-9"], "cluster.inter.beta_s_per_byte=-1e-09: must be > 0"),
    (["predict", "cluster.intra.beta_s_per_byte=0"], "cluster.intra.beta_s_per_byte=0.0: must be > 0"),
    (["predict", "cluster.inter.beta_s_per_byte=inf"], "cluster.inter.beta_s_per_byte=inf: must be > 0 and at most"),
    (["predict", "cluster.encode_s_per_byte.fp16=nan"], "cluster.encode_s_per_byte.fp16=nan: must be >= 0"),
    (["predict", "ranks_per_node=99"], "ranks_per_node=99: cluster local_2x2_1gbit has 2 per node"),
    (["predict", "model.name=resnet_nosuch"], "model.name=resnet_nosuch is neither small_cnn nor a timm model"),
    (["predict", "+parallel=single"], "+parallel=single runs one rank"),
    (["predict", "presets=[ddp,nosuch]"], "presets: no preset nosuch"),
    (["predict", "quality=/nonexistent/q.json"], "quality=/nonexistent/q.json: no such file (give the quality.json"),
    (["predict", "quality_budget=-0.01"], "quality_budget=-0.01: must be in [0, 1)"),
    (["predict", "error=0.7"], "error=0.7: must be in (0, 0.5)"),
    (["calibrate", "nprocs=1"], "nprocs=1: calibrate needs at least 2 ranks"),
    # a line rate of 0 was taken as none: the link kept as measured, transport=socket's ceiling not kept, no word
    (["accuracy", "line_rate=0bit"], "line_rate=0bit: give a rate above 0 as tc writes it"),
    (["calibrate", "transport=socket", "line_rate=0.0mbit"], "line_rate=0.0mbit: give a rate above 0"),
    (["accuracy", "bench=[/nonexistent/bench.json]"], "bench=/nonexistent/bench.json: cannot read it"),
    (["guess"], "first argument must be calibrate, predict or accuracy"),
]


@pytest.mark.parametrize("args, words", BAD)
def test_bad_input_is_one_line_exit_2_and_nothing_written(tmp_path, monkeypatch, capsys, args, words):
    """Each case as the CLI runs it (ringexp.plan.main, in this process: a second each instead of ten)."""
    out = tmp_path / "out"
    monkeypatch.setattr(sys, "argv", ["ringexp.plan", *args, f"out={out}"])
    with pytest.raises(SystemExit) as e:
        main()
    assert e.value.code == 2 and words in error_line(capsys.readouterr().err)
    assert not out.exists()


@pytest.mark.parametrize("arg, says", [("cluster.inter.beta_s_per_byte=.inf",
                                       "Value '.inf' of type 'str' could not be converted to Float"),
                                      ("cluster=nosuch", "Could not find 'cluster/nosuch'"),
                                      ("model=nosuch", "Could not find 'model/nosuch'")])
def test_a_composition_mistake_is_hydra_s_own_message_as_for_training(tmp_path, monkeypatch, capsys, arg, says):
    """A value of the wrong type or an option that is not there is Hydra's to report (as `ringexp.train steps=abc`
    is): its message, exit 1, no traceback, nothing written."""
    monkeypatch.setattr(sys, "argv", ["ringexp.plan", "predict", arg, f"out={tmp_path / 'out'}"])
    with pytest.raises(SystemExit) as e:
        main()
    err = capsys.readouterr().err
    assert e.value.code == 1 and says in err and "Traceback" not in err and not (tmp_path / "out").exists(), err


def test_the_command_line_says_one_line_and_exits_2(tmp_path):
    r = plan("predict", "cluster_file=/nonexistent/c.yaml", f"out={tmp_path / 'out'}", timeout=120)
    assert r.returncode == 2 and "cluster_file=/nonexistent/c.yaml: cannot read it" in error_line(r.stderr), r.stderr


def test_the_local_cluster_refuses_a_rate_of_0_before_making_anything_and_without_root(tmp_path):
    """`cluster_local.sh up --rate 0bit` passed the script's check: as root it took a cluster that was up down and
    made namespaces and a bridge before tc had the rate. Now one line and exit 2 before anything: here for a user
    who is not root, with ip, tc and nsenter that only record that they ran."""
    tools, ran = tmp_path / "bin", tmp_path / "ran"
    tools.mkdir()
    for tool, body in (("ip", f'echo ip "$@" >>{ran}'), ("tc", f'echo tc "$@" >>{ran}'),
                       ("nsenter", f'echo nsenter "$@" >>{ran}'), ("id", "echo 1000")):  # (id -u: not root)
        (tools / tool).write_text(f"#!/bin/sh\n{body}\n")
        (tools / tool).chmod(0o755)
    env = {**os.environ, "PATH": f"{tools}:{os.environ['PATH']}", "RINGEXP_CLUSTER_DIR": str(tmp_path / "state")}
    for rate in ("0bit", "0.0mbit", "000kbps"):
        r = subprocess.run([str(ROOT / "scripts" / "cluster_local.sh"), "up", "--rate", rate], env=env,
                           capture_output=True, text=True, timeout=60)
        assert (r.returncode, r.stdout) == (2, ""), r
        assert r.stderr == f"cluster_local: --rate {rate}: give a tc rate above 0 such as 1gbit or 250mbit, or none\n"
    assert not ran.exists() and not (tmp_path / "state").exists()


def cluster_yaml(path: Path, **changes) -> Path:
    """conf/cluster/local_2x2_1gbit.yaml with `changes` (dotted keys as a__b) written out by PyYAML, as a user's
    editor or script would: float('inf') becomes .inf, float('nan') .nan."""
    d = yaml.safe_load(Path(CONF_DIR, "cluster", "local_2x2_1gbit.yaml").read_text())
    for key, value in changes.items():
        *parents, leaf = key.split("__")
        node = d
        for k in parents:
            node = node[k]
        node[leaf] = value
    path.write_text(yaml.safe_dump(d))
    return path


def good_cluster_text() -> str:
    return Path(CONF_DIR, "cluster", "local_2x2_1gbit.yaml").read_text()


BAD_CLUSTERS = [
    ("syntax", lambda p: p.write_text("name: broken\nnodes: [2\nranks_per_node: 2\n"), "not valid YAML: expected"),
    ("utf16", lambda p: p.write_bytes(good_cluster_text().encode("utf-16")), "not UTF-8 text (byte 0)"),
    ("latin1", lambda p: p.write_bytes(("# r\xe9seau\n" + good_cluster_text()).encode("latin-1")),
     "not UTF-8 text (byte 3)"),
    ("inf_beta", lambda p: cluster_yaml(p, inter__beta_s_per_byte=float("inf")),
     "cluster.inter.beta_s_per_byte=inf: must be > 0 and at most 1 second per byte"),
    ("nan_encode", lambda p: cluster_yaml(p, encode_s_per_byte__fp16=float("nan")),
     "cluster.encode_s_per_byte.fp16=nan: must be >= 0"),
    ("alias", lambda p: p.write_text("name: a\nintra: &l {alpha_s: 1.0e-5, beta_s_per_byte: 1.0e-9}\ninter: *l\n"),
     "a YAML alias"),
    ("list", lambda p: p.write_text("- name: a\n"), "not a YAML mapping"),
    ("yaml11_boolean", lambda p: p.write_text(good_cluster_text() + "nvls: on\n"),  # (true to YAML 1.1, as read)
     f"line {good_cluster_text().count(chr(10)) + 1}: on unquoted is a boolean to YAML 1.1"),
    ("empty", lambda p: p.write_text(""), "not a YAML mapping"),
]


@pytest.mark.parametrize("case, write, words", BAD_CLUSTERS, ids=[c[0] for c in BAD_CLUSTERS])
def test_a_broken_cluster_file_is_one_line_naming_it_and_nothing_is_predicted(tmp_path, monkeypatch, capsys, case,
                                                                               write, words):
    """Each broken cluster file as predict reads it: one line naming the file, exit 2, no plan written (a NaN
    encode cost used to pass, min() skipping it, and ddp_fp16 came out fastest and recommended)."""
    path = tmp_path / f"{case}.yaml"
    write(path)
    out = tmp_path / "out"
    monkeypatch.setattr(sys, "argv", ["ringexp.plan", "predict", f"cluster_file={path}", "presets=[ddp,ddp_fp16]",
                                      "forward_s=0.01", "backward_s=0.02", "optimizer_s=0.005", f"out={out}"])
    with pytest.raises(SystemExit) as e:
        main()
    line = error_line(capsys.readouterr().err)
    assert e.value.code == 2 and words in line, line
    assert f"{path}: " in line and not out.exists()


def test_a_fifo_as_cluster_file_is_refused_at_once(tmp_path, monkeypatch, capsys):
    """A FIFO with no writer is refused, not waited on. (Were it opened to wait for a writer, one comes after 10 s
    and closes at once, so that this test fails rather than hangs.)"""
    fifo = tmp_path / "cluster.yaml"
    os.mkfifo(fifo)
    rescue = threading.Timer(10, lambda: os.close(os.open(fifo, os.O_RDWR | os.O_NONBLOCK)))
    rescue.daemon = True
    rescue.start()
    monkeypatch.setattr(sys, "argv", ["ringexp.plan", "predict", f"cluster_file={fifo}", f"out={tmp_path / 'out'}"])
    t0 = time.monotonic()
    try:
        with pytest.raises(SystemExit) as e:
            main()
    finally:
        rescue.cancel()
    assert time.monotonic() - t0 < 10 and e.value.code == 2
    assert f"cluster_file={fifo}: cannot read it (not a regular file)" in error_line(capsys.readouterr().err)


BENCH_ROW = {"algorithm": "ring", "size_bytes": 4 << 20, "count": 1 << 20, "nodes": 2, "ranks_per_node": 2,
             "link": "x", "time_us": 5e4}
BAD_BENCH = [
    ("dict", BENCH_ROW, "not a list of rows"),
    ("missing", [BENCH_ROW, {"algorithm": "ring", "size_bytes": 1024}], "row 1: no 'link'"),
    ("nan_time", [BENCH_ROW | {"time_us": float("nan")}], "row 0: time_us=nan must be a finite number > 0"),
    ("inf_mean", [BENCH_ROW | {"time_us_mean": float("inf")}], "row 0: time_us_mean=inf must be a finite number"),
    ("zero_nodes", [BENCH_ROW | {"nodes": 0}], "row 0: nodes=0 must be a finite number > 0"),
    ("string_count", [BENCH_ROW | {"count": "many"}], "row 0: count='many' is not an integer"),
    ("odd_algorithm", [BENCH_ROW | {"algorithm": "ring+powersgd"}], "algorithm 'ring+powersgd' is none"),
    ("a_number", [3], "row 0: a int, not a row"),
]


@pytest.mark.parametrize("case, content, words", BAD_BENCH, ids=[c[0] for c in BAD_BENCH])
def test_accuracy_on_a_bench_file_of_the_wrong_shape_is_one_line_naming_it(tmp_path, monkeypatch, capsys, case,
                                                                          content, words):
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(content))  # (json writes NaN for a NaN, as ringexp.bench would have)
    line = plan_refusal(monkeypatch, capsys, ["accuracy", f"bench=[{path}]", f"out={tmp_path / 'acc'}"])
    assert f"bench={path}: " in line and words in line, line
    assert not (tmp_path / "acc").exists()


# The plan the quality tests predict (a slow link, where PowerSGD is predicted fastest), and the task it is: the
# ddp preset with its training overrides, composed as training composes it, on the cluster's 2 x 2 ranks
PLAN_Q = ["cluster=local_2x2_250mbit", "model.width=32", "presets=[ddp,ring_fp16,ddp_powersgd,ddp_topk]",
          "forward_s=0.01", "backward_s=0.02", "optimizer_s=0.002"]


def plan_task(*train, nodes=2, ranks=4) -> dict:
    return quality.task_of(compose_config(["model.width=32", *train, "+parallel=ddp"], nodes), ranks)


def quality_record(path, task=None, one_seed=(), **diffs):
    """compare's quality.json of `task` (default: the plan's) with a verdict per preset from paired differences over
    3 seeds, or for a preset in `one_seed` a validation-set verdict of one shared seed (a bootstrap's interval: as
    narrow as three seeds', but an indication only)."""
    overrides, seeds = ["model.width=32"], ["0", "1", "2"]  # what every group of the record shares
    groups = [{"group": "+parallel=ddp", "baseline": True, "verdicts": {}, "overrides": ["+parallel=ddp", *overrides],
               "seeds": seeds, "left_out": []}]
    for name, d in diffs.items():
        v = quality.paired_seeds([d - 0.002, d, d + 0.002], 0.02)
        if name in one_seed:
            v = dataclasses.replace(v, test="validation-set bootstrap, seed 0 vs 0", seeds=1)
        groups.append({"group": f"+parallel={name}", "baseline": False, "overrides": [*overrides, f"+parallel={name}"],
                       "verdicts": {"final AUROC": v.record()}, "seeds": seeds[:v.seeds], "left_out": []})
    groups.append({"group": "+parallel=ddp_topk compression.ratio=0.001", "baseline": False,  # not a preset alone
                   "overrides": [*overrides, "+parallel=ddp_topk", "compression.ratio=0.001"], "seeds": seeds,
                   "left_out": [],
                   "verdicts": {"final AUROC": quality.paired_seeds([0.0, 0.001, 0.002], 0.02).record()}})
    records.write_json(path, {"format": quality.FORMAT, "task": plan_task() if task is None else task,
                              "margin": 0.02, "metrics": ["final AUROC"], "margins": {"final AUROC": 0.02},
                              "alpha": 0.05, "family": len(groups) - 1, "groups": groups})
    return path


def predicted(tmp_path, monkeypatch, capsys, *extra) -> tuple:
    """(plan.json, plan.md's text) of predict on PLAN_Q with `extra` arguments."""
    out = tmp_path / f"out-{len(list(tmp_path.glob('out-*')))}"
    monkeypatch.setattr(sys, "argv", ["ringexp.plan", "predict", *PLAN_Q, f"out={out}", *extra])
    main()
    capsys.readouterr()
    return json.loads((out / "plan.json").read_text()), (out / "plan.md").read_text()


def words(got: dict) -> dict:
    return {r["preset"]: r["quality"] for r in got["rows"]}


def test_the_recommendation_follows_the_measured_verdicts(tmp_path, monkeypatch, capsys):
    """On a slow link PowerSGD is predicted fastest: recommended where its record of this task calls it equivalent
    over 3 seeds, left out where a new measurement calls it worse (ring_fp16, equivalent, is then chosen); a wider
    quality_budget makes the same measurement acceptable. No verdict for a compressing preset: never recommended."""
    good = quality_record(tmp_path / "good.json", ring_fp16=0.001, ddp_powersgd=-0.004)
    bad = quality_record(tmp_path / "bad.json", ring_fp16=0.001, ddp_powersgd=-0.03)
    got, text = predicted(tmp_path, monkeypatch, capsys, f"quality={good}")
    assert "+parallel=ddp_powersgd" in got["recommended"] and words(got) == {
        "ddp": "exact", "ring_fp16": "equivalent", "ddp_powersgd": "equivalent", "ddp_topk": predict.NO_VERDICT}
    assert got["task"] == plan_task() and f"the verdicts of {good}, measured on this task" in text
    got, _ = predicted(tmp_path, monkeypatch, capsys, f"quality={bad}")
    assert "+parallel=ring_fp16" in got["recommended"] and words(got)["ddp_powersgd"] == "worse"
    got, _ = predicted(tmp_path, monkeypatch, capsys, f"quality={bad}", "quality_budget=0.05")
    assert "+parallel=ddp_powersgd" in got["recommended"] and words(got)["ddp_powersgd"] == "equivalent"


def test_a_preset_that_changes_phase_is_ranked_by_its_whole_run(tmp_path, monkeypatch, capsys):
    """PowerSGD's uncompressed first steps (start_step) count in its headline: over a run of as many steps as its
    start, its whole run is plain DDP's speed, not its compressed one; over a long run it nears the compressed one."""
    for steps, near in ((60, "ddp"), (6000, "steady")):
        got, text = predicted(tmp_path, monkeypatch, capsys, f"steps={steps}", "compression.start_step=60")
        rows = {r["preset"]: r for r in got["rows"]}
        psgd, ddp = rows["ddp_powersgd"], rows["ddp"]
        assert psgd["samples_s"] > 1.5 * ddp["samples_s"] and "whole run samples/s" in text
        want = ddp["samples_s"] if near == "ddp" else psgd["samples_s"]
        assert psgd["whole_samples_s"] == pytest.approx(want, rel=0.02) and psgd["speedup"] == pytest.approx(
            psgd["whole_samples_s"] / ddp["samples_s"]), (steps, psgd)


def test_a_one_seed_verdict_is_shown_as_an_indication_and_never_acted_on(tmp_path, monkeypatch, capsys):
    """The same record, PowerSGD's verdict now from one shared seed (its numbers still equivalent): shown as
    indicative with its difference, not recommended; with ring_fp16's on one seed too, only exact presets are left:
    the fastest of them is recommended and the report says what the others lack and how to get it."""
    record = quality_record(tmp_path / "q.json", one_seed={"ddp_powersgd"}, ring_fp16=0.001, ddp_powersgd=-0.004)
    got, text = predicted(tmp_path, monkeypatch, capsys, f"quality={record}")
    assert words(got)["ddp_powersgd"] == quality.INDICATIVE == "one seed (indicative)"
    assert "+parallel=ring_fp16" in got["recommended"] and words(got)["ring_fp16"] == "equivalent"
    assert "| one seed (indicative) (-0.004) |" in text
    assert "Left out, no decisive verdict on this task: ddp_powersgd (one seed only), ddp_topk\n" in text
    record = quality_record(tmp_path / "q1.json", one_seed={"ddp_powersgd", "ring_fp16"}, ring_fp16=0.001,
                            ddp_powersgd=-0.004)
    got, text = predicted(tmp_path, monkeypatch, capsys, f"quality={record}")
    assert got["recommended"].startswith("python -m ringexp.train +parallel=ddp ") and \
        set(words(got).values()) == {"exact", quality.INDICATIVE, predict.NO_VERDICT}
    assert ("need a decisive verdict on this task to be recommended; none for: ring_fp16 (one seed only), "
            "ddp_powersgd (one seed only), ddp_topk\n") in text
    assert "+parallel=ddp,ring_fp16,ddp_powersgd,ddp_topk seed=0,1,2,3,4,5,6 model.width=32" in text


def test_without_a_record_only_exact_presets_are_recommended_and_the_report_says_how_to_measure(
        tmp_path, monkeypatch, capsys):
    """No quality=: there is no default record (an installed package has no docs/results/): every preset is exact
    or has no verdict for this task, the fastest exact one is recommended, and the report names the seed sweep
    (and the tune) that would give the others a verdict. One preset asked for without a verdict: ddp, the
    baseline, is recommended rather than it."""
    got, text = predicted(tmp_path, monkeypatch, capsys)
    assert words(got) == {"ddp": "exact", "ring_fp16": predict.NO_VERDICT, "ddp_powersgd": predict.NO_VERDICT,
                          "ddp_topk": predict.NO_VERDICT} and got["quality"] is None
    assert got["recommended"] == "python -m ringexp.train +parallel=ddp model.width=32"
    assert "equivalent" not in "".join(r["quality"] for r in got["rows"])
    assert "no record of verdicts given (quality=PATH)" in text and "seed sweep of it on 4 ranks" in text
    assert "python -m ringexp.train -m +parallel=ddp,ring_fp16,ddp_powersgd,ddp_topk seed=0,1,2,3,4,5,6" in text
    assert "python -m ringexp.tune" in text and "docs/results" not in text
    got, text = predicted(tmp_path, monkeypatch, capsys, "+parallel=ring_fp16")
    assert words(got) == {"ring_fp16": predict.NO_VERDICT} and "+parallel=ddp " in got["recommended"] + " "
    assert "the baseline: no preset predicted here is exact or has a decisive verdict on this task" in text


def test_a_seed_sweep_s_own_record_of_this_task_is_what_predict_recommends_from(tmp_path, monkeypatch, capsys):
    """End to end: compare over a seed sweep whose runs recorded this task (3 seeds of ddp, ddp_powersgd just below
    it, ddp_topk far worse) writes quality.json; predict reads it: PowerSGD equivalent and recommended, top-k worse.
    The same sweep's record given to a plan of another world size is refused."""
    sweep = tmp_path / "sweep"
    jitter = {"ddp": (0.0, 0.0, 0.0), "ddp_powersgd": (0.0, 0.001, 0.002), "ddp_topk": (0.003, -0.002, 0.0)}
    for seed in range(3):
        for preset, auroc in (("ddp", 0.90), ("ddp_powersgd", 0.897), ("ddp_topk", 0.80)):
            overrides = ["model.width=32", f"+parallel={preset}", f"seed={seed}"]
            got = auroc + (0.004, -0.003, 0.001)[seed] + jitter[preset][seed]  # (seed 0's task is easier)
            run = tmp_path / "sweep" / f"{preset}-{seed}"
            run.mkdir(parents=True)
            records.write_summary(run, {
                "status": "completed", "name": ",".join(overrides), "job_type": preset, "strategy": preset,
                "choices": {"parallel": preset}, "overrides": overrides, "world_size": 4, "task": plan_task(),
                "throughput": {"median": 40.0, "p10": 36.0, "p90": 44.0},
                "time": {"step_s": 0.1, "compute_s": 0.06, "comm_s": 0.03, "exposed_comm_s": 0.02},
                "final": {"auroc_macro": got, "f1_macro": 0.2, "step": 200},
                "best": {"auroc_macro": got, "f1_macro": 0.2, "step": 200}})
    assert compare.main([str(sweep)]) == 0
    capsys.readouterr()
    record = quality.read_record(sweep / "quality.json")
    assert record["task"] == plan_task() and record["format"] == quality.FORMAT
    got, _ = predicted(tmp_path, monkeypatch, capsys, f"quality={sweep / 'quality.json'}")
    assert "+parallel=ddp_powersgd" in got["recommended"]
    assert (words(got)["ddp_powersgd"], words(got)["ddp_topk"]) == ("equivalent", "worse")
    line = plan_refusal(monkeypatch, capsys, ["predict", *PLAN_Q, "ranks_per_node=1",
                                              f"quality={sweep / 'quality.json'}", f"out={tmp_path / 'other'}"])
    assert "its verdicts are of another task (world_size: 4 in the record, 2 here; samples: " in line, line
    assert not (tmp_path / "other").exists()


ANOTHER_TASK = [
    ("model", lambda: plan_task("model.width=8"), "model.width: 8 in the record, 32 here"),
    ("steps", lambda: plan_task("steps=120"), "samples: 30720 in the record, 76800 here"),
    ("ranks", lambda: plan_task(ranks=2), "world_size: 2 in the record, 4 here"),
    ("optimizer", lambda: plan_task("optim.lr=0.5"), "optim.lr: 0.5 in the record, 0.003 here"),
    ("absent", lambda: {k: v for k, v in plan_task().items() if k != "data"}, "data: absent in the record, a "),
    ("null", lambda: None, "the record names none: its runs are from before runs recorded their task"),
]


@pytest.mark.parametrize("case, task, said", ANOTHER_TASK, ids=[c[0] for c in ANOTHER_TASK])
def test_a_record_of_another_task_is_one_line_naming_what_differs_and_nothing_is_written(
        tmp_path, monkeypatch, capsys, case, task, said):
    """A verdict measured on another model, length, world size or optimizer says nothing of this task (the review's
    case: a 120-step small-CNN record recommending PowerSGD for ResNet-18 at 3,000 steps): quality= naming one is
    one line with the fields that differ, both values, exit 2, nothing predicted or written."""
    record = quality_record(tmp_path / "q.json", task=task(), ring_fp16=0.001, ddp_powersgd=-0.004)
    if case == "null":
        doc = json.loads(record.read_text())
        records.write_json(record, doc | {"task": None})
    out = tmp_path / "out"
    line = plan_refusal(monkeypatch, capsys, ["predict", *PLAN_Q, f"quality={record}", f"out={out}"])
    assert line.startswith(f"ringexp: error: quality={record}: its verdicts are of another task (") and said in line
    assert "seed sweep (docs/sweeps.md) or python -m ringexp.tune" in line and not out.exists()


def test_a_record_of_an_older_format_is_refused_in_one_line(tmp_path, monkeypatch, capsys):
    """The shipped slow-link story's record (format 1: no task, ci90) is a result, never a verdict predict uses: one
    line, exit 2; so is one of format 4 (no family its tests were divided among) and one of a format to come."""
    for record, said in ((Path(ROOT, "docs", "results", "cluster-story-quality.json"), "format is null, not 5"),
                         (tmp_path / "q4.json", "format is 4, not 5"), (tmp_path / "q6.json", "format is 6, not 5")):
        if record.parent == tmp_path:
            doc = json.loads(quality_record(record, ring_fp16=0.001).read_text())
            records.write_json(record, doc | {"format": int(record.stem[1:])})
        out = tmp_path / "out"
        line = plan_refusal(monkeypatch, capsys, ["predict", *PLAN_Q, f"quality={record}", f"out={out}"])
        assert line.startswith(f"ringexp: error: quality={record}: {said}: a record of an unknown format"), line
        assert not out.exists()
