"""What a study is: its grid of cases, its figures, its findings, its guide rows and its
README parts, in one folder (``storebench.studies.<name>``) registered in
``storebench.studies.STUDIES``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # a case worker imports this package: no pandas or matplotlib at run time
    from matplotlib.figure import Figure

    from ..results import Results


@dataclass(frozen=True)
class FigureSpec:
    """One figure of a study: ``draw(results) -> Figure`` saved as ``<name>.png/.svg``;
    ``caption`` says what it shows (the README and notebooks use it)."""

    name: str
    caption: str
    draw: Callable[[Results], Figure]


def no_guide_rows(results: Results) -> list:
    return []


@dataclass(frozen=True)
class Study:
    """``grid(*, profile, data_dir, repeats=None) -> list[Case]`` lays out the cases;
    ``findings(results) -> list[str]`` and ``guide(results) -> list[GuideRow]`` read the
    study's rows through ``storebench.results``; ``notebook`` is the notebook showing it."""

    name: str
    question: str
    grid: Callable[..., list]
    figures: tuple[FigureSpec, ...]
    findings: Callable[[Results], list[str]]
    guide: Callable[[Results], list] = no_guide_rows
    notebook: str = ""
    # Its questions are about the synthetic profiles (e.g. targets set for their shapes):
    # ``storebench study --dataset`` leaves it out.
    synthetic_only: bool = False
    # ``services(cases)``: a context manager the runner enters around the cases left to
    # run (an S3 server holding their datasets); its mapping goes into each case's
    # environment. None: the cases need nothing outside their own process.
    services: Callable | None = None
    # ``prepare(*, profile, data_dir, progress)``: builds what the study needs beyond the
    # profile's core formats (the peers study: the peer formats, in the peers environment),
    # called by ``storebench study`` before the grid is laid out. None: nothing more.
    prepare: Callable | None = None
