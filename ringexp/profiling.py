"""`profile.enabled=true`: a torch.profiler trace of a few steps, written as a Chrome/Perfetto trace."""

import logging

import torch
from torch.profiler import ProfilerActivity, profile

log = logging.getLogger("ringexp")


def start(device: torch.device):
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    prof = profile(activities=activities, record_shapes=False, with_stack=False)
    prof.start()
    return prof


def finish(prof, run_dir, rank: int, first: int, last: int, top: int, device: torch.device) -> dict:
    """Stop, write trace_rank<r>.json into the run directory, and return the top operators by self time."""
    prof.stop()
    path = run_dir / f"trace_rank{rank}.json"
    prof.export_chrome_trace(str(path))
    key = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    averages = prof.key_averages()
    rows = sorted(averages, key=lambda e: getattr(e, key), reverse=True)[:top]
    log.info("profile of steps %d-%d (%s):\n%s", first, last, path.name,
             averages.table(sort_by=key, row_limit=top))
    return {"trace": path.name, "steps": [first, last], "sort": key,
            "top_ops": [{"name": e.key, "calls": e.count, "self_ms": getattr(e, key) / 1e3,
                         "total_ms": (e.device_time_total if device.type == "cuda" else e.cpu_time_total) / 1e3}
                        for e in rows]}
