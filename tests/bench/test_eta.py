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


def test_a_study_replans_its_cases_when_it_starts():
    """A study whose grid counted none of its cases before its datasets were built (the
    peers study builds its sets when it starts) is told its cases as it starts: the estimate
    then counts them, not "0 cases to run, about 0 s left" while they run."""
    eta = StudyEta({"formats": ["f1"], "peers": []}, {("peers", "p1"): 4.0})
    eta.done("formats", "f1", 2.0)
    assert eta.text() == "0 cases to run, about 0 s left"
    eta.plan("peers", ["p1", "p2", "p3"])
    assert eta.remaining == {("peers", "p1"), ("peers", "p2"), ("peers", "p3")}
    eta.done("peers", "p1", 4.0)
    eta.plan("peers", ["p1", "p2", "p3"])  # planned again: a finished case stays finished
    assert eta.text() == "2 cases to run, about 8 s left"


def test_before_its_sets_exist_a_study_counts_the_cases_the_reference_ran(tmp_path):
    """The peers study's grid cannot be planned before its cut sets are built: the estimate
    takes the cases the committed reference measured for it instead of none."""
    from pathlib import Path

    from storebench.study import run_estimate

    reference = Path(__file__).resolve().parents[2] / "results" / "reference"
    expected = {key for key in expected_case_seconds(reference, "small") if key[0] == "peers"}
    assert expected
    empty = tmp_path / "data"
    empty.mkdir()
    eta = run_estimate(["peers"], "small", empty, None, tmp_path / "results", "small")
    assert eta.remaining == expected


def test_run_study_tells_its_planned_cases_before_running_any(tmp_path, ci_data_root):
    """``on_planned`` hears the grid's cases not yet in the results file, before any runs."""
    from storebench.study import planned_cases, run_study

    class Planned(Exception):
        pass

    def stop(name, case_ids):
        raise Planned(name, case_ids)

    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "ci").symlink_to(ci_data_root)
    cases = planned_cases("prefetch", "ci", ci_data_root, None)
    with ResultsWriter(tmp_path / "results" / "ci" / "prefetch.csv") as writer:
        writer.write_rows([make_row(run_id="r", study="prefetch", case_id=cases[0].case_id,
                                    repeat=-1, metric="case_seconds", value=1.0, unit="s",
                                    status="ok", profile="ci")])
    try:
        run_study("prefetch", profile="ci", data_root=tmp_path / "data",
                  results_root=tmp_path / "results", record_env=False, progress=False,
                  on_planned=stop)
    except Planned as planned:
        assert planned.args == ("prefetch", [case.case_id for case in cases[1:]])
    else:
        raise AssertionError("on_planned was not called")
    # Nothing ran: the results file holds only the row written above.
    text = (tmp_path / "results" / "ci" / "prefetch.csv").read_text()
    assert text.count("\n") == 2
