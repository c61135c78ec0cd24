"""What a tune's trials cost in machine seconds: the Budget (what the records have spent, whether it covers the next
run), and the estimates it is checked against (a run's steps at its measured or predicted step time, its start, its
evaluations; what verifying one candidate still needs). Each is in closed form: its work grows with the records,
never with a number the user gave (tune.seeds may be far more than will ever run)."""

import dataclasses
import math

from ringexp.tune import trials
from ringexp.tune.config import MAX_RUNS
from ringexp.tune.ranking import Ranking, full_steps

FULL = ("diagnose", "verify")  # the phases whose runs are at full length (the baseline's seed 0 is diagnose's)
STARTUP_S = 10.0  # a run's start and end (imports, workers, checkpoint): what a full-length run's wall time
# beyond its steps is not taken to be evaluations


@dataclasses.dataclass
class Budget:
    """The tune's machine seconds: `total_s`, what the trial log has spent, and the estimates of what its runs
    still need against a Ranking (ranking.py); verification runs `seeds` full-length runs of each verified
    candidate and of the baseline, from seed `first_seed`."""
    total_s: float
    log: trials.Log
    seeds: int
    first_seed: int

    def spent(self) -> float:
        return sum(r.get("wall_s", 0.0) for r in self.log.done.values())

    def covers(self, need_s: float) -> bool:
        return self.spent() + need_s <= self.total_s

    def estimate(self, r: Ranking, c, steps: int, every: int | None = None) -> float:
        """Machine seconds a run of `c` (a Candidate, or None: the baseline) for `steps` steps should take,
        evaluating every `every` steps (None: once, a trial): its measured step where a run has one (else the
        planner's, scaled as the baseline's was), plus the start and each evaluation as the full-length runs so
        far took them."""
        name = "baseline" if c is None else c.name
        ran = [x for x in self.log.done.values() if x.get("candidate") == name and x["status"] == "completed"]
        step = ran[-1]["step_s"] if ran else (c.predicted if c else r.base_pred)["step_s"] * r.scale
        return STARTUP_S + steps * step + (1 if every is None else math.ceil(steps / every)) * self.eval_s()

    def eval_s(self) -> float:
        """One evaluation's seconds: the largest that a full-length run's wall time leaves beyond its steps."""
        full = [x for x in self.log.done.values() if x["phase"] in FULL and x["status"] == "completed"]
        return max([max(0.0, x["wall_s"] - STARTUP_S - x["steps"] * x["step_s"]) / math.ceil(x["steps"] / x["every"])
                    for x in full] or [0.0])

    def full_estimate(self, r: Ranking, c) -> float:
        return self.estimate(r, c, *full_steps(r.base, c))

    def reserve(self, r: Ranking) -> float:
        """What verifying one candidate still needs: the baseline's seeds not run yet, and the seeds of the
        first candidate in the order."""
        return self.left(None) * self.full_estimate(r, None) + self.seeds * self.full_estimate(r, r.order[0])

    def verifying(self, r: Ranking, c) -> float:
        """What the seeds of `c` and the baseline's not run yet still cost."""
        return sum(self.left(x) * self.full_estimate(r, x) for x in (None, c))

    def left(self, c) -> int:
        """How many of the seeds' full-length runs of `c` (None: the baseline) trials.jsonl does not hold yet."""
        start, ran = prefix(c), 0
        for key in self.log.done:
            i = index(key.removeprefix(start), self.first_seed) if key.startswith(start) else None
            ran += i is not None and 0 <= i < self.seeds
        return self.seeds - ran


def full_key(first_seed: int, c, i: int) -> str:
    """trials.jsonl's key of seed `i`'s full-length run of `c` (None: the baseline)."""
    return f"{prefix(c)}{first_seed + i}"


def trial_seed(first_seed: int, rung: int) -> int:
    """The seed of every trial at halving rung `rung`: past every verification seed (tune.seeds is at most
    MAX_RUNS / 2, from `first_seed`), one per rung, so that each of a candidate's trials is a run its verification
    does not repeat: a collapse tied to a seed counts once, and each rung is one more run to see a rare one in
    (ringexp.tune.collapse)."""
    return first_seed + MAX_RUNS // 2 + rung


def prefix(c) -> str:
    return f"verify-{'baseline' if c is None else trials.slug(c.name)}-s"


def index(seed: str, first: int):
    """The index among the seeds from `first` of `seed` as a key writes it, or None where it is no such seed."""
    try:
        return int(seed) - first if str(int(seed)) == seed else None
    except ValueError:  # (not a number, or more digits than Python converts)
        return None
