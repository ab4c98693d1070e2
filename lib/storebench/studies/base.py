"""What a study is: its grid of cases, its figures, its findings, its guide rows and its
README parts, in one folder (``storebench.studies.<name>``) registered in
``storebench.studies.STUDIES``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # a case worker imports this package: no pandas or matplotlib at run time
    import pandas as pd
    from matplotlib.figure import Figure

    from ..results import Results


@dataclass(frozen=True)
class FigureSpec:
    """One figure of a study: ``draw(results) -> Figure`` saved as ``<name>.png/.svg``;
    ``caption`` says what it shows (the README and notebooks use it)."""

    name: str
    caption: str
    draw: Callable[[Results], Figure]
    # ``rows(results)``: the table of what the figure draws, one row per mark, for a figure
    # whose marks are not each a median (``results.Stat``): verdicts, counts, every point of
    # a scatter. None: the medians the figure reads are its rows
    # (``report.figures.figure_rows``).
    rows: Callable[[Results], pd.DataFrame] | None = None
    # What one of ``rows``'s rows holds, for the line above the table (a figure drawn from
    # medians needs none: its rows are each a median, its spread and n).
    rows_caption: str = ""

    def __post_init__(self) -> None:
        if self.rows is not None and not self.rows_caption:
            raise ValueError(f"figure {self.name}: a rows table needs a rows_caption saying "
                             "what each of its rows holds")


@dataclass(frozen=True)
class TargetMeasure:
    """A target as measured: the median, its 95% interval (``low`` == ``high`` == ``value``
    where a single measurement has none) over ``repeats``, and ``limiting``: what the same
    rows show limits it (a sentence, for the caption of an unmet target)."""

    value: float
    low: float
    high: float
    repeats: int
    limiting: str = ""
    # The result rows the value is read from ((study, case_id, metric)), and for a ratio of
    # two figures, those of its denominator: ``storebench consistency`` checks them.
    sources: tuple[tuple[str, str, str], ...] = ()
    against: tuple[tuple[str, str, str], ...] = ()
    # The value is computed from those rows (over a machine limit, say), not their median.
    derived: bool = False


@dataclass(frozen=True)
class TargetSpec:
    """A performance target an issue set: ``measure(results) -> TargetMeasure | None`` (None:
    these results hold no rows for it). Met when the interval's lower end reaches
    ``threshold``; ``is_fraction``: the value is a fraction (shown as a percentage), else a
    ratio. ``unmeasured``: why no run measures it yet, where none can (its table row says
    so rather than stay silent)."""

    key: str
    name: str
    description: str
    threshold: float
    is_fraction: bool
    measure: Callable[[Results], TargetMeasure | None]
    unmeasured: str = ""
    # Measured on a small synthetic set to calibrate the machine and the loaders' ceilings,
    # not on the training set a practitioner's answer rests on: the methodology page shows
    # it, the README's targets table does not.
    calibration: bool = False


def no_guide_rows(results: Results) -> list:
    return []


def no_sentences(results: Results) -> list[str]:
    return []


@dataclass(frozen=True)
class LiveComparison:
    """The one comparison a study's notebook times on the reader's machine in about a
    minute (``storebench.live``): two of the study's own cases, each picked from its grid by
    a choice's case fields (``choices``: a name -> ``{field: value}``; a ``param_<name>``
    key matches a param, ``function`` the case function's name), the first of ``pair`` over
    the second, by ``metric`` (or ``metrics``, one per side, where one case times both).
    ``settings`` are the knobs the notebook's cell names, with the study's own values:
    ``workers``, ``batch_size``, ``decoder`` (the ``decode`` param), ``cache``. ``formats``
    and ``encodings`` are the sets built for it, where missing."""

    pair: tuple[str, str]
    choices: Mapping[str, Mapping[str, object]]
    formats: tuple[str, ...]
    encodings: tuple[str, ...]
    metric: str = "samples_per_s"
    metrics: tuple[str, str] | None = None
    settings: Mapping[str, object] = field(default_factory=dict)
    # False where a smaller number is better (a time to first batch): the ratio is then
    # the second over the first, so that above 1 still reads "the first is better".
    higher_is_better: bool = True

    def __post_init__(self) -> None:
        unknown = [name for name in self.pair if name not in self.choices]
        if unknown:
            raise ValueError(f"live comparison: {unknown} not among its choices "
                             f"{sorted(self.choices)}")
        wrong = sorted(set(self.settings) - set(LIVE_SETTINGS))
        if wrong:
            raise ValueError(f"live comparison: unknown settings {wrong}; known: "
                             f"{list(LIVE_SETTINGS)}")

    def side_metric(self, side: int) -> str:
        return self.metrics[side] if self.metrics is not None else self.metric


# The knobs a live cell may set, and the case field each one sets.
LIVE_SETTINGS = {"workers": "workers", "batch_size": "batch_size", "decoder": "param_decode",
                 "cache": "cache"}


@dataclass(frozen=True)
class LiveAudit:
    """The audit a study's notebook runs on the reader's machine in under a minute
    (``storebench.live.run_audit``), for a study that checks properties rather than timing
    rates: its own case for each of two recipes (``recipes``, the default pair; the case
    whose ``recipe`` param names it), made smaller by ``settings``, and each property's
    verdict here beside the reference's for the same recipe. ``verdicts(results)``: one row
    per recipe (a ``recipe`` column) and a column per property, of which the cell prints
    ``properties``. ``settings``: the study's own values of ``LIVE_AUDIT_SETTINGS``."""

    recipes: tuple[str, str]
    verdicts: Callable[[Results], pd.DataFrame]
    properties: tuple[str, ...]
    settings: Mapping[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        wrong = sorted(set(self.settings) - set(LIVE_AUDIT_SETTINGS))
        if wrong:
            raise ValueError(f"live audit: unknown settings {wrong}; known: "
                             f"{list(LIVE_AUDIT_SETTINGS)}")


# The knobs a live audit's cell may set, and the case param each one sets (a tuple of counts
# is written as the param's comma-separated list).
LIVE_AUDIT_SETTINGS = {"samples": "samples", "ranks": "rank_counts", "workers": "worker_counts"}


@dataclass(frozen=True)
class ReadmePlace:
    """Where the README's findings block is written: paths in it are relative to ``base``;
    ``results_dir`` holds the results it states."""

    results_dir: Path
    base: Path

    def relative(self, path: Path) -> str:
        return path.resolve().relative_to(self.base.resolve()).as_posix()


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
    # Its cases build the sets they read themselves (probe images, say): nothing of the
    # profile's is built for it.
    reads_profile_sets: bool = True
    # ``services(cases)``: a context manager the runner enters around the cases left to
    # run (an S3 server holding their datasets); its mapping goes into each case's
    # environment. None: the cases need nothing outside their own process.
    services: Callable | None = None
    # What the README shows of it: these figures (names among ``figures``), and the markdown
    # ``readme_text(results, place: ReadmePlace)`` returns ("" for nothing).
    readme_figures: tuple[str, ...] = ()
    readme_text: Callable | None = None
    # ``caveats(results)``: sentences on what the results cover (any study's rows), stated
    # with the machine.
    caveats: Callable[[Results], list[str]] = no_sentences
    # ``page_text(results)``: the markdown ``storebench readme`` writes between the
    # ``<!-- study:start -->`` and ``<!-- study:end -->`` markers of its docs page. None: none.
    page_text: Callable | None = None
    # ``finalists(results, cases) -> list[Case]``: a second stage, laid out from the rows its
    # first stage (``cases``, the grid) wrote, which the runner runs after the grid into the
    # same results (the out_of_core study times whole epochs of its screen's best paths).
    # None: the grid is the whole study.
    finalists: Callable | None = None
    # ``prepare(*, profile, data_dir, progress)``: builds what the study needs beyond the
    # profile's core formats (the peers study: the peer formats, in the peers environment),
    # called by ``storebench study`` before the grid is laid out. None: nothing more.
    prepare: Callable | None = None
    # The performance targets its rows decide (``storebench.report.targets`` lists them all).
    targets: tuple[TargetSpec, ...] = ()
    # Its README part and figures show every study's targets too: their table and figure
    # are drawn above the studies (``storebench.report.targets``), which know them all.
    shows_every_target: bool = False
    # What its notebook's live cell runs on the reader's machine: a comparison it times,
    # or an audit whose verdicts it reads; None: none.
    live: LiveComparison | LiveAudit | None = None
    # The rate its cold cases are read on, first repeat against the later ones
    # (``results.cold_repeats``): the methodology's evidence of a cache below the guest.
    # "": it has no cold cases.
    cold_rate_metric: str = ""

    def __post_init__(self) -> None:
        drawn = {spec.name for spec in self.figures}
        unknown = [name for name in self.readme_figures if name not in drawn]
        if unknown:
            raise ValueError(f"study {self.name!r}: README figures {unknown} are not among "
                             f"its figures {sorted(drawn)}")
