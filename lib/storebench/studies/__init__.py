"""The studies: one module per study (its grid of cases, case functions, figures, findings
and guide rows) and ``STUDIES``, the plain registry that also gives the run order.

Adding a study is one module defining ``STUDY = Study(...)``, one line here and one
notebook; ``tests/studies/test_study_contract.py`` then runs its ci grid, draws every figure and
renders every finding.
"""

from __future__ import annotations

from . import (
    formats,
    gpu_feed,
    lazy_vs_preloaded,
    out_of_core,
    peers,
    prefetch,
    remote,
    targets,
)
from .base import FigureSpec, Study
from .gpu_decode import study as gpu_decode

# Run order: cheap and foundational first.
STUDIES: dict[str, Study] = {
    study.name: study for study in (
        formats.STUDY,
        lazy_vs_preloaded.STUDY,
        prefetch.STUDY,
        gpu_feed.STUDY,
        targets.STUDY,
        out_of_core.STUDY,
        remote.STUDY,
        peers.STUDY,
        gpu_decode.STUDY,
    )
}


def get_study(name: str) -> Study:
    try:
        return STUDIES[name]
    except KeyError:
        raise KeyError(f"unknown study {name!r}; known studies: {list(STUDIES)}") from None


__all__ = ["STUDIES", "FigureSpec", "Study", "get_study"]
