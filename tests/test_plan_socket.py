"""The planner's links from their mechanisms: the socket transport (streams x a per-stream ceiling, at most what
NCCL's proxy threads move; NCCL's channels and socket variables), shares by topology, a GPU codec's cost, compute
slowed beside communication on GPUs, calibrate's socket fit and all-to-all and all-gather shares, and their bad
input."""

import dataclasses
import math

import pytest
import torch
from helpers.processes import plan_refusal
from helpers.runs import published_cases

from ringexp import parallel
from ringexp.cluster import costmodel, nccl
from ringexp.cluster import files as clusters
from ringexp.cluster.schema import (
    EFFICIENCY,
    OVERLAP_SLOWDOWN,
    POWERSGD_TENSOR_S,
    SOCKET_THREAD_BPS,
    ClusterConfig,
    LinkConfig,
)
from ringexp.config import BackendConfig
from ringexp.errors import ConfigError
from ringexp.plan import rules
from ringexp.validate import compose_config


def socket(gbit: float, **kw) -> LinkConfig:
    return LinkConfig(1.4e-5, 8 / (gbit * 1e9), transport="socket", **kw)


def test_a_socket_link_reaches_less_of_a_faster_line():
    """Two streams (NCCL's two channels, one socket each) fill a 1 Gbit/s link but not a 100 Gbit/s one."""
    shares = [costmodel.efficiency(socket(g)) for g in (1, 10, 25, 100)]
    assert shares == sorted(shares, reverse=True)
    assert shares[0] > 0.98 and 0.3 < shares[-1] < 0.45  # NCCL over 100 Gbit/s: 4-6 of 12.5 GB/s (nccl#450, #398)


def test_the_ceiling_reproduces_nccl_s_rings_over_tcp_at_32_gbit():
    """NVIDIA/nccl#209 (NCCL 2.3.7, GCP, 32 Gbit/s): 2.06, 2.77, 3.28, 3.75 GB/s with 1, 2, 4, 8 rings (one
    socket each), each within 5% of the rule's."""
    for streams, measured in ((1, 2.06e9), (2, 2.77e9), (4, 3.28e9), (8, 3.75e9)):
        got = 1 / costmodel.beta(socket(32, streams=streams))
        assert got == pytest.approx(measured, rel=0.05), streams


@pytest.mark.parametrize("env, streams", [
    ({}, 0), ({"NCCL_SOCKET_NTHREADS": "4"}, 8), ({"NCCL_SOCKET_NTHREADS": "2", "NCCL_NSOCKS_PERTHREAD": "8"}, 32),
    ({"NCCL_NSOCKS_PERTHREAD": "4"}, 2), ({"NCCL_MIN_NCHANNELS": "4"}, 4), ({"NCCL_MAX_NCHANNELS": "1"}, 1),
    ({"NCCL_MIN_NCHANNELS": "8", "NCCL_MAX_NCHANNELS": "4"}, 8)])
def test_nccl_s_socket_variables_set_the_streams_as_nccl_counts_them(env, streams):
    """Channels (2, cut to MAX, then copied up to MIN, which wins) x sockets per connection (threads x sockets per
    thread, where no helper thread means the connection's own socket: NSOCKS_PERTHREAD alone adds none); no
    variable: the file's."""
    assert nccl.socket_streams(env, 0) == streams


def test_a_channel_setting_keeps_the_cluster_s_sockets_per_connection():
    """An AWS file's 32 streams (2 channels x 16 sockets): 4 channels keep the 16 sockets; threads set anew
    replace them."""
    assert nccl.socket_streams({"NCCL_MIN_NCHANNELS": "4"}, 32) == 64
    assert nccl.socket_streams({"NCCL_MAX_NCHANNELS": "64"}, 32) == 32
    assert nccl.socket_streams({"NCCL_SOCKET_NTHREADS": "2"}, 32) == 4


def tcp_cluster(gbit: float) -> ClusterConfig:
    return ClusterConfig(name="tcp", nodes=2, ranks_per_node=1, gpu_arch="volta", inter=socket(gbit),
                         intra=LinkConfig(3.4e-6, 1e-11, transport="nvlink"))


