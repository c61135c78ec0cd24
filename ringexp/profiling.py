"""`profile.enabled=true`: a torch.profiler trace of a few steps, written as a Chrome/Perfetto trace."""

import contextlib
import logging
import os
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

from ringexp import records

log = logging.getLogger("ringexp")


def start(device: torch.device):
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    prof = profile(activities=activities, record_shapes=False, with_stack=False)
    prof.start()
    return prof


def finish(prof, run_dir, rank: int, first: int, last: int, top: int, device: torch.device, groups=()) -> dict:
    """Stop, once the step's collectives on `groups` have ended, write trace_rank<r>.json into the run directory,
    and return the top operators by self time."""
    settle(groups)
    prof.stop()
    path = Path(run_dir) / f"trace_rank{rank}.json"
    export(prof, path)
    key = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    averages = prof.key_averages()
    rows = sorted(averages, key=lambda e: getattr(e, key), reverse=True)[:top]
    log.info("profile of steps %d-%d (%s):\n%s", first, last, path.name,
             averages.table(sort_by=key, row_limit=top))
    return {"trace": path.name, "steps": [first, last], "sort": key,
            "top_ops": [{"name": e.key, "calls": e.count, "self_ms": getattr(e, key) / 1e3,
                         "total_ms": (e.device_time_total if device.type == "cuda" else e.cpu_time_total) / 1e3}
                        for e in rows]}


def settle(groups) -> None:
    """Wait for every collective this rank started on `groups` (None: the default group) to end, its profiler
    record included. gloo completes a collective's future (which DDP waits for) before it ends the profiler's
    record of it, on its own thread: a profiler stopped in between frees the buffer that thread then writes
    (glibc's "malloc(): unsorted double linked list corrupted", SIGABRT, in 2 of 40 resumed profiled runs). A
    barrier runs only once every collective queued before it on its group has ended, record included, and
    returns once its own has."""
    if dist.is_initialized():
        for group in groups:
            dist.barrier(group=group)


def export(prof, path: Path) -> None:
    """The trace as the file `path`, through records.write_file (a link planted at the name is replaced, never
    written through): torch writes to the name it is given, so it gets a fresh one of mkstemp's beside it first."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(tmp)
        records.write_file(path, records.read_bytes(tmp, records.TRACE))
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
