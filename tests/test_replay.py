"""python -m studies.tune_replay: the seconds an order of candidates spends before it has tried the best equivalent,
on small sweeps whose answer is known by hand, and the sweep of docs/results/tune-story.md as transcribed."""

import importlib
from collections import Counter

import numpy as np
import pytest

from studies import tune_replay as replay


def row(name: str, wall_s: float, verdict: str = "worse", whole_s: float = 10.0, auroc: float = 0.9) -> dict:
    return {"candidate": name, "wall_s": wall_s, "verdict": verdict, "whole_s": whole_s, "final_auroc": auroc}


def test_a_fixed_order_costs_the_prefix_sum_up_to_the_best():
    rows = [row("a", 30, whole_s=500), row("b", 7, "equivalent", 20), row("c", 11, "equivalent", 90),
            row("d", 50, "better", 40)]
    target = replay.best(rows)
    assert target["candidate"] == "c"  # the fastest equivalent or better, not the fastest ("a" is worse)
    assert replay.time_to(rows, target) == (48.0, 3)  # 30 + 7 + 11, the best's own run included
    assert replay.time_to([rows[2], *rows[:2]], target) == (11.0, 1)
    assert replay.time_to(rows[:2], target) == (float("inf"), 2)  # an order that left it out never reaches it
    assert not replay.first_is_best(rows, target)  # "b" is the first equivalent there
    assert replay.first_is_best([rows[0], rows[2], rows[1]], target)


def test_random_order_has_the_exact_distribution_of_three_candidates():
    # the best costs 1 and comes first, second or third with chance 1/3 each; second behind "x" or "y" alike
    rows = [row("best", 1, "equivalent", 50), row("x", 10, "equivalent", 20), row("y", 100)]
    runs = replay.shuffles(rows, rows[0], n=2000, seed=3)
    freq = Counter(s for s, _, _ in runs)
    assert set(freq) == {1.0, 11.0, 101.0, 111.0}
    for value, p in {1.0: 1 / 3, 11.0: 1 / 6, 101.0: 1 / 6, 111.0: 1 / 3}.items():
        assert abs(freq[value] / len(runs) - p) < 0.04, (value, freq)
    secs = [s for s, _, _ in runs]
    assert abs(np.mean(secs) - (1 + (10 + 100) / 2)) < 4  # exactly 56: the best plus half of every other
    assert np.percentile(secs, 10) == 1.0 and np.percentile(secs, 90) == 111.0
    # "x" is equivalent too: the first equivalent tried is the best exactly when the best comes before "x"
    assert abs(sum(f for _, _, f in runs) / len(runs) - 1 / 2) < 0.04


def test_an_optuna_study_pays_once_per_candidate_and_nothing_for_no_candidate():
    pytest.importorskip("optuna")
    rows = [row("fast but worse", 5, whole_s=900), row("slow", 40, "equivalent", 10), row("best", 3, "equivalent", 30)]
    by_name = {r["candidate"]: r for r in rows}
    for seed in range(5):
        secs, trials, _ = replay.study(rows, rows[2], seed, {"candidate": sorted(by_name)},
                                       lambda p: by_name[p["candidate"]])
        assert trials <= 3 and secs in (3, 8, 43, 48)  # each candidate's run at most once, however often asked
    # a combination that is no candidate (None) is known before any run: it costs nothing
    grid = {("p", "k"): rows[2]}
    secs, trials, first = replay.study(rows, rows[2], 0, {"preset": ["p", "q"], "knob": ["k", "none"]},
                                       lambda p: grid.get((p["preset"], p["knob"])))
    assert (secs, trials, first) == (3, 1, True)


def test_the_transcribed_sweep_is_the_story_table():
    sweep = replay.load(replay.SWEEP)
    rows = sweep["rows"]
    assert len(rows) == 22 and len({r["candidate"] for r in rows}) == 22
    assert replay.best(rows)["candidate"] == "+parallel=hierarchical_int8"
    # tune-story.md: 3977 s of runs for the candidates and the baseline (342 s), each row rounded to the second
    assert abs(sum(r["wall_s"] for r in rows) + 342 - 3977) <= 12


@pytest.mark.slow
def test_the_planner_ranking_is_the_tune_space_over_the_sweep():
    """About 16 s on 2 cores: the tune's space composed (every preset and knob) and one rank's compute measured."""
    sweep = replay.load(replay.SWEEP)
    plan = replay.planner(sweep["task"], sweep["rows"])
    tried = [r["candidate"] for _, r in plan["order"]]
    pruned = [r["candidate"] for _, r, _ in plan["left_out"]]
    assert sorted(tried + pruned) == sorted(r["candidate"] for r in sweep["rows"])  # 22, each row once
    assert sorted(pruned) == ["+parallel=fsdp", "+parallel=fsdp accumulation.steps=4"]
    # tune-story.md's replay section: HEAD's ranking puts hierarchical_int8 9th of 20
    assert len(tried) == 20 and tried.index("+parallel=hierarchical_int8") == 8
    assert plan["names"]["+parallel=ddp accumulation=x4"] == "ddp accumulation.steps=4"


@pytest.mark.parametrize("module, args, says", [
    ("studies.tune_replay", ["{tmp}/missing.json"], "cannot replay it"),
    ("studies.tune_replay", ["{tmp}/list.json"], "cannot replay it"),
    ("studies.tune_story", [], "usage: python -m studies.tune_story OUT"),
])
def test_a_study_given_what_it_cannot_read_says_so_in_one_line(tmp_path, capsys, module, args, says):
    """The studies' own entries (run from the root): a missing or malformed sweep, or no directory, is ringexp's
    one line and exit 2, not a traceback."""
    (tmp_path / "list.json").write_text("[1, 2]")
    study = importlib.import_module(module)
    assert study.main([a.format(tmp=tmp_path) for a in args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("ringexp: error: ") and says in err, err
