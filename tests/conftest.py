"""Helpers every test module shares (test modules never import each other): the real CLI in a subprocess, shrunk
to a few CPU steps; strategies built from the real composed config; killing and resuming runs; reading an
offline W&B run's records."""

import contextlib
import dataclasses
import io
import json
import os
import re
import signal
import struct
import subprocess
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
import zygote
from PIL import Image

from ringexp import records, train
from ringexp.launch import elastic
from ringexp.metrics import state_bytes
from ringexp.trainer import forward_backward
from ringexp.validate import compose_config

ROOT = Path(__file__).resolve().parent.parent
# Tests that run torch in pytest's own process do it on one thread: their figures do not depend on the machine.
torch.set_num_threads(1)
# A few seconds of training: tiny model and data, still 2 real gloo workers.
# A row every step (logger.log_every=1), so that tests can follow the run step by step. No W&B (logger=none):
# its offline run costs about 2.5 s of CPU a run; the tests of W&B's records say logger=wandb.
TINY = ["steps=12", "eval_every=6", "throughput_warmup=2", "data.train_size=1024", "data.val_size=101",
        "data.batch_size=16", "model.width=8", "optim.warmup_steps=2", "logger=none", "logger.log_every=1"]


# How scripts/test.sh spreads the suite over its 2 pytest workers (pytest-xdist, -n 2). A unit of work is one test,
# except where tests share something: a file whose fixtures are module- or session-scoped goes whole to one worker
# (split, each worker would build them again), and test_cluster.py and test_slurm.py, which both start and stop
# this machine's one Slurm (and apt-install it), are one unit, run one after the other. Units go out in the order
# of LONGEST_FIRST (the files whose tests take longest on a 2-core machine, as measured for docs/results/README.md's
# "the suite"), so that the last minutes are short tests filling in, not one long file on one worker.
SHARED = {"test_cluster.py": "slurm", "test_slurm.py": "slurm", "test_compare.py": None, "test_completed.py": None,
          "test_resume.py": None, "test_train.py": None, "test_lr_rule.py": None}
LONGEST_FIRST = ["test_cluster.py", "test_slurm.py", "test_resume.py", "test_hostile.py", "test_tune.py",
                 "test_hostile_tune.py", "test_fuzz.py", "test_plan.py", "test_library.py", "test_faults.py",
                 "test_hostile_run.py", "test_bench.py", "test_quality.py"]


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # (stable: a file's own order is kept)


@pytest.hookimpl(optionalhook=True)  # (pytest -p no:xdist: no such hook)
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class Units(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            name = Path(path).name
            return nodeid if name not in SHARED else SHARED[name] or path

    config.option.loadscopereorder = False  # in collection order: LONGEST_FIRST's
    return Units(config, log)


def workers(fn, n: int, *args) -> dict:
    """fn(*args) in n real gloo workers through torch's elastic launch ({rank: return value}), forked from a
    forkserver that has imported this module: under a second each, against about 8 s to spawn fresh interpreters.
    Not forked from pytest's process: it runs threads (the launch's own rendezvous store, earlier tests' pools), and
    a fork that catches one holding a lock leaves the child stuck on it (a rank never joined, in CI)."""
    start_forkserver()
    return elastic(fn, n, *args, start_method="forkserver")


def start_forkserver():
    """Start multiprocessing's forkserver with this module and torch imported once (idempotent). Python 3.11's
    forkserver ignores the parent's sys.path, so tests/ reaches it through PYTHONPATH, for its start only.
    torchmetrics too (and torch's compiler, which it imports): a worker that wraps a model in DDP or evaluates
    imports them, 3 s of CPU a worker (10 under load), once here instead (pytest's own process only where a test
    uses it)."""
    from multiprocessing import forkserver

    forkserver.set_forkserver_preload(["conftest", "torchmetrics"])
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "tests"), saved) if p)
    try:
        forkserver.ensure_running()
    finally:
        os.environ.pop("PYTHONPATH") if saved is None else os.environ.update(PYTHONPATH=saved)


