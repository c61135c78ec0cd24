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

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ringexp import records
from ringexp.cluster.schema import ClusterConfig
from ringexp.errors import ConfigError, one_line
from ringexp.plan.fields import MAX_BATCH, across_runs, check_run, described, env, model, number, overrides
from ringexp.plotting import short
from ringexp.records import yaml_text

CASE_KEYS = {"name": str, "study": str, "source": str, "cluster": str, "batch": int, "compute": dict, "runs": list}


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
