"""`python -m ringexp.plan calibrate|predict [KEY=VALUE ...]`: what each strategy and compressor will cost on a
cluster before you rent it. The model is ringexp/costmodel.py; clusters are described in conf/cluster/.

calibrate  On the ranks it runs on (`nprocs` local workers, or every rank of a torchrun or Slurm job): every
           rank exchanges a message with a neighbour at each of `sizes`, all at once as in a ring step, first
           inside its node, then with the same local rank on the next node; each level's medians are fitted to
           alpha + n beta by least squares. Then the cost per byte of an add and of every codec, and how much
           slower a rank computes in training (every rank computing and communicating) than alone. Writes a
           conf/cluster/ file (or out=PATH).
predict    For cluster=NAME (or a YAML path) and a training config (model=, data.*, accumulation=, ... as for
           ringexp.train): one row per conf/parallel preset (+parallel=P for one), with the predicted
           communication, exposed communication, step time, samples/s, speed-up over ddp and bytes each rank
           sends per step; the recommended command line (the fastest preset whose measured quality cost is
           within quality_budget); a plot of step time against inter-node bandwidth. Into out= (default
           outputs/plan/<cluster>/<model>/): plan.md, plan.json, plan.png.
accuracy   bench=[bench.json,...] of ringexp.bench run on the cluster: every row's median against the model
           (accuracy.md and .json into out= when given).
"""

import dataclasses
import json
import math
import os
import statistics
import subprocess
import sys
import threading
import time
from datetime import date
from functools import partial
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ringexp import compress, costmodel, records
from ringexp import dist as rdist
from ringexp.config import CONF_DIR, ClusterConfig, CompressionConfig, ModelConfig, PlanConfig, load_yaml, plain
from ringexp.errors import ConfigError, one_line, print_error
from ringexp.launch import adopt_srun_task, elastic, under_external_launcher
from ringexp.models import build_model
from ringexp.optim import build_optimizer
from ringexp.timing import median_time
from ringexp.validate import compose_config

CODECS = ("fp16", "bf16", "int8", "topk", "randomk", "sign", "powersgd")
PLAN_KEYS = {f.name for f in dataclasses.fields(PlanConfig)}
# Measured macro-AUROC lost against uncompressed training (mean paired difference; docs/results/
# compression-quality.md: small CNN, 3 seeds, 7 for bf16; top-k, random-k and sign: seed 0, 1%, error feedback
# on as the presets run them). A gain counts as no loss.
QUALITY_LOSS = {"none": 0.0, "fp16": 0.0, "bf16": 0.003, "int8": 0.005, "powersgd": 0.014, "topk": 0.140,
                "randomk": 0.328, "sign": 0.052}
PLOT_PRESETS = ("ddp", "hierarchical", "hierarchical_int8", "ring_fp16", "ddp_powersgd", "fsdp")
BANDWIDTHS_GBIT = (0.1, 0.25, 0.5, 1, 2.5, 10, 25, 50, 100, 200, 400)
# what `accuracy` reads of a bench.json row, and its type
BENCH_KEYS = {"algorithm": str, "link": str, "size_bytes": int, "count": int, "nodes": int, "ranks_per_node": int,
              "time_us": (int, float)}
CLUSTER_LIMIT = 1 << 20  # the most a cluster file may hold (they take 2 KB)


def clusters() -> list:
    return sorted(p.stem for p in Path(CONF_DIR, "cluster").glob("*.yaml"))


