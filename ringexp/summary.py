"""The schema of summary.json, beside its writer (ringexp.recorder's `Recorder.summary`): what keys every run's
summary holds (EVERY_RUN), what a completed run's adds (COMPLETED), which must be there (REQUIRED), and the kinds of
value each may hold (KINDS). `shape_error(summary)` says what makes a summary one its readers cannot use; compare
checks every run with it once, when the run is loaded, so that its table, plots and predictions can rely on it.
"""

BIG = 1e300  # a number beyond it (or an integer too big for a float) would overflow a reader's arithmetic


def is_text(v) -> bool:
    """str that can be written out as UTF-8 (JSON can hold a lone surrogate, "\\ud800", which cannot)."""
    if not isinstance(v, str):
        return False
    try:
        v.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _text_map(v) -> bool:
    return isinstance(v, dict) and all(is_text(x) for item in v.items() for x in item)


def _backend_record(v) -> bool:
    """What backend.chosen reads: `env` and `from`, text to text (`from` may be left out when `env` is empty)."""
    return (isinstance(v, dict) and _text_map(v.get("env", {}))
            and _text_map(v.get("from", None if v.get("env") else {})))


# The kinds of value a summary's keys may hold, and what compare's table, plots and predictions read from a summary.
# A key may be absent or null unless REQUIRED.
KINDS = {
    "text": is_text,
    "a number": lambda v: type(v) in (int, float) and -BIG < v < BIG,  # not bool, NaN or infinite
    "a number >= 0": lambda v: type(v) in (int, float) and 0 <= v < BIG,
    "a count >= 1": lambda v: type(v) is int and 1 <= v < BIG,
    "a mapping": lambda v: isinstance(v, dict),
    "a list of text": lambda v: isinstance(v, list) and all(map(is_text, v)),
    "a backend record": _backend_record,
    "a list of targets": lambda v: isinstance(v, list) and all(_target(t) for t in v),
}


def _target(t) -> bool:
    """One entry of a summary's `targets` (ringexp.recorder.reached): a level in (0, 1] and, once reached, its
    step, samples and seconds."""
    return (isinstance(t, dict) and type(t.get("auroc")) in (int, float) and 0 < t["auroc"] <= 1
            and all(t.get(k) is None or KINDS["a number >= 0"](t[k]) for k in ("step", "samples", "train_s",
                                                                              "elapsed_s")))


EVERY_RUN = {"status": "text", "error": "text", "overrides": "a list of text"}
COMPLETED = {
    "throughput": "a mapping", **{f"throughput.{k}": "a number >= 0" for k in ("median", "p10", "p90",
                                                                                 "whole_run", "train_s")},
    "final": "a mapping", "final.auroc_macro": "a number >= 0", "final.f1_macro": "a number >= 0",
    "best": "a mapping", "best.auroc_macro": "a number >= 0", "best.f1_macro": "a number >= 0",
    "targets": "a list of targets",
    "time": "a mapping", "time.verdict": "text", "time.other_s": "a number",  # what the parts leave unexplained
    **{f"time.{k}": "a number >= 0" for k in ("step_s", "data_s", "compute_s", "comm_s", "exposed_comm_s",
                                              "optimizer_s", "overlap")},
    "memory": "a mapping", "memory.peak_bytes": "a number >= 0", "peak_memory_bytes": "a number >= 0",
    "wire_bytes_per_rank_per_step": "a number >= 0", "world_size": "a count >= 1", "job_type": "text",
    "task": "a mapping",  # quality.task_of: what a quality verdict on this run was measured on
    # the learning rate the schedule started from and the rule that set it (ringexp.optim.base_lr; compare shows it)
    "lr_rule": "a mapping", "lr_rule.rule": "text", "lr_rule.factor": "a number >= 0", "lr_rule.lr": "a number >= 0",
    "versions": "a mapping",  # ringexp.versions: the code it ran, which a verdict's runs must share
    "nodes": "a count >= 1", "ranks_per_node": "a count >= 1", "link": "text", "backend_env": "a backend record",
    # local_sgd, diloco (Strategy.synchronizations): every how many steps the models were synchronised, how often
    "synchronizations": "a mapping", "synchronizations.period": "a count >= 1",
    "synchronizations.count": "a number >= 0", "synchronizations.bytes_per_sync": "a number >= 0",
}
REQUIRED = {"status", "throughput", "final", "best"}


def shape_error(summary) -> str | None:
    """What makes `summary` one the report cannot use (the first key missing or of the wrong kind), or None."""
    if not isinstance(summary, dict):
        return f"holds {described(summary)}, not a summary"
    for key, kind in (EVERY_RUN | (COMPLETED if summary.get("status") == "completed" else {})).items():
        value = summary
        for part in key.split("."):  # a key's mapping comes before it in the table: a dict or absent here
            value = value.get(part) if value is not None else None
        if value is None and key in REQUIRED:
            return f"no {key}, which must be {kind}"
        if value is not None and not KINDS[kind](value):
            return f"{key} is {described(value)}, not {kind}"
    return None


def described(value) -> str:
    """A value in a message: short, and never the repr of a container (which may be nested deep)."""
    if isinstance(value, list) and value:
        return f"a list of {', '.join(sorted({type(x).__name__ for x in value}))}"
    return ascii(value)[:40] if isinstance(value, str | int | float) else f"a {type(value).__name__}"