def test_a_run_with_more_sockets_is_predicted_faster_on_a_fast_tcp_link():
    shapes = [torch.Size([4096, 4096])] * 8  # 512 MB of gradients
    compute = {"forward_s": 0.01, "backward_s": 0.02, "optimizer_s": 0.0}
    cl = tcp_cluster(100)
    base = parallel.step_cost(cl, compose_config(["+parallel=ddp"], 2), shapes, compute)
    more = parallel.step_cost(cl, compose_config(["+parallel=ddp", "+backend.env.NCCL_SOCKET_NTHREADS=4",
                                                  "+backend.env.NCCL_NSOCKS_PERTHREAD=2"], 2), shapes, compute)
    assert more["comm_s"] < 0.5 * base["comm_s"]
    slow = parallel.step_cost(tcp_cluster(1), compose_config(["+parallel=ddp", "+backend.env.NCCL_SOCKET_NTHREADS=4"],
                                                             2), shapes, compute)
    plain = parallel.step_cost(tcp_cluster(1), compose_config(["+parallel=ddp"], 2), shapes, compute)
    assert slow["comm_s"] == pytest.approx(plain["comm_s"], rel=0.03)  # a slow line is the limit either way


def test_compute_beside_communication_is_slowed_on_gpus_only():
    """DDP on NCCL: backward lasts the GPU generation's factor x the communication beside it longer (hiding as
    much more of what was exposed); on gloo, and with overlap_slowdown 0, the step is compute plus exposure."""
    shapes = [torch.Size([1024, 1024])] * 25  # 100 MB in 1 MB buckets: all but the last hidden in backward
    compute = {"forward_s": 1.0, "backward_s": 2.0, "optimizer_s": 0.0}
    cfg = compose_config(["+parallel=ddp", "parallel.bucket_cap_mb=1"], 1)
    gpu = ClusterConfig(name="g", nodes=1, ranks_per_node=8, gpu_arch="volta",
                        intra=LinkConfig(3.4e-6, 1e-10, transport="nvlink"))
    got = parallel.step_cost(gpu, cfg, shapes, compute)
    plain = parallel.step_cost(dataclasses.replace(gpu, overlap_slowdown=0.0), cfg, shapes, compute)
    hidden = plain["comm_s"] - plain["exposed_s"]
    assert got["step_s"] - plain["step_s"] == pytest.approx(
        max(0.0, OVERLAP_SLOWDOWN["volta"] * hidden - plain["exposed_s"]), rel=1e-9, abs=1e-12)
    assert plain["exposed_s"] < OVERLAP_SLOWDOWN["volta"] * hidden and got["step_s"] > plain["step_s"]
    cpu = dataclasses.replace(gpu, backend="gloo")
    assert costmodel.overlap_slowdown(cpu) == 0.0


def test_calibrate_keeps_a_slow_socket_link_as_its_streams_ceiling():
    """transport=socket: the measured rate below line rate is kept as the per-stream ceiling that gives it, so
    the level predicts what was measured, and more streams predict more."""
    got = {"alpha_s": 1e-4, "beta_s_per_byte": 8 / 20e6, "errors": [0.0], "points": [[4096, 1e-3]]}
    level = clusters.inter_level(got, "25mbit", "measured", streams=1)
    assert level["transport"] == "socket" and level["streams"] == 1 and level["beta_s_per_byte"] == 8 / 25e6
    link = LinkConfig(**{k: level[k] for k in ("alpha_s", "beta_s_per_byte", "transport", "streams", "socket_Bps")})
    assert costmodel.beta(link) == pytest.approx(8 / 20e6)
    assert costmodel.beta(dataclasses.replace(link, streams=4)) == pytest.approx(1 / (4 * 12.5e6) + 8 / 25e6)
    assert "socket_Bps" not in clusters.inter_level(got, "25mbit", "measured")  # an efficiency, as before
    at_line = dict(got, beta_s_per_byte=8 / 25e6 * (1 + 1e-9))  # at line rate, to within the measurement
    assert clusters.inter_level(at_line, "25mbit", "measured", streams=2)["transport"] == "measured"


@pytest.mark.parametrize("ceiling", [0.0, math.nan, math.inf])
def test_a_socket_ceiling_of_zero_or_nan_is_refused_naming_it(ceiling):
    with pytest.raises(ConfigError, match="cluster.inter.socket_Bps"):
        ClusterConfig(inter=socket(10, socket_Bps=ceiling))


@pytest.mark.parametrize("env, words", [
    ({"NCCL_SOCKET_NTHREADS": "17"}, "backend.env.NCCL_SOCKET_NTHREADS=17: must be an integer in [1, 16]"),
    ({"NCCL_SOCKET_NTHREADS": "8", "NCCL_NSOCKS_PERTHREAD": "16"},
     "backend.env.NCCL_SOCKET_NTHREADS=8: times NCCL_NSOCKS_PERTHREAD=16 is more than NCCL's 64"),
    ({"NCCL_NSOCKS_PERTHREAD": "0"}, "backend.env.NCCL_NSOCKS_PERTHREAD=0: must be an integer in [1, 64]")])
