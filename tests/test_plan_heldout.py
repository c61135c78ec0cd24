"""The planner scored out of sample: leave-one-source-out chooses every rule chosen on the published cases again
without the study it scores (ringexp/plan/heldout.py, rules.py), and the cases file's studies and sources that
would defeat it are refused."""

import copy
import json
import math
import random
import statistics
import sys
import time

import pytest
from helpers.processes import plan_refusal
from helpers.runs import published_cases

from ringexp.plan import heldout, rules
from ringexp.plan.cli import main

OWN, OTHER = {"rule": "the model's"}, {"rule": "another"}


def rows(errors: dict) -> list:
    """One step_s run per study at each |error| given, {study: [error, ...]}; no baselines."""
    return [{"case": f"case {s}", "study": s, "run": f"run {i}", "unit": "step_s", "measured": 1.0,
             "predicted": 1.0 + e, "error": e, "input": False, "baseline": None}
            for s, es in errors.items() for i, e in enumerate(es)]


def test_a_study_is_predicted_under_the_rules_chosen_on_the_other_studies():
    """Study a fits the other rule best, b and c the model's: held out, a gets what b and c choose (the model's,
    so its own best fit is not used), b and c what the rest choose."""
    by = [(OWN, rows({"a": [0.30], "b": [0.05], "c": [0.05]})), (OTHER, rows({"a": [0.01], "b": [0.20], "c": [0.04]}))]
    got = heldout.held_out(by)
    assert got["a"][0] == OWN and [r["error"] for r in got["a"][1]] == [0.30]
    assert got["b"][0] == OTHER and [r["error"] for r in got["b"][1]] == [0.20]
    assert got["c"][0] == OTHER and [r["error"] for r in got["c"][1]] == [0.04]
    assert heldout.held_out([(OWN, rows({"a": [0.1, 0.2]}))]) == {}  # one study: nothing to choose on


def test_every_study_weighs_the_same_whatever_its_number_of_runs():
    """Study b's nine runs are a little better under the other rule, c's two runs much better under the model's:
    held out, a gets the model's (mean of b's and c's medians), though most runs are b's."""
    by = [(OWN, rows({"a": [0.1], "b": [0.06] * 9, "c": [0.02, 0.02]})),
          (OTHER, rows({"a": [0.1], "b": [0.05] * 9, "c": [0.30, 0.30]}))]
    assert heldout.held_out(by)["a"][0] == OWN


def test_ratio_directions_decide_between_equal_errors():
    """Two combinations equally far off: the one that sees a variant slower than its baseline, as measured, is
    chosen."""
    def pair(study, variant_predicted):
        base = {"case": "c", "study": study, "run": "base", "unit": "step_s", "measured": 1.0, "predicted": 1.1,
                "error": 0.1, "input": False, "baseline": None}
        return [base, dict(base, run="variant", measured=1.2, predicted=variant_predicted,
                           error=variant_predicted / 1.2 - 1, baseline="base")]
    by = [(OWN, pair("b", 1.08) + pair("a", 1.08)), (OTHER, pair("b", 1.32) + pair("a", 1.32))]
    assert heldout.scored(by[0][1])[0] == pytest.approx(heldout.scored(by[1][1])[0])  # the same errors: 10%
    assert heldout.held_out(by)["a"][0] == OTHER  # 1.32 / 1.1 > 1, as measured; 1.08 / 1.1 < 1 is not


def test_each_study_s_choice_is_the_one_rescoring_the_other_studies_gives():
    """Held_out derives every study's choice from each study's median and directions computed once; it must choose
    what scoring the other studies' rows afresh (the definition, written out here) chooses, ties included."""
    rng = random.Random(53)

    def study_rows(s, scale):
        base = {"case": f"case {s}", "study": s, "run": "base", "unit": "step_s", "measured": 1.0,
                "input": s == "s0", "baseline": None}  # (s0: no run scored, its ratios still are)
        runs = [dict(base, run=f"r{i}", measured=rng.uniform(0.5, 2), baseline="base") for i in range(3)]
        for r in [base, *runs]:
            r["predicted"] = r["measured"] * (1 + scale * rng.uniform(-0.3, 0.3))
            r["error"] = r["predicted"] / r["measured"] - 1
        return [base, *runs]

    by = [({"rule": c}, [r for s in range(9) for r in study_rows(f"s{s}", rng.choice((0.5, 1, 2)))])
          for c in range(6)]
    by.append(({"rule": "a tie"}, by[2][1]))  # the same rows as combination 2: the first of equals is chosen

    def definition(rows, study):
        others = [r for r in rows if r["study"] != study]
        medians = [statistics.median(e) for s in {r["study"] for r in others}
                   if (e := [abs(r["error"]) for r in others if r["study"] == s and not r["input"]])]
        base = {r["case"]: r for r in others if r["baseline"] is None}
        right = sum((r["measured"] / base[r["case"]]["measured"] > 1) ==
                    (r["predicted"] / base[r["case"]]["predicted"] > 1) for r in others if r["baseline"])
        return -round(statistics.mean(medians), 9), right

    got = heldout.held_out(by)
    for study in got:
        want = max(by, key=lambda cr: definition(cr[1], study))
        assert got[study][0] == want[0] and got[study][1] == [r for r in want[1] if r["study"] == study], study


