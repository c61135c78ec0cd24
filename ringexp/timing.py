"""Where a step's time went, without a profiler: compute, communication, exposed communication, overlap.

The training loop marks the phases of each step on the training thread; the strategy reports every
collective from the communication side (`CommTimer.start` / `end`: a DDP hook's future completing, FSDP's
all-gather and reduce-scatter calls). From those:
- communication: how long at least one collective was in flight (the union of their spans);
- exposed communication: how long the step waited for communication once its own computation was done.
  DDP family: backward hands its last bucket over, then waits for every bucket's future: the time from that
  hand-over to the end of backward. FSDP (collectives issued on the training thread): the time spent inside
  collective calls that block it;
- overlap = 1 - exposed / communication: the share of communication hidden behind computation;
- compute = forward + backward time less data waits and exposed communication.

Timestamps come from `Clock`: perf_counter on CPU, CUDA events on GPUs (recorded on the current stream, so
they mark when the device got there, not when the CPU queued the work). The only device-specific code here.
"""

import statistics
import threading
import time

import torch

# The parts of a step in records (time/<part>) and summary.json (medians)
PARTS = ("data_s", "compute_s", "comm_s", "exposed_comm_s", "optimizer_s", "overlap", "other_s")


class Clock:
    def __init__(self, device: torch.device):
        self.device, self.cuda = device, device.type == "cuda"

    def now(self):
        """A mark: on CUDA an event on the calling thread's current stream of this clock's device, named
        explicitly: a hook's worker thread may have another current device, and events of two devices cannot be
        compared."""
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record(torch.cuda.current_stream(self.device))
            return event
        return time.perf_counter()

    def since(self, origin, mark) -> float:
        """Seconds from `origin` to `mark` (both from `now`; on CUDA only once the device has passed both)."""
        return origin.elapsed_time(mark) / 1e3 if self.cuda else mark - origin

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()


class CommTimer:
    """The current step's collectives as (start, end, blocking) marks. Thread-safe: hooks end on other threads.

    `exposure` is how exposed communication is measured for this strategy: "handover" (DDP family) or
    "blocking" (FSDP). On CUDA, FSDP's calls return once queued, so blocking time says nothing about the
    device: exposed communication is then not reported (None) rather than reported wrong."""

    def __init__(self, clock: Clock, exposure: str = "handover"):
        self.clock, self.exposure = clock, exposure
        self.lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self.lock:
            self.spans = []  # [start, end or None, blocking]
            self.last_handover = None
            self.between = getattr(self, "between", [])  # spans kept across steps until taken (taken_between)

    def keep(self, span: list) -> None:
        """Keep an ended span beyond its step: a periodic averaging, which a logged step's split spreads over the
        steps since the previous row (a row's own step rarely is the one that synchronised)."""
        with self.lock:
            self.between.append(span)

    def taken_between(self) -> float:
        """Seconds of the spans kept since the last call (the clock must have passed them: on CUDA, synced)."""
        with self.lock:
            kept, self.between = self.between, []
        return sum(self.clock.since(s, e) for s, e, _ in kept)

    def start(self, handover: bool = False) -> list:
        mark = self.clock.now()
        span = [mark, None, False]
        with self.lock:
            self.spans.append(span)
            if handover:
                self.last_handover = mark
        return span

    def end(self, span: list, blocking: bool = False) -> None:
        span[1], span[2] = self.clock.now(), blocking

    def measure(self, origin, backward_end) -> dict:
        """comm_s and exposed_comm_s of the step that began at `origin` and finished backward at `backward_end`."""
        with self.lock:
            spans = [(self.clock.since(origin, s), self.clock.since(origin, e), b) for s, e, b in self.spans
                     if e is not None]
            handover = self.last_handover
        comm, bwd = union_length([(s, e) for s, e, _ in spans]), self.clock.since(origin, backward_end)
        # blocking collectives after backward (a periodic averaging after the optimizer): exposed, and out of the
        # optimizer's time (after_s)
        after = sum(e - s for s, e, b in spans if b and s >= bwd)
        if self.exposure == "handover":
            exposed = max(0.0, self.clock.since(handover, backward_end)) if handover is not None else 0.0
        elif self.clock.cuda:
            exposed = None
        else:
            exposed = sum(e - s for s, e, b in spans if b and s < bwd)
        return {"comm_s": comm, "exposed_comm_s": exposed, "after_s": after}


def union_length(intervals: list) -> float:
    total, reach = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if e > reach:
            total += e - max(s, reach)
            reach = e
    return total


def timed_hook(hook, timer: CommTimer):
    """A DDP communication hook that reports each bucket to `timer`: handed over when DDP calls it (its
    gradients are ready), done when its future completes (on whichever thread completes it)."""
    def run(state, bucket):
        span = timer.start(handover=True)

        def done(fut):
            timer.end(span)
            return fut.value()
        return hook(state, bucket).then(done)
    return run


def breakdown(step_s: float, data_s: float, fwd_bwd_s: float, optimizer_s: float, comm: dict) -> dict:
    """The parts of one step; `other_s` is what they leave unexplained (logging, waiting for slower ranks)."""
    during, after = comm["exposed_comm_s"], comm.get("after_s", 0.0)  # (after: already out of optimizer_s)
    compute = max(0.0, fwd_bwd_s - data_s - (during or 0.0))
    exposed = None if during is None else during + after
    parts = {"data_s": data_s, "compute_s": compute, "comm_s": comm["comm_s"], "exposed_comm_s": exposed,
             "optimizer_s": optimizer_s}
    parts["overlap"] = (max(0.0, min(1.0, 1 - exposed / comm["comm_s"]))
                        if exposed is not None and comm["comm_s"] > 0 else None)
    parts["other_s"] = step_s - data_s - compute - (exposed or 0.0) - optimizer_s
    return parts


def verdict(t: dict, tips: str) -> str:
    """One line in the spirit of the seed articles' checklist, from the step's median parts `t`; `tips` is what the
    strategy suggests trying when communication is exposed (ringexp.parallel's `Strategy.tips`)."""
    step = t.get("step_s")
    if not step:
        return "no steady steps measured"
    lines = []
    if not t.get("comm_s"):
        lines.append("no communication measured")
    else:
        share, overlap = t["comm_s"] / step, t.get("overlap")
        line = f"communication is {share:.0%} of step time"
        if overlap is None:
            line += ", overlap not measured on this device (use profile.enabled=true)"
        elif overlap < 0.6 and (t.get("exposed_comm_s") or 0) >= 0.05 * step:
            line += f", overlap {overlap:.0%} (< 60%): try {tips}"
        elif overlap < 0.6:
            line += f", overlap {overlap:.0%}, but what is exposed is under 5% of the step: little to gain"
        else:
            line += f", overlap {overlap:.0%} (>= 60%): communication is mostly hidden behind compute"
        lines.append(line)
    data_share = (t.get("data_s") or 0) / step
    if data_share > 0.1:
        lines.append(f"data loading is {data_share:.0%} of step time: raise data.num_workers")
    return "; ".join(lines)


def median_time(fn, iters: int, sync=lambda: None) -> float:
    """Median seconds of `iters` calls of fn() after one untimed call (first-touch page faults, scratch
    buffers); `sync` waits for the device (torch.cuda.synchronize on GPUs)."""
    return statistics.median(times_of(fn, iters, sync))


def times_of(fn, iters: int, sync=lambda: None) -> list:
    """Seconds of each of `iters` calls of fn() after one untimed call, as median_time times them."""
    fn()
    sync()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return times
