"""The planner past one machine: NCCL's algorithm x protocol choice against hand-computed cases from NCCL's own
tables, NCCL_ALGO / NCCL_PROTO restricting it, transports below line rate, per-call and per-bucket costs,
calibration's small-message latency, and the published cases (`plan accuracy cases=`) with their bad input."""

import copy
import dataclasses
import json
import sys
import time

import pytest
import torch
from helpers.processes import ROOT, plan_refusal
from helpers.runs import published_cases

from ringexp import comm, compress, parallel
from ringexp.cluster import costmodel, nccl
from ringexp.cluster import files as clusters
from ringexp.cluster.schema import EFFICIENCY, ClusterConfig, LinkConfig, bytes_per_s
from ringexp.config import CompressionConfig
from ringexp.errors import ConfigError
from ringexp.parallel.ddp import bucket_shapes
from ringexp.plan import fields, published
from ringexp.plan.calibrate import fit
from ringexp.plan.cli import main
from ringexp.validate import compose_config

# one node of 8 GPUs on NVLink at 100 GB/s each way, NCCL's own NVLink ring Simple latency (3.4 us), Ampere
NODE = ClusterConfig(name="node", nodes=1, ranks_per_node=8, gpu_arch="ampere",
                     intra=LinkConfig(3.4e-6, 1e-11, transport="nvlink", efficiency=1.0))
H100 = clusters.read(f"{ROOT}/conf/cluster/h100_16x8_200g.yaml")
PUBLISHED = f"{ROOT}/ringexp/plan/published.yaml"


def test_a_large_all_reduce_on_one_node_is_ring_simple_at_nccl_s_latency_and_bandwidth():
    """64 MB: ring Simple takes NCCL's base 8.4 us + 14 steps x 3.4 us, and the bytes at 100 GB/s x 8/14
    (tuning.cc: busBw -> algBw by nRanks / nsteps); tree, LL and LL128 are slower there."""
    n = 64e6
    ring = (8.4 + 14 * 3.4 + n / (1000 * 100 * 8 / 14)) * 1e-6
    with nccl.recording() as chose:
        assert comm.seconds("builtin", NODE, n) == pytest.approx(ring, rel=1e-12)
    assert chose == [("allreduce", "ring", "simple")]
    tree = (8.4 + 2 * 7 * 4.0 + n / (1000 * 100 * .92 * .5 * .7)) * 1e-6  # 1e6 x 64 B: correction index 19 -> 0.7
    assert nccl.time_s(NODE, "allreduce", "tree", "simple", n) == pytest.approx(tree, rel=1e-12)


def test_a_small_all_reduce_is_latency_bound_and_takes_the_low_latency_protocol():
    """4 KB on one node: ring LL, 6.6 us + 14 x 0.6 us, at half the bandwidth (LL sends a flag with every
    8 bytes); across 16 nodes of 8: the tree, whose latency grows with log2(nodes), not with 2(p-1) steps."""
    ll = (6.6 + 14 * 0.6 + 4096 / (1000 * 50 * 8 / 14)) * 1e-6
    with nccl.recording() as chose:
        assert nccl.seconds(NODE, "allreduce", 4096) == pytest.approx(ll, rel=1e-12)
    assert chose == [("allreduce", "ring", "ll")]
    with nccl.recording() as chose:
        small = nccl.seconds(H100, "allreduce", 4096)
    assert chose[0][1:] == ("tree", "ll") and small < 1e-4
    assert nccl.time_s(H100, "allreduce", "ring", "simple", 4096) > 5 * small


@pytest.mark.parametrize("algo, proto, allowed", [
    ("ring", "", {("ring", "ll"), ("ring", "ll128"), ("ring", "simple")}),
    ("^tree", "simple", {("ring", "simple")}),
    ("allgather:tree;allreduce:tree", "^ll,ll128", {("tree", "simple")}),
    ("nvls", "", {("ring", "ll"), ("ring", "ll128"), ("ring", "simple"), ("tree", "ll"), ("tree", "ll128"),
                  ("tree", "simple")}),  # no NVLS on this cluster: nothing left, so NCCL's default
])
def test_nccl_algo_and_proto_restrict_the_choice_as_they_restrict_nccl(algo, proto, allowed):
    cl = dataclasses.replace(H100, nccl_algo=algo, nccl_proto=proto)
    assert set(nccl.enabled(cl, "allreduce")) == allowed


