"""`python -m ringexp.tune.keeper PARENT_PID CMD...`: a trial's first process, so that a trial never outlives its tune.

A trial runs in a session of its own (Ctrl-C at the terminal reaches the tune, which stops the trial itself), so
a tune killed with SIGKILL, alone or with its process group, would leave the trial running: the next start of the
same tune then found its own trial writing into the directory it was about to reuse. The keeper is the session's
leader; it starts CMD in its own process group and asks the kernel for a signal when the tune dies (Linux's
parent-death signal, which needs no cooperation from the dying process). Then it stops the whole group as the
tune would have: SIGTERM (ringexp.train stops at the next step and says so in summary.json), SIGKILL after a
grace period. CMD gets the same parent-death request, so a keeper killed on its own takes its trial with it.
Signals the tune sends to the group (Ctrl-C, a timeout) reach CMD directly; the keeper only waits for it.
"""

import ctypes
import os
import signal
import subprocess
import sys
import time

PR_SET_PDEATHSIG = 1  # linux/prctl.h
GRACE_S = 30.0  # what a trial gets to stop on SIGTERM before SIGKILL (the tune's own stop waits as long)


def on_parent_death(sig: int) -> None:
    """Ask the kernel to send `sig` to this process when its parent thread dies (Linux; elsewhere nothing)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, sig)
    except (OSError, AttributeError):
        pass


def main(argv: list) -> int:
    parent, cmd = int(argv[0]), argv[1:]
    orphaned = []
    signal.signal(signal.SIGTERM, lambda s, f: orphaned.append(s))  # the parent-death signal (or the tune's stop)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches CMD through the group; the keeper waits for it
    on_parent_death(signal.SIGTERM)
    if os.getppid() != parent:  # the tune died before the request above: nothing to keep
        return 143
    child = subprocess.Popen(cmd, preexec_fn=lambda: on_parent_death(signal.SIGTERM))
    while child.poll() is None:
        if orphaned and os.getppid() != parent:
            stop_group(child)
            break
        time.sleep(0.2)
    return child.wait()


def stop_group(child) -> None:
    """The tune is gone: SIGTERM to the trial's whole process group, SIGKILL to what is left after GRACE_S."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.killpg(os.getpgrp(), signal.SIGTERM)
    try:
        child.wait(timeout=GRACE_S)
    except subprocess.TimeoutExpired:
        pass
    os.killpg(os.getpgrp(), signal.SIGKILL)  # (the keeper too: what is left of the group goes with it)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
