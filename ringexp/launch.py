"""How workers start and how their failure is told: PyTorch's elastic launch on this machine, or in place when an
external torchrun (or a Slurm task) already made this process one rank of the job; `run_worker` is every rank's
entry point."""

import contextlib
import logging
import os
import re
import signal
import sys
import tempfile
import threading
import time
import uuid
import zlib
from pathlib import Path

import torch.distributed as dist
from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.elastic.rendezvous import dynamic_rendezvous
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from ringexp import backend, checkpoint, metrics, records, stop
from ringexp import dist as rdist
from ringexp.config import Device
from ringexp.errors import PeerLost, one_line, peer_lost, timed_out
from ringexp.sinks.logfile import FileHandler
from ringexp.trainer import Trainer

log = logging.getLogger("ringexp")


def under_external_launcher() -> bool:
    """True when this process is already a rank: torchrun (or anything torchrun-like) set RANK/WORLD_SIZE."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def slurm_task() -> bool:
    """True inside a task of a Slurm job that submitit started (hydra/launcher=slurm)."""
    return os.environ.get("SUBMITIT_EXECUTOR") == "slurm"


def adopt_srun_task() -> None:
    """In one of several tasks a plain `srun` started (no torchrun inside), export torch's rank variables (RANK,
    WORLD_SIZE, MASTER_ADDR/PORT, LOCAL_*) from Slurm's through submitit's helper, as submitit's own tasks get
    them: the process then runs as one rank of the job, as under torchrun (a port every task derives from the
    job id). For the tools (plan calibrate, bench); training on Slurm goes through hydra/launcher=slurm."""
    if under_external_launcher() or int(os.environ.get("SLURM_STEP_NUM_TASKS", "1")) < 2:
        return
    os.environ["SUBMITIT_EXECUTOR"] = "slurm"  # submitit reads Slurm's variables only inside its own jobs
    export_slurm_rank()


EPHEMERAL = 32768  # where Linux's default ephemeral ports begin (net.ipv4.ip_local_port_range: 32768 60999)
PORTS = 20000  # the lowest port a job's rendezvous takes (submitit's own lower bound)


def job_port(job_id: str) -> int:
    """The rendezvous port of Slurm job `job_id`, the same in every task of it, below the ephemeral ports: submitit
    draws one in 20000-60000 from the job id, mostly among the ports the kernel hands to outgoing connections (srun's
    and slurmstepd's own among them), and a fresh Slurm's job 1 always gets 51342, which the clean-clone suite of
    2026-12-06 found in use on the first node (EADDRINUSE). Deterministic: every task derives the same one."""
    return PORTS + zlib.crc32(job_id.encode()) % (EPHEMERAL - PORTS)


def export_slurm_rank() -> None:
    """In a Slurm task, torch's rank variables from Slurm's (submitit's helper), the port job_port's unless the
    environment gives one."""
    from submitit.helpers import TorchDistributedEnvironment  # only inside a Slurm task (an optional extra)

    os.environ.setdefault("MASTER_PORT", str(job_port(os.environ.get("SLURM_JOB_ID", "0"))))
    TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)


def as_rank(main, other, srun: bool = True):
    """The entry of a command that runs as one rank of a job: `other()` on a non-zero rank under torchrun (or, with
    `srun`, in a task of a plain srun: adopt_srun_task), which composes the same config and writes nothing of
    its own; `main()` everywhere else (rank 0, or no external launcher: ringexp starts its own workers)."""
    if srun:
        adopt_srun_task()
    if under_external_launcher() and os.environ["RANK"] != "0":
        return other()
    return main()


def refused_elsewhere(wait_s: float = 60.0) -> None:
    """Exit 2, without a word, from a non-zero rank whose config is refused: rank 0 composes the same config and
    says what is wrong. Not at once: torchrun's agent stops every rank as soon as one exits, and rank 0, slower to
    compose (Hydra's app), was stopped before it said it; the agent stops this rank when rank 0 exits."""
    try:
        time.sleep(wait_s)
    except KeyboardInterrupt:  # the agent's SIGTERM (stop.default makes it raise as Ctrl-C does)
        pass
    sys.exit(2)


def caller_name(depth: int = 2) -> str:
    """torch's dynamic_rendezvous.get_method_name without inspect.stack(): that reads the source of every frame
    and looks each up among all loaded modules (cpython#92041), about 0.1 s a call with torch loaded, and the
    rendezvous names its caller in every event it records (about 1 s of CPU per launch on 2 cores)."""
    try:
        return sys._getframe(depth).f_code.co_name
    except ValueError:  # a stack shallower than depth, as torch's own answer for it
        return "no_method_name"


dynamic_rendezvous.get_method_name = caller_name


def elastic(fn, nproc: int, *args, log_dir=None, max_restarts: int = 0, start_method: str = "spawn") -> dict:
    """Run fn(*args) in `nproc` local workers through torch's elastic launch (the engine behind torchrun);
    returns {rank: return value}. fn must be importable (workers are spawned).

    When a worker dies the agent stops the others (SIGTERM, then SIGKILL) and either restarts them all (up to
    `max_restarts` times; they resume from the last checkpoint) or raises ChildFailedError naming the rank."""
    # The agent logs a dead worker's traceback and every signal it sends; ringexp reports the failure in one
    # line instead (worker_failure), and the workers' own logs stay in the run directory.
    if not os.environ.get("HYDRA_FULL_ERROR"):
        for name in ("torch.distributed.elastic", "torch.distributed.elastic.multiprocessing.errors",
                     "torch.multiprocessing.spawn"):
            logging.getLogger(name).setLevel(logging.CRITICAL)
    if max_restarts:
        # Workers otherwise share the agent's rendezvous store across restarts, where the dead round's keys
        # (gloo's peer addresses) are still found: the restarted ranks then connect to dead ports. Without
        # sharing, each round's rank 0 serves a fresh store on a fresh port.
        os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    # Without a log_dir (calibrate, the tests' workers: no run directory) the agent's per-attempt folders go to a
    # temporary one that is removed afterwards, not left in the user's /tmp after every job.
    where = contextlib.nullcontext(log_dir) if log_dir else tempfile.TemporaryDirectory(prefix="ringexp-",
                                                                                        ignore_cleanup_errors=True)
    with where as logs:
        config = LaunchConfig(
            min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=uuid.uuid4().hex[:12],
            # Port 0: the rendezvous store picks a free port, so consecutive or concurrent jobs never collide.
            rdzv_backend="c10d", rdzv_endpoint="localhost:0",
            start_method=start_method, max_restarts=max_restarts, monitor_interval=0.1,
            signals_to_handle=stop.TORCH_HANDLES, logs_specs=DefaultLogsSpecs(log_dir=str(logs)),
        )
        if start_method == "spawn":  # (ends without finalizing: rdist.spawned)
            fn, args = rdist.spawned, (fn, *args)
        with stop.launching():
            return elastic_launch(config, fn)(*args)


def launch(cfg, run_dir: Path, meta: dict):
    """Run the job for `cfg` (a checked TrainConfig); returns rank 0's summary."""
    if slurm_task():
        # One rank per Slurm task: rank, world size and master address from the job's environment (on any
        # number of nodes). CUDA_VISIBLE_DEVICES stays as Slurm set it: ringexp picks the GPU by LOCAL_RANK.
        export_slurm_rank()
        return run_worker(cfg, str(run_dir), meta)
    if under_external_launcher():
        return run_worker(cfg, str(run_dir), meta)
    # CPU workers are forked from this process, which has imported torch already: about 8 s less start-up per
    # run on 2 cores than spawning fresh interpreters. CUDA cannot survive a fork once this process has touched
    # it (validation asks the GPU what it supports), so GPU workers are spawned.
    cpu = cfg.launcher.device == Device.cpu
    if cpu:
        metrics.preload()
    return elastic(forked_worker if cpu else run_worker, cfg.launcher.nproc_per_node, cfg, str(run_dir), meta,
                   log_dir=run_dir / "workers", max_restarts=cfg.launcher.max_restarts,
                   start_method="fork" if cpu else "spawn")[0]


def forked_worker(cfg, run_dir: str, meta: dict):
    """A worker forked from the Hydra process: it drops the logging handlers it inherited (Hydra's console and
    train.log), so that, as a spawned worker, it logs to its own rank<N>.log only."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    return run_worker(cfg, run_dir, meta)


def answer_wait(error: str, timeout_s: float) -> float:
    """How long a rank whose collective broke waits for the others to check in (rdist.who_is_gone). A rank that
    timed out waited timeout_s already, as every live rank did: 10 s is enough for them. A rank told at once (its
    neighbour's socket reset) must give the others their whole timeout to notice, or it names live ranks as gone
    (seen: a killed Slurm task's neighbour named all three others)."""
    return min(10.0, timeout_s) if timed_out(error) else timeout_s + 10.0


def run_worker(cfg, run_dir, meta):
    """Entry point of every rank (elastic launch, torchrun or Slurm). Returns rank 0's summary, or
    stop.INTERRUPTED on every rank when the job was asked to stop (Ctrl-C, SIGTERM: ringexp.stop).

    Under an elastic agent (ringexp's launcher, torchrun) a worker whose agent is gone (killed with SIGKILL: the
    kernel's parent-death signal, SIGINT, stops the training) exits here by itself: torch's wrapper would hand
    the return value to the dead agent and wait for it to be read, forever."""
    stop.take_over()
    agent = os.getppid() if "TORCHELASTIC_RUN_ID" in os.environ else None
    if agent is not None:
        watch_agent(agent, run_dir)
    try:
        return attempt(cfg, run_dir, meta)
    finally:
        if agent is not None and os.getppid() != agent:
            orphaned(agent, run_dir)


ORPHAN_GRACE_S = 20.0  # what a worker whose agent died gets to stop by itself before its watcher ends it


def watch_agent(agent: int, run_dir) -> None:
    """A daemon thread that ends this worker ORPHAN_GRACE_S after its agent died, should anything hold it past its
    next step (the parent-death signal stops it there, and it exits through `orphaned`). Seen once in CI: a rank
    that had logged its stop was still alive a minute later, idle, its launcher killed."""
    def watch():
        while os.getppid() == agent:
            time.sleep(1.0)
        time.sleep(ORPHAN_GRACE_S)
        orphaned(agent, run_dir, flush_logs=False)  # (a log handler's lock may be what holds the main thread)

    threading.Thread(target=watch, name="ringexp-agent-watch", daemon=True).start()


def orphaned(agent: int, run_dir, flush_logs: bool = True) -> None:
    """The agent that started this worker is gone: rank 0 says so in summary.json (a completed run's stays), then
    the worker exits at once."""
    if os.environ.get("RANK") == "0" and run_dir:
        kept = checkpoint.complete(run_dir)
        where = f"resume=auto hydra.run.dir={run_dir} continues from {kept[-1].name}" if kept else \
            "no checkpoint was written"
        records.mark_failed(run_dir, f"interrupted: the launcher (pid {agent}) was killed; {where}", "interrupted")
    if flush_logs:
        logging.shutdown()
    os._exit(stop.EXIT_CODE)


def attempt(cfg, run_dir, meta):
    if stop.requested():  # the launcher was interrupted while it started this worker
        return stop.INTERRUPTED
    try:
        return train_rank(cfg, run_dir, meta)
    except BaseException as e:
        # A peer that stopped first breaks this rank's collective: wait for this rank's own signal, which is on
        # its way (and, if none comes, linger a moment anyway, so that the launcher, which reports the first
        # worker it sees fail, sees the dead peer, the cause, before this one).
        deadline = time.monotonic() + (2 if peer_lost(str(e)) else 0)
        while not stop.requested() and time.monotonic() < deadline:
            time.sleep(0.05)
        # Name the silent node. Also when this rank's agent is stopping it: a rank beside it found the same and
        # ended first (seen in CI: the second rank of a node cut off said nothing). A stop the user asked for
        # (Ctrl-C) ends it quietly instead.
        # On one node a dead peer is the agent's to name (it saw the signal); one that timed out hangs or was
        # stopped, and only its peers can tell.
        silent = rdist.spans_nodes() or timed_out(str(e))
        if peer_lost(str(e)) and silent and (not stop.requested() or stop.agent_stopping()):
            raise PeerLost(rdist.who_is_gone(gloo_message(one_line(str(e))),
                                             answer_wait(str(e), cfg.parallel.timeout_s), stop.requested)) from e
        if not stop.requested():
            raise
        log.info("stopped on request (%s)", one_line(str(e)) or type(e).__name__)
        stop.release()
        if stop.agent_stopping():
            raise SystemExit(128 + signal.SIGTERM) from None
        return stop.INTERRUPTED


def train_rank(cfg, run_dir, meta):
    in_force = backend.apply(cfg.backend)  # before the process group: the backends read it as they start
    env = rdist.init(cfg.launcher.device, cfg.launcher.threads_per_worker, cfg.parallel.timeout_s)
    if cfg.launcher.deterministic:
        rdist.deterministic()
    try:
        # Ranks started by an external torchrun each composed the config; rank 0 alone made the run dir.
        shared = [run_dir, meta]
        everyone = [in_force]
        if env.world_size > 1:
            dist.broadcast_object_list(shared, src=0)
            everyone = [None] * env.world_size
            dist.all_gather_object(everyone, in_force)
        run_dir, meta = Path(shared[0]), shared[1]
        handler = FileHandler(run_dir / f"rank{env.rank}.log")  # (never through a link planted at the name)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        meta = meta | {"backend_env": {"preset": cfg.backend.name} | backend.agreed(everyone)
                       | {"no_effect": backend.no_effect(in_force["env"], env.backend)}}
        if env.world_size > 1:
            rdist.share_addresses(env)
        return Trainer(cfg, env, run_dir, meta).train()
    finally:
        rdist.cleanup()


def gloo_message(message: str) -> str:
    """The words of a collective's error without what wraps them: DDP's hook repeats "Got the following error when
    running the callback: RuntimeError:" and gloo prefixes its source file."""
    message = message.rsplit("RuntimeError: ", 1)[-1]
    return re.sub(r"^\[[^\]]*\.(cc|cpp|h):\d+\] ", "", message)


def exit_words(code: int) -> str:
    """What a worker's exit code says when it left no error behind: 128 + N is how a worker that stopped on signal N
    ends (a SIGTERM sent to it alone, by something other than ringexp: ringexp.stop)."""
    if code > 128 and code - 128 in signal.Signals._value2member_map_:
        return f"exit code {code}: it stopped on {signal.Signals(code - 128).name}, sent to it alone"
    return f"exit code {code}, with no error of its own (its rank<N>.log in the run directory may say why)"


def worker_failure(e) -> tuple:
    """(one line, exit code) for a failed job: the rank that failed first and why; exit code 2 for ringexp's own
    configuration or data errors. When one worker dies the others soon fail too (their peer is gone), so the
    root cause is sought first among ranks killed by a signal, then among errors not about a lost peer."""
    if not isinstance(e, ChildFailedError):
        return one_line(str(e)) or repr(e), 1

    def text(f) -> str:
        message = f.message or f"exit code {f.exitcode}"
        if isinstance(message, dict):  # the worker's error file: {"message": "Type: text", "extraInfo": {...}}
            message = message.get("message", "")
        if str(message).startswith("To enable traceback"):  # torch's words for a worker that wrote no error
            message = exit_words(f.exitcode)
        return one_line(str(message))

    def rank_key(item):  # a rank that named the silent ones first: it says more than a signal (rdist.who_is_gone)
        rank, f = item
        return ("stopped answering" not in text(f), f.exitcode >= 0, peer_lost(text(f)), f.timestamp, rank)

    rank, failure = min(e.failures.items(), key=rank_key)
    line = text(failure)
    code = 2 if line.startswith(("DataError", "ConfigError", "ringexp.errors.")) else 1
    for prefix in ("ringexp.errors.DataError: ", "ringexp.errors.ConfigError: ", "DataError: ", "ConfigError: ",
                   "ringexp.errors.PeerLost: ", "PeerLost: "):
        line = line.removeprefix(prefix)
    return f"worker rank {rank} failed: {line}", code