def test_a_run_s_backend_env_restricts_the_planner_s_step():
    """+backend.env.NCCL_ALGO=ring on a preset: its small all-reduces can no longer take the tree, and the step
    it predicts is slower (PowerSGD's P and Q are small: 16 x 8 ranks)."""
    shapes = [torch.Size([1024, 1024])] * 8
    compute = {"forward_s": 0.01, "backward_s": 0.02, "optimizer_s": 0.0}
    free = parallel.step_cost(H100, compose_config(["+parallel=ddp_powersgd"], 16), shapes, compute)
    ring = parallel.step_cost(H100, compose_config(["+parallel=ddp_powersgd", "+backend.env.NCCL_ALGO=ring"], 16),
                              shapes, compute)
    assert "tree/LL" in free["nccl"] and "tree" not in ring["nccl"] and ring["comm_s"] > free["comm_s"]


def test_gloo_keeps_its_own_ring_and_all_gather():
    gloo = dataclasses.replace(NODE, backend="gloo")
    assert comm.seconds("builtin", gloo, 64e6) == comm.seconds("ring", gloo, 64e6)
    shapes = [torch.Size([1 << 20])]
    with nccl.recording() as chose:
        compress.seconds(gloo, CompressionConfig(name="topk", ratio=0.01), "builtin", shapes)
    assert chose == []


def test_a_transport_below_line_rate_slows_every_byte_by_its_share():
    link = LinkConfig(0.0, 1e-9, transport="rdma")
    assert costmodel.hop(link, 1e6) == pytest.approx(1e-3 / EFFICIENCY["rdma"])
    assert costmodel.hop(dataclasses.replace(link, efficiency=0.8), 1e6) == pytest.approx(1e-3 / 0.8)
    assert costmodel.hop(dataclasses.replace(link, transport="measured"), 1e6) == pytest.approx(1e-3)
    with pytest.raises(ConfigError, match="cluster.inter.transport=tcp"):
        ClusterConfig(inter=LinkConfig(transport="tcp"))
    with pytest.raises(ConfigError, match="cluster.intra.efficiency=1.5"):
        ClusterConfig(intra=LinkConfig(efficiency=1.5))


def test_per_call_and_per_bucket_costs_make_small_buckets_slower():
    """Every collective call pays `call_s`; every DDP bucket costs the training thread `bucket_s`: 1 MB buckets
    then cost more than 25 MB ones, where without them (communication hidden in backward) they would not."""
    shapes = [torch.Size([256, 1024])] * 100  # 100 MB
    compute = {"forward_s": 0.05, "backward_s": 0.1, "optimizer_s": 0.0}

    def step(cl, mb):
        return parallel.step_cost(cl, compose_config(["+parallel=ddp", f"parallel.bucket_cap_mb={mb}"], 1), shapes,
                                  compute)["step_s"]
    calls = dataclasses.replace(NODE, call_s=2e-5)
    costly = dataclasses.replace(calls, bucket_s=5e-5)
    for mb, buckets in ((1, 100), (25, 4)):  # 1 MB of parameters each: one bucket each, or 25 of them together
        assert len(bucket_shapes(compose_config([f"parallel.bucket_cap_mb={mb}"], 1), shapes)) == buckets
        assert step(costly, mb) - step(calls, mb) == pytest.approx(buckets * 5e-5, rel=1e-9)
    unslowed = dataclasses.replace(NODE, overlap_slowdown=0.0)  # (compute beside communication: its own test)
    assert step(costly, 1) > step(costly, 25) and step(unslowed, 1) <= step(unslowed, 25)
    assert comm.seconds("ring", costly, 1e6) - comm.seconds("ring", NODE, 1e6) == pytest.approx(2e-5)


def test_calibration_s_latency_is_what_the_smallest_exchange_took_beyond_its_bytes():
    """The issue's 3-node case: a 4 KB exchange took 0.84 ms while a 1 MB one came in under n beta; the least
    residual up to 1 MB made alpha 0. Now alpha is the 4 KB exchange's residual, and every size's error is kept."""
    beta = 8 / 500e6  # 500 Mbit/s
    points = [(4096, 0.84e-3), (65536, 1.9e-3), (1 << 20, 0.95 * (1 << 20) * beta), (1 << 22, (1 << 22) * beta),
              (1 << 24, (1 << 24) * beta), (1 << 26, (1 << 26) * beta)]
    f = fit(points)
    assert f["alpha_s"] == pytest.approx(0.84e-3 - 4096 * f["beta_s_per_byte"])
    assert f["alpha_s"] > 0.7e-3 and len(f["errors"]) == 6 and f["errors"][0] == pytest.approx(0.0, abs=1e-9)


