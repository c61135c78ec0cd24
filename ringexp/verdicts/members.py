"""Which runs a seed group holds: those its numbers and its quality verdict rest on (docs/sweeps.md).

    reference(base)          the task and code versions every verdict is on: the baseline group's, which every
                             completed run of it must record and share; else (None, why) and no verdict at all
    admitted(group, ref)     the group with only its runs of that task and those versions (`ref` None: not checked)
                             that recorded an evaluation, the first run of each seed; each other run, and each run
                             with the group's overrides that did not complete, in its `left_out` with why
    stopped(summary)         why a run that did not complete is left out of its group

The reference is the baseline's, never a majority's nor some group's first run: runs added to a sweep can be left out,
or take every verdict away (a baseline run of another task), but never turn a verdict into one on another task.
"""

from dataclasses import replace

from ringexp import predict
from ringexp.errors import one_line
from ringexp.verdicts.load import printable_path


def baseline(a: str, b: str) -> str:
    """A run's differing field beside the baseline's."""
    return f"{a}, the baseline's {b}"


def reference(base) -> tuple:
    """({"task", "versions"} of the baseline group `base`, '') or (None, why it gives no verdict): its runs must
    each record a task (summary `task`), the same one, under the same versions (summary `versions`)."""
    first, *rest = base.runs
    if not isinstance(first["summary"].get("task"), dict):
        return None, (f"the baseline's run {where(first)} records no task (a run from before runs recorded it): no "
                      "verdict")
    ref = {"task": first["summary"]["task"], "versions": first["summary"].get("versions") or {}}
    for run in rest:
        if why := mismatch(run["summary"], ref, lambda a, b: f"{a}, {where(first)}'s {b}"):
            return None, f"the baseline's own runs disagree ({where(run)}: {why}): no verdict"
    return ref, ""


def mismatch(summary: dict, ref: dict, both=baseline) -> str:
    """Why a run's `summary` is not of the task and code versions `ref` ('' when it is)."""
    if not isinstance(summary.get("task"), dict):
        return "no task recorded (a run from before runs recorded it)"
    if said := predict.differences(summary["task"], ref["task"], both):
        return f"another task ({said})"
    if said := predict.differences(summary.get("versions") or {}, ref["versions"], both):
        return f"another code version ({said})"
    return ""


def admitted(group, ref):
    """`group` (a verdicts.groups.Group) with only the runs a verdict may pair (see the module's docstring); the
    others added to its left_out (after the runs that did not complete), each with why."""
    runs, seeds, out = [], [], list(group.left_out)
    for run, seed in zip(group.runs, group.seeds, strict=True):
        why = ref is not None and mismatch(run["summary"], ref)
        if not why and run["summary"]["final"].get("auroc_macro") is None:
            why = "no evaluation recorded"
        if not why and seed in seeds:
            why = f"seed {seed} again (the group's run of it: {where(runs[seeds.index(seed)])})"
        if why:
            out.append((run, seed, why))
        else:
            runs.append(run)
            seeds.append(seed)
    return replace(group, runs=tuple(runs), seeds=tuple(seeds), left_out=tuple(out))


def stopped(summary: dict) -> str:
    """Why a run with a group's overrides that did not complete is not in it: its status and error."""
    error = summary.get("error")
    return f"{summary.get('status')}" + (f": {one_line(error)}" if isinstance(error, str) and error else "")


def where(run: dict) -> str:
    return printable_path(run["dir"])
