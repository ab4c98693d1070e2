"""The toy study: how fast each raw dataset reads front to back through its reader."""

from __future__ import annotations

from pathlib import Path

from storebench.bench.case import Case
from storebench.plots import bars, empty_figure, summarise
from storebench.results import Results, select
from storebench.studies.base import FigureSpec, Study
from storebench.studies.grid import profile_datasets, repeat_fields

NAME = "toy"


def grid(*, profile: str, data_dir: Path | str, repeats: int | None = None) -> list[Case]:
    return [Case(study=NAME, function="toy_study.cases:sequential_pass_case",
                 format=manifest["format"], encoding="raw", dataset=str(path), loader="reader",
                 access="sequential", batch_size=64, **repeat_fields(profile, repeats))
            for path, manifest in profile_datasets(profile, data_dir)
            if manifest["encoding"] == "raw"]


def rates(results: Results):
    return summarise(select(results.study(NAME), "samples_per_s"), "samples_per_s", ["format"])


def plot_rates(results: Results):
    table = rates(results)
    if table.empty:
        return empty_figure("no toy rows")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 3), layout="constrained")
    ax = fig.add_subplot()
    bars(ax, list(table["format"]), table)
    ax.set_ylabel("samples per second")
    ax.set_title("Which format reads a raw set fastest, front to back?")
    return fig


def findings(results: Results) -> list[str]:
    return [f"{row.format}: {row.median:,.0f} samples/s front to back."
            for row in rates(results).itertuples()]


STUDY = Study(
    name=NAME,
    question="How fast does each raw dataset read front to back?",
    grid=grid,
    figures=(FigureSpec("toy_rates", "Sequential reads of every raw set.", plot_rates),),
    findings=findings,
    readme_figures=("toy_rates",),
)