def test_the_shipped_published_cases_load_with_a_source_for_every_number():
    found, cases = published.load(PUBLISHED)
    names = {c["name"] for c in cases}
    assert {"ddp-bench resnet50", "ddp-bench resnext101_32x8d", "bert-large seq128 mixed",
            "rn50v1.5 dgx-1 fp32"} <= names
    assert all(r["source"] for c in cases for r in c["runs"]) and all(c["compute"]["source"] for c in cases)
    assert {c.gpu_arch for c in found.values()} == {"volta", "ampere"}


def write_cases(tmp_path, change) -> str:
    return published_cases(tmp_path, ("ddp-bench resnet50",), change)


def drop(d, key):
    d.pop(key)


BAD_CASES = [
    ("missing field", lambda doc: drop(doc["cases"][0], "batch"), "case ddp-bench resnet50: batch: missing"),
    ("non-positive bandwidth", lambda doc: doc["clusters"]["dgx1_v100"]["inter"].update(beta_s_per_byte=0),
     "cluster dgx1_v100: cluster.inter.beta_s_per_byte=0"),
    ("unknown algorithm", lambda doc: doc["cases"][0].update(env={"NCCL_ALGO": "hypercube"}),
     "case ddp-bench resnet50: env.NCCL_ALGO: hypercube"),
    ("unknown protocol", lambda doc: doc["cases"][0].update(env={"NCCL_PROTO": "ll256"}),
     "case ddp-bench resnet50: env.NCCL_PROTO: ll256"),
    ("a number without a source", lambda doc: drop(doc["cases"][0]["runs"][1], "source"),
     "case ddp-bench resnet50: run '8 GPUs': source: missing"),
    ("a measurement that is no number", lambda doc: doc["cases"][0]["runs"][0].update(step_s=-1),
     "run '1 GPU DDP': step_s: -1 must be a finite number > 0"),
    # read silently wrong before: NCCL reads "08" as 0 (C's strtoll stops at the 8), ringexp read 8
    ("an NCCL count NCCL reads otherwise", lambda doc: doc["cases"][0].update(env={"NCCL_MIN_NCHANNELS": "08"}),
     "case ddp-bench resnet50: env.NCCL_MIN_NCHANNELS: 08: is no number as NCCL reads it"),
    # a ratio finds its baseline by case and run name: a second case or run of one name took the other's place
    ("two cases of one name",
     lambda doc: doc["cases"].append(copy.deepcopy(doc["cases"][0]) | {"source": "another quote"}),
     "case ddp-bench resnet50: name: case #0 has it too"),
    ("two runs of one name", lambda doc: doc["cases"][0]["runs"][2].update(name="8 GPUs"),
     "case ddp-bench resnet50: run '8 GPUs': two runs of the case have this name"),
    ("a run its own baseline", lambda doc: doc["cases"][0]["runs"][1].update(baseline="8 GPUs"),
     "case ddp-bench resnet50: run '8 GPUs': baseline: its own name"),  # (a ratio of 1, counted right)
    ("a case in two units", lambda doc: doc["cases"][0]["runs"][2].update(samples_s=2462.0) or
     drop(doc["cases"][0]["runs"][2], "step_s"),  # (a ratio of a throughput over a step time)
     "case ddp-bench resnet50: run '16 GPUs': samples_s: the case's first run gives step_s"),
]


@pytest.mark.parametrize("case, change, words", BAD_CASES, ids=[c[0] for c in BAD_CASES])
def test_a_bad_published_cases_file_is_one_line_naming_the_case_and_field(tmp_path, monkeypatch, capsys, case,
                                                                           change, words):
    path = write_cases(tmp_path, change)
    line = plan_refusal(monkeypatch, capsys, ["accuracy", f"cases=[{path}]", f"out={tmp_path / 'acc'}"])
    assert f"cases={path}: " in line and words in line, line
    assert not (tmp_path / "acc").exists()


UNQUOTED = [  # (where, the value unquoted, what it was read as before: silently)
    (lambda doc: doc["cases"][0]["runs"][0], "input", "no", "false, though YAML 1.2 reads the text 'no'"),
    (lambda doc: doc["clusters"]["dgx1_v100"], "nvls", "yes", "true, though YAML 1.2 reads the text 'yes'"),
    (lambda doc: doc["cases"][0].setdefault("env", {}), "NCCL_MIN_NCHANNELS", "010", "8, though YAML 1.2 reads 10"),
]


