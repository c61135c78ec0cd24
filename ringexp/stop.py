"""Ctrl-C and termination: a request to stop, honoured where it is safe, never an exception thrown at a random line.

Python's default (and torch elastic's) answer to a signal, an exception raised wherever the main thread happens
to be, broke here in two ways: landing in a fork's at-fork hooks, it is ignored by Python and leaves the logging
lock held (the launcher then hung for good while its workers trained on), and an `except Exception` on its way
swallows it (a worker in W&B's start-up trained to the end). So, with SIGINT, SIGTERM and SIGHUP:

    launcher  before any worker starts: KeyboardInterrupt, which train.cli turns into one line and exit 130 (only
              ringexp's and Hydra's code runs, nothing forks). While workers run (`launching`): the signal is
              recorded and passed on to the workers as SIGINT; the launcher waits for them, then exits 130.
              A second signal: the workers are killed and the launcher exits 130 at once.
    worker    (`take_over`): the signal is recorded; the trainer stops at the next step boundary (`check`), and
              an error from a peer that stopped first counts as stopping. The worker then returns INTERRUPTED, so
              the elastic agent neither reports a failure nor restarts it. Only a SIGTERM from an elastic agent
              (`agent_stopping`: it is shutting the job down because another worker failed) ends the worker with
              exit code 143 at once: that agent no longer reads what its workers return.
    a process forked from one of these that did not take over (a bench worker) gets the default action; data
    loader workers ignore Ctrl-C (`ignore`): their trainer shuts them down.
"""

import contextlib
import os
import signal
import sys

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
EXIT_CODE = 130  # what shells report for Ctrl-C
INTERRUPTED = {"status": "interrupted"}  # a worker's return value when it stopped on request
# what torch elastic's agent may still handle its own way (LaunchConfig.signals_to_handle): not SIGNALS
TORCH_HANDLES = "SIGQUIT"

_received = []  # signals this process was sent (a forked child starts with its parent's list)
_owner = {"pid": None, "forward": False}


def requested() -> bool:
    """True once this process was asked to stop."""
    return bool(_received)


def check() -> None:
    """At a safe point: KeyboardInterrupt if a stop was requested."""
    if _received:
        raise KeyboardInterrupt(f"stopped on signal {signal.Signals(_received[0]).name}")


def _handler(signum, frame) -> None:
    if os.getpid() != _owner["pid"]:  # a forked child that did not take over: the signal's default action
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    _received.append(signum)
    if not _owner["forward"]:
        return
    if len(_received) == 1:
        _signal_children(signal.SIGINT)
        return
    _signal_children(signal.SIGKILL)  # asked twice: stop now
    print("ringexp: error: interrupted twice; workers killed (checkpoints already written are intact)",
          file=sys.stderr, flush=True)
    os._exit(EXIT_CODE)


def _install(forward: bool) -> None:
    _owner.update(pid=os.getpid(), forward=forward)
    for s in SIGNALS:
        signal.signal(s, _handler)


@contextlib.contextmanager
def launching():
    """The launcher while its workers run: signals recorded and passed on (see the module's docstring). Once a stop
    was asked for, later signals are ignored: the launcher is only writing its one line and the summary, and a
    KeyboardInterrupt raised there would print a traceback from interpreter shutdown after that line."""
    before = {s: signal.getsignal(s) for s in SIGNALS}
    _install(forward=True)
    try:
        yield
    finally:
        for s, h in before.items():
            signal.signal(s, signal.SIG_IGN if _received else h)


def agent_stopping() -> bool:
    """True when this worker was sent SIGTERM (and no Ctrl-C) under an elastic agent: the agent is stopping it."""
    return signal.SIGTERM in _received and signal.SIGINT not in _received and "TORCHELASTIC_RUN_ID" in os.environ


def release() -> None:
    """A worker that has stopped: from now on SIGTERM and SIGHUP end it at once (an agent shutting down sends
    SIGTERM). SIGINT is ignored: the launcher passes the terminal's Ctrl-C on, so a worker gets it twice, and the
    copy that arrives late would raise KeyboardInterrupt wherever the worker is while it shuts down (seen: inside
    a data loader's __del__, "Exception ignored in ..." before the one line). A second Ctrl-C meant as such
    reaches the launcher, which kills the workers."""
    for s in SIGNALS:
        signal.signal(s, signal.SIG_IGN if s == signal.SIGINT else signal.SIG_DFL)


def take_over() -> None:
    """A worker's first act: signals are recorded here and honoured by `check`."""
    _install(forward=False)


def ignore() -> None:
    """A data loader worker: Ctrl-C sent to the whole process group passes it by (its trainer stops it). SIGTERM
    keeps its default: it is how Python's multiprocessing ends daemon processes at exit."""
    for s in (signal.SIGINT, signal.SIGHUP):
        signal.signal(s, signal.SIG_IGN)


def while_loading() -> None:
    """Ctrl-C while Python imports torch and Hydra (seconds): one line and exit 130, not an import traceback.
    Nothing is written yet; train.cli puts Python's own handler back once the imports are done."""
    def quit_now(signum, frame):
        print("ringexp: error: interrupted", file=sys.stderr, flush=True)
        os._exit(EXIT_CODE)

    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, quit_now)


def default() -> None:
    """Python's own behaviour, with SIGTERM and SIGHUP raising as Ctrl-C does (before any worker starts)."""
    for s in SIGNALS:
        signal.signal(s, signal.default_int_handler)


def _signal_children(sig) -> None:
    for pid in _children(os.getpid()):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def proc_stat(pid) -> list:
    """The fields of /proc/PID/stat after the command's name (state, parent pid, ...); [] when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def _children(pid: int) -> list:
    """This process's children, from /proc (on systems without it the terminal's Ctrl-C reaches the whole
    process group anyway)."""
    found = []
    with contextlib.suppress(OSError):
        for entry in os.listdir("/proc"):
            if entry.isdigit() and proc_stat(entry)[1:2] == [str(pid)]:
                found.append(int(entry))
    return found