def test_choosing_without_each_study_is_linear_in_the_studies():
    """1,000 studies took 190 s: each study's choice scored every other study again under every combination
    (600 studies: 14 s). Now each study is scored once per combination: 600 studies in well under a second."""
    combos = rules.combinations()
    by = [(c, rows({f"s{i}": [0.01 * (i * j % 7), 0.02] for i in range(600)})) for j, c in enumerate(combos)]
    start = time.perf_counter()
    got = heldout.held_out(by)
    lines = heldout.report(by[0][1], got)
    assert time.perf_counter() - start < 5
    assert len(got) == 600 and len(lines) == 600 + 6


def test_every_combination_of_the_rules_changes_the_cluster_as_it_says():
    combos = rules.combinations()
    assert combos[0] == {rule: next(iter(alts)) for rule, alts in rules.RULES.items()}
    assert len(combos) == len({tuple(c.values()) for c in combos}) == math.prod(map(len, rules.RULES.values()))
    assert rules.differs(combos[0]) == "" and rules.differs(combos[-1]).count(":") == len(rules.RULES)


def two_studies(tmp_path, change=lambda doc: None) -> str:
    return published_cases(tmp_path, ("ddp-bench resnet50", "rn50v1.5 dgx-a100 tf32"), change)


def test_accuracy_reports_each_study_held_out_under_the_rules_chosen_without_it(tmp_path, monkeypatch, capsys):
    path = two_studies(tmp_path)
    monkeypatch.setattr(sys, "argv", ["ringexp.plan", "accuracy", f"cases=[{path}]", f"out={tmp_path / 'acc'}"])
    main()
    out = capsys.readouterr().out
    assert "In sample: 8 published runs (not counting the 1 the compute came from)" in out
    assert "## Leave-one-source-out" in out
    assert "| pytorch-ddp-benchmark | 7 |" in out and "Held out (out of sample): 8 runs: median |error|" in out
    got = json.loads((tmp_path / "acc" / "accuracy-published.json").read_text())["held_out"]
    assert set(got) == {"pytorch-ddp-benchmark", "dle-resnet50v1.5-pytorch"}
    assert all(r["study"] == study for study, h in got.items() for r in h["runs"])
    assert all(set(h["rules"]) == set(rules.RULES) for h in got.values())


def test_a_file_of_one_study_is_scored_in_sample_only(tmp_path, monkeypatch, capsys):
    path = two_studies(tmp_path, lambda doc: [c.update(study="one") for c in doc["cases"]])
    monkeypatch.setattr(sys, "argv", ["ringexp.plan", "accuracy", f"cases=[{path}]"])
    main()
    assert "Leave-one-source-out: needs cases of two studies at least" in capsys.readouterr().out


def test_a_quote_shared_by_cases_of_different_clusters_is_refused_naming_the_field(tmp_path, monkeypatch, capsys):
    """One source on two clusters' cases would make one publication of two (or two of one): leave-one-source-out
    could not hold it out as a whole."""
    def copied(doc):
        doc["cases"][1]["source"] = doc["cases"][0]["source"]
    path = two_studies(tmp_path, copied)
    line = plan_refusal(monkeypatch, capsys, ["accuracy", f"cases=[{path}]", f"out={tmp_path / 'acc'}"])
    assert "case rn50v1.5 dgx-a100 tf32: source: the same as case 'ddp-bench resnet50'" in line, line
    assert not (tmp_path / "acc").exists()


def test_a_quote_shared_by_cases_of_different_studies_is_refused(tmp_path, monkeypatch, capsys):
    """The same quote in two studies would let a publication help choose the rules it is scored under."""
    def copied(doc):
        doc["cases"].append(copy.deepcopy(doc["cases"][0]) | {"name": "copy", "study": "another"})
    path = two_studies(tmp_path, copied)
    line = plan_refusal(monkeypatch, capsys, ["accuracy", f"cases=[{path}]"])
    assert "case copy: source: the same as case 'ddp-bench resnet50'" in line and "of study" in line, line


def test_a_case_without_its_study_is_refused(tmp_path, monkeypatch, capsys):
    path = two_studies(tmp_path, lambda doc: doc["cases"][0].pop("study"))
    line = plan_refusal(monkeypatch, capsys, ["accuracy", f"cases=[{path}]"])
    assert "case ddp-bench resnet50: study: missing" in line, line
