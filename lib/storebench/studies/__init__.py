"""The studies: one folder per study and ``STUDIES``, the registry that also gives the run order.

A study's folder holds ``study.py`` (its grid of cases, figures, findings, guide rows and
README parts, as ``STUDY = Study(...)``) and ``cases.py`` (its case functions, light enough
for a case worker to import without pandas or matplotlib). Adding a study is one folder, one
line in ``STUDY_NAMES`` and one notebook; the contract tests then run its ci grid, draw every
figure and render every finding.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from importlib import import_module

from .base import FigureSpec, Study

# Run order: cheap and foundational first.
STUDY_NAMES = (
    "formats",
    "lazy_vs_preloaded",
    "prefetch",
    "gpu_feed",
    "targets",
    "out_of_core",
    "remote",
    "peers",
    "gpu_decode",
)


class StudyRegistry(Mapping):
    """Study name -> ``Study``, each study's module imported on first use: listing the names
    (or importing a study's case functions in a worker) imports no study's plotting code.
    ``modules`` maps a name to the module defining ``STUDY``."""

    def __init__(self, modules: Mapping[str, str]) -> None:
        self._modules = dict(modules)

    def __getitem__(self, name: str) -> Study:
        if name not in self._modules:
            raise KeyError(name)
        study = import_module(self._modules[name]).STUDY
        if study.name != name:
            raise ValueError(f"{self._modules[name]} defines study {study.name!r}, "
                             f"registered as {name!r}")
        return study

    def __contains__(self, name: object) -> bool:
        return name in self._modules

    def __iter__(self) -> Iterator[str]:
        return iter(self._modules)

    def __len__(self) -> int:
        return len(self._modules)

    def with_study(self, name: str, module: str) -> StudyRegistry:
        """A registry with one more study, run last (tests register a study of their own)."""
        return StudyRegistry({**self._modules, name: module})


def study_modules(names: Iterable[str]) -> dict[str, str]:
    return {name: f"{__name__}.{name}.study" for name in names}


STUDIES = StudyRegistry(study_modules(STUDY_NAMES))


def get_study(name: str) -> Study:
    try:
        return STUDIES[name]
    except KeyError:
        raise KeyError(f"unknown study {name!r}; known studies: {list(STUDIES)}") from None


__all__ = ["STUDIES", "FigureSpec", "Study", "StudyRegistry", "get_study"]
