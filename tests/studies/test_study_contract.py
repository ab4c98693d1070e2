"""The study contract, for every study of ``STUDIES``: its ci grid runs (in the ci study that
``make study`` would run), every figure draws from its ci results, every finding and guide row
renders, and it has its notebook."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from matplotlib.figure import Figure

from storebench.bench.schema import read_results
from storebench.guide import GuideRow
from storebench.report.figures import study_figures
from storebench.results import Results
from storebench.studies import STUDIES, Study, get_study
from storebench.study import NOTEBOOKS_DIR


@pytest.fixture(scope="module")
def ci_results(ci_study) -> Results:
    return Results.load(ci_study[0])


@pytest.mark.parametrize("name", list(STUDIES))
def test_its_ci_grid_ran_without_failures(name, ci_study):
    rows = read_results(ci_study[0] / f"{name}.csv")
    assert set(rows["study"]) == {name}
    assert (rows["status"] == "ok").any(), name
    failed = rows[~rows["status"].isin(["ok", "skipped"])]
    assert failed.empty, failed[["case_id", "error"]].to_dict("records")


@pytest.mark.parametrize("name", list(STUDIES))
def test_every_figure_draws_from_its_ci_results(name, ci_results):
    study = STUDIES[name]
    assert study.figures, f"{name} has no figure"
    for spec in study_figures(study):
        fig = spec.draw(ci_results)
        assert isinstance(fig, Figure), spec.name
        texts = [t.get_text() for ax in fig.axes for t in ax.texts]
        assert not any(t.startswith("no ") for t in texts), f"{spec.name} drew nothing: {texts}"


@pytest.mark.parametrize("name", list(STUDIES))
def test_every_finding_and_guide_row_renders(name, ci_results):
    study = STUDIES[name]
    sentences = study.findings(ci_results)
    assert sentences and all(isinstance(s, str) and s for s in sentences), name
    assert not any("nan" in s.split() for s in sentences), sentences
    rows = study.guide(ci_results)
    assert all(isinstance(row, GuideRow) for row in rows)
    for row in rows:
        assert row.choice and row.evidence
        json.dumps(row.to_dict())


@pytest.mark.parametrize("name", list(STUDIES))
def test_it_is_one_registered_folder_with_a_notebook(name):
    study = STUDIES[name]
    assert isinstance(study, Study) and study.name == name
    assert (NOTEBOOKS_DIR / study.notebook).is_file(), study.notebook
    # Its grid and findings come from its own folder (``study``, or the module of that
    # job: ``grid``, ``report``); its case functions from the folder's cases module.
    for job in (study.grid, study.findings):
        assert job.__module__.startswith(f"storebench.studies.{name}."), job.__module__
    folder = Path(sys.modules[f"storebench.studies.{name}.study"].__file__).parent
    assert (folder / "cases.py").is_file() and (folder / "study.py").is_file()
    names = [spec.name for spec in study_figures(study)]
    assert len(names) == len(set(names))


def test_unknown_study_names_the_known_ones():
    with pytest.raises(KeyError, match="known studies: \\['formats'"):
        get_study("nope")


def test_figure_names_are_unique_across_studies():
    names = [spec.name for study in STUDIES.values() for spec in study_figures(study)]
    assert len(names) == len(set(names))