def test_socket_counts_out_of_nccl_s_range_are_refused(env, words):
    with pytest.raises(ConfigError, match="^" + words.replace("[", r"\[").replace("]", r"\]")):
        compose_config(["+parallel=ddp", *(f"+backend.env.{k}={v}" for k, v in env.items())], 1)


def test_a_count_of_digits_python_reads_but_int_does_not_is_refused():
    """'\u00b2' is a digit to str.isdigit and no integer to int(): a cases file's env reaches the check with it."""
    with pytest.raises(ConfigError, match="NCCL_SOCKET_NTHREADS=\u00b2: is no number as NCCL reads it"):
        BackendConfig(env={"NCCL_SOCKET_NTHREADS": "\u00b2"})


def test_a_count_is_read_as_nccl_reads_it_a_c_integer():
    """NCCL reads its counts with C's strtoll(value, NULL, 0): "010" is the octal 8 and "0x10" 16, and the streams
    predicted are the ones NCCL runs (int() read "010" as 10); "08", which NCCL reads as 0 and ignores the rest
    of, is refused."""
    assert nccl.socket_streams({"NCCL_MIN_NCHANNELS": "010"}, 0) == 8
    env = {"NCCL_MIN_NCHANNELS": "0x10", "NCCL_SOCKET_NTHREADS": "02", "NCCL_NSOCKS_PERTHREAD": "2"}
    assert nccl.socket_streams(env, 0) == 16 * 2 * 2
    BackendConfig(env={"NCCL_MIN_NCHANNELS": "0x10"})  # NCCL's 16, within its 64
    for bad in ("08", "4 sockets", ""):
        with pytest.raises(ConfigError, match=f"NCCL_MIN_NCHANNELS={bad}: is no number as NCCL reads it"):
            BackendConfig(env={"NCCL_MIN_NCHANNELS": bad})


@pytest.mark.parametrize("change, words", [
    (lambda doc: doc["clusters"]["dgx1_v100"]["inter"].update(transport="socket", socket_Bps=0),
     "cluster dgx1_v100: cluster.inter.socket_Bps=0"),
    (lambda doc: doc["cases"][0].update(env={"NCCL_SOCKET_NTHREADS": 32, "NCCL_NSOCKS_PERTHREAD": 4}),
     "case ddp-bench resnet50: env.NCCL_SOCKET_NTHREADS: 32: must be an integer in [1, 16]"),
    (lambda doc: doc["cases"][0].update(env={"NCCL_SOCKET_NTHREADS": 16, "NCCL_NSOCKS_PERTHREAD": 8}),
     "case ddp-bench resnet50: env.NCCL_SOCKET_NTHREADS: 16 times NCCL_NSOCKS_PERTHREAD=8 is more than NCCL's 64"),
], ids=["zero ceiling", "threads", "threads x sockets"])
def test_a_cases_file_with_socket_settings_nccl_refuses_is_one_line(tmp_path, monkeypatch, capsys, change, words):
    path = published_cases(tmp_path, ("ddp-bench resnet50", "rn50v1.5 dgx-a100 tf32"), change)
    line = plan_refusal(monkeypatch, capsys, ["accuracy", f"cases=[{path}]"])
    assert f"cases={path}: " in line and words in line, line


def test_calibrate_s_transport_is_measured_or_socket_with_a_line_rate(monkeypatch, capsys):
    """Refused before anything is measured: an unknown transport, sockets with no line rate to fall short of,
    and NCCL socket counts in the environment NCCL would not take."""
    line = plan_refusal(monkeypatch, capsys, ["calibrate", "transport=tcp"])
    assert "transport=tcp: choose measured or socket" in line, line
    monkeypatch.delenv("RINGEXP_CLUSTER_LINK", raising=False)
    line = plan_refusal(monkeypatch, capsys, ["calibrate", "transport=socket"])
    assert "transport=socket keeps what the link reached below its line rate: give line_rate=" in line, line
    monkeypatch.setenv("NCCL_SOCKET_NTHREADS", "32")
    line = plan_refusal(monkeypatch, capsys, ["calibrate", "transport=socket", "line_rate=10gbit"])
    assert "NCCL_SOCKET_NTHREADS=32 in the environment: must be an integer in [1, 16]" in line, line


