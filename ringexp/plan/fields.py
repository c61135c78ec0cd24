"""The fields of one published case and of its runs, each checked for its kind and range before anything is built
(ringexp.plan.published reads the file; every refusal goes through its `wrong(field, why)`, which names the file
and the case)."""

import math

from ringexp.config import NCCL_CHOICES, NCCL_COUNTS, nccl_count_error, nccl_list_error, nccl_sockets_error
from ringexp.errors import ConfigError
from ringexp.models import check_model
from ringexp.plotting import short

RUN_KEYS = {"name": str, "nodes": int, "ranks_per_node": int, "source": str}
# the NCCL variables a case may set: what the model reads of a run's backend.env (NCCL's choice; its sockets)
MODEL_ENV = ("NCCL_ALGO", "NCCL_PROTO", *NCCL_COUNTS)
MEASURES = ("step_s", "samples_s")  # what a run's measurement may be: seconds per optimizer step, or throughput
# The ranges of a case's numbers, checked before anything is built: `params` is split into shapes of 4M (scoring,
# one entry each, and every run's cost walks them: 10^12 takes seconds a run, 10^15 took 5 GB before failing);
# `batch` at most what the training schema's default data holds on each of 2 ranks (compose_config checks it);
# a step of more than a day or a throughput of more than 10^9 samples/s is no measurement (1e308 made every
# prediction infinite).
MAX_PARAMS = 10 ** 12  # a trillion: beyond the largest dense model published
MAX_BATCH = 8192
MAX = {"step_s": 86400.0, "samples_s": 1e9}


def across_runs(checked_runs: list, wrong) -> None:
    """Every run of a case under its own name, and measured in one unit (MEASURES): a ratio divides one run's
    measurement by its baseline's, and is no ratio of a step time over a throughput."""
    seen, unit = set(), None
    for run in checked_runs:
        label = f"run {ascii(short(run['name']))}"
        if run["name"] in seen:
            wrong(label, "two runs of the case have this name; give each its own")
        seen.add(run["name"])
        given = next(m for m in MEASURES if m in run)
        if (unit := unit or given) != given:
            wrong(f"{label}: {given}", f"the case's first run gives {unit}: give every run of a case in one unit "
                  "(its ratios divide one run's by another's)")


def env(case: dict, wrong) -> None:
    """The NCCL variables the model reads (MODEL_ENV), each of a value NCCL takes."""
    if not isinstance(case.get("env") or {}, dict):
        wrong("env", f"{described(case['env'])} is not a mapping of {', '.join(MODEL_ENV)}")
    for key, value in (case.get("env") or {}).items():
        if key not in MODEL_ENV:
            wrong(f"env.{short(key)}", f"only {', '.join(MODEL_ENV)} change the model")
        if bad := nccl_list_error(key, str(value)) if key in NCCL_CHOICES else nccl_count_error(key, str(value)):
            wrong(f"env.{key}", f"{short(value)}: {bad}")
    if bad := nccl_sockets_error(case.get("env") or {}):
        wrong("env.NCCL_SOCKET_NTHREADS", f"{case['env'].get('NCCL_SOCKET_NTHREADS')} {bad}")


def model(case: dict, wrong) -> None:
    """A timm model's name, or a parameter count in [1, MAX_PARAMS]: one of them."""
    if ("model" in case) == ("params" in case):
        wrong("model", "give a timm model name or a parameter count (params), one of them")
    if "params" in case:
        n = case["params"]
        if type(n) is not int or not 1 <= n <= MAX_PARAMS:
            wrong("params", f"{described(n)} must be a whole number of parameters in [1, {MAX_PARAMS:.0e}]")
        return
    if not isinstance(case["model"], str):
        wrong("model", f"{described(case['model'])} is not a timm model's name")
    try:
        check_model(case["model"])
    except ConfigError as e:
        wrong("model", str(e).removeprefix("model.name="))


def overrides(d: dict, key: str, wrong, prefix: str = "") -> None:
    """`d[key]`, where given, a list of training overrides (text): never a string, whose letters would be
    taken one by one, nor a list inside the list."""
    v = d.get(key, [])
    if not isinstance(v, list) or not all(isinstance(o, str) for o in v):
        wrong(f"{prefix}{key}", f"{described(v)} is not a list of training overrides (text, e.g. [+parallel=ddp])")


def described(v) -> str:
    """A value of the file in a message: short (a name may be any length), a container by its kind."""
    if isinstance(v, list):
        return f"a list of {', '.join(sorted({type(x).__name__ for x in v})) or 'nothing'}"
    return ascii(short(v)) if isinstance(v, str) else short(repr(v)) if isinstance(v, int | float | bool) or \
        v is None else f"a {type(v).__name__}"


def check_run(run, j: int, names: set, wrong) -> None:
    label = f"runs[{j}]" if not isinstance(run, dict) or not isinstance(run.get("name"), str) else \
        f"run {ascii(short(run['name']))}"
    if not isinstance(run, dict):
        wrong(label, "not a mapping")
    for key, kind in RUN_KEYS.items():
        if not isinstance(run.get(key), kind) or isinstance(run.get(key), bool):
            wrong(f"{label}: {key}", "missing" if key not in run else f"{described(run[key])} is not a {kind.__name__}")
    given = [m for m in MEASURES if m in run]
    if len(given) != 1:
        wrong(f"{label}: step_s", "give the measured step_s or samples_s, one of them")
    number(run, given[0], wrong, f"{label}: ")
    overrides(run, "train", wrong, f"{label}: ")
    if run.get("baseline") is not None and (not isinstance(run["baseline"], str) or run["baseline"] not in names):
        wrong(f"{label}: baseline", f"{described(run['baseline'])} is no run of this case")
    if run.get("baseline") == run["name"]:
        wrong(f"{label}: baseline", "its own name: a run over itself is no ratio; name another run of the case")


def number(d: dict, key: str, wrong, prefix: str) -> None:
    v, most = d.get(key), MAX.get(key, MAX["step_s"])
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and 0 < v <= most):
        wrong(f"{prefix}{key}", "missing" if key not in d else f"{described(v)} must be a finite number > 0 and "
              f"at most {most:g}")
