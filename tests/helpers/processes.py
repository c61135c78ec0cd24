"""The real command lines and processes the tests run: ringexp's CLIs in a subprocess (forked from the warm
interpreter, zygote.py, unless RINGEXP_TEST_FRESH=1) or in this process where they must refuse, real gloo workers,
an external torchrun, and the process tree of a run."""

import contextlib
import io
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import zygote
from ringexp import train
from ringexp.launch import elastic

ROOT = Path(__file__).resolve().parents[2]


def workers(fn, n: int, *args) -> dict:
    """fn(*args) in n real gloo workers through torch's elastic launch ({rank: return value}), forked from a
    forkserver that has imported this module: under a second each, against about 8 s to spawn fresh interpreters.
    Not forked from pytest's process: it runs threads (the launch's own rendezvous store, earlier tests' pools), and
    a fork that catches one holding a lock leaves the child stuck on it (a rank never joined, in CI)."""
    start_forkserver()
    return elastic(fn, n, *args, start_method="forkserver")


def start_forkserver():
    """Start multiprocessing's forkserver with the tests' helpers and torch imported once (idempotent). Python 3.11's
    forkserver ignores the parent's sys.path, so tests/ reaches it through PYTHONPATH, for its start only.
    torchmetrics too (and torch's compiler, which it imports): a worker that wraps a model in DDP or evaluates
    imports them, 3 s of CPU a worker (10 under load), once here instead (pytest's own process only where a test
    uses it)."""
    from multiprocessing import forkserver

    forkserver.set_forkserver_preload(["helpers.runs", "torchmetrics"])
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
