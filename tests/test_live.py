"""The notebooks' live cells, the rows behind every figure, and ``measure = True``."""

from __future__ import annotations

import pytest

from storebench.report.figures import FIGURE_ROWS_LIMIT, figure_rows, study_figures
from storebench.results import Results, stat
from storebench.studies import STUDIES
from storebench.studies.base import LiveAudit, LiveComparison
from storebench.study import REPO_ROOT, measure_study

REFERENCE = REPO_ROOT / "results" / "reference"
LIVE_STUDIES = [name for name, study in STUDIES.items() if study.live is not None]


def test_every_study_notebook_has_a_live_cell():
    # The correctness study audits properties, not rates: its cell runs an audit
    # (LiveAudit) rather than timing a ratio. Each live cell runs in the ci study's
    # notebooks, which test_notebooks checks printed both machines' numbers or verdicts.
    assert set(LIVE_STUDIES) == set(STUDIES)
    assert isinstance(STUDIES["correctness"].live, LiveAudit)
    assert all(isinstance(STUDIES[name].live, LiveComparison) for name in STUDIES
               if name != "correctness")


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
    rows = figure_rows(spec, results).table
    assert {"metric", "median", "spread", "n", "case"} <= set(rows.columns)
    assert len(rows) > 0 and (rows["n"] > 0).all()
    first = rows.iloc[0]
    case_id = first["case"].split(" (+")[0]
    found = stat(results.df, first["metric"], study="prefetch", case_id=case_id)
    assert found.count == first["n"] and str(found) == first["median"]


@pytest.fixture(scope="module")
def reference_figure_rows():
    """Every registered figure's rows from the committed reference, with and without the
    limit: {name: (shown, all)}."""
    if not REFERENCE.is_dir():
        pytest.skip("no committed reference results")
    results = Results.load(REFERENCE)
    present = set(results.df["study"])
    return {spec.name: (figure_rows(spec, results), figure_rows(spec, results, limit=None))
            for study in STUDIES.values() if study.name in present
            for spec in study_figures(study)}


@pytest.mark.timeout(600)
def test_every_figure_has_rows_and_a_short_table_says_what_it_leaves_out(
        reference_figure_rows):
    empty = [name for name, (shown, _) in reference_figure_rows.items() if len(shown) == 0]
    assert empty == []
    for name, (shown, whole) in reference_figure_rows.items():
        assert len(shown) <= FIGURE_ROWS_LIMIT, name
        assert whole.total == len(whole) == shown.total, name
        if len(whole) > FIGURE_ROWS_LIMIT:
            assert shown.note == (f"showing {FIGURE_ROWS_LIMIT} of {len(whole)}; "
                                  "figure_rows(..., limit=None) for all")
            assert shown.note in repr(shown) and shown.note in shown._repr_html_()
        else:
            assert shown.note == "" and shown.table.equals(whole.table), name


def test_each_rows_table_says_what_its_rows_hold(reference_figure_rows):
    import html

    from storebench.report.figures import MEDIAN_ROWS_CAPTION
    from storebench.studies import FigureSpec

    for study in STUDIES.values():
        for spec in study_figures(study):
            if spec.name not in reference_figure_rows:
                continue
            shown = reference_figure_rows[spec.name][0]
            caption = spec.rows_caption if spec.rows is not None else MEDIAN_ROWS_CAPTION
            assert shown.caption == caption, spec.name
            assert repr(shown).startswith(caption)
            assert shown._repr_html_().startswith(f"<p>{html.escape(caption)}")
    with pytest.raises(ValueError, match=r"^figure f: a rows table needs a rows_caption"):
        FigureSpec("f", "a figure", lambda results: None, rows=lambda results: None)


