"""Figures regenerate from a saved results directory alone, with stable format order and
colour, and read as a person needs: labels in words, no case ids, log axes with ticks."""

from __future__ import annotations

import math
import re
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pandas as pd
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import PathCollection
from matplotlib.figure import Figure

from storebench import plots
from storebench.bench.schema import COLUMNS, METRIC_UNITS, make_row, validate
from storebench.formats import FORMATS
from storebench.loaders.paths import LOADER_PATHS
from storebench.report.figures import plot_all, study_figures
from storebench.results import Results
from storebench.studies import STUDIES
from storebench.studies.formats.report import plot_sequential_read

REFERENCE = Path(__file__).resolve().parents[2] / "results" / "reference"
SPECS = {spec.name: spec for study in STUDIES.values() for spec in study_figures(study)}
STUDY_OF = {spec.name: study.name for study in STUDIES.values()
            for spec in study_figures(study)}


@pytest.mark.timeout(180)
def test_plot_all_regenerates_every_figure_from_the_files(formats_results, tmp_path):
    # Only the CSV and env.json travel: nothing else is needed to redraw.
    for name in ("formats.csv", "env.json"):
        shutil.copy(formats_results / name, tmp_path / name)
    written = plot_all(tmp_path)
    expected = {f"{spec.name}{suffix}" for spec in STUDIES["formats"].figures
                for suffix in (".png", ".svg")}
    assert {p.name for p in written} == expected
    for path in written:
        assert path.parent == tmp_path / "figures"
        if path.suffix == ".png":
            assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        else:
            assert ET.parse(path).getroot().tag.endswith("svg")


def test_plot_all_needs_results(tmp_path):
    with pytest.raises(FileNotFoundError, match="no results"):
        plot_all(tmp_path)
    with pytest.raises(FileNotFoundError, match=f"{tmp_path / 'missing'}: no such results"):
        plot_all(tmp_path / "missing")


def synthetic_rows(formats, repeats=3):
    """Rows for a sequential-read grid whose values are a known function of format and
    repeat, so that the drawn medians and spreads can be checked exactly."""
    rows = []
    for f, fmt in enumerate(formats):
        for cache in ("cold", "warm"):
            for repeat in range(repeats):
                rows.append(make_row(
                    run_id="r", study="formats", case_id=f"{fmt}-raw/{cache}", format=fmt,
                    encoding="raw", loader="reader", access="sequential", cache=cache,
                    resident_fraction=0.0 if cache == "cold" else 1.0, repeat=repeat,
                    metric="file_MBps", value=100.0 * (f + 1) + 10 * repeat, unit="MB/s",
                    status="ok",
                ))
    return validate(pd.DataFrame(rows))


def test_formats_appear_in_registry_order_whatever_the_data_order():
    registry = list(FORMATS)
    df = synthetic_rows(list(reversed(registry)))
    fig = plot_sequential_read(df, limits={"cold_seq_read_GBps": 2.0,
                                           "page_cache_read_GBps": 10.0})
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == registry
    limit_lines = sorted(line.get_ydata()[0] for line in ax.get_lines()
                         if line.get_label().endswith("limit"))
    assert limit_lines == [2000.0, 10000.0]
    assert ax.get_ylabel() == plots.metric_title("file_MBps") != "file_MBps"


def test_medians_and_spread_come_from_the_repeats():
    df = synthetic_rows(["memmap"], repeats=3)
    summary = plots.summarise(df, "file_MBps", ["format", "cache"])
    assert summary["median"].tolist() == [110.0, 110.0]
    assert summary["low"].tolist() == [100.0, 100.0]
    assert summary["high"].tolist() == [120.0, 120.0]
    assert [s.values for s in summary["stat"]] == [(100.0, 110.0, 120.0)] * 2
    failed = df.copy()
    failed.loc[0, "status"], failed.loc[0, "error"] = "failed", "x"
    assert plots.summarise(failed, "file_MBps", ["cache"])["count"].tolist() == [2, 3]


def test_colour_of_a_format_does_not_depend_on_what_else_is_plotted():
    registry = list(FORMATS)
    alone = plots.format_colours([registry[-1]])
    together = plots.format_colours(registry + ["newformat"])
    assert alone[registry[-1]] == together[registry[-1]]
    assert len(set(together.values())) == len(together)