def load(args: list) -> tuple:
    """(PlanConfig, training overrides) from KEY=VALUE arguments: PlanConfig's keys go to conf/plan.yaml,
    every other one is a training override. cluster=PATH.yaml loads that file over the default cluster."""
    plan = [a for a in args if a.split("=", 1)[0].lstrip("+~").split(".")[0] in PLAN_KEYS]
    train = [a for a in args if a not in plan]
    path = next((a.split("=", 1)[1] for a in plan if a.startswith("cluster=") and a.endswith((".yaml", ".yml"))), "")
    name = next((a.split("=", 1)[1] for a in plan if a.startswith("cluster=")), "")
    if name and not path and name not in clusters():
        raise ConfigError(f"cluster={name}: no such cluster file; choose from {', '.join(clusters())} "
                          "(conf/cluster/), or give a YAML path")
    if name and not path:  # read here first, so that Hydra, which reads it again, reads a file that is sound
        cluster_file_config(Path(CONF_DIR, "cluster", f"{name}.yaml"))
    try:
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            cfg = compose("plan", overrides=[a for a in plan if not (path and a.startswith("cluster="))])
        if path:
            cfg.cluster = cluster_file_config(path, over=cfg.cluster)
        return OmegaConf.to_object(cfg), train
    except (HydraException, OmegaConfBaseException) as e:
        # Hydra's first line only names the override ("Error merging override x=.inf"); its cause says what is wrong
        cause = f": {one_line(str(e.__cause__))}" if e.__cause__ else ""
        raise ConfigError(one_line(str(e)).rstrip(".") + cause) from None


def cluster_file_config(path, over=None):
    """The checked ClusterConfig of a cluster file (over `over`, a composed cluster config): a regular file of at
    most CLUSTER_LIMIT bytes (a FIFO or a device is refused, not waited on), UTF-8 YAML, every number finite and
    in its range; ConfigError naming the file otherwise."""
    try:
        data = records.read_bytes(path, CLUSTER_LIMIT, follow=True)
    except OSError as e:
        raise ConfigError(f"cluster={path}: cannot read it ({e.strerror or e}); give a conf/cluster/ YAML file"
                          ) from None
    return load_yaml(ClusterConfig, path, data, over)


# --- calibrate -------------------------------------------------------------------------------------------------

def exchange_times(cfg: PlanConfig, env, to: int, frm: int, sync) -> list:
    """[(bytes, seconds)]: every rank sends `bytes` to `to` while receiving as much from `frm`, all at once; a
    time is the slowest rank's, the median of `iters` rounds after one warm-up."""
    out = []
    for size in cfg.sizes:
        send, recv = (torch.zeros(size, dtype=torch.uint8, device=env.device) for _ in range(2))
        times = []
        for it in range(cfg.iters + 1):
            dist.barrier()
            t0 = time.perf_counter()
            ops = [dist.P2POp(dist.isend, send, to), dist.P2POp(dist.irecv, recv, frm)]
            for w in dist.batch_isend_irecv(ops):
                w.wait()
            sync()
            t = slowest(env, time.perf_counter() - t0)
            times += [t] if it else []
        out.append((size, statistics.median(times)))
    return out


def fit(points: list, scale: int = 1) -> dict:
    """alpha + beta n through (bytes x scale, seconds) points. beta: least squares on absolute error, so that the
    large messages the collectives are made of set it (a relative fit let small messages, noisy and helped by
    the shaper's burst, pull beta down 15-60% on the local cluster); alpha: the least that messages up to 1 MB
    take beyond beta n (scheduling hiccups only ever add time), kept >= 0."""
    x = np.array([b * scale for b, _ in points], dtype=float)
    t = np.array([s for _, s in points], dtype=float)
    (intercept, beta), *_ = np.linalg.lstsq(np.stack([np.ones_like(x), x], 1), t, rcond=None)
    if beta <= 0:
        beta, intercept = t[-1] / x[-1], 0.0
    small = x <= (1 << 20) * scale
    alpha = max(0.0, float(np.min(t[small] - beta * x[small])) if small.any() else float(intercept))
    worst = float(np.max(np.abs(alpha + beta * x - t) / t))
    return {"alpha_s": alpha, "beta_s_per_byte": float(beta), "fit_error": worst,
            "points": [[int(b), s] for b, s in zip(x, t, strict=True)]}


