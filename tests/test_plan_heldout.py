"""The planner scored out of sample: leave-one-source-out chooses every rule chosen on the published cases again
without the study it scores (ringexp/plan/heldout.py, rules.py), and the cases file's studies and sources that
would defeat it are refused."""

import copy
import json
import sys

import pytest
from conftest import plan_refusal, published_cases

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


def test_every_combination_of_the_rules_changes_the_cluster_as_it_says():
    combos = rules.combinations()
    assert combos[0] == {rule: next(iter(alts)) for rule, alts in rules.RULES.items()}
    assert len(combos) == len({tuple(c.values()) for c in combos}) == 2 ** len(rules.RULES)
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
