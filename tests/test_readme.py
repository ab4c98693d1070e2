"""The README's code runs, and its findings block is what the reference results say."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import data_gen
from storebench.formats import build_dataset

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
# The loader snippets live in the docs pages the README links to.
DOCS_TEXT = "\n".join(path.read_text() for path in sorted((ROOT / "docs").rglob("*.md")))
SNIPPETS = [
    block for block in re.findall(r"```python\n(.*?)```", DOCS_TEXT, flags=re.S)
    if "data/ci/" in block
]
QUICK_START = re.search(r"## Quick start\n.*?```python\n(.*?)```", README, flags=re.S).group(1)
# The README's own checkpoint-and-resume example (its loader part: the rest is in docs/).
(RESUME,) = [block for block in re.findall(r"```python\n(.*?)```", README, flags=re.S)
             if "load_state_dict" in block]


@pytest.fixture(scope="module")
def ci_workdir(tmp_path_factory):
    """A working directory with the datasets the snippets open under data/ci/."""
    workdir = tmp_path_factory.mktemp("readme")
    for snippet in [*SNIPPETS, RESUME]:
        for name, encoding in re.findall(r"data/ci/(\w+)-(\w+)", snippet):
            spec = data_gen.PROFILES["ci"].spec_for(encoding)
            build_dataset(spec, name, workdir / "data" / "ci", workers=1)
    return workdir


def test_readme_has_the_seven_loader_snippets():
    assert len(SNIPPETS) == 7
    assert any('decode="window"' in s and "StepInput" in s for s in SNIPPETS)
    assert any("SeaweedServer" in s and "s3://" in s for s in SNIPPETS)
    assert any("torch_dataloader" in s for s in SNIPPETS)
    assert any("ProcessPrefetcher" in s for s in SNIPPETS)
    assert any("tfrecord_pipeline" in s for s in SNIPPETS)
    assert any("gather_threads=2" in s for s in SNIPPETS)
    assert any("load_state_dict" in s and "state_dict()" in s for s in SNIPPETS)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("index", range(7))
def test_snippet_runs(ci_workdir, index):
    script = ci_workdir / f"snippet_{index}.py"
    body = "\n".join("    " + line for line in SNIPPETS[index].splitlines())
    script.write_text(f"def main():\n{body}\n\n\nif __name__ == '__main__':\n    main()\n")
    result = subprocess.run(
        [sys.executable, str(script)],
        cwd=ci_workdir,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.timeout(300)
@pytest.mark.timeout(300)
def test_the_readme_resume_example_delivers_exactly_the_rest_of_the_epoch(ci_workdir):
    """Short (15 lines at most), and what it says: the resumed loader, with another worker
    count, delivers the epoch's remaining samples in the uninterrupted order."""
    assert len(RESUME.strip().splitlines()) <= 15
    check = """
import numpy as np
whole = ShuffleSampler(len(dataset), seed=0).indices()
assert np.array_equal(np.concatenate(rest), whole[2 * 64:]), "not the rest of the epoch"
assert len(state) < 1000, len(state)
print("resumed", len(rest), "batches")
"""
    script = ci_workdir / "readme_resume.py"
    script.write_text(RESUME + check)
    result = subprocess.run([sys.executable, str(script)], cwd=ci_workdir,
                            capture_output=True, text=True, timeout=280)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "resumed 6 batches" in result.stdout  # 512 samples: 8 batches, 2 before the state


def test_the_quick_start_snippet_runs_over_an_imported_jpeg_set(tmp_path):
    """The README's quick start, over a JPEG set where it opens data/my_images/lmdb-jpeg."""
    spec = data_gen.PROFILES["ci"].spec_for("jpeg")
    built = build_dataset(spec, "lmdb", tmp_path / "data", workers=1).path
    assert 'open_dataset("data/my_images/lmdb-jpeg")' in QUICK_START
    code = QUICK_START.replace("data/my_images/lmdb-jpeg", str(built))
    body = "\n".join("    " + line for line in code.splitlines())
    script = tmp_path / "quick_start.py"
    script.write_text(f"def main():\n{body}\n    print(images.shape, len(labels))\n\n\n"
                      "if __name__ == '__main__':\n    main()\n")
    result = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                            text=True, timeout=280)
    assert result.returncode == 0, result.stderr[-3000:]
    assert re.fullmatch(rf"\(\d+, {spec.height}, {spec.width}, 3\) \d+\n", result.stdout)


def test_findings_block_matches_the_reference_results():
    reference = ROOT / "results" / "reference"
    if not (reference / "env.json").exists():
        pytest.fail("results/reference is missing: the README's findings have no source")
    from storebench.report.readme import render_findings_block

    block = re.search(
        r"<!-- findings:start -->\n(.*?)<!-- findings:end -->", README, flags=re.S
    ).group(1)
    assert block == render_findings_block(reference, relative_to=ROOT)