def slowest(env, seconds: float) -> float:
    t = torch.tensor([seconds], dtype=torch.float64, device=env.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def compute_costs(cfg: PlanConfig, env, sync) -> dict:
    """Per float32 byte, every rank at once (the slowest rank's): an add, each codec's encode and decode
    (PowerSGD: P = MQ, orthogonalise, Q = M^T P, M ~ P Q^T at rank 8, as one encode); and the compute slowdown."""
    x, y = torch.randn(1 << 22, device=env.device), torch.randn(1 << 22, device=env.device)
    nbytes = 4 * x.numel()
    dist.barrier()
    out = {"add_s_per_byte": slowest(env, median_time(lambda: y.add_(x), cfg.iters, sync)) / nbytes,
           "encode_s_per_byte": {}, "decode_s_per_byte": {}}
    for name in CODECS[:-1]:
        dist.barrier()
        enc, dec, _ = compress.codec_seconds(CompressionConfig(name=name, error_feedback=False), x, cfg.iters, sync)
        out["encode_s_per_byte"][name] = slowest(env, enc) / nbytes
        out["decode_s_per_byte"][name] = slowest(env, dec) / nbytes
    m, q = torch.randn(1024, 1024, device=env.device), torch.randn(1024, 8, device=env.device)

    def powersgd():
        p = torch.linalg.qr(m @ q).Q
        return p @ (m.T @ p).T

    dist.barrier()
    out["encode_s_per_byte"]["powersgd"] = slowest(env, median_time(powersgd, cfg.iters, sync)) / (4 * m.numel())
    out["decode_s_per_byte"]["powersgd"] = 0.0
    out["compute_slowdown"] = compute_slowdown(env, cfg.iters, sync)
    return out


def compute_slowdown(env, iters: int, sync) -> float:
    """How much slower a rank computes in training than alone: ResNet-18's forward and backward (batch 8, 64 x 64)
    on rank 0 alone, against every rank at once while each also exchanges 4 MB messages with its ring neighbours,
    as DDP's all-reduces run during backward. On shared CPU cores the network stack takes its share: 2.9 on the
    2 x 2 local cluster, against 2.4 without the exchanges and 2.0 for a matmul loop (story runs: 3.4)."""
    model = build_model(ModelConfig(name="resnet18"), 8).to(env.device)
    x, y = torch.randn(8, 3, 64, 64, device=env.device), torch.rand(8, 8, device=env.device)

    def work():
        F.binary_cross_entropy_with_logits(model(x), y).backward()

    work()
    dist.barrier()
    alone = median_time(work, iters, sync) if env.rank == 0 else 0.0
    dist.barrier()
    busy = exchanging(env, lambda: median_time(work, iters, sync))
    return slowest(env, busy) / slowest(env, alone)


def exchanging(env, fn):
    """fn() while a thread on every rank exchanges 4 MB with its ring neighbours on a group of its own; the ranks
    agree each round (a 1-element all-reduce) whether to go on, so that all stop after the same round."""
    side, n = dist.new_group(), env.world_size
    stop = threading.Event()
    send, recv, flag = (torch.randn(1 << 20, device=env.device), torch.empty(1 << 20, device=env.device),
                        torch.zeros(1, device=env.device))

    def loop():
        while True:
            flag.fill_(float(stop.is_set()))
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=side)
            if flag.item():
                return
            for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, send, (env.rank + 1) % n, side),
                                             dist.P2POp(dist.irecv, recv, (env.rank - 1) % n, side)]):
                w.wait()

    thread = threading.Thread(target=loop, name="ringexp-calibrate-exchange", daemon=True)
    thread.start()
    try:
        return fn()
    finally:
        stop.set()
        thread.join()
        dist.destroy_process_group(side)


