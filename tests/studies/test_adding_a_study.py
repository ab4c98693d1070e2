"""What adding a study touches is what docs/contributing.md says: each place it lists holds
every registered study, the count it states is the list's length, and no other file lists
the studies (a place left out of the guide would be one)."""

from __future__ import annotations

import re
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from storebench.studies import STUDIES, STUDY_NAMES

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "contributing.md"
STUDIES_DIR = ROOT / "lib" / "storebench" / "studies"
COUNTS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
          "eight": 8, "nine": 9, "ten": 10}


def guide_section() -> str:
    text = GUIDE.read_text()
    start = text.index("## Adding a study")
    return text[start:text.index("\n## ", start + 1)]


def documented_places() -> list[str]:
    """The path each numbered item of the section starts with."""
    return re.findall(r"^\d+\. `([^`]+)`", guide_section(), flags=re.M)


def study_folder(name: str) -> Path:
    return Path(sys.modules[STUDIES[name].grid.__module__].__file__).parent


def folder_files() -> list[str]:
    """The files the section's first item lists, one bullet each."""
    first = guide_section().split("\n2. ", 1)[0]
    return re.findall(r"^   - `(\w+\.py)`", first, flags=re.M)


# The module of its folder that each job of a ``Study`` comes from.
JOB_MODULES = {"grid": "grid", "findings": "report", "guide": "guide"}
# Folders still one study.py, being reworked elsewhere; each to be split like the others.
NOT_YET_SPLIT = ("remote", "out_of_core", "peers")


def split_by_job(name: str) -> bool:
    study = STUDIES[name]
    return (all((STUDIES_DIR / name / f).is_file() for f in folder_files())
            and all(getattr(study, job).__module__ == f"storebench.studies.{name}.{module}"
                    for job, module in JOB_MODULES.items()))


def independent_folders() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (contract,) = [c for c in config["tool"]["importlinter"]["contracts"]
                   if c["name"] == "study folders stand alone"]
    return contract["modules"]


def nav_pages() -> list[str]:
    nav = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=yaml.BaseLoader)["nav"]
    (studies,) = [item["Studies"] for item in nav if isinstance(item, dict) and "Studies" in item]
    return [next(iter(item.values())) for item in studies]


# What each documented place must hold for a registered study ``name``, in the guide's order.
PLACES: dict[str, Callable[[str], bool]] = {
    "lib/storebench/studies/<name>/": lambda name: (
        study_folder(name) == STUDIES_DIR / name and split_by_job(name)),
    "lib/storebench/studies/__init__.py": lambda name: name in STUDY_NAMES,
    "pyproject.toml": lambda name: f"storebench.studies.{name}" in independent_folders(),
    "notebooks/NN_<topic>.ipynb": lambda name: bool(
        re.fullmatch(r"\d\d_\w+\.ipynb", STUDIES[name].notebook)
        and (ROOT / "notebooks" / STUDIES[name].notebook).is_file()),
    "docs/studies/<name>.md": lambda name: (ROOT / "docs" / "studies" / f"{name}.md").is_file(),
    "mkdocs.yml": lambda name: f"studies/{name}.md" in nav_pages(),
}
# The places that list every study, one entry each (the others are the study's own files).
LISTS = ("lib/storebench/studies/__init__.py", "pyproject.toml", "mkdocs.yml")


def test_the_guide_lists_the_places_and_says_how_many():
    assert documented_places() == list(PLACES)
    assert {"__init__.py", "cases.py", "study.py"} | {f"{m}.py" for m in JOB_MODULES.values()} \
        <= set(folder_files())
    stated = re.search(r"Adding a study touches (\w+) places", guide_section())
    assert stated is not None and COUNTS[stated[1]] == len(PLACES)


@pytest.mark.parametrize("name", list(STUDIES))
@pytest.mark.parametrize("place", list(PLACES))
def test_each_place_holds_every_study(place, name):
    if place == "lib/storebench/studies/<name>/" and name in NOT_YET_SPLIT:
        assert not split_by_job(name), f"{name} is split now: take it off NOT_YET_SPLIT"
        return
    assert PLACES[place](name), f"{name} is missing from {place}"


def _files_to_search() -> list[Path]:
    """The hand-written files of the repository: not the results, the study folders, the
    generated findings blocks or the list of slow tests pytest writes."""
    files = [p for p in ROOT.iterdir() if p.is_file() and p.suffix in (".md", ".toml", ".yml",
                                                                       ".yaml", ".cfg", ".txt")]
    files.append(ROOT / "Makefile")
    for folder in ("lib", "tests", "docs", "notebooks", "data_gen"):
        files += [p for p in (ROOT / folder).rglob("*") if p.is_file()
                  and p.suffix in (".py", ".md", ".ipynb", ".toml", ".yml", ".txt", ".cfg")]
    return [p for p in files if "__pycache__" not in p.parts
            and not any(p.is_relative_to(STUDIES_DIR / name) for name in STUDIES)
            and p.name != "slow_tests.txt" and p != Path(__file__)]


def _hand_written(path: Path) -> str:
    text = path.read_text(errors="replace")
    # A findings block is generated from the results (``storebench readme``).
    return re.sub(r"<!-- findings:start -->.*?<!-- findings:end -->", "", text, flags=re.S)


def test_no_other_file_lists_every_study():
    names = list(STUDIES)
    listing = sorted(str(p.relative_to(ROOT)) for p in _files_to_search()
                     if all(re.search(rf"\b{name}\b", _hand_written(p)) for name in names))
    assert listing == sorted(LISTS)
