"""What a tune's trials cost in machine seconds: the budget (what the records have spent, whether it covers the next
run), and the estimates it is checked against (a run's steps at its measured or predicted step time, its start, its
evaluations; what verifying one candidate still needs). Each is in closed form: its work grows with the records,
never with a number the user gave (tune.seeds may be far more than will ever run)."""

import dataclasses
import math

from ringexp.tune import trials

FULL = ("diagnose", "verify")  # the phases whose runs are at full length (the baseline's seed 0 is diagnose's)
STARTUP_S = 10.0  # a run's start and end (imports, workers, checkpoint): what a full-length run's wall time
# beyond its steps is not taken to be evaluations


@dataclasses.dataclass
class Budget:
    total_s: float
    log: trials.Log

    def spent(self) -> float:
        return sum(r.get("wall_s", 0.0) for r in self.log.done.values())

    def covers(self, need_s: float) -> bool:
        return self.spent() + need_s <= self.total_s


def estimate(t, c, steps: int, every: int | None = None) -> float:
    """Machine seconds a run of `c` (a Candidate, or None: the baseline) for `steps` steps should take,
    evaluating every `every` steps (None: once, a trial): its measured step where a run has one (else the
    planner's, scaled as the baseline's was), plus the start and each evaluation as the full-length runs so far
    took them."""
    name = "baseline" if c is None else c.name
    ran = [r for r in t.log.done.values() if r.get("candidate") == name and r["status"] == "completed"]
    step = ran[-1]["step_s"] if ran else (c.predicted if c else t.base_pred)["step_s"] * t.scale
    return STARTUP_S + steps * step + (1 if every is None else math.ceil(steps / every)) * eval_s(t)


def eval_s(t) -> float:
    """One evaluation's seconds: the largest that a full-length run's wall time leaves beyond its steps."""
    full = [r for r in t.log.done.values() if r["phase"] in FULL and r["status"] == "completed"]
    return max([max(0.0, r["wall_s"] - STARTUP_S - r["steps"] * r["step_s"]) / math.ceil(r["steps"] / r["every"])
                for r in full] or [0.0])


def full_estimate(t, c) -> float:
    steps, every = (t.base.steps, t.base.eval_every) if c is None else t.full_steps(c)
    return estimate(t, c, steps, every)


def reserve(t) -> float:
    """What verifying one candidate still needs: the baseline's seeds not run yet, and the seeds of the
    first candidate in the order."""
    return left(t, None) * full_estimate(t, None) + t.tc.seeds * full_estimate(t, t.order[0])


def verifying(t, c) -> float:
    """What the seeds of `c` and the baseline's not run yet still cost."""
    return sum(left(t, x) * full_estimate(t, x) for x in (None, c))


def full_key(t, c, i: int) -> str:
    """trials.jsonl's key of seed `i`'s full-length run of `c` (None: the baseline)."""
    return f"{prefix(c)}{t.base.seed + i}"


def prefix(c) -> str:
    return f"verify-{'baseline' if c is None else trials.slug(c.name)}-s"


def left(t, c) -> int:
    """How many of the tune.seeds full-length runs of `c` (None: the baseline) trials.jsonl does not hold yet."""
    start, ran = prefix(c), 0
    for key in t.log.done:
        i = index(key.removeprefix(start), t.base.seed) if key.startswith(start) else None
        ran += i is not None and 0 <= i < t.tc.seeds
    return t.tc.seeds - ran


def index(seed: str, first: int):
    """The index among the seeds from `first` of `seed` as a key writes it, or None where it is no such seed."""
    try:
        return int(seed) - first if str(int(seed)) == seed else None
    except ValueError:  # (not a number, or more digits than Python converts)
        return None
