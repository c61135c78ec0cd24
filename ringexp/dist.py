"""Process-group set-up for one worker. All device-specific choices live here and in launch.py."""

import atexit
import os
import random
import signal
import socket
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from ringexp import stop

_held = False  # whether this process joined a process group (init): how `end` ends it
_returned = False  # whether this spawned worker's function returned (`spawned`)


@dataclass
class Env:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    device: torch.device
    backend: str

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def threads(local_world: int, given: int = 0) -> int:
    """Intra-op threads of one worker: `given` (launcher.threads_per_worker), else OMP_NUM_THREADS as the user
    or launcher set it (torchrun sets 1 for several workers per node; scripts/cluster_local.sh sets the machine's
    cores over all its nodes' ranks, since every node of that cluster is this one machine), else the cores this
    process may run on (a Slurm or taskset CPU set, not the whole machine) over the workers of the node:
    oversubscribed intra-op threads make every rank slower."""
    if given:
        return given
    env = os.environ.get("OMP_NUM_THREADS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    return max(1, cores() // local_world)


def cores() -> int:
    """CPUs this process may run on: its affinity set where the OS has one (Linux), else the machine's."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def init(device: str, threads_per_worker: int = 0, timeout_s: float = 300.0) -> Env:
    """Join the process group described by the torchrun-style environment (RANK, WORLD_SIZE, MASTER_*)."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    # A GPU rank's CPU threads too (data collation, pinning): the cores shared among the node's ranks, as torchrun's
    # OMP_NUM_THREADS would, which a local elastic launch does not set.
    torch.set_num_threads(threads(local_world, threads_per_worker))
    if device == "cuda":
        # One GPU per rank: the node's GPUs by local rank, or the one GPU a scheduler bound to each task
        # (Slurm's --gpus-per-task: every task sees its own as cuda:0)
        dev, backend = torch.device("cuda", local_rank % torch.cuda.device_count()), "nccl"
        torch.cuda.set_device(dev)
    else:
        dev, backend = torch.device("cpu"), "gloo"
    global _held
    _held = True
    if not dist.is_initialized():
        dist.init_process_group(backend, rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s),
                                device_id=dev if backend == "nccl" else None)
    return Env(rank, world, local_rank, local_world, dev, backend)


def deterministic() -> None:
    """Deterministic algorithms for the rest of this process (launcher.deterministic): on GPUs, cuDNN's
    convolutions and cuBLAS's reductions otherwise sum in an order that varies from run to run (atomics, split-K),
    so a resumed run drifts from an uninterrupted one by about 1e-3 in 10 steps (docs/results/gpu.md). Call it
    before the first matmul: cuBLAS reads its workspace setting when it starts. Ops with no deterministic version
    (max pooling's backward on CUDA) warn instead of failing; CPU ranks are deterministic already."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)


def handover(device: torch.device):
    """A mark another thread's work on `device`'s tensors must wait for: on CUDA, an event recorded on the
    calling thread's current stream of that device (the compute stream that produced them); None on CPU."""
    if device.type != "cuda":
        return None
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(device))
    return event


@contextmanager
def on_device(device: torch.device, ready=None, streams: dict | None = None):
    """Run a block on a thread other than the one that produced its tensors (a communication hook's worker). On
    CUDA: `device` becomes the thread's current device (a new thread's is cuda:0, whatever rank it serves), and
    the block's work goes on a side stream (one per device, kept in `streams`) that first waits for `ready`
    (handover's event), so it starts after the tensors are written and runs beside the compute stream. On CPU:
    as is."""
    if device.type != "cuda":
        yield
        return
    with torch.cuda.device(device):
        stream = streams.setdefault(device, torch.cuda.Stream(device)) if streams is not None else \
            torch.cuda.Stream(device)
        if ready is not None:
            stream.wait_event(ready)
        with torch.cuda.stream(stream):
            yield


