"""The study notebooks: committed clean, parametrised for papermill, executed end to end on
the ci profile, and every figure regenerated from the committed reference results."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from storebench.bench.envinfo import read_env
from storebench.bench.schema import read_results
from storebench.formats import knob_variants
from storebench.report.figures import study_figures
from storebench.report.recipes import RECIPES_NOTEBOOK
from storebench.studies import STUDIES
from storebench.studies.targets.cases import TARGETS
from storebench.study import NOTEBOOKS_DIR, REPO_ROOT, live_cells_env

NOTEBOOKS = sorted(NOTEBOOKS_DIR.glob("[0-9]*.ipynb"))
PARAMETERS = {"profile": "small", "results_dir": "results/reference",
              "data_root": "data", "measure": False}
REFERENCE = REPO_ROOT / "results" / "reference"
STOREBENCH = Path(sys.executable).with_name("storebench")


def test_the_notebooks_are_there_and_every_study_has_one():
    """Each study's notebook, named by its registry entry (the targets study's is the
    findings notebook, over every study), and the recipes' notebook: never listed here
    again."""
    named = {study.notebook for study in STUDIES.values()}
    assert all(named) and "05_findings.ipynb" in named
    assert sorted(p.name for p in NOTEBOOKS) == sorted(named | {RECIPES_NOTEBOOK})


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_committed_without_outputs(path):
    notebook = nbformat.read(path, as_version=4)
    nbformat.validate(notebook)
    assert notebook.metadata["kernelspec"]["name"] == "python3"
    for number, cell in enumerate(notebook.cells):
        if cell.cell_type == "code":
            assert cell.outputs == [], f"{path.name} cell {number} has outputs"
            assert cell.execution_count is None, f"{path.name} cell {number} was executed"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_has_one_parameters_cell_with_the_four_defaults(path):
    notebook = nbformat.read(path, as_version=4)
    tagged = [cell for cell in notebook.cells if "parameters" in cell.metadata.get("tags", [])]
    assert len(tagged) == 1, f"{path.name}: {len(tagged)} cells tagged 'parameters'"
    first_code = next(cell for cell in notebook.cells if cell.cell_type == "code")
    assert first_code is tagged[0], f"{path.name}: the parameters cell is not the first code cell"
    assigned = {}
    for statement in ast.parse(tagged[0].source).body:
        assert isinstance(statement, ast.Assign), f"{path.name}: parameters cell does more " \
                                                  "than assign"
        (target,) = statement.targets
        assigned[target.id] = ast.literal_eval(statement.value)
    assert assigned == PARAMETERS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_asks_its_question_and_ends_with_computed_findings(path):
    notebook = nbformat.read(path, as_version=4)
    opening = notebook.cells[0]
    assert opening.cell_type == "markdown" and opening.source.startswith("# ")
    assert "**Question:**" in opening.source
    last = notebook.cells[-1]
    assert last.cell_type == "code"
    assert "Markdown(" in last.source and "findings." in last.source


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_answers_its_question_before_any_table_or_figure(path):
    # The question, the parameters, the results loaded, then the answer computed from them:
    # a reader has it before the evidence.
    notebook = nbformat.read(path, as_version=4)
    code = [cell.source for cell in notebook.cells if cell.cell_type == "code"]
    answer = next(i for i, source in enumerate(code) if "findings.answer_markdown(" in source)
    assert answer == 2, f"{path.name}: the answer is code cell {answer}, not the third"
    assert "Results.load(" in code[1]
    assert code[answer].startswith("Markdown(") and len(code[answer].splitlines()) == 1
    assert not [s for s in code[:answer] if "draw(" in s or "format_table(" in s]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_prose_types_no_numbers(path):
    # Numbers belong in text formatted from the results; the prose may only name things
    # (HDF5, notebook titles), so a bare number in a markdown cell is a typed-in figure.
    notebook = nbformat.read(path, as_version=4)
    for number, cell in enumerate(notebook.cells):
        if cell.cell_type != "markdown":
            continue
        body = cell.source.split("\n", 1)[1] if cell.source.startswith("# ") else cell.source
        typed = re.findall(r"\b\d[\d.,]*\b", body)
        assert typed == [], f"{path.name} markdown cell {number} types numbers: {typed}"


def _errors(notebook) -> list[str]:
    return [f"cell {number}: {output.get('ename')}: {output.get('evalue')}"
            for number, cell in enumerate(notebook.cells) if cell.cell_type == "code"
            for output in cell.outputs if output.output_type == "error"]


# The notebooks with no live cell (``Study.live``).
NO_LIVE_CELL = {Path(study.notebook).stem for study in STUDIES.values() if study.live is None}


def test_study_on_the_ci_profile_end_to_end(ci_study):
    """Build, every study, plots and every notebook, as ``make study`` runs them."""
    profile_dir, completed = ci_study
    # The study ends with a summary: where results went, cases run/reused/failed, the guide.
    assert f"results in {profile_dir}" in completed.stdout
    assert "failed." in completed.stdout and "Decision guide for this machine:" in completed.stdout

    env = read_env(profile_dir / "env.json")
    assert env["profile"] == "ci"
    frames = {}
    for study in STUDIES:
        df = frames[study] = read_results(profile_dir / f"{study}.csv")
        assert set(df["study"]) == {study}
        assert (df["status"] == "ok").any(), f"{study}: no case succeeded"
    timing = json.loads((profile_dir / "timing.json").read_text())
    assert timing["failed_cases"] == {}, timing["failed_cases"]
    # The knob variants were built and measured, and the results alone say what was met
    # and whether the accelerator was real.
    names = {json.loads(p).get("dataset_name") for p in frames["formats"]["params"]}
    assert {v.name for v in knob_variants()} <= names
    targets = frames["targets"]
    whole = targets[targets["repeat"] == -1]
    for metric in ("target_value", "target_threshold", "target_met"):
        assert set(whole.loc[whole["metric"] == metric, "loader"]) == {t.key for t in TARGETS}
    feed_params = [json.loads(p) for p in frames["gpu_feed"]["params"]]
    assert all(isinstance(p["emulated"], bool) and p["device"] for p in feed_params)

    figures = {p.name for p in (profile_dir / "figures").iterdir()}
    expected = {f"{spec.name}{suffix}" for study in STUDIES.values()
                for spec in study_figures(study) for suffix in (".png", ".svg")}
    assert expected <= figures, f"figures missing: {sorted(expected - figures)}"

    executed = sorted((profile_dir / "notebooks").glob("*.ipynb"))
    assert [p.name for p in executed] == [p.name for p in NOTEBOOKS]
    for path in executed:
        notebook = nbformat.read(path, as_version=4)
        assert _errors(notebook) == [], f"{path.name}: {_errors(notebook)}"
        injected = [cell for cell in notebook.cells
                    if "injected-parameters" in cell.metadata.get("tags", [])]
        assert len(injected) == 1 and "profile = \"ci\"" in injected[0].source
        images = [output for cell in notebook.cells if cell.cell_type == "code"
                  for output in cell.outputs if "image/png" in output.get("data", {})]
        assert images, f"{path.name}: no figure was drawn"
        last = notebook.cells[-1].outputs
        assert any("text/markdown" in output.get("data", {}) for output in last), \
            f"{path.name}: the findings cell produced no markdown"
        # The live cell timed its comparison (or ran its audit) on the ci sets and printed
        # it beside the reference's (every study notebook, and the recipes').
        printed = "".join(output.get("text", "") for cell in notebook.cells
                          if cell.cell_type == "code" and any(
                              call in cell.source
                              for call in ("run_live", "run_recipes", "run_audit"))
                          for output in cell.outputs)
        if path.stem not in NO_LIVE_CELL:
            # Both: a ratio (an audit: each recipe's verdicts) on this machine and the
            # reference's, neither missing.
            for label in ("your machine:", "reference machine:"):
                lines = [ln for ln in printed.splitlines() if label in ln]
                assert lines and not any("not measured" in ln for ln in lines), \
                    f"{path.name}: the live cell printed no {label} {printed[-600:]!r}"
                if path.stem == Path(STUDIES["correctness"].notebook).stem:
                    # One line per recipe of the cell's two.
                    assert len(lines) == 2 and all("exactly once: " in ln for ln in lines), \
                        f"{path.name}: the live audit printed no verdicts {printed[-600:]!r}"
    timing = json.loads((profile_dir / "timing.json").read_text())
    assert "notebooks" in timing["stage_seconds"]
    assert timing["failed_cases"] == {}


@pytest.mark.timeout(300)
def test_figures_regenerate_from_the_committed_reference_results(tmp_path):
    if not REFERENCE.is_dir():
        pytest.skip(f"{REFERENCE.relative_to(REPO_ROOT)} is not committed yet")
    committed = {p.name for p in (REFERENCE / "figures").iterdir()}
    # The studies the reference run holds rows of: a study added since draws from the next.
    present = {path.name.split(".")[0] for path in REFERENCE.glob("*.csv*")}
    expected = {f"{spec.name}{suffix}" for study in STUDIES.values() if study.name in present
                for spec in study_figures(study) for suffix in (".png", ".svg")}
    assert committed == expected
    assert committed, "the reference results have no figures"
    copy = tmp_path / "reference"
    shutil.copytree(REFERENCE, copy, ignore=shutil.ignore_patterns("figures", "notebooks"))
    completed = subprocess.run([str(STOREBENCH), "plot", str(copy)], capture_output=True,
                               text=True, timeout=280, env={**os.environ, "MPLBACKEND": "Agg"})
    assert completed.returncode == 0, completed.stderr[-4000:]
    assert {p.name for p in (copy / "figures").iterdir()} == committed


CWDS = {"root": REPO_ROOT, "notebooks": NOTEBOOKS_DIR}


@pytest.fixture(scope="module")
def findings_run_from(tmp_path_factory):
    """``05_findings`` executed once from each working directory of ``CWDS``, both at once
    in spawned processes (papermill changes the working directory of the process it runs
    in): ``{id: the executed notebook, or the error its execution raised}``."""
    import concurrent.futures
    import multiprocessing

    import papermill

    if not REFERENCE.is_dir():
        pytest.skip("no committed reference results")
    path = NOTEBOOKS_DIR / "05_findings.ipynb"
    outs = {name: tmp_path_factory.mktemp(f"from-{name}") / path.name for name in CWDS}
    context = multiprocessing.get_context("spawn")
    # The live cell stays off (the ci study's notebooks run every live cell): two at once
    # would build the repository's data/ sets side by side. The spawned processes and their
    # kernels inherit the setting.
    with live_cells_env("off"), concurrent.futures.ProcessPoolExecutor(
            len(CWDS), mp_context=context) as pool:
        # A cell over the limit fails in its own process, which shuts its kernel down.
        running = {name: pool.submit(papermill.execute_notebook, str(path), str(outs[name]),
                                     cwd=str(cwd), progress_bar=False, kernel_name="python3",
                                     execution_timeout=280, parameters={"profile": "ci"})
                   for name, cwd in CWDS.items()}
        return {name: future.exception() or outs[name] for name, future in running.items()}


# The first test to ask for the fixture carries both executions: the two tests' limits.
@pytest.mark.timeout(600)
@pytest.mark.parametrize("cwd", list(CWDS))
def test_a_notebook_runs_from_the_repository_root_and_from_notebooks(cwd, findings_run_from):
    """Paths in the parameters resolve from the repository, not the working directory (every
    notebook resolves them with the same ``study.resolve_repo_path``)."""
    out = findings_run_from[cwd]
    if isinstance(out, BaseException):
        raise out
    executed = nbformat.read(out, as_version=4)
    assert _errors(executed) == []
    text = json.dumps([cell.get("outputs", []) for cell in executed.cells])
    assert "/tmp" not in text and str(REPO_ROOT) not in text


def test_committed_reference_notebooks_carry_no_temporary_paths():
    executed = sorted((REFERENCE / "notebooks").glob("*.ipynb"))
    if not executed:
        pytest.skip("no committed reference notebooks")
    for path in executed:
        text = path.read_text()
        assert "/tmp/" not in text and "/work/" not in text, path.name


def _notebook_file(path: Path, source: str) -> None:
    notebook = nbformat.v4.new_notebook()
    parameters = nbformat.v4.new_code_cell(
        'profile = "ci"\nresults_dir = "results"\ndata_root = "data"\nmeasure = False')
    parameters.metadata["tags"] = ["parameters"]
    notebook.cells = [parameters, nbformat.v4.new_code_cell(source)]
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                       "language": "python"}
    nbformat.write(notebook, path)


@pytest.mark.timeout(300)
def test_notebooks_run_two_at_a_time_and_a_failure_names_its_notebook(tmp_path):
    from storebench.study import execute_notebooks

    notebooks, results = tmp_path / "notebooks", tmp_path / "results"
    notebooks.mkdir()
    _notebook_file(notebooks / "01_fine.ipynb", "import os\nprint('pid', os.getpid())")
    _notebook_file(notebooks / "02_fine.ipynb", "import os\nprint('pid', os.getpid())")
    written = execute_notebooks(results, profile="ci", notebooks_dir=notebooks,
                                progress=False, jobs=2)
    assert [p.name for p in written] == ["01_fine.ipynb", "02_fine.ipynb"]
    for path in written:
        executed = nbformat.read(path, as_version=4)
        assert _errors(executed) == []
        assert executed.metadata["papermill"]["parameters"]["profile"] == "ci"
    _notebook_file(notebooks / "03_broken.ipynb", "raise ValueError('no such results')")
    with pytest.raises(Exception, match="no such results") as caught:
        execute_notebooks(results, profile="ci", notebooks_dir=notebooks, progress=False,
                          jobs=2)
    assert "while executing notebook 03_broken.ipynb" in caught.value.__notes__
