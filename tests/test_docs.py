"""The docs site: it builds with --strict (broken links, anchors, pages left out of the nav or
unresolved API references fail), each study's page shows the study's committed figures, and
the README's links into it resolve."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from storebench.report.figures import study_figures
from storebench.studies import STUDIES

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
FIGURES = ROOT / "results" / "reference" / "figures"


def nav_pages(nav) -> list[str]:
    pages = []
    for item in nav:
        value = next(iter(item.values())) if isinstance(item, dict) else item
        pages += nav_pages(value) if isinstance(value, list) else [value]
    return pages


@pytest.mark.timeout(300)
def test_the_site_builds_strict(tmp_path):
    site = tmp_path / "site"
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT, capture_output=True, text=True, timeout=280,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "WARNING" not in result.stderr
    # The API reference resolved: the loaders' page documents ProcessPrefetcher.
    assert "ProcessPrefetcher" in (site / "api" / "loaders" / "index.html").read_text()
    # Only the figures are published from results/, never its rows or notebooks.
    published = {p.suffix for p in (site / "results").rglob("*") if p.is_file()}
    assert published == {".png"}


def test_every_page_is_in_the_nav_and_every_nav_entry_is_a_page():
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=yaml.BaseLoader)
    pages = nav_pages(config["nav"])
    on_disk = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")
                     if "results" not in p.relative_to(DOCS).parts)
    assert sorted(pages) == on_disk


@pytest.mark.parametrize("name", list(STUDIES))
def test_each_study_page_shows_its_committed_figures(name):
    text = (DOCS / "studies" / f"{name}.md").read_text()
    assert STUDIES[name].question in text
    for figure in study_figures(STUDIES[name]):
        shown = f"](../results/reference/figures/{figure.name}.png)" in text
        assert shown == (FIGURES / f"{figure.name}.png").exists(), figure.name


def test_the_readme_links_into_the_docs_and_its_links_resolve():
    readme = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\((docs/[^)#]+)", readme)
    assert "docs/index.md" in links
    assert all((ROOT / link).exists() for link in links), links


# How the project was built, not what the user reads: issue numbers ("issue 46", or "#46"
# with no project before it: "pytorch#139792" and a link's "[#880]" cite another project's),
# run ids quoted as "run 1a2b3c" or whole (outside a path: a results directory is named by
# its run), the sessions that built it, machines lent to it.
PROJECT_HISTORY = re.compile(
    r"\bissues? #?\d+\b|\bruns? [0-9a-f]{6}\b|\bthe issue\b|\bthe session\b|\bborrowed\b"
    r"|(?<![\w\[/.-])#\d+\b|(?<![\w/.-])\d{8}T\d{6}Z-[0-9a-f]{6}\b",
    flags=re.I)


def test_the_readme_and_the_docs_speak_to_the_user_not_of_the_project_s_history():
    pages = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
    found = [f"{page.relative_to(ROOT)}:{number}: {match.group(0)}"
             for page in pages
             for number, line in enumerate(page.read_text().splitlines(), start=1)
             for match in PROJECT_HISTORY.finditer(line)]
    assert found == []
    for internal in ("in the H200 run a18d21", "as issue 46 asks", "see #46",
                     "correctness in run 20261207T160248Z-5aec74", "the issue asks",
                     "(20261207T160248Z-5aec74)"):
        assert PROJECT_HISTORY.search(internal), internal
    for cited in ("pytorch#139792", "[#880](https://github.com/mosaicml/streaming/issues/880)",
                  "results/gpu-runs/20261127T210559Z-673565/figures", "# A heading",
                  "colour #1f77b4"):
        assert not PROJECT_HISTORY.search(cited), cited