def calibrate_worker(cfg: PlanConfig) -> dict:
    env = rdist.init("cuda" if torch.cuda.is_available() else "cpu")
    sync = partial(rdist.sync, env.device)
    where = rdist.topology(env)
    k, nodes = where["ranks_per_node"], where["nodes"]
    node, local = divmod(env.rank, k)
    out = dict(where) | {"backend": env.backend, "cpu_threads": torch.get_num_threads() if env.backend == "gloo" else 0}
    if k > 1:
        out["intra"] = fit(exchange_times(cfg, env, node * k + (local + 1) % k, node * k + (local - 1) % k, sync))
    if nodes > 1:  # a step of the ring over every rank: one stream each way per node link, beside the intra hops
        n = env.world_size  # (an exchange within one pair of ranks measured 30-50% slower at 1 Gbit/s here)
        out["inter"] = fit(exchange_times(cfg, env, (env.rank + 1) % n, (env.rank - 1) % n, sync))
    out |= compute_costs(cfg, env, sync)
    rdist.cleanup()
    return out


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=CONF_DIR, timeout=10).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def cluster_file(m: dict, cfg: PlanConfig) -> tuple:
    """(name, YAML text) of a conf/cluster/ file from calibrate's measurements."""
    link = cfg.label or m["link"]
    name = Path(cfg.out).stem if cfg.out else f"calibrated_{m['nodes']}x{m['ranks_per_node']}_{link}"
    how = f"measured by python -m ringexp.plan calibrate at commit {commit()} on {date.today()}"
    levels = {}
    for level in ("intra", "inter"):
        got = m.get(level) or m.get("intra") or m.get("inter")
        note = how if level in m else f"not measured (no second {'rank on a node' if level == 'intra' else 'node'}"\
            f"): the other level's values"
        levels[level] = {"alpha_s": got["alpha_s"], "beta_s_per_byte": got["beta_s_per_byte"],
                         "source": f"{note}; worst fit error {got['fit_error']:.0%}"}
    body = {"name": name, "nodes": m["nodes"], "ranks_per_node": m["ranks_per_node"], "link": link,
            "backend": m["backend"], **levels,
            "add_s_per_byte": m["add_s_per_byte"], "encode_s_per_byte": m["encode_s_per_byte"],
            "decode_s_per_byte": m["decode_s_per_byte"], "compute_slowdown": m["compute_slowdown"],
            "cpu_threads": m["cpu_threads"], "source": how}
    return name, f"# {how}\n" + OmegaConf.to_yaml(OmegaConf.create(body))


def calibrate(cfg: PlanConfig) -> None:
    if under_external_launcher():
        if int(os.environ["WORLD_SIZE"]) < 2:
            raise ConfigError("calibrate needs at least 2 ranks (nprocs=2 or more, or torchrun --nproc-per-node 2)")
        m = calibrate_worker(cfg)
    else:
        m = elastic(calibrate_worker, cfg.nprocs, cfg)[0]
    name, text = cluster_file(m, cfg)
    out = Path(cfg.out or Path(CONF_DIR, "cluster", f"{name}.yaml"))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    for level in ("intra", "inter"):
        if level in m:
            f = m[level]
            seen = ", ".join(f"{b >> 10} KB {t * 1e3:.2f} ms" for b, t in f["points"])
            print(f"ringexp: {level}: alpha {f['alpha_s'] * 1e6:.1f} us, {8 / f['beta_s_per_byte'] / 1e9:.2f} Gbit/s "
                  f"(worst fit error {f['fit_error']:.0%}; measured {seen})")
    print(f"ringexp: add {1 / m['add_s_per_byte'] / 1e9:.2f} GB/s, compute slowdown {m['compute_slowdown']:.2f}; "
          f"wrote {out} (use it: python -m ringexp.plan predict cluster={name})")


def other_rank(args: list) -> None:
    """A non-zero rank of calibrate under torchrun or Slurm: the same config, nothing written."""
    try:
        cfg, _ = load(args)
    except ConfigError as e:
        print_error(str(e))
        sys.exit(2)
    calibrate_worker(cfg)


# --- predict ---------------------------------------------------------------------------------------------------

def presets() -> list:
    return sorted(p.stem for p in Path(CONF_DIR, "parallel").glob("*.yaml") if p.stem != "single")


def preset_config(name: str, train: list):
    """The training config of conf/parallel preset `name` with the user's training overrides."""
    if name == "single":
        raise ConfigError("+parallel=single runs one rank: there is no communication to predict; pick a "
                          f"multi-rank preset ({', '.join(presets())})")
    if name not in presets():
        raise ConfigError(f"preset {name}: no such conf/parallel preset; choose from {', '.join(presets())}")
    return compose_config([*train, f"+parallel={name}"])


