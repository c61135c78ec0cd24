"""The communication backend's environment (the `backend` config group): its variables set in a worker before the
process group starts, on every launch path (local workers, torchrun, Slurm tasks: each worker sets its own), and
what was in force, for the records.

A variable the config sets wins over the environment's; one it does not set is kept as the environment has it.
NCCL reads its variables when it starts a communicator and gloo when it creates its device: both happen inside
init_process_group, so nothing set later would count. With NCCL_DEBUG on, NCCL's log goes to a file of this
worker's (unless NCCL_DEBUG_FILE is set), with its choices (TUNING, unless NCCL_DEBUG_SUBSYS is set), from which
the algorithm and protocol NCCL chose are counted.
"""

import os
import re
import tempfile
from collections import Counter
from pathlib import Path

from ringexp.config import BACKEND_PREFIXES

# NCCL's log line for each collective's choice (NCCL_DEBUG_SUBSYS with TUNING): "Best tuning, algorithm, RING,
# protocol, SIMPLE" (enqueue.cc)
CHOICE = re.compile(r"Best tuning, algorithm, (\w+), protocol, (\w+)")


def apply(backend) -> dict:
    """Set `backend.env` in this process's environment; returns what is in force: {"env": {KEY: value}, "from":
    {KEY: "config" | "environment" | "config (environment had V)" | "ringexp"}}, over every backend variable."""
    before = {k: v for k, v in os.environ.items() if k.startswith(BACKEND_PREFIXES)}
    source = {k: "environment" for k in before}
    for key, value in backend.env.items():
        value = str(value)
        os.environ[key] = value
        had = before.get(key)
        source[key] = "config" if had is None or had == value else f"config (environment had {had})"
    if os.environ.get("NCCL_DEBUG"):  # NCCL's log, with its choices (TUNING), in a file of this worker's
        for key, value in (("NCCL_DEBUG_FILE", log_file), ("NCCL_DEBUG_SUBSYS", lambda: "INIT,ENV,TUNING")):
            if not os.environ.get(key):  # (the log file made only where it is needed)
                os.environ[key], source[key] = value(), "ringexp"
    return {"env": {k: os.environ[k] for k in sorted(source)}, "from": dict(sorted(source.items()))}


def log_file() -> str:
    """Where this worker's NCCL log goes when NCCL_DEBUG is on and no NCCL_DEBUG_FILE is set (the run directory is
    not known yet: an external torchrun's ranks learn rank 0's after the process group starts); the trainer
    copies it into the run directory at the end. A fresh file of this worker's own (mkstemp: never a name someone
    could have planted a link at), which NCCL then opens and truncates."""
    fd, path = tempfile.mkstemp(prefix=f"ringexp-nccl-{os.getpid()}-", suffix=".log")
    os.close(fd)
    return path


def no_effect(env: dict, backend: str) -> list:
    """The variables in force that `backend` ("gloo" or "nccl") never reads."""
    other = ("NCCL_", "TORCH_NCCL_") if backend == "gloo" else ("GLOO_", "TORCH_GLOO_")
    return [k for k in env if k.startswith(other)]


def nccl_chose(log_file) -> dict:
    """{"ALGORITHM/PROTOCOL": collectives} counted from NCCL's log, or {} (no log, or no TUNING lines)."""
    try:
        text = Path(log_file).read_text(errors="replace")
    except (OSError, TypeError):
        return {}
    return dict(Counter(f"{a}/{p}" for a, p in CHOICE.findall(text)).most_common())


def chosen(record) -> dict:
    """The variables of a record (`apply`'s, or a summary's backend_env) that the config or the environment set:
    those ringexp added itself (a log file of each worker's own) left out."""
    return {k: v for k, v in (record or {}).get("env", {}).items() if record["from"].get(k) != "ringexp"}


def agreed(records: list) -> dict:
    """One record from every rank's (`apply`'s, in rank order): the common one, with the ranks that differ from
    rank 0 listed under "differs" (a node whose environment held other values)."""
    first = records[0]
    differs = {f"rank {r}": chosen(rec) for r, rec in enumerate(records) if chosen(rec) != chosen(first)}
    return first | {"ranks": len(records)} | ({"differs": differs} if differs else {})


def total(counts: list) -> dict:
    """nccl_chose's counts of every rank, summed, most frequent first."""
    return dict(sum((Counter(c) for c in counts), Counter()).most_common())