def test_colour_of_a_loader_path_comes_from_the_registry():
    colours = [plots.path_colour(name) for name in LOADER_PATHS]
    assert len(set(colours)) == len(colours)
    assert plots.path_colour("not-a-path") == "grey"


def test_log_axis_labels_ticks_at_1_2_5_of_each_decade():
    fig = Figure()
    ax = fig.add_subplot()
    ax.plot([300, 40_000], [1, 2])
    plots.log_axis(ax, "x")
    ax.set_xlim(300, 40_000)
    fig.draw_without_rendering()
    assert visible_tick_texts(ax.xaxis) == ["500", "1k", "2k", "5k", "10k", "20k"]
    # Zero reads "0" (tick_text also labels linear axes that start at zero).
    assert [plots.tick_text(v) for v in (0.0, -1.0, 0.5, 2e6, 3e9)] == [
        "0", "", "0.5", "2M", "3G"]


def log_axis_labels(low: float, high: float) -> list[str]:
    """The tick labels ``log_axis`` shows on a y axis viewed from ``low`` to ``high``."""
    fig = Figure()
    ax = fig.add_subplot()
    ax.plot([1, 2], [low, high])
    plots.log_axis(ax)
    ax.set_ylim(low, high)
    fig.draw_without_rendering()
    return visible_tick_texts(ax.yaxis)


def test_a_log_axis_over_less_than_a_decade_gets_round_ticks_inside_it():
    shown = log_axis_labels(8_000, 9_900)
    assert len(shown) >= 3 and "10k" not in shown, shown


def test_a_log_axis_over_less_than_a_decade_is_labelled_near_both_ends():
    """Evenly spaced linear ticks on a log axis from 0.085 to 0.45 s labelled only 0.16 and
    up, leaving the marks below unreadable: round steps spread over the log scale instead."""
    shown = [float(text) for text in log_axis_labels(0.085, 0.45)]
    assert len(shown) >= 3, shown
    assert min(shown) <= 0.085 * 1.5 and max(shown) >= 0.45 / 1.5, shown


def test_peak_memory_labels_bars_by_the_column_it_is_given():
    rows = []
    for label, pss in (("memmap-raw, sequential, warm", 60e6), ("lmdb-raw, random, cold", 90e6)):
        for metric, value in (("peak_pss_bytes", pss), ("peak_uss_bytes", pss / 2)):
            rows.append(make_row(run_id="r", study="formats", case_id=f"read:{label}/x",
                                 repeat=0, metric=metric, value=value, unit="bytes",
                                 status="ok"))
    df = validate(pd.DataFrame(rows)).assign(
        label=lambda d: d["case_id"].str.removeprefix("read:").str.removesuffix("/x"))
    fig = plots.plot_peak_memory(df, label_column="label", title="Peak memory")
    (ax,) = fig.axes
    # Highest PSS first; the title's second line names it.
    assert [t.get_text() for t in ax.get_yticklabels()] == [
        "lmdb-raw, random, cold", "memmap-raw, sequential, warm"]
    assert sorted(p.get_width() for p in ax.patches) == [30.0, 45.0, 60.0, 90.0]  # MB
    assert fig._suptitle.get_text() == (
        "Peak memory\nHighest: lmdb-raw, random, cold, 90 MB PSS")


def test_peak_memory_shows_the_top_cases_counts_the_rest_and_marks_dataset_sizes():
    rows = []
    for i in range(plots.PEAK_MEMORY_ROWS + 2):
        for metric, value in (("peak_pss_bytes", (i + 1) * 10e6),
                              ("peak_uss_bytes", (i + 1) * 5e6)):
            rows.append(make_row(run_id="r", study="formats", case_id=f"read:c{i}/x", repeat=0,
                                 metric=metric, value=value, unit="bytes", status="ok"))
    df = validate(pd.DataFrame(rows)).assign(
        label=lambda d: d["case_id"].str.removeprefix("read:").str.removesuffix("/x"),
        size=100e6)
    fig = plots.plot_peak_memory(df, label_column="label", title="Peak", size_column="size")
    (ax,) = fig.axes
    shown = [t.get_text() for t in ax.get_yticklabels()]
    assert shown == [f"c{i}" for i in range(plots.PEAK_MEMORY_ROWS + 1, 1, -1)]
    assert "2 more cases not shown, each below 20 MB PSS" in ax.get_xlabel()
    (sizes,) = [line for line in ax.lines if line.get_label() == "the dataset's size on disk"]
    assert set(sizes.get_xdata()) == {100.0}
    assert fig._suptitle.get_text().endswith("140 MB PSS, 1.4\u00d7 its dataset")
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert plots.PSS_LABEL in legend and plots.USS_LABEL in legend