def future(device: torch.device) -> torch.futures.Future:
    """A future for a tensor on `device`. On CUDA it is stream-aware: set_result records an event on the current
    stream, and whoever waits for the value (DDP's reducer) waits on the device for that event, not on the host."""
    return torch.futures.Future(devices=[device]) if device.type == "cuda" else torch.futures.Future()


def sync(device: torch.device) -> None:
    """Wait until `device` has done the work queued so far (CUDA); nothing on CPU. For timing single operations
    (the bench, calibrate); the training loop reads CUDA events instead."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def slowest(seconds: float, device) -> float:
    """The largest of every rank's `seconds`, the same number on every rank (a collective): a step of a job lasts
    as long as its slowest rank's."""
    t = torch.tensor([seconds], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def topology(env: Env) -> dict:
    """Where the job runs: nodes and ranks per node as the launcher said (torchrun, the elastic launch and
    submitit set LOCAL_WORLD_SIZE), and the link between nodes as scripts/cluster_local.sh shaped it."""
    local = env.local_world_size
    return {"nodes": max(1, env.world_size // local), "ranks_per_node": local,
            "link": os.environ.get("RINGEXP_CLUSTER_LINK", "loopback") if env.world_size > local else "loopback"}


_addresses: list = []  # every rank's node, by rank (share_addresses), for naming the ones that stop answering
_pids: list = []  # every rank's process id, by rank (on this node: to tell a stopped rank from a dead one)


def address() -> str:
    """This rank's node as its peers know it: the host name and the address it reaches the master from (on
    scripts/cluster_local.sh's nodes, network namespaces of one machine, only the address differs)."""
    host = socket.gethostname()
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:  # connect() on UDP sends nothing
            s.connect((os.environ["MASTER_ADDR"], int(os.environ.get("MASTER_PORT", 1))))
            return f"{host} ({s.getsockname()[0]})"
    except (KeyError, OSError, ValueError):
        return host


def share_addresses(env: Env) -> None:
    global _addresses, _pids
    both = [None] * env.world_size
    dist.all_gather_object(both, (address(), os.getpid()))
    _addresses, _pids = [a for a, _ in both], [p for _, p in both]


def why_silent(silent: list, rank: int) -> str:
    """What the silent ranks on this rank's own node are doing (stopped, exited, or neither: hung). A stopped one
    started by this rank's own agent is continued (SIGCONT): stopped, it cannot hear the agent's SIGTERM and would
    hold the whole job for the agent's 30 s of grace; continued, it finds its peers gone and fails too. (Killing it
    would make it the failure the agent reports, before this rank's line naming it.)"""
    said = []
    for r, state, ppid in local_states(silent, rank):
        if state == "T" and ppid == str(os.getppid()):
            os.kill(_pids[r], signal.SIGCONT)
        said.append(f"rank {r}'s pid {_pids[r]} " + {"T": "was stopped (SIGSTOP)",
                                                     "t": "is being traced", "": "has exited",
                                                     "Z": "has exited"}.get(state, "hangs"))
    return "; ".join(said)


def local_states(ranks: list, rank: int) -> list:
    """(rank, process state letter or '' when gone, parent pid) of those of `ranks` on this rank's node."""
    out = []
    for r in ranks:
        if _pids and _addresses[r] == _addresses[rank]:
            fields = stop.proc_stat(_pids[r])
            out.append((r, fields[0] if fields else "", fields[1] if fields else ""))
    return out


def spans_nodes() -> bool:
    """Whether this job's ranks run on more than one node (as the launcher set WORLD_SIZE and LOCAL_WORLD_SIZE)."""
    world = int(os.environ.get("WORLD_SIZE", 1))
    return world > int(os.environ.get("LOCAL_WORLD_SIZE", world))


def who_is_gone(cause: str, wait_s: float, give_up=lambda: False) -> str:
    """After a collective failed because a peer went silent (a node down, its link cut): which ranks still answer.
    Every rank that can reach the job's store, on the master, checks in there under a key of this attempt; the
    ranks that have not within `wait_s` (or by the time `give_up()`) are named, with their nodes. A rank that cannot
    reach the store itself says that its own node is cut off from the master's."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    master = f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
    me = f"rank {rank} on {_addresses[rank] if _addresses else address()}"
    prefix = f"ringexp/answers/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/"
    silent = None
    try:
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                              timeout=timedelta(seconds=wait_s), wait_for_workers=False)
        store.set(prefix + str(rank), "1")
        deadline = time.monotonic() + wait_s
        while True:
            silent = [r for r in range(world) if not store.check([prefix + str(r)])]
            # (a stopped or exited rank of this node never checks in: no need to wait for it)
            mute = [r for r, state, _ in local_states(silent, rank) if state in ("T", "t", "Z", "")]
            if len(mute) == len(silent) or time.monotonic() > deadline or give_up():
                break
            time.sleep(0.2)
    except Exception:  # (the store's own error says only that it timed out, or that it closed)
        if silent is None:  # never reached it
            return (f"{me}: the master {master} does not answer either: this node is cut off from rank 0's, or "
                    f"rank 0's node is down ({cause})")
        # rank 0, which holds the store, ended its own wait first and left: what this rank saw last stands
    if not silent:
        return f"{me}: {cause}"
    nodes = sorted({_addresses[r] for r in silent}) if _addresses else []
    local = why_silent(silent, rank)
    return (f"{me}: rank{'s' * (len(silent) > 1)} {', '.join(map(str, silent))}"
            f"{' on ' + ', '.join(nodes) if nodes else ''} stopped answering ({local or 'node down or its link cut'})"
            f" ({cause})")


def seed_everything(seed: int, rank: int) -> None:
    """Per-rank seeds for dropout/augmentation; model init is made identical by DDP's broadcast."""
    s = seed * 1000 + rank
    random.seed(s)
    np.random.seed(s % 2**32)
    torch.manual_seed(s)


def cleanup() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def spawned(fn, *args):
    """fn(*args) in a worker that multiprocessing spawned, whose process then ends as `end` ends one: a spawned
    process ends through the interpreter's finalization (a forked or forkserver one through os._exit), where
    torch's gloo may abort it after its return value was handed over, failing its job. The exit handler is
    registered before any other, so it runs after them all; only once fn has returned (exit code 0)."""
    global _returned
    atexit.register(_skip_finalization)
    result = fn(*args)
    _returned = True
    return result


def _skip_finalization() -> None:
    if _returned:
        _exit_now(0)


def _exit_now(code: int) -> None:
    """End this process with `code` at once, what it printed flushed: no finalization (`end`)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def end(main) -> None:
    """Run `main` (a program's command line) as this process, then end the process with its exit code. One that
    joined a process group ends with os._exit once its exit handlers (W&B's, logging's) have run, skipping the
    interpreter's finalization: there torch 2.14.1 aborts a process now and then, its group destroyed and every
    Python exit handler run ("terminate called without an active exception", no Python frame on the stack: 5 of
    50 plain 4-rank gloo jobs under torchrun on this machine, 0 of 60 ending so), and under torchrun that fails
    the node's job after its work is done, while every other node's agent waits 300 s for it (torchrun's exit
    barrier; CI's cut-link test, 2026-12-07). ringexp's own CPU workers, forked by torch's start_processes, end
    through os._exit already; its spawned ones (GPU runs, bench, calibrate) through `spawned`. A bug's traceback
    is left to Python."""
    try:
        main()
        code = 0
    except SystemExit as e:
        code = e.code
    if not _held:
        sys.exit(code)
    if code is not None and not isinstance(code, int):  # sys.exit("message"), as Python prints it
        print(code, file=sys.stderr)
        code = 1
    atexit._run_exitfuncs()
    _exit_now(code or 0)
