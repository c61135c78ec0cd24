"""A peer killed in the middle of a collective: the others fail fast with a message, they never hang."""

import multiprocessing as mp
import os
import signal
import socket
import time

import pytest
import torch

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
    ctx = mp.get_context("spawn")
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
