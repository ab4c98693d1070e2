"""``storebench study --quick``: the cases behind the answer table, and a run of them."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from storebench.report.advise import advise, guide_rows
from storebench.report.answer import ANSWER_SITUATIONS, situation_for
from storebench.report.quick import QuickCase, quick_cases
from storebench.results import Results
from storebench.study import REPO_ROOT

REFERENCE = REPO_ROOT / "results" / "reference"


@pytest.fixture(scope="module")
def reference() -> Results:
    return Results.load(REFERENCE)


def _guide_row(results: Results, choice):
    """The guide row an advice's choice was read from (its study, question and facets)."""
    for row in guide_rows(results, choice.study):
        if row.question == choice.question and dict(row.facets) == dict(choice.facets):
            return row
    return None


def test_each_store_decision_is_measured_from_its_two_best_candidates_only(reference):
    cases = quick_cases(reference)
    chosen = {(c.study, c.case_id) for c in cases}
    checked = 0
    for situation in ANSWER_SITUATIONS:
        if situation.images not in set(reference.df["encoding"].dropna()):
            assert not [c for c in cases if any(d.startswith(situation.text)
                                                 for d in c.decisions)]
            continue
        advice = advise(situation_for(situation, reference), reference)
        row = _guide_row(reference, advice.store)
        assert row is not None, situation.text
        top_two = {(s[0], s[1]) for cand in row.candidates[:2] for s in cand.stat.sources}
        rest = {(s[0], s[1]) for cand in row.candidates[2:] for s in cand.stat.sources}
        assert top_two <= chosen
        assert not (rest - top_two) & {(c.study, c.case_id) for c in cases
                                        if f"{situation.text}: store" in c.decisions}
        mine = {(c.study, c.case_id) for c in cases if f"{situation.text}: store" in c.decisions}
        assert mine == top_two
        checked += 1
    assert checked >= 4


def test_every_quick_case_names_its_reference_runs_and_dataset(reference):
    cases = quick_cases(reference)
    assert cases
    df = reference.df
    for case in cases:
        rows = df[(df["study"] == case.study) & (df["case_id"] == case.case_id)]
        assert not rows.empty, case.case_id
        assert set(case.reference_runs) == set(rows["run_id"].astype(str))
        assert case.metric in set(rows["metric"])
        assert case.dataset.startswith(f"{case.format}-{case.encoding}")
    parts = {d.rsplit(": ", 1)[1] for c in cases for d in c.decisions}
    assert {"store", "loader", "sample size"} <= parts


def test_answers_agree_by_the_candidates_they_name_not_their_order(reference):
    from storebench.report.quick import agreement, compared_answers, named

    advice = advise(situation_for(ANSWER_SITUATIONS[0], reference), reference)
    pair = named(advice.store)
    assert advice.store.label in pair
    a, b, c = frozenset({"x", "y"}), frozenset({"y", "x"}), frozenset({"y", "z"})
    assert agreement([a, frozenset()], [b, frozenset()]) == "same"
    assert agreement([a, a], [c, a]) == "overlapping"
    assert agreement([a, a], [frozenset({"z"}), a]) == "different"
    # The reference against itself: every answered row the same.
    table = compared_answers(reference, reference)
    assert set(table["answers"]) <= {"same", "not answered on both"}
    assert (table["answers"] == "same").sum() >= 4


def test_quick_refuses_the_options_of_a_full_study(capsys):
    from storebench.cli import main

    assert main(["study", "--quick", "--profile", "ci", "--repeats", "2"]) == 2
    err = capsys.readouterr().err
    assert "--quick measures the reference's own cases on its own sets" in err
    assert "--repeats" in err and "--profile" in err


def _case_ids(path: Path) -> list[str]:
    with open(path, newline="") as f:
        return [row["case_id"] for row in csv.DictReader(f)]


def test_a_quick_run_measures_only_its_cases_and_resumes(ci_study, tmp_path):
    """Against the ci study's results as the reference: two of its prefetch cases and one
    it never planned; the run measures the two (and nothing else), says which was not
    planned, writes its answer and evidence, and a second run measures nothing again."""
    from storebench.bench.plan import plan_for
    from storebench.quick_study import CASES_FILE, REPORT_FILE, run_quick_study

    results_dir, _ = ci_study
    reference = Results.load(results_dir)
    prefetch = reference.study("prefetch")
    picked = list(dict.fromkeys(prefetch["case_id"]))[:2]
    cases = []
    for case_id in picked:
        first = prefetch[prefetch["case_id"] == case_id].iloc[0]
        cases.append(QuickCase("prefetch", case_id, "samples_per_s", first["format"],
                               first["encoding"], f"{first['format']}-{first['encoding']}",
                               ("a situation: loader",), ("run-a",)))
    cases.append(QuickCase("prefetch", "loader_epoch:no-such/case", "samples_per_s", "memmap",
                           "raw", "memmap-raw", ("a situation: loader",), ("run-b",)))
    out = tmp_path / "results"
    lines = []
    times = run_quick_study(reference_dir=results_dir, data_root=results_dir.parents[1] / "data",
                            results_root=out, progress=False, log=lines.append, cases=cases)
    quick = out / "quick"
    ids = _case_ids(quick / "prefetch.csv")
    assert set(ids) == set(picked)
    repeats = plan_for("ci").decision_repeats or plan_for("ci").repeats
    rows = Results.load(quick).study("prefetch")
    for case_id in picked:
        ok = rows[(rows["case_id"] == case_id) & (rows["metric"] == "samples_per_s")
                  & (rows["status"] == "ok")]
        assert ok["repeat"].nunique() >= repeats
    assert "loader_epoch:no-such/case" in times.skipped_studies["prefetch"]
    timing = json.loads((quick / "timing.json").read_text())
    assert list(timing["stage_seconds"]) == ["build", "environment", "study:prefetch", "report"]
    assert timing["ran_cases"] == {"prefetch": 2}
    report = (quick / REPORT_FILE).read_text()
    for case_id in picked:
        assert case_id in report
    assert "run-a" in report
    recorded = json.loads((quick / CASES_FILE).read_text())
    assert [c["case_id"] for c in recorded] == [c.case_id for c in cases]
    assert "not measured, prefetch" in "\n".join(lines)

    again = run_quick_study(reference_dir=results_dir, data_root=results_dir.parents[1] / "data",
                            results_root=out, progress=False, log=lines.append, cases=cases)
    assert again.ran_cases == {"prefetch": 0}
    assert again.reused_cases == {"prefetch": 2}
    assert _case_ids(quick / "prefetch.csv") == ids


@pytest.mark.timeout(300)
def test_the_build_makes_only_the_sets_its_cases_read(tmp_path):
    """A peers case over LMDB: its study's own sets in that format only, none of the other
    peer formats the peers study builds for a whole run."""
    from storebench.bench.plan import peer_sets_dir
    from storebench.environments import EnvironmentUnavailableError, python_for
    from storebench.quick_study import _build
    from storebench.study import data_dir_for, study_data_dir

    try:
        python_for("peers")
    except EnvironmentUnavailableError as err:
        pytest.skip(str(err))
    data_dir = data_dir_for("ci", tmp_path / "data")
    case = QuickCase("peers", "peer_epochs:lmdb-jpeg/x", "later_epochs_samples_per_s", "lmdb",
                     "jpeg", "lmdb-jpeg")
    _build("ci", data_dir, [case], progress=False)
    built = sorted(p.name for p in peer_sets_dir(study_data_dir("peers", "ci", data_dir))
                   .iterdir() if (p / "manifest.json").exists())
    assert built == ["lmdb-jpeg", "lmdb-raw"]
