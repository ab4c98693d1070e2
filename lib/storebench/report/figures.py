"""Every study's figures, drawn from a results directory alone."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ..plots import save_figure
from ..results import Results, stat_columns, stats_drawn, stats_read
from ..studies import STUDIES, FigureSpec, Study, get_study

# What a figure's row is, where its rows have it: shown when it differs between rows.
FIGURE_ROW_FIELDS = ("study", "format", "encoding", "loader", "prefetcher", "workers",
                     "batch_size", "access", "cache")


def study_figures(study: Study) -> tuple[FigureSpec, ...]:
    """A study's figures: its own, after every study's targets' figure on the study that
    shows them (``Study.shows_every_target``)."""
    from .targets import TARGETS_MET

    return ((TARGETS_MET,) if study.shows_every_target else ()) + study.figures


def readme_figures(study: Study) -> tuple[str, ...]:
    """The names of the figures the README shows of a study."""
    from .targets import TARGETS_MET

    return ((TARGETS_MET.name,) if study.shows_every_target else ()) + study.readme_figures


def _draw_figures(results_dir: str, figures: Sequence[tuple[str, str]],
                  results=None) -> list[Path]:
    """Draw and save ``figures``, (study, figure name) pairs, from ``results`` (loaded from
    ``results_dir`` when not given: a unit of work that a worker process can take needs
    only a path and plain data)."""
    if results is None:
        results = Results.load(results_dir)
    written: list[Path] = []
    for study, name in figures:
        spec = next(spec for spec in study_figures(get_study(study)) if spec.name == name)
        written += save_figure(spec.draw(results), Path(results_dir) / "figures" / name)
    return written


def plot_all(results_dir: Path | str, *, workers: int | None = None) -> list[Path]:
    """Regenerate every figure from ``<results_dir>/*.csv`` and ``env.json`` alone, into
    ``<results_dir>/figures/``; returns the files written.

    Rendering (PNG and SVG) is CPU-bound and nothing is measured meanwhile, so the figures
    are drawn by ``workers`` processes (default: up to two, one per core)."""
    results_dir = Path(results_dir)
    results = Results.load(results_dir)
    present = set(results.df["study"])
    wanted = [(study.name, spec.name) for study in STUDIES.values() if study.name in present
              for spec in study_figures(study)]
    workers = max(1, min(workers if workers is not None else min(2, os.cpu_count() or 1),
                         len(wanted)))
    if workers == 1:
        return _draw_figures(str(results_dir), wanted, results)
    from concurrent.futures import ProcessPoolExecutor

    # One share per worker, so each loads the results once.
    with ProcessPoolExecutor(max_workers=workers) as pool:
        done = list(pool.map(_draw_figures, [str(results_dir)] * workers,
                             [wanted[share::workers] for share in range(workers)]))
    return [path for paths in done for path in paths]


# A figure's rows table shows at most this many rows, the rest counted in its note: a reader
# checks a mark against it, and a screenful is what one reads.
FIGURE_ROWS_LIMIT = 40


# What a row of a figure drawn from medians holds.
MEDIAN_ROWS_CAPTION = ("One row per median the figure draws: what was measured, the median, "
                       "the spread of its repeats (lowest to highest) and n, the repeats "
                       "that ran.")


@dataclass(frozen=True)
class FigureRows:
    """A figure's rows as a notebook shows them: ``table``, the first ``len(table)`` of
    ``total`` rows, and above it ``caption``, what each row holds, and, where some are left
    out, a line saying how many."""

    table: pd.DataFrame
    total: int
    caption: str = MEDIAN_ROWS_CAPTION

    @property
    def note(self) -> str:
        if len(self.table) == self.total:
            return ""
        return (f"showing {len(self.table)} of {self.total}; figure_rows(..., limit=None) "
                "for all")

    @property
    def heading(self) -> str:
        return self.caption + (f" ({self.note})" if self.note else "")

    def __len__(self) -> int:
        return len(self.table)

    # Shown as the table itself, under what a row holds and the note where there is one.
    def _repr_html_(self) -> str:
        from html import escape

        return f"<p>{escape(self.heading)}</p>" + self.table._repr_html_()

    def __repr__(self) -> str:
        return f"{self.heading}\n{self.table!r}"


def figure_rows(spec: FigureSpec, results: Results, *,
                limit: int | None = FIGURE_ROWS_LIMIT) -> FigureRows:
    """The rows figure ``spec`` draws from ``results``, one per mark: the figure's own
    table where it declares one (``FigureSpec.rows``: verdicts, counts, points), else one
    per median it computes: what was measured (the fields that differ between its rows, and
    the cases), the metric, the median, the spread of the repeats (min to max) and their
    count ``n``. The figure is drawn again and every median it takes through the query
    layer (``results.Stat``) is reported, so the table holds what the bars and points were
    drawn from. Beyond ``limit`` rows (None: no limit) only the first are shown, medians
    ordered by metric and then largest first."""
    caption = MEDIAN_ROWS_CAPTION
    if spec.rows is not None:
        table, caption = spec.rows(results).reset_index(drop=True), spec.rows_caption
    else:
        table = _median_rows(spec, results)
        if limit is not None and len(table) > limit:
            table = table.sort_values(["metric", "_value"], ascending=[True, False],
                                      kind="stable")
        table = table.drop(columns="_value").reset_index(drop=True)
    shown = table if limit is None else table.head(limit)
    return FigureRows(shown, len(table), caption)


def _median_rows(spec: FigureSpec, results: Results) -> pd.DataFrame:
    """Every median drawing ``spec`` reads (``results.stats_read``), or where it reports
    those it drew (``results.mark_drawn``) those, once each, with its value in ``_value``
    for ordering."""
    with stats_read() as seen, stats_drawn() as drawn:
        spec.draw(results)
    shown = {(stat.sources, stat.unit, stat.values) for stat in drawn}
    out, kept = [], set()
    for stat, row in seen:
        key = (stat.sources, stat.unit, stat.values)
        if key in kept or (shown and key not in shown):
            continue
        kept.add(key)
        cases = list(dict.fromkeys(case for _, case, _ in stat.sources)) or [row["case_id"]]
        out.append({
            **{name: row.get(name) for name in FIGURE_ROW_FIELDS},
            "metric": str(row["metric"]),
            **stat_columns(stat),
            "case": cases[0] + (f" (+{len(cases) - 1} more)" if len(cases) > 1 else ""),
            "_value": stat.median,
        })
    columns = ["metric", "median", "spread", "n", "case", "_value"]
    table = pd.DataFrame(out, columns=[*FIGURE_ROW_FIELDS, *columns])
    varying = [name for name in FIGURE_ROW_FIELDS
               if table[name].astype(str).nunique() > 1]
    return table[[*varying, *columns]]
