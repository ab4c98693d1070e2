"""The studies: one folder per study and ``STUDIES``, the registry that also gives the run order.

A study's folder holds ``study.py`` (``STUDY = Study(...)``), ``cases.py`` (its case
functions, light enough for a case worker to import without pandas or matplotlib) and,
split by job, its grid (``grid.py``), its tables, figures and findings (``report.py``) and its
guide rows (``guide.py``). A folder imports no other study's folder and not this registry:
what several studies share sits beside the folders. docs/contributing.md lists what adding a
study touches; the contract tests then run its ci grid, draw every figure and render every
finding.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..registry import LazyRegistry
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
    "startup",
    "resume",
    "correctness",
    "gpu_decode",
)


class StudyRegistry(LazyRegistry):
    """Study name -> ``Study``, each study's module imported on first use: listing the names
    (or importing a study's case functions in a worker) imports no study's plotting code.
    ``modules`` maps a name to the module defining ``STUDY``; a registered study runs after
    the others."""

    kind = "study"

    def member(self, module, name: str) -> Study:
        if module.STUDY.name != name:
            raise ValueError(f"{module.__name__} defines study {module.STUDY.name!r}, "
                             f"registered as {name!r}")
        return module.STUDY


def study_modules(names: Iterable[str]) -> dict[str, str]:
    return {name: f"{__name__}.{name}.study" for name in names}


STUDIES = StudyRegistry(study_modules(STUDY_NAMES))


def get_study(name: str) -> Study:
    try:
        return STUDIES[name]
    except KeyError:
        raise KeyError(f"unknown study {name!r}; known studies: {list(STUDIES)}") from None


__all__ = ["STUDIES", "FigureSpec", "Study", "StudyRegistry", "get_study"]
