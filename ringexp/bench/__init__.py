"""`python -m ringexp.bench [overrides]`: all-reduce algorithms timed like nccl-tests, checked against builtin.

For each world size in `nprocs` one elastic job; in it, for each dtype and message size, every algorithm is
first checked against torch.distributed.all_reduce on the same random input (#wrong counts elements off by
more than the dtype's tolerance), then timed: `iters` rounds, algorithms interleaved within a round so that
the machine's drift hits all of them alike; a time is the slowest rank's, the median over rounds is kept.
algbw = bytes / time; busbw = algbw x 2(n-1)/n (nccl-tests' PERFORMANCE.md), comparable across n.

Under torchrun (on one node or several: `scripts/cluster_local.sh torchrun -- -m ringexp.bench ...`) the job's
own ranks are benchmarked instead of `nprocs`, hierarchical follows the job's real nodes, and every row says
where it ran (nodes, ranks per node, the link between nodes).
"""

import csv
import io
import logging
import math
import os
import statistics
import sys
import time
from functools import partial
from pathlib import Path

import hydra
import torch
import torch.distributed as dist
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

from ringexp import comm, compress, conffiles, entry, records
from ringexp import dist as rdist
from ringexp.bench.config import BenchConfig
from ringexp.config import CONF_DIR, CompressionConfig, Device, credentials, hidden, plain
from ringexp.errors import ConfigError, print_error
from ringexp.launch import elastic, under_external_launcher, worker_failure
from ringexp.sinks.wandb import WandbSink
from ringexp.timing import median_time
from ringexp.validate import check_gpus, resolve_device

log = logging.getLogger("ringexp")
DTYPE_NAMES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16, "bfloat16": torch.bfloat16}
TOLERANCE = {"float32": 1e-5, "float64": 1e-12, "float16": 1e-2, "bfloat16": 2e-2}
# Copies of the largest message one rank holds at once besides one buffer per row (timed_rounds): the input, its
# float32 draw, the check's reference and tolerance (count_wrong), the algorithm's scratch; a 16-bit message's
# float32 temporaries take twice its bytes. codec=true holds the input, its cast, the payload and the decode.
COPIES, CODEC_COPIES = 4, 4


def sizes(cfg) -> list:
    if cfg.sizes:
        return list(cfg.sizes)
    out, s = [], cfg.min_bytes
    while s <= cfg.max_bytes:
        out.append(s)
        s *= cfg.size_factor
    return out


def check(cfg: BenchConfig, external: bool = False) -> None:
    """What the bench config's own field checks cannot see: names, and nodes against every world size (under an
    external launcher the job's one world size, and its real nodes when it spans several)."""
    for name in cfg.algorithms:  # ringexp.comm's names: ring, ring:KiB, hierarchical[:variant], naive, builtin
        try:
            comm.parse(name)
        except ValueError as e:
            raise ConfigError(f"bench: {e}") from None
    try:  # every row's name as ringexp.compress.parse reads it (compressors, :inter, :two_phase, :all_gather)
        row_specs(cfg)
    except ValueError as e:
        raise ConfigError(f"bench: {e} (powersgd is a DDP hook: not benchmarked)") from None
    bad = [d for d in cfg.dtypes if d not in DTYPE_NAMES]
    if bad:
        raise ConfigError(f"bench: unknown dtype {bad[0]}; choose from {', '.join(DTYPE_NAMES)}")
    # auto: cuda where every world size finds a GPU per rank on this node (NCCL runs one rank per GPU), else cpu;
    # resolved in place, so that the workers see the resolved device
    local = [int(os.environ.get("LOCAL_WORLD_SIZE", 1))] if external else cfg.nprocs
    if cfg.launcher.device == Device.auto and max(local) > torch.cuda.device_count():
        cfg.launcher.device = Device.cpu
    cfg.launcher.device = resolve_device(cfg.launcher.device)
    for n in local:
        check_gpus(cfg.launcher.device, n, "LOCAL_WORLD_SIZE" if external else "nprocs")
    check_sizes(cfg, max(local))
    if any(comm.parse(a)[0] == "hierarchical" for a in cfg.algorithms):
        worlds = [int(os.environ["WORLD_SIZE"])] if external else cfg.nprocs
        if external and worlds[0] > int(os.environ.get("LOCAL_WORLD_SIZE", worlds[0])):
            return  # the real nodes divide the job by construction
        odd = [n for n in worlds if n % cfg.nodes]
        if odd:
            raise ConfigError(f"bench: nodes={cfg.nodes} does not divide nprocs={odd[0]}; set nodes to a divisor")


