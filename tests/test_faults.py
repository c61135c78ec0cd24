"""A peer killed in the middle of a collective: the others fail fast with a message, they never hang; a rank that
lost its peers names them even when its agent stops it meanwhile."""

import multiprocessing as mp
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers.processes import ROOT, start_forkserver

TIMEOUT_S = 20


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ring_member(rank: int, world: int, port: int, algorithm: str, results):
    # Plain processes, not the elastic launcher: its agent would kill the survivors itself when one dies,
    # and what is tested here is that the collectives notice on their own.
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    from ringexp import comm
    from ringexp import dist as rdist

    rdist.init("cpu", timeout_s=TIMEOUT_S)
    x = torch.ones(1 << 20)
    try:
        for step in range(1000):
            if rank == world - 1 and step == 3:
                os.kill(os.getpid(), signal.SIGKILL)  # dies between two of its sends
            comm.all_reduce(x, algorithm, **comm.options_for(algorithm, {
                "timeout_s": TIMEOUT_S, "nodes": 2, "segment_bytes": 64 << 10}))
            x.fill_(1)
        results.put((rank, "finished", 0.0))
    except Exception as e:
        results.put((rank, str(e), time.monotonic()))


@pytest.mark.parametrize("algorithm", ["ring", "hierarchical", "naive"])
def test_killed_peer_is_an_error_not_a_hang(algorithm):
    start_forkserver()  # members forked from a server that has torch loaded: not 4 fresh interpreters a case
    ctx = mp.get_context("forkserver")
    results, world, port = ctx.Queue(), 4, free_port()
    procs = [ctx.Process(target=ring_member, args=(r, world, port, algorithm, results)) for r in range(world)]
    for p in procs:
        p.start()
    try:
        got = [results.get(timeout=TIMEOUT_S + 60) for _ in range(world - 1)]
        killed_at = time.monotonic()
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    assert procs[-1].exitcode == -signal.SIGKILL
    for rank, message, _ in got:
        assert message != "finished", rank
        assert f"{algorithm} all-reduce" in message and "rank" in message and "step" in message, message
    assert killed_at - min(t for *_, t in got) < TIMEOUT_S + 30


STOPPED_RANK = """
import os, signal, sys
from types import SimpleNamespace
from ringexp import dist as rdist, launch
os.environ.update(WORLD_SIZE="4", LOCAL_WORLD_SIZE="2", TORCHELASTIC_RUN_ID="t")  # 2 nodes of 2, under torchrun

def train_rank(*args):  # the rank's collective broke on a silent peer, and a signal came meanwhile
    os.kill(os.getpid(), getattr(signal, sys.argv[1]))
    raise RuntimeError("Timed out waiting 10000ms for send operation to complete")

launch.train_rank = train_rank
rdist.who_is_gone = lambda cause, wait_s, give_up: f"ranks 2, 3 stopped answering ({cause}); gave up: {give_up()}"
try:
    print("returned", launch.run_worker(SimpleNamespace(parallel=SimpleNamespace(timeout_s=10)), None, None))
except Exception as e:
    print(type(e).__name__, e)
"""


@pytest.mark.parametrize("signal_name, said", [
    # its agent stops it (a rank beside it failed first): it still says whom it lost, without waiting any longer
    ("SIGTERM", "PeerLost ranks 2, 3 stopped answering (Timed out waiting 10000ms for send operation to complete); "
                "gave up: True"),
    ("SIGINT", "returned {'status': 'interrupted'}"),  # the user's Ctrl-C: it stops quietly
])
def test_a_rank_that_lost_its_peers_names_them_even_when_its_agent_stops_it(signal_name, said):
    r = subprocess.run([sys.executable, "-c", STOPPED_RANK, signal_name], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.stdout.strip().splitlines()[-1] == said, r.stdout + r.stderr[-2000:]


ENDS = """
import atexit, sys
from ringexp import dist as rdist

class Finalized:  # (its __del__ runs as the interpreter finalizes, where torch's gloo aborts a process now and then)
    def __del__(self):
        print("finalized", flush=True)

kept = Finalized()
atexit.register(print, "exit handlers ran", flush=True)

def main():
    if sys.argv[1] == "group":
        rdist.init("cpu", timeout_s=TIMEOUT)
        rdist.cleanup()
    print("done", end="")  # (unflushed: the end must flush it)
    sys.exit(int(sys.argv[2]))

rdist.end(main)
"""


@pytest.mark.parametrize("code", [0, 3])
def test_a_process_that_held_a_group_ends_with_its_code_and_exit_handlers_but_never_finalizes(code):
    """rdist.end: a rank that joined a process group skips the interpreter's finalization, where torch 2.14.1 aborts
    a process now and then after its work is done (and torchrun's agents then wait 300 s for its node), yet keeps its
    exit code, its exit handlers and what it printed; a process that held none ends as Python ends it."""
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "RANK": "0",
           "WORLD_SIZE": "1", "PYTHONPATH": str(ROOT)}
    for held, finalizes in (("group", False), ("none", True)):
        r = subprocess.run([sys.executable, "-c", ENDS.replace("TIMEOUT", str(TIMEOUT_S)), held, str(code)],
                           capture_output=True, text=True, env=env, timeout=120)
        assert r.returncode == code, r.stderr
        assert r.stdout.startswith("done") and "exit handlers ran" in r.stdout, r.stdout
        assert ("finalized" in r.stdout) == finalizes, (held, r.stdout)


class Finalized:
    """Touches `path` as the interpreter finalizes (a module global's __del__)."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __del__(self):
        open(self.path, "w").close()  # (a builtin: pathlib may be torn down by then)


def spawned_member(marks: str) -> int:
    import atexit

    import torch.distributed as dist

    from ringexp import dist as rdist

    rdist.init("cpu", timeout_s=TIMEOUT_S)
    rank = dist.get_rank()
    atexit.register(Path(marks, f"handlers{rank}").touch)
    sys.modules["__main__"].kept = Finalized(Path(marks, f"finalized{rank}"))  # (__main__ is cleared first)
    rdist.cleanup()
    return rank


def test_a_spawned_worker_hands_over_its_result_and_runs_its_exit_handlers_but_never_finalizes(tmp_path):
    """ringexp's launch of spawned workers (GPU runs, bench, calibrate): rdist.spawned ends each after its exit
    handlers, without the finalization where gloo aborts a process now and then, once its result is handed over."""
    from ringexp import launch

    # (the agent returns once every worker has exited)
    assert launch.elastic(spawned_member, 2, str(tmp_path), start_method="spawn") == {0: 0, 1: 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["handlers0", "handlers1"]
