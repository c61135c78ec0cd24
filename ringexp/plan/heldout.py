"""Leave-one-source-out: the published cases scored out of sample. Every rule the model chose on the cases
(rules.py) is chosen again without the scored study's cases (all of that publication's runs held out together),
then that study is predicted under the rules chosen without it. A combination is chosen by the lowest mean,
over the other studies, of each study's median |error| (every publication weighs the same: a rule that only
changes the few studies on TCP is judged on them, not drowned by the many runs it leaves alone), then by the
most ratio directions right there."""

import statistics
from fractions import Fraction

from ringexp.plan import rules, scoring


class Fit:
    """A combination's rows by study, and what choosing a combination weighs of each study, computed once: its
    median |error| (none where no run of it is scored) and its ratio directions right (a ratio's baseline is a run
    of its own case, so of its own study), with their totals. Leaving a study out is then a subtraction: choosing
    for every study is linear in the studies (scoring the others again for each was quadratic)."""

    def __init__(self, rows: list):
        self.rows = {}
        for r in rows:
            self.rows.setdefault(r["study"], []).append(r)
        self.median = {s: statistics.median(e) for s, rs in self.rows.items()
                       if (e := [abs(r["error"]) for r in rs if not r["input"]])}
        self.right = {s: sum(x["right"] for x in scoring.ratios(rs)) for s, rs in self.rows.items()}
        # the exact sum, so that the mean below is the very float statistics.mean gives (a tie stays a tie)
        self.total = sum(map(Fraction, self.median.values()), Fraction(0))
        self.rights = sum(self.right.values())

    def scored(self, without=None) -> tuple:
        """What choosing maximises without study `without`: -(the mean over the other studies of each study's
        median |error|), so that every publication weighs the same whatever its number of runs, then their
        ratio directions right."""
        total, n = self.total, len(self.median)
        if without in self.median:
            total, n = total - Fraction(self.median[without]), n - 1
        spread = float(total / n) if n else 0.0
        return -round(spread, 9), self.rights - self.right.get(without, 0)  # (equal to 1e-9: a tie)


def scored(rows: list) -> tuple:
    """Fit.scored of every study of `rows`."""
    return Fit(rows).scored()


def held_out(by_combination: list) -> dict:
    """{study: (the combination chosen without it, its rows under that combination)} from `by_combination`:
    [(combination, every case's rows under it)], the model's own first (which wins a tie). A file of one study
    gives {}."""
    studies = list(dict.fromkeys(r["study"] for r in by_combination[0][1]))
    if len(studies) < 2:
        return {}
    fits = [Fit(rows) for _, rows in by_combination]
    out = {}
    for study in studies:
        best = max(range(len(fits)), key=lambda i: fits[i].scored(without=study))
        out[study] = (by_combination[best][0], fits[best].rows[study])
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
    inside = Fit(own).median
    for study, (combination, rows) in got.items():
        errors = sorted(abs(r["error"]) for r in rows if not r["input"])
        rats = scoring.ratios(rows)
        lines.append(f"| {study} | {len(errors)} | {median([inside[study]] if study in inside else [])} | "
                     f"{median(errors)} | "
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