# -- every figure of every study ---------------------------------------------------------
@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Results:
    """The committed reference results, copied first so nothing can write into them."""
    copy = tmp_path_factory.mktemp("reference")
    for path in [*REFERENCE.glob("*.csv"), REFERENCE / "env.json"]:
        shutil.copy(path, copy / path.name)
    return Results.load(copy)


@pytest.fixture(scope="module")
def reference_figures(reference) -> dict[str, Figure]:
    before = reference.df.copy()
    figures = {}
    for name, spec in SPECS.items():
        fig = spec.draw(reference)
        fig.draw_without_rendering()  # lays out, so tick labels are what a reader sees
        figures[name] = fig
    # Figure functions are pure: drawing left the rows as they were.
    pd.testing.assert_frame_equal(reference.df, before)
    return figures


@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", list(SPECS))
def test_every_figure_draws_from_the_reference_results(name, reference, reference_figures):
    if (reference.df["study"] != STUDY_OF[name]).all():
        pytest.skip(f"results/reference has no rows of the {STUDY_OF[name]} study: it was "
                    "run before that study existed")
    fig = reference_figures[name]
    assert isinstance(fig, Figure)
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert not any(t.startswith("no ") for t in texts), f"{name} drew nothing: {texts}"
    assert any(ax.has_data() for ax in fig.axes), name


@pytest.mark.parametrize("name", list(SPECS))
def test_every_figure_handles_empty_results(name, reference):
    assert isinstance(SPECS[name].draw(Results(reference.df.iloc[0:0], reference.env)), Figure)


def axes_of(fig: Figure):
    for ax in fig.axes:
        yield from (("x", ax, ax.xaxis), ("y", ax, ax.yaxis))


def visible_tick_texts(axis) -> list[str]:
    """The major tick labels inside the axis's view limits, as drawn."""
    low, high = sorted(axis.get_view_interval())
    locations = [v for v in axis.get_majorticklocs() if low <= v <= high]
    return [t for t in axis.get_major_formatter().format_ticks(locations) if t]


CASE_ID = re.compile(r":.*/")


@pytest.mark.parametrize("name", list(SPECS))
def test_no_tick_label_is_a_case_id(name, reference_figures, reference):
    case_ids = set(reference.df["case_id"])
    for which, _, axis in axes_of(reference_figures[name]):
        labels = [t.get_text() for t in axis.get_ticklabels()]
        assert not [t for t in labels if CASE_ID.search(t) or t in case_ids], (name, which)


@pytest.mark.parametrize("name", list(SPECS))
def test_axis_titles_are_words_not_column_names(name, reference_figures, reference):
    raw_names = set(COLUMNS) | set(METRIC_UNITS) | set(reference.df["metric"])
    raw_names = {n for n in raw_names if "_" in n}
    for which, ax, _ in axes_of(reference_figures[name]):
        title = ax.get_xlabel() if which == "x" else ax.get_ylabel()
        words = set(re.split(r"[\s,;()]+", title))
        assert title.strip() not in raw_names and not words & raw_names, (name, which, title)


@pytest.mark.parametrize("name", list(SPECS))
def test_every_log_axis_has_at_least_three_labelled_ticks(name, reference_figures):
    for which, _, axis in axes_of(reference_figures[name]):
        if axis.get_scale() != "log":
            continue
        shown = visible_tick_texts(axis)
        assert len(shown) >= 3, (name, which, shown)


def overlapping_tick_labels(fig: Figure, axis) -> list[tuple[str, str]]:
    """Neighbouring major tick labels of ``axis`` whose drawn boxes meet."""
    renderer = FigureCanvasAgg(fig).get_renderer()
    low, high = sorted(axis.get_view_interval())
    labels = [tick.label1 for tick in axis.get_major_ticks()
              if low <= tick.get_loc() <= high and tick.label1.get_visible()
              and tick.label1.get_text()]
    boxes = [(label.get_text(), label.get_window_extent(renderer)) for label in labels]
    return [(a, b) for (a, box_a), (b, box_b) in zip(boxes, boxes[1:], strict=False)
            if box_a.overlaps(box_b)]