def run_cli(run_dir: Path, *overrides: str, module: str = "ringexp.train", timeout: int = 300, env=None,
            prefix=()) -> subprocess.CompletedProcess:
    args, e = [*overrides, f"hydra.run.dir={run_dir}"], cli_env(env)
    if module == zygote.MODULE and not prefix and not env and not zygote.fresh():  # (env: some is read on import)
        return zygote.run(args, e, timeout)
    cmd = [*prefix] if prefix else [sys.executable, "-m", module]
    return subprocess.run([*cmd, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=e)


# `python -m ringexp.train ARGS` as a tune's trial runs it, forked from this pytest worker's warm interpreter (zygote):
# a trial's own run is about a second of training behind 10 s of imports, and the tune's tests run a dozen trials.
# This client is the trial's process (the tune's keeper starts it and signals its group): it hands its stdin, stdout
# and stderr, directory, environment and arguments to the warm interpreter, passes every signal it gets on to the
# forked run's process group (the run starts a session of its own), and exits as the run did.
TRAIN_CLIENT = r"""import json, os, signal, socket, sys
caught = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
signal.pthread_sigmask(signal.SIG_BLOCK, caught)  # (held until the run's pid is known)
conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
conn.connect(sys.argv[1])
request = {"module": "ringexp.train", "args": sys.argv[2:], "cwd": os.getcwd(), "env": dict(os.environ)}
socket.send_fds(conn, [json.dumps(request).encode()], [0, 1, 2])
pid = int(conn.recv(64))

def forward(sig, _):
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:  # (not yet its own group's leader, or gone)
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass

for s in caught:
    signal.signal(s, forward)
signal.pthread_sigmask(signal.SIG_UNBLOCK, caught)
code = int(conn.recv(64))
if code < 0:
    signal.signal(-code, signal.SIG_DFL)
    os.kill(os.getpid(), -code)
sys.exit(code)
"""


def train_command(where: Path) -> str:
    """The shell command (to exec, with "$@") that runs ringexp.train as a tune's trial: forked from the warm
    interpreter through TRAIN_CLIENT (written into `where`), or `python -m ringexp.train` under RINGEXP_TEST_FRESH=1."""
    if zygote.fresh():
        return f"{sys.executable} -m ringexp.train"
    client = where / "train_client.py"
    client.write_text(TRAIN_CLIENT)
    return f"{sys.executable} {client} {zygote.server().path}"


def start_module(module: str, *args: str, fresh: bool = False):
    """`python -m module args` in ROOT, in a session of its own, stdout and stderr piped: zygote.Forked's (forked
    from the warm interpreter: 10 s of imports less each) unless `fresh` or RINGEXP_TEST_FRESH=1, else Popen's."""
    if not (fresh or zygote.fresh()):
        return zygote.Forked(list(args), cli_env(), module)
    return subprocess.Popen([sys.executable, "-m", module, *args], cwd=ROOT, env=cli_env(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)


def run_module(module: str, *args: str, timeout: float) -> subprocess.CompletedProcess:
    """subprocess.run(capture_output=True, text=True) of `python -m module args` in ROOT, forked as start_module's."""
    if zygote.fresh():
        return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, env=cli_env(), capture_output=True,
                              text=True, timeout=timeout)
    return zygote.run(list(args), cli_env(), timeout, module)


def cli_env(extra=None) -> dict:
    """A command's environment: this one, W&B quiet, tracebacks left to ringexp (no HYDRA_FULL_ERROR)."""
    env = {**os.environ, "WANDB_SILENT": "true", **(extra or {})}
    env.pop("HYDRA_FULL_ERROR", None)
    return env


# Callbacks run just before this process opens a path (sys.addaudithook; a hook cannot be removed, so there is one,
# and it does nothing while ON_OPEN is empty): what another process would do at that moment (swap a file, start a
# run beside this one). ON_OPEN[path] = callback, which returns True to be called again at the next open.
ON_OPEN = {}


def _on_open(event, args):
    if event == "open" and ON_OPEN and (callback := ON_OPEN.pop(str(args[0]), None)) is not None:
        if callback():
            ON_OPEN[str(args[0])] = callback


sys.addaudithook(_on_open)

read_summary = records.read_summary
read_rows = records.read_rows  # the one reader of metrics.jsonl


def published_cases(tmp_path, names, change=lambda doc: None) -> str:
    """ringexp/plan/published.yaml with only the cases `names` (and every cluster), changed by `change`, written
    to tmp_path: the path."""
    doc = yaml.safe_load((ROOT / "ringexp" / "plan" / "published.yaml").read_text())
    doc["cases"] = [c for c in doc["cases"] if c["name"] in names]
    change(doc)
    path = tmp_path / "cases.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def error_line(stderr: str) -> str:
    """ringexp's one error line; fails if there is not exactly one, or a traceback."""
    lines = [x for x in stderr.splitlines() if x.startswith("ringexp: error:")]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr, stderr
    return lines[0]


@contextlib.contextmanager
def within(seconds: int):
    """A failed test instead of one that hangs or runs for minutes (a FIFO opened for reading waits for a writer
    forever; matplotlib lays out every character of a 900 KB label). pytest's failure, not TimeoutError: that is an
    OSError, which compare takes for an unreadable file."""
    def give_up(*_):
        pytest.fail(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, give_up)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def plan_refusal(monkeypatch, capsys, args: list) -> str:
    """ringexp.plan's command line on `args`, in this process (a second instead of ten): its one error line, once
    it has checked that the command exited 2."""
    from ringexp.plan.cli import main

    monkeypatch.setattr(sys, "argv", ["ringexp.plan", *args])
    with pytest.raises(SystemExit) as e:
        main()
    assert e.value.code == 2
    return error_line(capsys.readouterr().err)


def run_torchrun(cmd: list[str], cwd, timeout: int = 600) -> subprocess.CompletedProcess:
    """An external torchrun, run again where one of its processes aborted at exit: torch 2.14.1's gloo sometimes
    does, after destroy_process_group, in a loop of plain torch with no ringexp in it too (1 run of 8,
    2026-12-05; again in CI's external torchrun test, 2026-12-06). Any other failure is returned as it is."""
    for _ in range(3):
        r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
        if r.returncode == 0 or "terminate called without an active exception" not in r.stderr:
            break
    return r


@pytest.fixture
def tiny():
    return list(TINY)


@pytest.fixture
def image_folder(tmp_path):
    return make_image_folder(tmp_path / "images")


def make_image_folder(root: Path, n: int = 24) -> Path:
    """A small real image folder with a labels CSV: 3 labels, n PNG images."""
    root.mkdir(parents=True)
    rng = np.random.default_rng(0)
    lines = ["path,cat,dog,bird"]
    for i in range(n):
        Image.fromarray(rng.integers(0, 255, (20, 20, 3), dtype=np.uint8)).save(root / f"img{i}.png")
        lines.append(f"img{i}.png," + ",".join(str(int(v)) for v in rng.integers(0, 2, 3)))
    (root / "labels.csv").write_text("\n".join(lines) + "\n")
    return root


# --- strategies on real process groups ---------------------------------------------------------------------

def strategy_cfg(strategy: str, world: int, **parallel_overrides):
    """The real composed config of `+parallel=strategy` for `world` workers, with parallel.* overridden."""
    cfg = compose_config([f"+parallel={strategy}", f"launcher.nproc_per_node={world}"])
    return dataclasses.replace(cfg, parallel=dataclasses.replace(cfg.parallel, **parallel_overrides))


def train_steps(model, opt, rank: int, k: int, steps: int, no_sync):
    """`steps` optimizer steps of k micro-batches of random data (per-rank, same for every strategy): the
    losses and the whole gradients (FSDP's shards gathered) of every step, and the bytes of parameters,
    gradients and optimizer state the rank held after the first."""
    losses, grads, state = [], [], None
    for step in range(steps):
        g = torch.Generator().manual_seed(100 * step + rank)
        micro = iter([(torch.randn(4, 3, 12, 12, generator=g), torch.randint(0, 2, (4, 5), generator=g).float())
                      for _ in range(k)])
        scaler = torch.amp.GradScaler("cpu", enabled=False)
        losses.append(float(forward_backward(model, micro, k, nullcontext, scaler, no_sync)))
        grads.append(torch.cat([(p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).flatten()
                                for p in model.parameters()]))
        opt.step()
        state = state or state_bytes(model, opt)
        opt.zero_grad()
    return losses, grads, state["state_bytes"]


# --- runs that are killed and resumed ----------------------------------------------------------------------

# 30 steps, a checkpoint every 5: the kill lands after step 8 and the resumption continues from step 5.
RUN = [o for o in TINY if not o.startswith(("steps", "eval_every"))] + [
    "steps=30", "eval_every=10", "checkpoint.every_steps=5", "logger=none"]
KILL_AFTER = 8
EXIT_WITHIN_S = 60
# (preset, what is killed, resume afterwards): exactness for ddp, ring, ring_fp16 and top-k with error feedback,
# and FSDP's distributed checkpoint; a dying rank for ddp, ring, hierarchical and fsdp.
# (plain DDP's kill is ddp_topk's without the compressor state: that case covers it)
KILL_CASES = [("ring+wandb", "rank0", True), ("ring_fp16", "job", True), ("ddp_topk", "rank1", True),
              ("hierarchical", "rank1", False), ("fsdp", "rank1", True)]


def start(run_dir, *overrides, fresh=False):
    """The run started in its own session (start_module's: forked from a warm interpreter unless `fresh`), its
    stdout and stderr piped."""
    return start_module(zygote.MODULE, *overrides, f"hydra.run.dir={run_dir}", fresh=fresh)


def descendants(pid: int) -> set:
    """pid and every process below it, from /proc."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = set(), [pid]
    while todo:
        p = todo.pop()
        found.add(p)
        todo += children.get(p, [])
    return found


def alive(pid: int) -> bool:
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def worker_pid(run_dir, rank: int) -> int:
    return int(re.search(r"\(pid (\d+)\)", (run_dir / f"rank{rank}.log").read_text()).group(1))


def wait_for_step(proc, run_dir, step: int, timeout=180):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        rows = read_rows(run_dir)
        if rows and rows[-1]["step"] >= step:
            return
        time.sleep(0.02)
    raise AssertionError(f"no step {step} within {timeout}s")


def preset_overrides(preset: str) -> list:
    """`ring+wandb`: the ring preset with the offline W&B run on (whose id the resumed run must continue);
    `ddp+cuda`: on the GPUs (NCCL, one rank per GPU), with deterministic algorithms: cuDNN's and cuBLAS's default
    ones sum in an order that varies, and the losses of two uninterrupted runs drift apart by 1e-3 in 10 steps."""
    name, _, extra = preset.partition("+")
    cuda = ["launcher.device=cuda", "launcher.deterministic=true"]
    # diloco+fast: synchronised (period 3, two fragments, sign with error feedback) before the first checkpoint
    fast = ["parallel.period=3", "parallel.fragments=2", "compression=sign"]
    return [f"+parallel={name}"] + {"wandb": ["logger=wandb"], "cuda": cuda, "fast": fast}.get(extra, [])


def losses(run_dir) -> dict:
    return {r["step"]: r["train/loss"] for r in read_rows(run_dir)}


def reference_losses(run_root):
    """get(preset): the losses of an uninterrupted run of RUN with that preset, computed once (in `run_root()`)."""
    cache = {}

    def get(preset):
        if preset not in cache:
            run_dir = run_root() / preset.replace("+", "_")
            r = run_cli(run_dir, *RUN, *preset_overrides(preset))
            assert r.returncode == 0, r.stderr[-3000:]
            cache[preset] = losses(run_dir)
        return cache[preset]

    return get


def kill_and_resume(run_dir, preset: str, kill: str, resume: bool, references) -> float:
    """Kill a run after step KILL_AFTER (one worker, or the whole job), check how it went down, resume it and
    compare every loss with the uninterrupted reference; returns the seconds from the kill to the job's exit."""
    proc = start(run_dir, *RUN, *preset_overrides(preset))
    wait_for_step(proc, run_dir, KILL_AFTER)
    tree = descendants(proc.pid)
    killed_at = time.monotonic()
    if kill == "job":  # the whole job at once, as a preempted or lost node would
        os.killpg(proc.pid, signal.SIGKILL)
    else:
        os.kill(worker_pid(run_dir, int(kill[-1])), signal.SIGKILL)
    _, err = proc.communicate(timeout=EXIT_WITHIN_S + 30)
    took = time.monotonic() - killed_at
    assert proc.returncode != 0
    assert took < EXIT_WITHIN_S, took
    deadline = time.monotonic() + 10
    while any(alive(p) for p in tree) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in tree if alive(p)], "processes left behind"
    if kill != "job":
        line = next(x for x in err.splitlines() if x.startswith("ringexp: error:"))
        assert f"worker rank {kill[-1]} failed" in line and "SIGKILL" in line and "Traceback" not in err, err
        assert read_summary(run_dir)["status"] == "failed"
    steps_before = sorted(losses(run_dir))
    assert steps_before[-1] >= KILL_AFTER
    assert (run_dir / "checkpoints" / "step-00000005" / "meta.json").is_file()
    if not resume:
        return took

    r = run_cli(run_dir, *RUN, *preset_overrides(preset), "resume=auto")
    assert r.returncode == 0, r.stderr[-3000:]
    s = read_summary(run_dir)
    assert s["status"] == "completed" and s["resumed_from"]["step"] >= 5
    rows = read_rows(run_dir)
    assert [row["step"] for row in rows] == list(range(1, 31)), "every step exactly once"
    ref, got = references(preset), losses(run_dir)
    # Bit-identical: same weights, optimizer, schedule, residuals, RNG and data position as the reference (on GPUs
    # with deterministic algorithms: preset_overrides). A first step off at or before the checkpoint's is the
    # device's nondeterminism; after it, the resumption.
    off = [(k, got[k], ref[k]) for k in ref if got.get(k) != ref[k]]
    assert got.keys() == ref.keys() and not off, off[:5]
    assert s["final"]["auroc_macro"] is not None
    if preset.endswith("+wandb"):  # the resumed run continued the same W&B run: same id, a second segment
        runs = sorted((run_dir / "wandb").glob("offline-run-*"))
        wandb_id = json.loads((run_dir / "checkpoints" / "step-00000030" / "meta.json").read_text())["wandb_id"]
        assert len(runs) == 2 and all(r.name.endswith(f"-{wandb_id}") for r in runs), runs
    return took