def measure_compute(cfg, model, threads: int) -> dict:
    """One rank's forward, backward and optimizer step on this machine (random inputs of the config's batch and
    image size), medians of 5 after 2 warm-up steps."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    sync = partial(rdist.sync, device)
    torch.set_num_threads(threads)
    model = model.to(device)
    b, s = cfg.data.batch_size, cfg.data.image_size
    x, y = torch.randn(b, 3, s, s, device=device), (torch.rand(b, cfg.data.num_labels, device=device) < 0.3).float()
    opt, _ = build_optimizer(model, cfg.optim, b, 100)
    marks = []
    for _ in range(7):
        t = [time.perf_counter()]
        loss = F.binary_cross_entropy_with_logits(model(x).float(), y)
        sync()
        t.append(time.perf_counter())
        loss.backward()
        sync()
        t.append(time.perf_counter())
        opt.step()
        opt.zero_grad()
        sync()
        t.append(time.perf_counter())
        marks.append(np.diff(t))
    f, bw, o = np.median(np.array(marks[2:]), axis=0)
    return {"forward_s": float(f), "backward_s": float(bw), "optimizer_s": float(o)}


def compute_times(pc: PlanConfig, cfg, model, cl) -> tuple:
    """(forward, backward, optimizer seconds, where they come from): given, or measured on one rank here times
    the cluster's compute slowdown."""
    given = {k: getattr(pc, k) for k in ("forward_s", "backward_s", "optimizer_s")}
    if all(v is not None for v in given.values()):
        return given, "given on the command line"
    threads = cl.cpu_threads or rdist.threads(cl.ranks_per_node)  # as the slowdown was measured
    got = {k: v * cl.compute_slowdown for k, v in measure_compute(cfg, model, threads).items()}
    where = "a GPU" if torch.cuda.is_available() else f"{threads} CPU thread(s)"
    return got | {k: v for k, v in given.items() if v is not None}, \
        f"measured here on one rank ({where}) x compute_slowdown {cl.compute_slowdown:.2f}"


def sent_bytes(cfg, cl, shapes: list) -> float:
    """Bytes the busiest rank sends per optimizer step (ringexp.compress's count; FSDP: 2 all-gathers per
    micro-step and a reduce-scatter)."""
    ranks, numel = cl.nodes * cl.ranks_per_node, sum(s.numel() for s in shapes)
    if str(cfg.parallel.strategy) == "fsdp":
        gather, reduce = costmodel.fsdp_ratios(cfg)
        return 4 * numel * (ranks - 1) / ranks * (2 * cfg.accumulation.steps * gather + reduce)
    algo = {"ddp": "builtin"}.get(str(cfg.parallel.strategy), str(cfg.parallel.strategy))
    options = {"nodes": cl.nodes, "variant": str(cfg.parallel.variant)} if algo == "hierarchical" else {}
    return compress.wire_bytes(cfg.compression, algo, numel, ranks, shapes, **options)


def powersgd_s(cfg, cl, shapes: list) -> float | None:
    """PowerSGD's arithmetic per step for these shapes, measured on one rank here times the cluster's compute
    slowdown, when the config uses it (None otherwise)."""
    if cfg.compression.name != "powersgd":
        return None
    return compress.powersgd.arithmetic_s(shapes, cfg.compression) * cl.compute_slowdown


def row(name: str, cfg, cl, shapes: list, compute: dict, here: bool) -> dict:
    """One preset's prediction. `here`: compute was measured on this machine, so PowerSGD's arithmetic is too."""
    got = costmodel.predict_step(cl, cfg, shapes, **compute, powersgd_s=powersgd_s(cfg, cl, shapes) if here else None)
    c = cfg.compression
    loss = QUALITY_LOSS.get(c.name, 0.0) if c.name != "none" else 0.0
    return {"preset": name, "strategy": str(cfg.parallel.strategy), "compression": c.name,
            "accumulation": cfg.accumulation.steps, **got, "sent_bytes": sent_bytes(cfg, cl, shapes),
            "auroc_loss": loss}


def with_bandwidth(cl, gbit: float):
    return dataclasses.replace(cl, inter=dataclasses.replace(cl.inter, beta_s_per_byte=8 / (gbit * 1e9)))