@pytest.mark.parametrize("name", list(SPECS))
def test_no_two_tick_labels_of_a_log_axis_run_into_each_other(name, reference_figures):
    """On out_of_core_knobs' short x axis 1-2-5 ticks over 4.5 decades read "100k200k"."""
    fig = reference_figures[name]
    for which, _, axis in axes_of(fig):
        if axis.get_scale() == "log":
            assert not overlapping_tick_labels(fig, axis), (name, which)


def test_a_log_axis_too_short_for_1_2_5_labels_thins_them_to_ones_that_fit():
    fig = Figure(figsize=(3, 2))
    ax = fig.add_subplot()
    ax.plot([50, 1_000_000], [1, 2])
    plots.log_axis(ax, "x")
    ax.set_xlim(40, 1_200_000)
    fig.draw_without_rendering()
    assert visible_tick_texts(ax.xaxis) == ["100", "1k", "10k", "100k", "1M"]
    assert not overlapping_tick_labels(fig, ax.xaxis)
    fig.set_size_inches(12, 2)
    fig.draw_without_rendering()
    assert visible_tick_texts(ax.xaxis) == [
        "50", "100", "200", "500", "1k", "2k", "5k", "10k", "20k", "50k", "100k", "200k",
        "500k", "1M"]


def test_every_figure_is_named_after_its_study():
    # All figures share one figures/ folder; the prefix says which study drew each.
    for study in STUDIES.values():
        for spec in study_figures(study):
            assert spec.name.startswith(f"{study.name}_"), spec.name
            assert spec.caption, spec.name


def marks_in_display(ax) -> list[tuple[float, float, float]]:
    """Where the axes' point marks (markers of lines and errorbars, scatter points) are
    drawn: (x, y, radius) in display pixels."""
    pixels_per_point = ax.figure.dpi / 72.0
    marks = []
    for line in ax.lines:
        if line.get_marker() in (None, "None", "", " "):
            continue
        xy = line.get_xydata()
        radius = line.get_markersize() * pixels_per_point / 2
        if len(xy):
            marks.extend((x, y, radius) for x, y in line.get_transform().transform(xy))
    for collection in ax.collections:
        if not isinstance(collection, PathCollection):  # scatter points, not bars' lines
            continue
        offsets = collection.get_offsets()
        sizes = collection.get_sizes()  # areas in points squared
        if len(offsets) and len(sizes):
            radius = math.sqrt(float(max(sizes))) * pixels_per_point / 2
            marks.extend((x, y, radius) for x, y in
                         collection.get_offset_transform().transform(offsets))
    return [m for m in marks if all(map(math.isfinite, m))]


@pytest.mark.parametrize("name", list(SPECS))
def test_no_legend_covers_a_mark(name, reference_figures):
    # A legend inside a panel hid TFRecord's lazy/cold mark in the lazy_vs_preloaded panels.
    fig = reference_figures[name]
    for ax in fig.axes:
        legend = ax.get_legend()
        if legend is None:
            continue
        box = legend.get_window_extent()
        covered = [(round(x), round(y)) for x, y, r in marks_in_display(ax)
                   if box.x0 - r < x < box.x1 + r and box.y0 - r < y < box.y1 + r]
        assert not covered, (name, ax.get_title(), covered[:3])


@pytest.mark.parametrize("name", list(SPECS))
def test_every_legend_stands_outside_the_panels(name, reference_figures):
    """A legend inside a panel covers a mark as soon as the data moves under it (run
    9bb3b8 did that to two figures whose legends had been clear): every legend, a panel's or
    the figure's, lies outside every panel, whatever the data."""
    fig = reference_figures[name]
    legends = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
    for legend in [*legends, *fig.legends]:
        box = legend.get_window_extent()
        inside = [ax.get_title() or "untitled panel" for ax in fig.axes
                  if box.overlaps(ax.get_window_extent())]
        assert not inside, (name, [t.get_text() for t in legend.get_texts()][:3], inside)