def test_figures_not_drawn_from_medians_give_what_they_draw(reference_figure_rows):
    # The verdict grids: a row per recipe (path), a column per property (scenario).
    verdicts = reference_figure_rows["correctness_properties"][1].table
    assert list(verdicts.columns) == ["recipe", "exactly once", "distinct randomness",
                                      "deterministic", "shuffled", "resume", "killed worker"]
    assert verdicts["recipe"].is_unique and set(verdicts["exactly once"]) <= {
        "pass", "fail", "error", "skipped", "not run"}
    resume = reference_figure_rows["resume_exact"][1].table
    assert list(resume.columns)[0] == "path" and "checkpoint bytes" in resume.columns
    assert "exact" in set(resume["same workers"])
    # One bar per target; one point per repeat, summarised per cache state.
    targets = reference_figure_rows["targets_met"][1].table
    assert targets["target"].is_unique and set(targets["verdict"]) <= {
        "met", "unmet", "undecided", "not measured"}
    for name in ("formats_resident_fraction", "lazy_vs_preloaded_resident_fraction"):
        resident = reference_figure_rows[name][1].table
        assert list(resident["cache"]) == ["cold", "warm"], name
        assert (resident["metric"] == "resident_fraction").all() and (resident["n"] > 0).all()
    budget = reference_figure_rows["out_of_core_budget"][1].table
    assert set(budget["held"]) <= {"yes", "no", "\u2013"} and not budget.empty


@pytest.mark.parametrize("name", ["prefetch_decoders", "prefetch_peak_memory",
                                  "formats_peak_memory"])
def test_a_figure_that_reads_more_medians_than_it_draws_lists_a_row_per_bar(
        name, reference_figure_rows):
    from matplotlib.patches import Rectangle

    spec = next(spec for study in STUDIES.values() for spec in study_figures(study)
                if spec.name == name)
    bars = [patch for ax in spec.draw(Results.load(REFERENCE)).axes for patch in ax.patches
            if isinstance(patch, Rectangle) and patch.get_width() * patch.get_height()]
    rows = reference_figure_rows[name][1]
    assert rows.total == len(bars) > 0


def test_a_live_audit_prints_each_recipes_verdicts_beside_the_reference():
    from storebench.live import AuditResult

    result = AuditResult(
        "correctness: each property's verdict, a and b (audited here in 3 s)",
        ("exactly once", "shuffled"),
        {"a": {"exactly once": "pass", "shuffled": "fail"},
         "b": {"exactly once": "pass", "shuffled": "pass"}},
        {"a": {"exactly once": "pass", "shuffled": "pass"}}, "", "a machine", 3.0)
    assert result.text.splitlines() == [
        "correctness: each property's verdict, a and b (audited here in 3 s)",
        "  a",
        "    your machine:      exactly once: pass; shuffled: fail",
        "    reference machine: exactly once: pass; shuffled: pass",
        "  b",
        "    your machine:      exactly once: pass; shuffled: pass",
        "    reference machine: not measured: no row of this recipe",
        "  reference run: a machine"]


def test_a_live_cell_in_a_notebook_a_full_study_run_executes_says_so_and_times_nothing(
        tmp_path, monkeypatch):
    from storebench.live import run_audit, run_live, run_recipes
    from storebench.study import LIVE_CELLS_ENV

    monkeypatch.setenv(LIVE_CELLS_ENV, "off")
    printed = []
    assert run_live(STUDIES["prefetch"], profile="small", data_root=tmp_path / "data",
                    results_dir=tmp_path / "results", log=printed.append) is None
    assert run_recipes(("storebench-thread-lmdb", "torch-imagefolder"), profile="small",
                       data_root=tmp_path / "data", results_dir=tmp_path / "results",
                       log=printed.append) is None
    assert run_audit(STUDIES["correctness"], profile="small", data_root=tmp_path / "data",
                     results_dir=tmp_path / "results", log=printed.append) is None
    assert printed == [
        "live: not run: a study run executed this notebook, and its rows above time the "
        "prefetch study's comparisons. Run this cell in Jupyter to time it on your machine.",
        "live: not run: a study run executed this notebook, and its rows above time the "
        "recipes. Run this cell in Jupyter to time it on your machine.",
        "live: not run: a study run executed this notebook, and its rows above audit every "
        "recipe. Run this cell in Jupyter to audit two of them on your machine."]
    assert not (tmp_path / "data").exists() and not (tmp_path / "results").exists()
