"""Top-up repeats (``storebench.topup``): which questions a round takes, how the new
repeats join their case's run, and what the ci study's top-up wrote."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from storebench.cli import main
from storebench.topup import (
    TOPUP_FILE,
    CaseCost,
    Question,
    plan_round,
    topped_up_rows,
)


def cost(case_id: str, overhead_s: float, repeat_s: float, repeats: int = 5) -> CaseCost:
    return CaseCost("demo", case_id, "r1", "small", repeats, repeats, overhead_s, repeat_s)


def test_new_repeats_continue_the_case_s_run_and_drop_its_whole_case_rows():
    rows = [
        {"run_id": "topup", "case_id": "a", "repeat": 0, "metric": "samples_per_s"},
        {"run_id": "topup", "case_id": "a", "repeat": 1, "metric": "samples_per_s"},
        {"run_id": "topup", "case_id": "a", "repeat": 1, "metric": "peak_rss_bytes"},
        {"run_id": "topup", "case_id": "a", "repeat": -1, "metric": "repeats_run"},
        {"run_id": "topup", "case_id": "a", "repeat": -1, "metric": "case_seconds"},
    ]
    assert topped_up_rows(rows, run_id="r1", first_repeat=7) == [
        {"run_id": "r1", "case_id": "a", "repeat": 7, "metric": "samples_per_s"},
        {"run_id": "r1", "case_id": "a", "repeat": 8, "metric": "samples_per_s"},
        {"run_id": "r1", "case_id": "a", "repeat": 8, "metric": "peak_rss_bytes"},
    ]


def test_a_round_takes_the_cheapest_questions_that_fit_counting_a_shared_case_once():
    a, b, c, d = cost("a", 1.0, 1.0), cost("b", 2.0, 1.0), cost("c", 10.0, 5.0), cost("d", 0, 2)
    cheap = Question("demo", "cheap", "undecided", (a, b))        # 5 + 6 = 11 s
    shares = Question("demo", "shares a", "undecided", (a, d))    # 5 + 8, a already planned
    dear = Question("demo", "dear", "undecided", (b, c))          # 6 + 30 = 36 s
    assert cheap.cost_s(4) == 11.0
    chosen = plan_round([dear, shares, cheap], budget_left_s=20.0, repeats=4)
    assert [q.question for q in chosen] == ["cheap", "shares a"]
    # 13 s: "cheap" leaves 2 s, too little for d.
    assert plan_round([dear, shares, cheap], budget_left_s=13.0, repeats=4) == [cheap]
    assert plan_round([dear], budget_left_s=35.9, repeats=4) == []


def test_topup_of_a_directory_without_a_finished_study_is_one_clear_line(tmp_path, capsys):
    assert main(["topup", str(tmp_path), "--profile", "ci"]) == 2
    err = capsys.readouterr().err
    assert err == (f"storebench topup: {tmp_path / 'timing.json'}: no such file; top up the "
                   "results of a finished storebench study\n")


def test_the_ci_study_topped_up_undecided_questions_as_more_repeats_of_their_cases(ci_study):
    """What the ci study's top-up (the ci plan's budget) guarantees on any machine: which questions
    it takes, and how many rounds, depend on the machine's noise and speed, so the test
    checks each question it took, whatever they are: the new repeats continue their case's
    run, and each question taken gained repeats. Forced to the rule's minimum
    (``STOREBENCH_REPEAT_RULE``), it takes none."""
    from storebench.bench.plan import plan_for
    from storebench.bench.stats import forced_repeat_rule

    results, _ = ci_study
    timing = json.loads((results / "timing.json").read_text())
    assert "topup" in timing["stage_seconds"]
    record = json.loads((results / TOPUP_FILE).read_text())
    assert record["budget_s"] == plan_for("ci").topup_budget_s > 0
    forcing = forced_repeat_rule()
    if forcing == "minimum":
        assert record["questions"] == []
    else:
        # Three repeats a side decide no question: the budget takes the cheapest at least.
        assert record["questions"]
    for entry in record["questions"]:
        if forcing != "maximum":  # forced to the maximum, decided questions are taken too
            assert entry["before"]["verdict"] == "undecided"
        assert entry["after"]["verdict"] in ("better", "equivalent", "undecided")
        assert sum(entry["repeats_added"].values()) > 0, entry["question"]
        df = pd.read_csv(results / f"{entry['study']}.csv")
        for case_id, added in entry["repeats_added"].items():
            first_pass = df[(df["case_id"] == case_id) & (df["metric"] == "repeats_run")]
            rows = df[(df["case_id"] == case_id) & (df["repeat"] >= 0)]
            assert rows["run_id"].nunique() == 1, case_id
            for metric, group in rows.groupby("metric"):
                repeats = sorted(group["repeat"])
                assert repeats == list(range(len(repeats))), (case_id, metric)
            # The top-up's repeats follow the first pass's (one whole-case row).
            assert rows["repeat"].max() + 1 >= first_pass["value"].iloc[0] + added, case_id


@pytest.mark.parametrize("budget", ["-1", "nan"])
def test_a_negative_or_missing_top_up_budget_is_refused(budget):
    from storebench.bench.plan import StudyPlan

    with pytest.raises(ValueError, match="topup_budget_s must be >= 0"):
        StudyPlan(topup_budget_s=float(budget))


def test_the_floor_takes_every_top_two_case_to_the_decision_repeats_and_no_other(
        ci_study, tmp_path):
    """The floor (``decision_repeats``) on a copy of the ci study's gpu_feed results cut to
    each case's first 3 timed repeats (the ci plan's fixed count; the study's own top-up may
    have added more, as many as the machine's noise and speed led it to): each case behind
    a question's best and runner-up is taken to 5, outside the budget (0 here), as more
    repeats of its own run; no other case gains any. The floor repeats until no top two falls
    short, and which cases are the top two depends on what was measured, so the test checks
    what holds whichever they are."""
    import shutil

    from storebench.report.guide import decision_guide
    from storebench.results import Results
    from storebench.study import data_dir_for, study_data_dir
    from storebench.topup import row_cases, top_up

    results, _ = ci_study
    copy = tmp_path / "results"
    copy.mkdir()
    shutil.copy(results / "gpu_feed.csv", copy / "gpu_feed.csv")
    first_pass = pd.read_csv(copy / "gpu_feed.csv")
    first_pass[first_pass["repeat"] < 3].to_csv(copy / "gpu_feed.csv", index=False)
    data_dir = data_dir_for("ci", results.parent.parent / "data")

    def top_two(directory):
        rows = [row for row in decision_guide(Results.load(directory))
                if row.study == "gpu_feed" and row.runner_up is not None]
        assert rows, "the ci study's gpu_feed results answer a guide question"
        return {case_id for row in rows for _, case_id in row_cases(row)}

    def timed_repeats(directory):
        df = pd.read_csv(directory / "gpu_feed.csv")
        timed = df[(df["repeat"] >= 0) & (df["status"] == "ok")]
        return timed.groupby("case_id")["repeat"].apply(lambda r: sorted(set(r))).to_dict()

    before = timed_repeats(copy)
    assert set(map(len, before.values())) == {3}
    record = top_up(copy, profile="ci", budget_s=0.0, studies=["gpu_feed"],
                    data_dir_of=lambda name: study_data_dir(name, "ci", data_dir),
                    decision_repeats=5)
    after = timed_repeats(copy)
    floored = {entry["case_id"] for entry in record.floor}
    assert floored >= top_two(copy) and floored
    for case_id, repeats in after.items():
        assert repeats == list(range(5 if case_id in floored else 3)), case_id
    assert all(entry["repeats_before"] == 3 and entry["repeats_added"] == 2
               for entry in record.floor)
    assert record.case_seconds == 0.0 < record.floor_case_seconds
    assert record.questions == {}
    written = json.loads((copy / TOPUP_FILE).read_text())
    assert written["decision_repeats"] == 5
    assert {entry["case_id"] for entry in written["floor"]} == floored


def test_a_study_s_top_up_takes_its_plan_s_floor(monkeypatch, tmp_path):
    """``storebench study`` and ``storebench topup`` top up through ``top_up_results``: the
    default plan's floor (5) reaches ``top_up``; ci's is none."""
    from storebench import study, topup

    seen = []
    monkeypatch.setattr(topup, "top_up", lambda *args, **kwargs: seen.append(kwargs))
    for profile in ("small", "ci"):
        study.top_up_results(tmp_path, profile=profile, data_dir_of=lambda name: tmp_path,
                             budget_s=1.0)
    assert [kwargs["decision_repeats"] for kwargs in seen] == [5, None]


def test_the_top_up_never_repeats_a_build_so_its_row_keeps_n_1(ci_study, tmp_path,
                                                               monkeypatch):
    """A build is timed once, when it ran; its case reads the time from the manifest. Forced
    to take every question (``STOREBENCH_REPEAT_RULE=maximum``) with the floor on, the
    top-up on a copy of the ci study's formats results still leaves every build row at one
    repeat, so "Fastest to build" reads n = 1 a side and stays undecided."""
    import shutil

    from storebench.report.guide import decision_guide
    from storebench.results import Results
    from storebench.study import data_dir_for, study_data_dir
    from storebench.topup import top_up

    results, _ = ci_study
    copy = tmp_path / "results"
    copy.mkdir()
    shutil.copy(results / "formats.csv", copy / "formats.csv")
    data_dir = data_dir_for("ci", results.parent.parent / "data")

    def build_repeats(directory):
        df = pd.read_csv(directory / "formats.csv")
        builds = df[df["case_id"].str.startswith("build_cost:") & (df["repeat"] >= 0)]
        return builds.groupby("case_id")["repeat"].apply(lambda r: sorted(set(r))).to_dict()

    def fastest_build(directory):
        rows = [row for row in decision_guide(Results.load(directory))
                if row.question == "Fastest to build, raw arrays"]
        assert len(rows) == 1 and rows[0].runner_up is not None
        return rows[0]

    before = build_repeats(copy)
    assert len(before) >= 2 and set(map(tuple, before.values())) == {(0,)}
    row = fastest_build(copy)
    assert all(c.stat.count == 1 for c in row.candidates)
    monkeypatch.setenv("STOREBENCH_REPEAT_RULE", "maximum")
    record = top_up(copy, profile="ci", budget_s=0.0, studies=["formats"],
                    data_dir_of=lambda name: study_data_dir(name, "ci", data_dir),
                    decision_repeats=5)
    assert build_repeats(copy) == before
    touched = {entry["case_id"] for entry in record.floor} | {
        case_id for entry in record.questions.values() for case_id in entry["repeats_added"]}
    assert not {case_id for case_id in touched if case_id.startswith("build_cost:")}
    row = fastest_build(copy)
    assert row.verdict == "undecided"
    assert [c.stat.count for c in row.candidates[:2]] == [1, 1]