@pytest.mark.parametrize("where, key, value, was", UNQUOTED, ids=[u[2] for u in UNQUOTED])
def test_a_value_yaml_1_1_and_1_2_read_differently_is_refused_naming_the_file_and_line(
        tmp_path, monkeypatch, capsys, where, key, value, was):
    path = write_cases(tmp_path, lambda doc: where(doc).update({key: "VALUE_HERE"}))
    text = open(path).read()
    line_no = text[:text.index("VALUE_HERE")].count("\n") + 1
    open(path, "w").write(text.replace("VALUE_HERE", value))
    line = plan_refusal(monkeypatch, capsys, ["accuracy", f"cases=[{path}]"])
    assert line.startswith(f"ringexp: error: cases={path}: line {line_no}: {value} unquoted is "), line
    assert "YAML 1.1" in line and "YAML 1.2" in line and f"quote it ('{value}')" in line, line


def test_accuracy_on_published_cases_prints_every_run_and_ratio(tmp_path, monkeypatch, capsys):
    """The table has every run with its error and NCCL's modelled choice; a run and its baseline give a ratio
    whose direction is judged; the summary leaves out the run the compute came from."""
    def one_case(doc):
        doc["cases"][0]["runs"][0]["input"] = True
    path = write_cases(tmp_path, one_case)
    monkeypatch.setattr(sys, "argv", ["ringexp.plan", "accuracy", f"cases=[{path}]", f"out={tmp_path / 'acc'}"])
    main()
    out = capsys.readouterr().out
    assert "| ddp-bench resnet50 | 16 GPUs | 104.0 ms/step |" in out and "(compute from it)" in out
    assert "| ddp-bench resnet50 | 8 GPUs / 1 GPU DDP | 1.040 |" in out
    assert "6 published runs (not counting the 1 the compute came from)" in out
    assert (tmp_path / "acc" / "accuracy-published.json").is_file()


def test_a_case_of_the_most_parameters_a_file_may_give_is_predicted_in_seconds(tmp_path, monkeypatch, capsys):
    """params at fields.MAX_PARAMS, in 4M pieces, are 119,210 DDP buckets of 32 MB: each one's NCCL choice made
    anew, under each of the 32 combinations of the rules, took 76 s for this one run. Each shape of bucket is
    reckoned once (its choice still counted per bucket), each combination that leaves the cluster as another did
    once."""
    def biggest(doc):
        case = doc["cases"][0]
        case.pop("model")
        case.update(params=fields.MAX_PARAMS, runs=case["runs"][2:3])  # 16 GPUs: two nodes
    path = write_cases(tmp_path, biggest)
    monkeypatch.setattr(sys, "argv", ["ringexp.plan", "accuracy", f"cases=[{path}]"])
    start = time.perf_counter()
    main()
    assert time.perf_counter() - start < 30
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("| ddp-bench resnet50 |"))
    assert row.endswith(" x119210 |"), row  # NCCL's choice for each of the 238,419 pieces' 119,210 buckets


def test_calibrate_keeps_the_line_rate_and_what_the_transport_reached_of_it():
    """A link labelled (or given) as a rate: the file keeps the rate as beta and the measured share as efficiency,
    so the level predicts what was measured; a link measured faster than its rate is kept as measured."""
    got = {"alpha_s": 1e-4, "beta_s_per_byte": 8 / 20e6, "errors": [0.0], "points": [[4096, 1e-3]]}
    level = clusters.inter_level(got, "25mbit", "measured")
    assert level["beta_s_per_byte"] == pytest.approx(8 / 25e6) and level["efficiency"] == pytest.approx(0.8)
    assert costmodel.beta(LinkConfig(**{k: level[k] for k in ("alpha_s", "beta_s_per_byte", "efficiency")})) == \
        pytest.approx(8 / 20e6)
    assert "efficiency" not in clusters.inter_level(got, "10mbit", "measured")
    assert bytes_per_s("0bit") is None and bytes_per_s("0.5mbit") == 62500  # (0: no rate)


def test_predict_on_16_nodes_of_h100_shows_the_algorithm_and_protocol_each_preset_s_collectives_take(
        tmp_path, monkeypatch):
    out = tmp_path / "plan"
    monkeypatch.setattr(sys, "argv", ["ringexp.plan", "predict", "cluster=h100_16x8_200g", "forward_s=0.01",
                                      "backward_s=0.02", "optimizer_s=0.002", "presets=[ddp,ddp_powersgd,ring]",
                                      f"out={out}"])
    main()
    table = {line.split(" | ")[0].strip("| "): line for line in (out / "plan.md").read_text().splitlines()
             if line.startswith("| ")}
    assert table["preset"].endswith("NCCL's choice (model) |")
    assert "allreduce tree/LL" in table["ddp_powersgd"] and "its own p2p messages" in table["ring"]
    rows = {r["preset"]: r for r in json.loads((out / "plan.json").read_text())["rows"]}
    assert rows["ddp"]["nccl"].startswith("allreduce ") and rows["ring"]["nccl"] == ""