def test_one_proxy_thread_bounds_a_fast_socket_link_whatever_its_streams():
    """Since NCCL 2.4.2 a rank's one proxy thread moves every stream's bytes: more streams add no thread
    (nccl#209: 2.4.2's 1-8 rings all at 1.45-1.95 GB/s), so a 100 Gbit/s NIC with AWS's 32 streams reaches what its
    threads move, and threads started by NCCL_SOCKET_NTHREADS (a file's socket_threads) lift it again; at 10
    Gbit/s the line binds first."""
    thread = SOCKET_THREAD_BPS
    assert 1 / costmodel.beta(socket(100, streams=32)) == pytest.approx(thread)
    assert 1 / costmodel.beta(socket(100, streams=32, socket_threads=0.5)) == pytest.approx(thread / 2)
    assert 1 / costmodel.beta(socket(100, streams=32, socket_threads=4)) > 2 * thread
    assert costmodel.efficiency(socket(10, socket_threads=0.5)) == costmodel.efficiency(socket(10, socket_threads=8))
    with pytest.raises(ConfigError, match=r"cluster.inter.socket_threads=0.25: must be in \[0.5, "):
        ClusterConfig(inter=socket(100, socket_threads=0.25))


@pytest.mark.parametrize("transport, topology, share", [("pcie", "switch", 0.72), ("pcie", "root_complex", 0.40),
                                                         ("pcie", "cross_socket", 0.30), ("rdma", "gdr", 0.94),
                                                         ("rdma", "host", 0.64)])
def test_a_level_s_topology_sets_its_share_below_its_own_efficiency(transport, topology, share):
    link = LinkConfig(1e-5, 1e-10, transport=transport, topology=topology)
    assert costmodel.efficiency(link) == share
    assert costmodel.efficiency(dataclasses.replace(link, efficiency=0.5)) == 0.5  # a stated efficiency wins
    assert costmodel.efficiency(dataclasses.replace(link, topology="")) == EFFICIENCY[transport]


@pytest.mark.parametrize("transport, topology, words", [
    ("pcie", "gdr", "choose one of switch, root_complex, cross_socket for transport pcie"),
    ("nvlink", "switch", "only a pcie or rdma level states a topology")])
def test_a_topology_the_transport_has_not_is_refused_in_one_line(transport, topology, words):
    with pytest.raises(ConfigError, match=f"cluster.intra.topology={topology}: {words}"):
        ClusterConfig(intra=LinkConfig(transport=transport, topology=topology))


def test_a_gpu_codec_the_file_did_not_measure_costs_its_passes_through_memory():
    """On a GPU cluster a codec without a measured cost pays its passes over the bytes at 0.75 of the generation's
    memory bandwidth (V100's fp16 encode 1.5 / (0.75 x 900 GB/s)); a measured cost wins; a CPU cluster's missing
    codec costs nothing; PowerSGD pays per compressed tensor besides, so that per-tensor PowerSGD on a slow link
    is slower than fused buckets."""
    gpu = tcp_cluster(10)
    assert costmodel.codec(gpu, "fp16") == pytest.approx((1.5 / (0.75 * 900e9), 2.5 / (0.75 * 900e9)))
    assert costmodel.codec(dataclasses.replace(gpu, gpu_arch="hopper"), "fp16")[0] < costmodel.codec(gpu, "fp16")[0]
    measured = dataclasses.replace(gpu, encode_s_per_byte={"fp16": 1e-9}, decode_s_per_byte={"fp16": 2e-9})
    assert costmodel.codec(measured, "fp16") == (1e-9, 2e-9)
    assert costmodel.codec(dataclasses.replace(gpu, backend="gloo"), "fp16") == (0.0, 0.0)
    shapes = [torch.Size([2048, 2048])] * 16
    compute = {"forward_s": 0.05, "backward_s": 0.1, "optimizer_s": 0.0}
    psgd = ["+parallel=ddp_powersgd"]
    fused = parallel.step_cost(gpu, compose_config(psgd, 2), shapes, compute)
    free = parallel.step_cost(rules.free_codec(gpu), compose_config(psgd, 2), shapes, compute)
    assert fused["comm_s"] - free["comm_s"] >= 16 * POWERSGD_TENSOR_S["volta"] * 0.99


def test_calibrate_keeps_the_all_to_all_s_and_the_all_gather_s_measured_shares():
    """calibrate's measured all-to-all (k(p - k) messages through a node's link) and gloo all-gather (p - 1) become
    the level's shares, at most 1; nothing measured, nothing kept."""
    level = {"alpha_s": 0.0, "beta_s_per_byte": 8e-8, "transport": "measured", "efficiency": 0.9, "source": "m"}
    got = {"all_to_all": [1 << 20, 3 * (1 << 20) * 8e-8 / 0.6], "all_gather": [1 << 20, 3 * (1 << 20) * 8e-8 / 1.2]}
    kept = clusters.with_shares(level, got, {"all_to_all": 3, "all_gather": 3})
    assert kept["all_to_all_efficiency"] == pytest.approx(0.6) and kept["all_gather_efficiency"] == 1.0
    assert "1 MB messages (3 through a node's link)" in kept["source"]
    assert clusters.with_shares(level, {}, {"all_to_all": 3}) == level
