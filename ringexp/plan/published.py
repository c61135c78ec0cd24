"""Published measurements of real clusters as the planner's check (`python -m ringexp.plan accuracy cases=FILE`):
a YAML of clusters written from the papers' hardware and of cases (a model, a batch, one GPU's measured step as
the compute, and measured runs at several shapes and settings, every number with its source). This module reads
the file and checks it (`load`); scoring.py predicts each run as `predict` would (the strategy's `step_cost` on that
cluster and training config) and puts it beside its measurement; a run naming a `baseline` is also judged as a
ratio: did the model see which of the two is faster.

The file, in short (ringexp/plan/published.yaml is the shipped one):

    clusters: {NAME: a conf/cluster mapping (ClusterConfig)}
    cases:
      - name, study, source, cluster: NAME, model: timm name (or params: count), batch: per GPU
        compute: {step_s, source}: one GPU's forward, backward and optimizer step at that batch
        train: [training overrides], env: {NCCL_ALGO, NCCL_PROTO, NCCL_SOCKET_NTHREADS, ...}  (optional)
        runs: [{name, nodes, ranks_per_node, step_s or samples_s, source, train, baseline, input}]

`study` names the publication a case is from: leave-one-source-out (heldout.py) holds a study's cases out
together (a file of one study is scored in sample only), so a case's `source`, the quote its numbers come from,
cannot be a case's of another cluster as well (one quote is of one cluster's table). `input: true` marks the run
the compute was taken from: predicted exactly by construction, so not scored. Every field is checked for its kind
and range before anything is built (params at most 10^12, a step at most a day, train a list of overrides, a
model timm knows, NCCL's counts read as NCCL reads them and within its range, every case and run under a name of
its own, a baseline another run of the case, a case's runs in one unit); a run whose configuration Hydra or
ringexp refuses is named with the field: one line, `cases=FILE: case NAME: [run NAME: ]FIELD: WHY`. A value that
YAML 1.1 and 1.2 read differently (an unquoted `no`) is refused where the file is read (records.yaml_text)."""

import math

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ringexp import records
from ringexp.cluster.schema import ClusterConfig
from ringexp.config import NCCL_CHOICES, NCCL_COUNTS, nccl_count_error, nccl_list_error, nccl_sockets_error
from ringexp.errors import ConfigError, one_line
from ringexp.models import check_model
from ringexp.plotting import short
from ringexp.records import yaml_text

CASE_KEYS = {"name": str, "study": str, "source": str, "cluster": str, "batch": int, "compute": dict, "runs": list}
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


def load(path: str) -> tuple:
    """({cluster name: ClusterConfig}, [case]) of a published-cases file, every field checked; ConfigError naming
    the file, the case and the field otherwise."""
    try:
        doc = OmegaConf.to_container(OmegaConf.create(yaml_text(path, records.read_bytes(path, follow=True))))
    except OSError as e:
        raise ConfigError(f"cases={path}: cannot read it ({e.strerror or e}); give a published-cases YAML") from None
    except ConfigError as e:  # yaml_text's, naming the file
        raise ConfigError(f"cases={e}") from None
    except OmegaConfBaseException as e:
        raise ConfigError(f"cases={path}: {one_line(str(e))}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("clusters"), dict) or \
            not isinstance(doc.get("cases"), list) or not doc["cases"]:
        raise ConfigError(f"cases={path}: needs a `clusters` mapping and a non-empty `cases` list")
    clusters = {name: cluster(path, name, c) for name, c in doc["clusters"].items()}
    cases = [checked(path, i, c, clusters) for i, c in enumerate(doc["cases"])]
    studies(path, cases)
    return clusters, cases


def studies(path: str, cases: list) -> None:
    """A name per case (a ratio finds its baseline by case and run name) and a study per publication: no quote (a
    case's `source`) shared by cases of different clusters, which would make one publication of two, or of
    different studies, which would let one publication help choose the rules it is scored under
    (leave-one-source-out holds a study's cases out together)."""
    seen, names = {}, {}
    for i, c in enumerate(cases):
        if (first := names.setdefault(c["name"], i)) != i:
            refuser(path, i, c)("name", f"case #{first} has it too; give every case its own name")
        other = seen.setdefault(c["source"], c)
        for key, what in (("cluster", "on cluster"), ("study", "of study")):
            if other[key] != c[key]:
                refuser(path, i, c)("source", f"the same as case {described(other['name'])}'s, {what} "
                                    f"{described(other[key])}: a quote is of one cluster's results in one "
                                    "publication; quote this case's own and name its publication in `study`")


def cluster(path: str, name: str, body) -> ClusterConfig:
    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ClusterConfig), {"name": name, **body}))
    except (OmegaConfBaseException, ConfigError, TypeError) as e:
        raise ConfigError(f"cases={path}: cluster {short(name)}: {one_line(str(e))}") from None


def refuser(path: str, i: int, case):
    """The function that refuses a field of case `i`: ConfigError `cases=FILE: case NAME: FIELD: WHY`."""
    name = short(case["name"]) if isinstance(case, dict) and isinstance(case.get("name"), str) else f"#{i}"

    def wrong(field: str, why: str):
        raise ConfigError(f"cases={path}: case {name}: {field}: {why}")

    return wrong


def checked(path: str, i: int, case, clusters: dict) -> dict:
    """The case as read, or ConfigError `cases=FILE: case NAME: FIELD ...`."""
    wrong = refuser(path, i, case)
    if not isinstance(case, dict):
        wrong("case", "not a mapping")
    for key, kind in CASE_KEYS.items():
        if not isinstance(case.get(key), kind) or isinstance(case.get(key), bool):
            wrong(key, "missing" if key not in case else f"{described(case[key])} is not a {kind.__name__}")
    if case["cluster"] not in clusters:
        wrong("cluster", f"{described(case['cluster'])} is none of the file's clusters ({', '.join(clusters)})")
    if not 1 <= case["batch"] <= MAX_BATCH:
        wrong("batch", f"{case['batch']} must be in [1, {MAX_BATCH}] (per GPU)")
    model(case, wrong)
    number(case["compute"], "step_s", wrong, "compute.")
    if not case["compute"].get("source"):
        wrong("compute.source", "every number needs its source")
    overrides(case, "train", wrong)
    env(case, wrong)
    names = {r["name"] for r in case["runs"] if isinstance(r, dict) and isinstance(r.get("name"), str)}
    for j, run in enumerate(case["runs"]):
        check_run(run, j, names, wrong)
    across_runs(case["runs"], wrong)
    return case


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