def predict(pc: PlanConfig, train: list) -> None:
    cl = dataclasses.replace(pc.cluster, nodes=pc.nodes or pc.cluster.nodes,
                             ranks_per_node=pc.ranks_per_node or pc.cluster.ranks_per_node)
    rest = [a for a in train if not a.lstrip("+").startswith("parallel=")]
    one = [a.split("=", 1)[1] for a in train if a.lstrip("+").startswith("parallel=")]
    bad = [p for p in pc.presets if p not in presets()]
    if bad:
        raise ConfigError(f"presets: no preset {bad[0]}; choose from {', '.join(presets())}")
    configs = {n: preset_config(n, rest) for n in one or pc.presets or presets()}
    base = configs.get("ddp") or preset_config("ddp", rest)
    model = build_model(base.model, base.data.num_labels)
    shapes = [p.shape for p in model.parameters() if p.requires_grad]
    compute, source = compute_times(pc, base, model, cl)
    here = source.startswith("measured")
    rows = [row(n, c, cl, shapes, compute, here) for n, c in configs.items()]
    ddp = row("ddp", base, cl, shapes, compute, here)
    for r in rows:
        r["speedup"] = r["samples_s"] / ddp["samples_s"]
    ok = [r for r in rows if r["auroc_loss"] <= pc.quality_budget] or rows
    best = max(ok, key=lambda r: r["samples_s"])
    command = " ".join(["python -m ringexp.train", f"+parallel={best['preset']}", *rest])
    out = Path(pc.out or Path("outputs", "plan", cl.name, base.model.name))
    out.mkdir(parents=True, exist_ok=True)
    plot(cl, {n: c for n, c in (configs | {"ddp": base}).items() if n in PLOT_PRESETS}, shapes, compute,
         out / "plan.png")
    text = report(cl, base, rows, compute, source, best, command, pc)
    (out / "plan.md").write_text(text)
    (out / "plan.json").write_text(json.dumps({"cluster": plain(cl), "compute": compute, "compute_source": source,
                                               "rows": rows, "recommended": command}, indent=1) + "\n")
    print(text, end="")
    print(f"ringexp: wrote {out}/plan.md, plan.json and plan.png")


def report(cl, base, rows: list, compute: dict, source: str, best: dict, command: str, pc) -> str:
    ranks = cl.nodes * cl.ranks_per_node
    lines = [f"# Predicted by ringexp's cost model (not measured): {base.model.name}, batch {base.data.batch_size} "
             f"per rank, on {cl.name}: {cl.nodes} node(s) x {cl.ranks_per_node} = {ranks} ranks", "",
             f"- intra-node: alpha {cl.intra.alpha_s * 1e6:.1f} us, {8 / cl.intra.beta_s_per_byte / 1e9:.3g} Gbit/s "
             f"({cl.intra.source or 'no source given'})",
             f"- inter-node: alpha {cl.inter.alpha_s * 1e6:.1f} us, {8 / cl.inter.beta_s_per_byte / 1e9:.3g} Gbit/s "
             f"per node ({cl.inter.source or 'no source given'})",
             f"- compute per rank: forward {compute['forward_s'] * 1e3:.1f} ms, backward "
             f"{compute['backward_s'] * 1e3:.1f} ms, optimizer {compute['optimizer_s'] * 1e3:.1f} ms ({source})",
             "", "| preset | strategy | compression | accum | all-reduce s | exposed s | step s | samples/s | "
             "x ddp | MB sent/rank/step | AUROC cost |", "|" + "---|" * 11]
    for r in sorted(rows, key=lambda r: -r["samples_s"]):
        lines.append(f"| {r['preset']} | {r['strategy']} | {r['compression']} | {r['accumulation']} | "
                     f"{r['comm_s']:.3f} | {r['exposed_s']:.3f} | {r['step_s']:.3f} | {r['samples_s']:.1f} | "
                     f"{r['speedup']:.2f}x | {r['sent_bytes'] / 1e6:.2f} | {r['auroc_loss']:.3f} |")
    lossy = [r for r in rows if r["auroc_loss"] > pc.quality_budget]
    lines += ["", f"Recommended (fastest within quality_budget={pc.quality_budget} macro-AUROC): `{command}`"]
    if lossy:
        lines.append(f"Left out for quality: {', '.join(r['preset'] for r in lossy)} (measured losses in "
                     "docs/results/compression-quality.md, on the small CNN task; they vary with model and optimizer)")
    return "\n".join(lines) + "\n"