def test_no_two_reference_figures_share_a_title(reference, reference_figures):
    """Two figures under one title read as the same figure twice: the two studies' page-cache
    figures, and the formats study's bytes and samples per second, did."""

    def title(fig: Figure) -> str:
        if fig._suptitle is not None:
            return fig._suptitle.get_text()
        return " | ".join(ax.get_title() for ax in fig.axes if ax.get_title())

    by_title: dict[str, list[str]] = {}
    present = set(reference.df["study"])
    for name, fig in reference_figures.items():
        if STUDY_OF[name] in present:  # a study the reference lacks draws "not measured"
            by_title.setdefault(title(fig), []).append(name)
    assert {t: names for t, names in by_title.items() if len(names) > 1} == {}
    assert "" not in by_title


def test_a_saved_figure_has_the_same_bytes_every_time(tmp_path):
    # Regenerated figures differ in a diff only where their data did.
    df = synthetic_rows(["memmap", "lmdb"])
    fig = plot_sequential_read(df)
    first = [p.read_bytes() for p in plots.save_figure(fig, tmp_path / "a" / "figure")]
    second = [p.read_bytes() for p in plots.save_figure(fig, tmp_path / "b" / "figure")]
    assert first == second


def test_a_knob_case_that_failed_or_was_skipped_says_why_in_place_of_its_bar(reference):
    """A case killed at its memory budget drew no bar and no word (run 9bb3b8's k = 5
    Parquet row_group_size=1024 case): its place now says why."""
    from storebench.studies.out_of_core.study import plot_ooc_knobs

    df = reference.df[reference.df["status"] == "ok"]
    knob_rows = df[(df["study"] == "out_of_core") & df["case_id"].str.contains("/k=5/knob_")
                   & (df["status"] == "ok")]
    killed, skipped = sorted(knob_rows["case_id"].unique())[:2]
    replaced = []
    for case_id, status, error in (
            (killed, "failed", "worker was killed by SIGKILL during repeat 1 of 1 without "
                               "reporting: the kernel's OOM killer killed a process"),
            (skipped, "skipped", "no room: the budget is below the baseline")):
        row = df[(df["case_id"] == case_id) & (df["metric"] == "case_seconds")].iloc[[0]]
        replaced.append(row.assign(status=status, error=error))
    changed = pd.concat([df[~df["case_id"].isin([killed, skipped])], *replaced])
    texts = [t.get_text() for ax in plot_ooc_knobs(changed).axes for t in ax.texts]
    assert texts.count("k = 5: killed for outgrowing its memory budget") == 1
    assert texts.count("k = 5: skipped: no room") == 1
    assert not [t for ax in plot_ooc_knobs(df).axes for t in ax.texts]


def test_an_out_of_core_panel_left_out_by_design_says_why_and_keeps_the_epoch_ticks(
        ci_study):
    """The synthetic grid runs raw sequential reads at k = 0 and the largest k only: the
    k = 2 panel said "not measured" without why, and its empty axis put epoch ticks at 0..1.
    (The reference's ImageNet-like grid runs k = 0 and 5 only, so the ci study's synthetic
    rows show it.)"""
    from storebench.studies.out_of_core.study import K_VALUES, SEQUENTIAL_KS, SEQUENTIAL_LEFT_OUT

    fig = SPECS["out_of_core_epochs"].draw(Results.load(ci_study[0]))
    fig.draw_without_rendering()
    columns = len(K_VALUES)
    panels = {(i // columns, K_VALUES[i % columns]): ax for i, ax in enumerate(fig.axes)
              if ax.get_subplotspec() is not None}
    left_out = [k for k in K_VALUES if k not in SEQUENTIAL_KS]
    assert left_out
    for (row, k), ax in panels.items():
        texts = [t.get_text() for t in ax.texts]
        if row == 0 and k in left_out:
            assert texts == [SEQUENTIAL_LEFT_OUT] and not ax.lines
        else:
            assert texts == [] and ax.lines
        assert list(ax.get_xticks()) == [1, 2] and ax.get_xlim()[0] < 1 < 2 < ax.get_xlim()[1]


def test_parquets_missing_full_shuffle_line_is_said_in_its_row(reference_figures):
    """Parquet has no full-shuffle line (BLOCK_ONLY_FORMATS): the shuffle row says so, and
    only that row."""
    fig = reference_figures["out_of_core_epochs"]
    labels = [ax.get_ylabel() for ax in fig.axes if ax.get_ylabel()]
    assert len(labels) == 3
    assert [i for i, label in enumerate(labels) if "parquet: block shuffle only" in label] == [2]
