"""The remaining-time estimate a study run prints."""

from __future__ import annotations

import math

from storebench.bench.eta import StudyEta, expected_case_seconds
from storebench.bench.schema import ResultsWriter, make_row


def test_expected_times_scale_with_this_runs_pace():
    expected = {("a", "x"): 10.0, ("a", "y"): 20.0, ("b", "z"): 30.0}
    eta = StudyEta({"a": ["x", "y"], "b": ["z"]}, expected)
    assert eta.seconds_left() == 60.0
    eta.done("a", "x", 5.0)  # this run goes twice as fast as expected
    assert eta.seconds_left() == (20.0 + 30.0) / 2
    assert eta.text() == "2 cases to run, about 25 s left"


def test_cases_without_an_expectation_take_the_mean_of_their_study():
    eta = StudyEta({"a": ["x", "y", "w"], "b": ["z"]})
    assert math.isnan(eta.seconds_left())
    assert eta.text() == "4 cases to run"
    eta.done("a", "x", 120.0)
    assert eta.seconds_left() == 120.0 * 3  # y, w from study a; z from every study
    assert eta.text() == "3 cases to run, about 6 min left"


def test_expected_case_seconds_reads_ok_rows_of_the_profile(tmp_path):
    rows = [
        make_row(run_id="r", study="formats", case_id="c1", repeat=-1, metric="case_seconds",
                 value=4.0, unit="s", status="ok", profile="small"),
        make_row(run_id="r", study="formats", case_id="c2", repeat=-1, metric="case_seconds",
                 value=9.0, unit="s", status="failed", error="boom", profile="small"),
        make_row(run_id="r", study="formats", case_id="c3", repeat=-1, metric="case_seconds",
                 value=1.0, unit="s", status="ok", profile="ci"),
    ]
    with ResultsWriter(tmp_path / "formats.csv") as writer:
        writer.write_rows(rows)
    assert expected_case_seconds(tmp_path, "small") == {("formats", "c1"): 4.0}
    assert expected_case_seconds(tmp_path / "missing", "small") == {}


def test_a_fresh_run_plans_the_cases_its_results_directory_already_holds(tmp_path,
                                                                          ci_data_root):
    """``storebench study --fresh`` discards each study's earlier rows before running it, so
    its estimate counts them to run (it printed "0 cases to run, about 0 s left" throughout);
    a resumed run skips them. Their earlier times are the expectation either way."""
    from storebench.study import planned_cases, run_estimate

    cases = planned_cases("prefetch", "ci", ci_data_root, None)
    finished = cases[0].case_id
    with ResultsWriter(tmp_path / "prefetch.csv") as writer:
        writer.write_rows([make_row(run_id="r", study="prefetch", case_id=finished, repeat=-1,
                                    metric="case_seconds", value=7.0, unit="s", status="ok",
                                    profile="ci")])
    fresh = run_estimate(["prefetch"], "ci", ci_data_root, None, tmp_path, "ci", resume=False)
    resumed = run_estimate(["prefetch"], "ci", ci_data_root, None, tmp_path, "ci")
    assert fresh.remaining == {("prefetch", case.case_id) for case in cases}
    assert resumed.remaining == fresh.remaining - {("prefetch", finished)}
    assert fresh.expected[("prefetch", finished)] == 7.0