def plot(cl, configs: dict, shapes: list, compute: dict, path: Path) -> None:
    """Predicted step time of the main presets against the bandwidth of a node's link (alpha kept)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, cfg in sorted(configs.items()):
        steps = [costmodel.predict_step(with_bandwidth(cl, g), cfg, shapes, **compute)["step_s"]
                 for g in BANDWIDTHS_GBIT]
        ax.plot(BANDWIDTHS_GBIT, steps, marker="o", label=name)
    ax.axvline(8 / cl.inter.beta_s_per_byte / 1e9, color="grey", linestyle=":", label=f"{cl.name}'s link")
    ax.set(xscale="log", yscale="log", xlabel="inter-node bandwidth per node (Gbit/s)", ylabel="step time (s)",
           title=f"predicted (cost model): {cl.nodes} x {cl.ranks_per_node} ranks")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --- accuracy ---------------------------------------------------------------------------------------------------

def accuracy(pc: PlanConfig) -> None:
    """Every row of the bench.json files in `bench` (ringexp.bench on the cluster) against the model's prediction
    from the cluster file: a table, and the median and worst relative errors."""
    rows = [(path, r) for path in pc.bench for r in bench_rows(path)]
    if not rows:
        raise ConfigError("accuracy needs bench=[PATH,...]: bench.json files of ringexp.bench run on the cluster")
    out = []
    for path, r in rows:
        try:  # the cluster's own checks (nodes and ranks in range), naming the bench file whose row failed them
            cl = dataclasses.replace(pc.cluster, nodes=r["nodes"], ranks_per_node=r["ranks_per_node"])
        except ConfigError as e:
            raise ConfigError(f"bench={path}: {e}") from None
        name, _, comp = r["algorithm"].partition("+")
        algo = model_algorithm(name)
        cname, _, where = comp.partition(":")
        c = CompressionConfig(name=cname or "none", error_feedback=False, scope="inter_node" if where else "all")
        predicted = costmodel.compressed_s(cl, c, algo, r["count"])
        out.append({"algorithm": r["algorithm"], "size_bytes": r["size_bytes"], "nodes": r["nodes"],
                    "ranks_per_node": r["ranks_per_node"], "link": r["link"], "measured_s": r["time_us"] / 1e6,
                    "predicted_s": predicted, "error": predicted / (r["time_us"] / 1e6) - 1})
    errors = sorted(abs(o["error"]) for o in out)
    lines = [f"# {pc.cluster.name}: ringexp.bench medians against the cost model", "",
             "| nodes x ranks | link | algorithm | size | measured ms | predicted ms | error |", "|" + "---|" * 7]
    lines += [f"| {o['nodes']} x {o['ranks_per_node']} | {o['link']} | {o['algorithm']} | {o['size_bytes'] >> 20} MB | "
              f"{o['measured_s'] * 1e3:.1f} | {o['predicted_s'] * 1e3:.1f} | {o['error']:+.0%} |" for o in out]
    lines += ["", f"{len(out)} cases: median |error| {statistics.median(errors):.1%}, worst {errors[-1]:.1%}; "
              f"within 10%: {sum(e <= 0.10 for e in errors)}, within 25%: {sum(e <= 0.25 for e in errors)}"]
    text = "\n".join(lines) + "\n"
    if pc.out:
        Path(pc.out).mkdir(parents=True, exist_ok=True)
        Path(pc.out, "accuracy.md").write_text(text)
        Path(pc.out, "accuracy.json").write_text(json.dumps(out, indent=1) + "\n")
        accuracy_plot(pc.cluster.name, out, Path(pc.out, "accuracy.png"))
    print(text, end="")


def bench_rows(path: str) -> list:
    """The rows of one bench.json of ringexp.bench, each with what accuracy reads, of the type it needs (numbers
    finite and in range, an algorithm and compressor the bench runs); ConfigError naming the file and row."""
    try:
        rows = records.parse_json(records.read_bytes(path, records.SMALL, follow=True))
    except (OSError, ValueError) as e:
        raise ConfigError(f"bench={path}: cannot read it ({e}); give bench.json files of ringexp.bench") from None
    if not isinstance(rows, list):
        raise ConfigError(f"bench={path}: not a list of rows; give bench.json files of ringexp.bench")
    for i, r in enumerate(rows):
        wrong = bench_row_error(r)
        if wrong:
            raise ConfigError(f"bench={path}: row {i}: {wrong}; give bench.json files of ringexp.bench")
    return rows


def model_algorithm(bench_name: str) -> str:
    """The cost model's algorithm for a bench row's ('ring:256': a segment size; hierarchical is two_level)."""
    name = bench_name.split(":")[0]
    return {"hierarchical": "two_level"}.get(name, name)


def bench_row_error(r) -> str:
    """What keeps a bench.json row from being predicted ('' when nothing does)."""
    if not isinstance(r, dict):
        return f"a {type(r).__name__}, not a row (an object)"
    missing = [k for k in BENCH_KEYS if k not in r]
    if missing:
        return f"no {missing[0]!r}"
    for key, kind in BENCH_KEYS.items():
        v = r[key]
        if isinstance(v, bool) or not isinstance(v, kind):  # (True is an int to Python)
            return f"{key}={v!r} is not {'a string' if kind is str else 'an integer' if kind is int else 'a number'}"
        if kind is not str and not (math.isfinite(v) and v > 0):
            return f"{key}={v!r} must be a finite number > 0"
    name, _, comp = r["algorithm"].partition("+")
    cname, colon, where = comp.partition(":")
    if model_algorithm(name) not in costmodel.ALGORITHMS or (comp and (cname not in compress.COMPRESSORS
                                                                 or cname in ("none", "powersgd")
                                                                 or (colon and where != "inter"))):
        return f"algorithm {r['algorithm']!r} is none ringexp.bench runs"
    return ""


def accuracy_plot(name: str, out: list, path: Path) -> None:
    """Measured against predicted, one point per bench case (colour: compressor, marker: algorithm), with the
    line where they are equal and the 25% band around it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 5))
    markers = dict(zip(["builtin", "ring", "hierarchical", "leader", "naive"], "osD^v", strict=True))
    colours = {"none": "tab:blue", "fp16": "tab:orange", "int8": "tab:green"}
    for o in out:
        algo, _, comp = o["algorithm"].partition("+")
        comp = comp.split(":")[0] or "none"
        ax.scatter(o["measured_s"] * 1e3, o["predicted_s"] * 1e3, marker=markers.get(algo.split(":")[0], "x"),
                   color=colours.get(comp, "tab:grey"), s=30, alpha=0.8)
    lo = min(min(o["measured_s"], o["predicted_s"]) for o in out) * 1e3 / 1.5
    hi = max(max(o["measured_s"], o["predicted_s"]) for o in out) * 1e3 * 1.5
    ax.plot([lo, hi], [lo, hi], color="black", linewidth=1)
    ax.fill_between([lo, hi], [lo * 0.75, hi * 0.75], [lo * 1.25, hi * 1.25], color="grey", alpha=0.15,
                    label="within 25%")
    for label, m in markers.items():
        ax.scatter([], [], marker=m, color="black", label=label)
    for label, c in colours.items():
        ax.scatter([], [], marker="s", color=c, label=label)
    ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), xlabel="measured median (ms)",
           ylabel="predicted (ms)", title=f"{name}: all-reduce, model against ringexp.bench")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    usage = "usage: python -m ringexp.plan calibrate|predict|accuracy [KEY=VALUE ...] (see ringexp/plan.py)"
    args = sys.argv[1:]
    if not args or args[0] not in ("calibrate", "predict", "accuracy"):
        print_error(f"first argument must be calibrate, predict or accuracy; {usage}")
        sys.exit(2)
    command, args = args[0], args[1:]
    if command == "calibrate":
        adopt_srun_task()
    if command == "calibrate" and under_external_launcher() and os.environ.get("RANK", "0") != "0":
        return other_rank(args)
    try:
        cfg, train = load(args)
        if command != "predict" and train:
            raise ConfigError(f"{command} takes no training overrides (got {train[0]}); see conf/plan.yaml")
        if command == "calibrate":
            calibrate(cfg)
        elif command == "accuracy":
            accuracy(cfg)
        else:
            predict(cfg, train)
    except ConfigError as e:
        print_error(str(e))
        sys.exit(2)


if __name__ == "__main__":
    main()
