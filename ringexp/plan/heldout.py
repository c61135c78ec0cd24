"""Leave-one-source-out: the published cases scored out of sample. Every rule the model chose on the cases
(rules.py) is chosen again without the scored study's cases (all of that publication's runs held out together),
then that study is predicted under the rules chosen without it. A combination is chosen by the lowest mean,
over the other studies, of each study's median |error| (every publication weighs the same: a rule that only
changes the few studies on TCP is judged on them, not drowned by the many runs it leaves alone), then by the
most ratio directions right there."""

import statistics

from ringexp.plan import rules, scoring


def scored(rows: list) -> tuple:
    """What choosing a combination maximises on `rows`: -(the mean over studies of each study's median |error|),
    so that every publication weighs the same whatever its number of runs, then the ratio directions right."""
    studies = {}
    for r in rows:
        if not r["input"]:
            studies.setdefault(r["study"], []).append(abs(r["error"]))
    spread = statistics.mean(statistics.median(e) for e in studies.values()) if studies else 0.0
    return -round(spread, 9), sum(r["right"] for r in scoring.ratios(rows))  # (equal to 1e-9: a tie)


def held_out(by_combination: list) -> dict:
    """{study: (the combination chosen without it, its rows under that combination)} from `by_combination`:
    [(combination, every case's rows under it)], the model's own first. A file of one study gives {}."""
    studies = list(dict.fromkeys(r["study"] for r in by_combination[0][1]))
    if len(studies) < 2:
        return {}
    out = {}
    for study in studies:
        best = max(by_combination, key=lambda cr: scored([r for r in cr[1] if r["study"] != study]))
        out[study] = (best[0], [r for r in best[1] if r["study"] == study])
    return out


def summary(rows: list) -> str:
    errors = sorted(abs(r["error"]) for r in rows if not r["input"])
    rats = scoring.ratios(rows)
    if not errors:
        return "no run scored"
    return (f"{len(errors)} runs: median |error| {statistics.median(errors):.1%}, worst {errors[-1]:.1%}, within "
            f"10%: {sum(e <= 0.10 for e in errors)}; ratio directions right: {sum(r['right'] for r in rats)} of "
            f"{len(rats)}")


def report(own: list, got: dict) -> list:
    """The leave-one-source-out lines of `got` (held_out's), beside `own` (every run under the model's rules):
    per study its runs, its median |error| in sample and held out, its ratio directions, and the rules chosen
    without it where they differ from the model's; then the headline."""
    if not got:
        return ["Leave-one-source-out: needs cases of two studies at least (a case's `study`); in sample only."]
    lines = ["## Leave-one-source-out", "",
             "| study | runs | median error in sample | held out | worst held out | directions held out | "
             "rules chosen without it |", "|" + "---|" * 7]
    for study, (combination, rows) in got.items():
        inside = [abs(r["error"]) for r in own if r["study"] == study and not r["input"]]
        errors = sorted(abs(r["error"]) for r in rows if not r["input"])
        rats = scoring.ratios(rows)
        lines.append(f"| {study} | {len(errors)} | {median(inside)} | {median(errors)} | "
                     f"{format(errors[-1], '.1%') if errors else '-'} | {sum(r['right'] for r in rats)} of "
                     f"{len(rats)} | {rules.differs(combination) or 'the model' + chr(39) + 's'} |")
    return lines + ["", headline(got)]


def headline(got: dict) -> str:
    """Every study held out, together: the out-of-sample summary and the worst study's median."""
    pooled = [r for _, rows in got.values() for r in rows]
    medians = {s: statistics.median([abs(r["error"]) for r in rows if not r["input"]] or [0]) for s, (_, rows) in
               got.items()}
    worst = max(medians, key=medians.get)
    return f"Held out (out of sample): {summary(pooled)}; the worst study's median: {worst}, {medians[worst]:.1%}"


def median(errors: list) -> str:
    return format(statistics.median(errors), ".1%") if errors else "-"