def check_sizes(cfg: BenchConfig, ranks: int) -> None:
    """Every message holds one element of every dtype it is timed in, and the largest fits in memory with `ranks`
    ranks on this machine (host memory on the CPU, each rank's GPU on CUDA): else the workers would time another
    size than asked, or the kernel would kill one of them mid-table."""
    key = f"bench: sizes={cfg.sizes}" if cfg.sizes else f"bench: min_bytes={cfg.min_bytes}, max_bytes={cfg.max_bytes}"
    widest = max(["float32"] if cfg.codec else cfg.dtypes, key=lambda d: DTYPE_NAMES[d].itemsize)
    if min(sizes(cfg)) < DTYPE_NAMES[widest].itemsize:
        raise ConfigError(f"{key}: {min(sizes(cfg))} bytes hold no {widest} element; every size must be >= "
                          f"{DTYPE_NAMES[widest].itemsize} bytes")
    biggest = max(sizes(cfg))
    if cfg.codec:
        ranks, copies = 1, CODEC_COPIES
    else:
        copies = len(row_specs(cfg)) + COPIES * (2 if min(DTYPE_NAMES[d].itemsize for d in cfg.dtypes) < 4 else 1)
    cuda = cfg.launcher.device == Device.cuda and not cfg.codec
    have = (min(torch.cuda.get_device_properties(i).total_memory for i in range(ranks)) if cuda
            else os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    need = biggest * copies * (1 if cuda else ranks)
    if need > have:
        held = f"{ranks} ranks x {copies}" if ranks > 1 and not cuda else f"{copies}"
        raise ConfigError(f"{key}: a {fmt_size(biggest)} message needs about {fmt_size(need)} of memory ({held} "
                          f"buffers of its size), more than {'each GPU' if cuda else 'this machine'} has "
                          f"({fmt_size(have)}); time smaller sizes")


def row_specs(cfg: BenchConfig) -> dict:
    """{row name: (ringexp.comm algorithm, options, compressor config or None)}: every algorithm uncompressed, then
    every (algorithm, compressor) pair, NAME:inter wire formats on hierarchical rows only; a row's name is what
    ringexp.compress.parse reads back (ringexp.plan accuracy does)."""
    names = list(cfg.algorithms)
    for cname in cfg.compressors:
        if cname != "none":
            names += [f"{a}+{cname}" for a in cfg.algorithms if ":inter" not in cname or comm.parse(a)[0] ==
                      "hierarchical"]
    return {name: compress.parse(name, ratio=cfg.ratio) for name in names}


def count_wrong(x, y, c, dname: str, n: int, algorithm: str = "builtin") -> int:
    """Elements of `y` off from builtin's sum by more than the dtype's tolerance; for a compressor, from
    builtin's sum of every rank's locally encoded-and-decoded input, within that compressor's error bound; for
    the two phases, from what they return on every rank's input (torch's all-gather, then
    ringexp.compress.phases.reference), up to float32 summation order."""
    if c is None:
        ref = comm.all_reduce(x.clone(), "builtin", check=False)
        tol = TOLERANCE[dname] * (ref.abs().float() + 1)
    elif compress.route(c, algorithm, n) == "two_phase":
        xs = [torch.empty_like(x) for _ in range(n)]
        dist.all_gather(xs, x)
        ref = compress.reference(xs, c)
        tol = 1e-5 * (ref.abs().float() + 1)
    else:
        ref = comm.all_reduce(compress.roundtrip(x, c), "builtin", check=False)
        tol = compress.tolerance(c, ref, n)
    return int(((y.float() - ref.float()).abs() > tol).sum())


def bench_worker(cfg: BenchConfig) -> list:
    env = rdist.init(str(cfg.launcher.device))
    n, rows, where = env.world_size, [], rdist.topology(env)
    # hierarchical: the job's real nodes when it spans several, else cfg.nodes emulated ones on this machine
    nodes = where["nodes"] if where["nodes"] > 1 else cfg.nodes
    opts = {"segment_bytes": cfg.segment_kb and cfg.segment_kb * 1024, "timeout_s": cfg.timeout_s, "nodes": nodes}
    specs = row_specs(cfg)  # compressed rows use float32

    def run(buf, spec):
        algo, o, c = spec
        if c is None:
            # check=False: the bench times the algorithm alone (its inputs agree by construction)
            return comm.all_reduce(buf, algo, check=False, **comm.options_for(algo, opts | o))
        scope = {"scope": c.scope} if algo == "hierarchical" else {}
        return compress.all_reduce(buf, algo, compress.State(c), **(opts | o | scope))

    for dname in cfg.dtypes:
        dtype = DTYPE_NAMES[dname]
        for nbytes in sizes(cfg):
            count = max(1, nbytes // torch.tensor([], dtype=dtype).element_size())
            g = torch.Generator().manual_seed(1000 * env.rank + count)
            x = torch.randn(count, generator=g).to(env.device, dtype)
            here = {name: spec for name, spec in specs.items() if spec[2] is None or dtype == torch.float32}
            wrong = {name: count_wrong(x, run(x.clone(), spec), spec[2], dname, n, spec[0]) for name, spec in
                     here.items()}
            times = timed_rounds(cfg, x, {name: partial(run, spec=spec) for name, spec in here.items()})
            base = statistics.median(times["builtin"]) if "builtin" in times else None
            for name in here:
                t = statistics.median(times[name])
                algbw = count * x.element_size() / t / 1e9
                rows.append({
                    "nprocs": n, **where, "backend": env.backend, "algorithm": name,
                    "size_bytes": count * x.element_size(), "count": count,
                    "type": dname, "time_us": t * 1e6, "algbw_GBps": algbw, "busbw_GBps": algbw * 2 * (n - 1) / n,
                    "wrong": wrong[name], "vs_builtin": (base / t) if base else None,
                    "wire_bytes": sent_bytes(here[name], count * x.element_size(), n, opts),
                    "time_us_p10": 1e6 * (statistics.quantiles(times[name], n=10)[0] if len(times[name]) > 1 else t),
                    "time_us_mean": 1e6 * statistics.mean(times[name]),  # what a run pays over many, tails included
                })
            if env.is_main:
                print_rows(rows[-len(here):], header=nbytes == sizes(cfg)[0] and dname == cfg.dtypes[0])
    rdist.cleanup()
    return rows


def sent_bytes(spec, nbytes: int, n: int, opts: dict) -> int:
    """Bytes the busiest rank sends in one call of a row (the same count a training run records)."""
    algo, o, c = spec
    options = comm.options_for(algo, opts | o)
    if c is None:
        return comm.wire_bytes(algo, nbytes, n, **options)
    return compress.wire_bytes(c, algo, nbytes // 4, n, **options)


def timed_rounds(cfg: BenchConfig, x, runs: dict) -> dict:
    """{name: [seconds per round]}: warm-up, then rounds in which every run(buf) goes once (interleaved, so that
    the machine's drift hits all alike); a time is the slowest rank's. In a timed round every rank first idles
    cfg.gap_s before each run (untimed), as a training step computes before its all-reduce: a shaped link (tbf)
    saves tokens while idle, and each run, not just a round's first, should meet the link a step would."""
    bufs = {name: x.clone() for name in runs}
    times = {name: [] for name in runs}
    rounds, it = cfg.warmup + cfg.iters, 0
    while it < rounds:
        round_s = 0.0
        for name, run in runs.items():
            if cfg.gap_s and it >= cfg.warmup:
                time.sleep(cfg.gap_s)  # then the barrier: every rank starts the run together, as without a gap
            dist.barrier()
            rdist.sync(x.device)
            t0 = time.perf_counter()
            run(bufs[name])
            rdist.sync(x.device)  # (CUDA: the collective has run on the device, not just been queued)
            t = rdist.slowest(time.perf_counter() - t0, x.device)
            round_s += t
            if it >= cfg.warmup:
                times[name].append(t)
            bufs[name].copy_(x)  # untimed: repeated sums would grow to inf over hundreds of rounds
        if it == cfg.warmup:  # small sizes are noisy: more rounds, until about min_time_s in all
            rounds += min(19 * cfg.iters, max(0, math.ceil(cfg.min_time_s / round_s) - cfg.iters))
        it += 1
    return times


def codec_rows(cfg: BenchConfig) -> list:
    """`codec=true`: each compressor's encode and decode on one core against a float32-to-fp16 cast of the same
    tensor (the cheapest codec there is), median of `iters` rounds: what the CPU pays per byte the wire saves."""
    torch.set_num_threads(1)
    rows = []
    for nbytes in sizes(cfg):
        x = torch.randn(nbytes // 4)
        cast_s = median_time(partial(x.to, torch.float16), cfg.iters)
        rows += [codec_row(name, x, cast_s, cfg) for name in cfg.compressors if name != "none" and ":" not in name]
    print("\n# codecs on one core (x cast = a float32-to-fp16 cast's time / this time; 1 is as fast as the cast)")
    print(f"{'size':>8} {'codec':>9} {'encode ms':>10} {'decode ms':>10} {'cast ms':>8} {'enc x cast':>10} "
          f"{'dec x cast':>10} {'wire':>6}")
    for r in rows:
        print(f"{fmt_size(r['size_bytes']):>8} {r['codec']:>9} {r['encode_ms']:>10.2f} {r['decode_ms']:>10.2f} "
              f"{r['cast_fp16_ms']:>8.2f} {r['encode_vs_cast']:>10.2f} {r['decode_vs_cast']:>10.2f} "
              f"{r['wire_fraction']:>6.3f}")
    return rows


def codec_row(name: str, x, cast_s: float, cfg: BenchConfig) -> dict:
    c = CompressionConfig(name=name, ratio=cfg.ratio, error_feedback=False)
    enc_s, dec_s, payload = compress.codec_seconds(c, x, cfg.iters)
    return {"codec": name, "size_bytes": x.numel() * 4, "encode_ms": enc_s * 1e3, "decode_ms": dec_s * 1e3,
            "cast_fp16_ms": cast_s * 1e3, "encode_vs_cast": cast_s / enc_s, "decode_vs_cast": cast_s / dec_s,
            "wire_fraction": payload / (x.numel() * 4)}


def fmt_size(b: int) -> str:
    for unit, k in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if b >= k:
            return f"{b / k:g}{unit}"
    return f"{b}B"


def print_rows(rows: list, header: bool) -> None:
    if header:
        r = rows[0]
        print(f"\n# nprocs={r['nprocs']} on {r['nodes']} node(s) x {r['ranks_per_node']} rank(s), link {r['link']}, "
              f"{r['backend']}  "
              "(time = median over rounds of the slowest rank; "
              "busbw = algbw x 2(n-1)/n; x builtin = builtin time / this time; sent = bytes the busiest rank sends)")
        print(f"{'size':>8} {'count':>11} {'type':>9} {'algorithm':>24} {'time(us)':>11} {'algbw':>7} {'busbw':>7} "
              f"{'#wrong':>7} {'x builtin':>9} {'sent':>8}")
    for r in rows:
        ratio = f"{r['vs_builtin']:.2f}" if r["vs_builtin"] else "-"
        print(f"{fmt_size(r['size_bytes']):>8} {r['count']:>11} {r['type']:>9} {r['algorithm']:>24} "
              f"{r['time_us']:>11.1f} {r['algbw_GBps']:>7.3f} {r['busbw_GBps']:>7.3f} {r['wrong']:>7} {ratio:>9} "
              f"{fmt_size(r['wire_bytes']):>8}",
              flush=True)


def write_results(rows: list, run_dir: Path) -> None:
    """bench.json and bench.csv, each written whole (records.write_file: never through a symlink at its name)."""
    records.write_json(run_dir / records.BENCH, rows)
    buf = io.StringIO(newline="")
    w = csv.DictWriter(buf, fieldnames=list(rows[0]))
    w.writeheader()
    w.writerows(rows)
    records.write_file(run_dir / "bench.csv", buf.getvalue())


def log_wandb(cfg: dict, rows: list, run_dir: Path) -> None:
    meta = {"group": cfg["name"] or "bench", "job_type": "bench", "name": cfg["name"] or "bench", "choices": {}}
    sink = WandbSink.open(cfg, run_dir, meta)
    if sink is None:
        return
    for i, r in enumerate(rows, start=1):
        sink.log({f"bench/{k}": v for k, v in r.items() if isinstance(v, int | float)} | {
            "bench/label": f"{r['algorithm']}-n{r['nprocs']}-{r['type']}"}, i)
    sink.close()


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="bench")
def main(cfg) -> None:
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    secret = credentials(cfg)  # (recorded as their interpolations, as a training run's: ringexp.config.hidden)
    try:
        config = OmegaConf.to_object(cfg)  # BenchConfig: its fields check themselves
        check(config, external=under_external_launcher())
    except ConfigError as e:
        failed(run_dir, hidden(str(e), secret), 2)
    try:
        rows = results(config, run_dir)
    except Exception as e:  # a worker died or raised (the agent's error names the rank): one line, as train's
        message, code = worker_failure(e)
        failed(run_dir, hidden(message, secret), code)
    write_results(rows, run_dir)
    if not config.codec:
        log_wandb(hidden(plain(config), secret), rows, run_dir)
    print(f"\nringexp: results in {run_dir}/bench.csv and bench.json")


def results(config: BenchConfig, run_dir: Path) -> list:
    """The rows: the codecs in this process (codec=true), else one elastic job per world size, or this process as
    rank 0 of an external torchrun's (on one node or several)."""
    if config.codec:
        return codec_rows(config)
    if under_external_launcher():
        return bench_worker(config)
    rows = []
    for n in config.nprocs:
        rows += elastic(bench_worker, n, config, log_dir=run_dir / f"workers-n{n}")[0]
    return rows


def failed(run_dir: Path, message: str, code: int) -> None:
    """summary.json says why, ringexp's one line says it, and the exit code: 2 for a config, 1 for a failure."""
    records.mark_failed(run_dir, message[:2000])
    print_error(message)
    sys.exit(code)


def other_rank() -> None:
    """A non-zero rank under torchrun: the same bench config, composed without Hydra's app (no run directory)."""
    try:
        cfg = conffiles.compose(entry.overrides(sys.argv[1:]), "bench")
        config = OmegaConf.to_object(cfg)
        check(config, external=True)
    except (ConfigError, ValueError) as e:
        print_error(str(e))
        sys.exit(2)
    try:
        bench_worker(config)
    except Exception as e:  # rank 0 reports the job's failure; this rank, in one line, why it stopped
        message, code = worker_failure(e)
        print_error(message)
        sys.exit(code)