# --- an offline W&B run's transaction log, read without W&B's service ----------------------------------------
# The file is a 7-byte header (':W&B', magic 0xBEE1, version) followed by a LevelDB-style log: 32 KiB blocks of
# records, each a 7-byte header (crc32c, little-endian length, type) and data; records too big for a block are
# split FIRST/MIDDLE/LAST. Each full record is a protobuf `Record` from wandb.proto.

BLOCK, HEADER = 32768, 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def wandb_records(path: Path):
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B transaction log"
    pos, pending = 7, b""
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # block trailer padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        chunk = data[pos + HEADER:pos + HEADER + length]
        pos += HEADER + length
        if kind == 0 and length == 0:
            continue
        if kind in (FIRST, MIDDLE):
            pending = chunk if kind == FIRST else pending + chunk
            continue
        pending = chunk if kind == FULL else pending + chunk
        rec = pb.Record()
        rec.ParseFromString(pending)
        yield rec


def history_and_summary(path: Path):
    """([{key: value} per logged row], {summary key: value}, run record) from the transaction log."""
    rows, summary, run = [], {}, None
    for rec in wandb_records(path):
        kind = rec.WhichOneof("record_type")
        if kind == "history":
            rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                         for item in rec.history.item})
        elif kind == "summary":
            for item in rec.summary.update:
                summary[item.key or ".".join(item.nested_key)] = json.loads(item.value_json)
        elif kind == "run":
            run = rec.run
    return rows, summary, run


def refused(run_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
    """What run_cli returns for a command ringexp refuses before any worker starts, run in this process:
    ringexp.train's own entry (cli) on these arguments, with its exit code, stdout and stderr. A CLI run costs
    about 6 s of imports; this, a fraction of one. For commands that must be refused: anything else fails here."""
    argv, out, err, code = sys.argv, io.StringIO(), io.StringIO(), 0
    sys.argv = ["ringexp.train", *overrides, f"hydra.run.dir={run_dir}"]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            train.cli()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    finally:
        sys.argv = argv
    assert code != 0, f"not refused: {overrides}\n{err.getvalue()[-2000:]}"
    return subprocess.CompletedProcess(sys.argv, code, out.getvalue(), err.getvalue())
