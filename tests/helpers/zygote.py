"""A warm interpreter that the tests' `python -m ringexp.train` runs are forked from.

A tiny run costs about 6 s of CPU on this machine and 5.5 of them are imports (torch's CUDA build, then
torchmetrics, which the launcher loads before forking its workers); the suite starts about a hundred such runs.
Each pytest worker therefore keeps one server (this file run as a script) that has imported all of that once and
forks a child per run. The child is a real, separate process running the real command line: it takes the test's
stdin/stdout/stderr, working directory, environment and arguments, starts its own session (as
start_new_session=True does), and runs the module as `python -m` would (runpy, as __main__); the server reaps it and
reports its exit code as Popen would. What differs from a fresh interpreter is only what was imported before, so
the tests of start-up itself (Ctrl-C while importing) and RINGEXP_TEST_FRESH=1 use fresh interpreters.

The server runs no Python thread (a fork copies the calling thread only) and exits when its pytest worker does (EOF on
its stdin)."""

import contextlib
import json
import os
import runpy
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

MODULE = "ringexp.train"
ROOT = Path(__file__).resolve().parents[2]
_server = None


# --- the server ----------------------------------------------------------------------------------------------

def preload() -> None:
    import ringexp.train  # noqa: F401
    from ringexp import metrics

    metrics.preload()
    # (the native threads numpy's and scipy's OpenBLAS start at import have fork handlers: the launcher forks
    # its workers with them too)
    assert threading.active_count() == 1, "a Python thread would not survive the fork"


def serve(path: str):
    """Fork a child per request until stdin closes; returns (request, fds) in the child, never in the server."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(16)
    print("ready", flush=True)
    running = {}  # pidfd -> (pid, connection)
    while True:
        for ready in select.select([listener, sys.stdin, *running], [], [])[0]:
            if ready is sys.stdin:
                if not os.read(0, 1):
                    os.unlink(path)
                    os.rmdir(os.path.dirname(path))
                    sys.exit(0)
            elif ready is listener:
                conn, _ = listener.accept()
                msg, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
                pid = os.fork()
                if pid == 0:
                    for fd in running:
                        os.close(fd)
                    for closing in (listener, conn, *(c for _, c in running.values())):
                        closing.close()
                    return json.loads(msg), fds
                for fd in fds:
                    os.close(fd)
                conn.send(str(pid).encode())
                running[os.pidfd_open(pid)] = (pid, conn)
            else:
                pid, conn = running.pop(ready)
                os.close(ready)
                code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
                with contextlib.suppress(OSError):
                    conn.send(str(code).encode())
                conn.close()


def become(request: dict, fds: list) -> None:
    """Turn the forked child into `python -m <module> <args>` with the caller's files, directory and environment."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.setsid()
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    module = request["module"]
    sys.modules.pop(module, None)  # run afresh as __main__, as `python -m` does (no copy imported before)
    sys.argv = [module, *request["args"]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


# --- the client: what the tests use --------------------------------------------------------------------------

def fresh() -> bool:
    return os.environ.get("RINGEXP_TEST_FRESH") == "1"


def server():
    global _server
    if _server is None or _server.poll() is not None:
        path = os.path.join(tempfile.mkdtemp(prefix="ringexp-zygote-"), "socket")
        _server = subprocess.Popen([sys.executable, __file__, path], cwd=ROOT, stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE)
        assert _server.stdout.readline() == b"ready\n", "the warm interpreter did not start"
        _server.path = path
    return _server


class Forked:
    """The part of subprocess.Popen(text=True, stdout=PIPE, stderr=PIPE) the tests use, for a forked child."""

    def __init__(self, args: list, env: dict, module: str = MODULE):
        self.args, self.returncode = [sys.executable, "-m", module, *args], None
        out, err = os.pipe(), os.pipe()
        null = os.open(os.devnull, os.O_RDONLY)
        self.conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.conn.connect(server().path)
        request = {"module": module, "args": list(args), "cwd": str(ROOT), "env": dict(env)}
        socket.send_fds(self.conn, [json.dumps(request).encode()], [null, out[1], err[1]])
        for fd in (null, out[1], err[1]):
            os.close(fd)
        self.pid = int(self.conn.recv(64))
        self.stdout, self.stderr = out[0], err[0]
        self.read, self.open = {out[0]: [], err[0]: []}, {out[0], err[0]}

    def poll(self):
        return self.wait(0) if self.returncode is None else self.returncode

    def wait(self, timeout=None):
        if self.returncode is None:
            if not select.select([self.conn], [], [], timeout)[0]:
                if timeout == 0:
                    return None
                raise subprocess.TimeoutExpired(self.args, timeout)
            self.returncode = int(self.conn.recv(64))
            self.conn.close()
        return self.returncode

    def communicate(self, timeout=None):
        """stdout and stderr to their end (every process holding them has exited), then the exit code."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.open:
            ready = select.select(list(self.open), [], [], remaining(deadline))[0]
            if not ready and deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            for fd in ready:
                chunk = os.read(fd, 1 << 16)
                if chunk:
                    self.read[fd].append(chunk)
                else:
                    os.close(fd)
                    self.open.discard(fd)
        self.wait(remaining(deadline))
        return self.text(self.stdout), self.text(self.stderr)

    def text(self, fd: int) -> str:
        data = b"".join(self.read[fd]).decode(errors="replace")
        return data.replace("\r\n", "\n").replace("\r", "\n")  # universal newlines, as text=True

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def send_signal(self, sig) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)


def remaining(deadline):
    return None if deadline is None else max(0.001, deadline - time.monotonic())


def run(args: list, env: dict, timeout: float, module: str = MODULE) -> subprocess.CompletedProcess:
    """subprocess.run(capture_output=True, text=True, timeout=...) of `python -m module args` in ROOT, forked."""
    proc = Forked(args, env, module)
    try:
        out, err = proc.communicate(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


if __name__ == "__main__":
    preload()
    become(*serve(sys.argv[1]))