def test_the_commands_block_states_each_commands_time_from_its_timing_file(tmp_path):
    import json

    from storebench.report.readme import QUICK_RUNS, render_commands_block

    reference = ROOT / "results" / "reference"
    block = re.search(r"<!-- commands:start -->\n(.*?)<!-- commands:end -->", README,
                      flags=re.S).group(1)
    assert block == render_commands_block(reference, ROOT)

    results = tmp_path / "results" / "reference"
    results.mkdir(parents=True)
    assert "took" not in render_commands_block(results, tmp_path)
    (results / "timing.json").write_text(json.dumps({"total_seconds": 4800.0}))
    for run, seconds in (("20260101T000000Z-a", 900.0), ("20260102T000000Z-b", 690.0)):
        (tmp_path / QUICK_RUNS / run).mkdir(parents=True)
        (tmp_path / QUICK_RUNS / run / "timing.json").write_text(
            json.dumps({"total_seconds": seconds}))
    text = render_commands_block(results, tmp_path)
    assert ("took 11.5 min (`results/quick-runs/20260102T000000Z-b/timing.json`)"
            in text.splitlines()[3])
    assert "took 80.0 min (`results/reference/timing.json`)" in text.splitlines()[6]


def test_the_guide_page_matches_the_reference_results():
    from storebench.report.readme import GUIDE_PAGE, render_guide_page

    page = (ROOT / GUIDE_PAGE).read_text()
    block = re.search(r"<!-- findings:start -->\n(.*?)<!-- findings:end -->", page,
                      flags=re.S).group(1)
    assert block == render_guide_page(ROOT / "results" / "reference")


def generated_block(page: str) -> str:
    text = (ROOT / page).read_text()
    return re.search(r"<!-- findings:start -->\n(.*?)<!-- findings:end -->", text,
                     flags=re.S).group(1)


def test_the_docs_home_methodology_and_recipes_pages_match_what_generates_them():
    """The home page's answer table and the methodology page's calibration targets from the
    reference results, the recipes page from the registry: each as ``storebench readme``
    writes it."""
    from storebench.report.cold import cold_block
    from storebench.report.readme import (
        HOME_PAGE,
        METHODOLOGY_PAGE,
        render_calibration_block,
        render_home_block,
    )
    from storebench.report.recipes import RECIPES_PAGE, render_recipes_page

    reference = ROOT / "results" / "reference"
    assert generated_block(HOME_PAGE) == render_home_block(reference)
    assert generated_block(METHODOLOGY_PAGE) == render_calibration_block(reference)
    cold = re.search(r"<!-- cold:start -->\n(.*?)<!-- cold:end -->",
                     (ROOT / METHODOLOGY_PAGE).read_text(), flags=re.S).group(1)
    assert cold == cold_block(reference)
    assert generated_block(RECIPES_PAGE) == render_recipes_page()
    # The home page's links are the docs' own, not the README's.
    assert "](docs/" not in generated_block(HOME_PAGE)


def test_the_readme_is_short_and_its_answer_table_has_at_most_eight_rows():
    from storebench.report.answer import MAX_ANSWER_ROWS

    assert len(README.splitlines()) <= 300
    block = README[README.index("<!-- findings:start -->"):]
    table = block[block.index("| your situation |"):]
    rows = [line for line in table.splitlines()[2:] if line.startswith("|")]
    rows = rows[:next((i for i, line in enumerate(table.splitlines()[2:])
                       if not line.startswith("|")), len(rows))]
    assert 1 <= len(rows) <= MAX_ANSWER_ROWS


def test_the_study_time_sentence_counts_the_cases_that_failed(tmp_path):
    import json

    from storebench.report.readme import study_time_text

    timing = {"profile": "small", "total_seconds": 120.0,
              "stage_seconds": {"study:formats": 60.0, "study:peers": 50.0},
              "ran_cases": {"formats": 4, "peers": 3}, "reused_cases": {"formats": 1},
              "failed_cases": {}}
    (tmp_path / "timing.json").write_text(json.dumps(timing))
    assert study_time_text(tmp_path, tmp_path) == (
        "The `small` study took 2.0 min, 7 cases run and 1 reused (minutes by stage: formats "
        "1.0, peers 0.8; `timing.json`) on this machine.")
    timing["failed_cases"] = {"peers": ["peer_epochs:a", "peer_epochs:b"], "formats": ["c"]}
    (tmp_path / "timing.json").write_text(json.dumps(timing))
    assert "7 cases run (3 failed: peers, formats in `failed_cases`) and 1 reused" in (
        study_time_text(tmp_path, tmp_path))


def test_the_advise_examples_page_matches_the_reference_results():
    from storebench.report.examples import EXAMPLES, EXAMPLES_PAGE, render_examples_page

    page = (ROOT / EXAMPLES_PAGE).read_text()
    block = re.search(r"<!-- findings:start -->\n(.*?)<!-- findings:end -->", page,
                      flags=re.S).group(1)
    assert block == render_examples_page(ROOT / "results" / "reference", relative_to=ROOT)
    assert block.count("\n## ") + block.startswith("## ") == len(EXAMPLES) == 5
    # Answered or refused, each in advise's own words: a refusal names the nearest measured.
    answers = re.findall(r"```text\n(.*?)```", block, flags=re.S)
    assert len(answers) == 5
    assert all(a.startswith("Situation: ") or ("not measured" in a and "nearest measured" in a)
               for a in answers)
