"""The notebooks' live cells, the rows behind every figure, and ``measure = True``."""

from __future__ import annotations

import pytest

from storebench.report.figures import figure_rows
from storebench.results import Results, stat
from storebench.studies import STUDIES
from storebench.study import REPO_ROOT, measure_study

REFERENCE = REPO_ROOT / "results" / "reference"
LIVE_STUDIES = [name for name, study in STUDIES.items() if study.live is not None]


def test_every_study_notebook_but_one_has_a_live_comparison():
    # The correctness study audits properties, not rates: it has no ratio to time. Each
    # live cell runs in the ci study's notebooks, which test_notebooks checks printed both
    # machines' numbers.
    assert set(STUDIES) - set(LIVE_STUDIES) <= {"correctness"}


def test_measure_never_asks_when_headless(tmp_path, monkeypatch, capsys):
    """papermill and nbclient take no input: the plan is printed, then the study runs."""
    monkeypatch.delenv("STOREBENCH_HEADLESS", raising=False)
    ran = []

    def never(prompt):
        raise AssertionError("asked while headless")

    out = measure_study("prefetch", profile="ci", data_root=tmp_path / "data",
                        results_dir=tmp_path / "results" / "reference", ask=never,
                        run=lambda name, **options: ran.append((name, options)))
    printed = capsys.readouterr().out
    assert "measure = True runs the prefetch study" in printed and "cases to run" in printed
    assert [name for name, _ in ran] == ["prefetch"]
    assert out == tmp_path / "results" / "ci"


def test_measure_asks_first_when_interactive_and_a_no_runs_nothing(tmp_path, capsys):
    ran = []
    out = measure_study("prefetch", profile="ci", data_root=tmp_path / "data",
                        results_dir=tmp_path / "results" / "reference", ask=lambda p: "n",
                        run=lambda name, **options: ran.append(name), interactive=True)
    assert ran == [] and out == tmp_path / "results" / "reference"
    assert "Not measured" in capsys.readouterr().out


@pytest.mark.skipif(not REFERENCE.is_dir(), reason="no committed reference results")
def test_figure_rows_are_the_medians_the_figure_draws():
    results = Results.load(REFERENCE)
    spec = next(s for s in STUDIES["prefetch"].figures if s.name == "prefetch_paths")
    rows = figure_rows(spec, results)
    assert {"metric", "median", "spread", "n", "case"} <= set(rows.columns)
    assert len(rows) > 0 and (rows["n"] > 0).all()
    first = rows.iloc[0]
    case_id = first["case"].split(" (+")[0]
    found = stat(results.df, first["metric"], study="prefetch", case_id=case_id)
    assert found.count == first["n"] and str(found) == first["median"]


def test_a_live_cell_in_a_notebook_a_full_study_run_executes_says_so_and_times_nothing(
        tmp_path, monkeypatch):
    from storebench.live import run_live, run_recipes
    from storebench.study import LIVE_CELLS_ENV

    monkeypatch.setenv(LIVE_CELLS_ENV, "off")
    printed = []
    assert run_live(STUDIES["prefetch"], profile="small", data_root=tmp_path / "data",
                    results_dir=tmp_path / "results", log=printed.append) is None
    assert run_recipes(("storebench-thread-lmdb", "torch-imagefolder"), profile="small",
                       data_root=tmp_path / "data", results_dir=tmp_path / "results",
                       log=printed.append) is None
    assert printed == [
        "live: not run: a study run executed this notebook, and its rows above time the "
        "prefetch study's comparisons. Run this cell in Jupyter to time it on your machine.",
        "live: not run: a study run executed this notebook, and its rows above time the "
        "recipes. Run this cell in Jupyter to time it on your machine."]
    assert not (tmp_path / "data").exists() and not (tmp_path / "results").exists()
