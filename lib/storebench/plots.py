"""Drawing helpers every study's figures share.

Figures are built with ``matplotlib.figure.Figure`` directly (no pyplot, so no global figure
state and no display needed; a notebook displays the returned Figure). Each format keeps one
colour and one position everywhere, taken from the formats registry; each loader path keeps
one colour, taken from the loader-path registry. Bars and points are medians over the timed
repeats; error bars span min to max. Every figure function is pure: ``plot_x(df, *, ...) ->
Figure``; the study modules (``storebench.studies``) hold the figures themselves, and saving
is the caller's job (``save_figure``; ``report.figures.plot_all`` draws them all).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

from .results import (
    format_order,
    mark_drawn,
    ordered,
    reliable_peaks,
    resident_fractions,
    summary_table,
)
from .text import MULTIPLY, cache_label

CACHE_HATCHES = {"cold": "//", "warm": "", "": ""}
# One colour per loader family, wherever lazy and preloaded loading are compared.
LOADER_COLOURS = {"lazy": "#1f77b4", "preloaded": "#ff7f0e"}
# matplotlib's tab10, then tab20's light shades: one colour each for every format and every
# loader path of the registries (the peers' included).
PALETTE = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf",
    "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94", "#f7b6d2", "#c7c7c7",
    "#dbdb8d", "#9edae5",
    "#393b79", "#637939", "#8c6d31", "#843c39",
)
# Axis titles: words and units, never a column name.
METRIC_TITLES = {
    "samples_per_s": "samples per second",
    "file_MBps": "dataset bytes read per second (MB/s)",
    "read_MBps": "sample bytes delivered per second (MB/s)",
    "time_to_first_batch_s": "time to first batch (s)",
    "peak_pss_bytes": "peak PSS of the process tree (MB)",
    "write_seconds": "write time (s)",
    "size_ratio": "bytes on disk / raw pixel bytes",
    "accelerator_utilisation": "accelerator utilisation",
    "stall_fraction": "fraction of time the accelerator waits",
}


def metric_title(metric: str) -> str:
    return METRIC_TITLES.get(metric, metric.replace("_", " "))


def format_colours(formats: Sequence[str], order: Sequence[str] | None = None) -> dict:
    """A stable colour per format: the registry position decides it, not what is plotted."""
    order = list(order) if order is not None else format_order()
    full = ordered(list(order) + list(formats), order)
    return {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(full)}


def path_colour(name: str) -> str:
    """A stable colour per loader path, from the loader-path registry's order."""
    from .loaders.paths import LOADER_PATHS

    names = list(LOADER_PATHS)
    return PALETTE[names.index(name) % len(PALETTE)] if name in names else "grey"


def summarise(df: pd.DataFrame, metric: str, by: Sequence[str]) -> pd.DataFrame:
    """Median, min, max and count of ``metric`` per group (``results.summary_table``, so a
    figure and the sentence under it use the same rows)."""
    table = summary_table(df, metric, by)
    return table.rename(columns={"repeats": "count"})


def empty_figure(message: str) -> Figure:
    fig = Figure(figsize=(6, 2))
    ax = fig.add_subplot()
    ax.axis("off")
    ax.text(0.5, 0.5, message, ha="center", va="center")
    return fig


def tick_text(value: float, _position=None) -> str:
    if value == 0:
        return "0"
    if value < 0:
        return ""
    for factor, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= factor:
            return f"{value / factor:g}{suffix}"
    return f"{value:g}"


# Round steps within a decade for a view narrower than one, coarsest first: they stay evenly
# spread on the log scale, where evenly spaced linear ticks leave its low end unlabelled.
NARROW_LOG_SUBS = ((1.0, 2.0, 3.0, 5.0), (1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0))
# A narrow view's outermost labels lie within this factor of its ends.
NARROW_LOG_REACH = 1.5
# Ticks within each decade for a view wider than one, densest first: 1-2-5 where their labels
# fit, else 1-3 (steps of half a decade), else 1.
WIDE_LOG_SUBS = ((1.0, 2.0, 5.0), (1.0, 3.0), (1.0,))
# Tick labels keep this many font sizes apart; a digit of the default sans font is 0.64 of
# one wide (the widest label character; "k" and "." are narrower).
LABEL_GAP_EM = 0.5
CHARACTER_WIDTH_EM = 0.64


class ReadableLogLocator(LogLocator):
    """Ticks at 1, 2 and 5 of every decade, or where their labels would run into each other
    on the axis as drawn (a wide range on a short axis), the densest of ``WIDE_LOG_SUBS``,
    then every second, third... decade, whose labels keep ``LABEL_GAP_EM`` apart. Where the
    view spans less than a decade (too few of those would fall inside it): finer round steps
    (``NARROW_LOG_SUBS``), the first that puts three ticks inside it, reaching within
    ``NARROW_LOG_REACH`` of both ends; else evenly spaced round values."""

    def __init__(self) -> None:
        super().__init__(base=10, subs=WIDE_LOG_SUBS[0])

    def tick_values(self, vmin, vmax):
        low, high = sorted((vmin, vmax))
        if low > 0 and high / low < 10:
            for subs in NARROW_LOG_SUBS:
                ticks = LogLocator(base=10, subs=subs, numticks=20).tick_values(low, high)
                inside = ticks[(ticks >= low) & (ticks <= high)]
                if (len(inside) >= 3 and inside[0] <= low * NARROW_LOG_REACH
                        and inside[-1] >= high / NARROW_LOG_REACH):
                    return ticks
            return MaxNLocator(nbins=5).tick_values(low, high)
        if low <= 0 or self.axis is None:
            return super().tick_values(vmin, vmax)
        candidates = [LogLocator(base=10, subs=subs).tick_values(low, high)
                      for subs in WIDE_LOG_SUBS]
        first, last = math.floor(math.log10(low)), math.ceil(math.log10(high))
        candidates += [10.0 ** np.arange(first - first % stride, last + stride, stride)
                       for stride in range(2, max(last - first, 2) + 1)]
        for ticks in candidates:
            if labels_fit(self.axis, ticks, low, high):
                return ticks
        return candidates[-1]


def labels_fit(axis, ticks, low: float, high: float) -> bool:
    """Whether the ``tick_text`` labels of ``ticks`` inside [low, high] keep at least
    ``LABEL_GAP_EM`` apart on ``axis`` (a log axis) at its drawn length: side by side on an
    x axis (each label's width from its characters), stacked on a y axis (one line each)."""
    inside = np.asarray([t for t in ticks if low <= t <= high], dtype=float)
    if len(inside) < 2:
        return True
    figure = axis.axes.figure
    box = axis.axes.get_window_extent()
    horizontal = axis.axis_name == "x"
    points = (box.width if horizontal else box.height) * 72.0 / figure.dpi
    em = axis.get_major_ticks(1)[0].label1.get_fontsize()
    apart = np.diff(np.log10(inside)) * points / math.log10(high / low)
    if horizontal:
        widths = np.array([len(tick_text(t)) for t in inside]) * CHARACTER_WIDTH_EM * em
        needed = (widths[:-1] + widths[1:]) / 2 + LABEL_GAP_EM * em
    else:
        needed = np.full(len(apart), (1 + LABEL_GAP_EM) * em)
    return bool((apart >= needed).all())


def legend_below(fig: Figure, axes: Sequence, *, loc: str = "outside lower center",
                 fontsize: str = "small", ncols: int | None = None) -> None:
    """One legend for ``axes`` below the panels, each label once in the order first drawn.
    Inside a panel, marks that move with the data end up under it, whatever corner
    matplotlib picks for the data drawn today."""
    entries: dict[str, object] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            entries.setdefault(label, handle)
    if entries:
        fig.legend(list(entries.values()), list(entries), loc=loc, fontsize=fontsize,
                   ncols=ncols or min(len(entries), 4))


def log_axis(ax, which: str = "y") -> None:
    """A log axis with ticks at 1, 2 and 5 of every decade (fewer where their labels would
    run into each other, finer round steps over a narrow range), labelled ``2k``, ``50k``..."""
    axis = ax.yaxis if which == "y" else ax.xaxis
    (ax.set_yscale if which == "y" else ax.set_xscale)("log")
    axis.set_major_locator(ReadableLogLocator())
    axis.set_major_formatter(FuncFormatter(tick_text))
    axis.set_minor_formatter(NullFormatter())


def linear_axis(ax, which: str = "y") -> None:
    """A linear axis labelled as ``log_axis`` labels its ticks (``2k``, ``50k``...)."""
    (ax.yaxis if which == "y" else ax.xaxis).set_major_formatter(FuncFormatter(tick_text))


def profile_caption(df: pd.DataFrame, encoding: str | None = None, *,
                    samples: int | None = None) -> str:
    """``"20,000 samples, 64×64×3, raw"``: the sample count and image size of the rows'
    profile (one encoding, or every encoding present), from ``data_gen``'s profiles, or
    ``samples`` for the count where the rows read a set cut shorter; for an imported
    dataset's rows (their profile is its name), ``"my_images, mixed"``."""
    import data_gen

    profiles = [p for p in dict.fromkeys(df.get("profile", pd.Series(dtype=str))) if p]
    encodings = [encoding] if encoding else ordered(df["encoding"].dropna(),
                                                    ("raw", "png", "jpeg", "mixed"))
    parts = []
    for name in profiles[:1]:
        try:
            profile = data_gen.get_profile(name)
        except KeyError:
            parts += [f"{name}, {enc}" for enc in encodings]
            continue
        for enc in encodings:
            try:
                spec = profile.spec_for(enc)
            except KeyError:
                continue
            h, w, c = spec.image_shape
            count = spec.num_samples if samples is None else samples
            parts.append(f"{count:,} samples, {h}{MULTIPLY}{w}{MULTIPLY}{c}, {enc}")
    return "; ".join(parts)


def bars(ax, labels: Sequence[str], summary: pd.DataFrame, *, colours=None,
         horizontal: bool = False, scale: float = 1.0) -> None:
    """One bar per row of ``summary`` (median, low, high) with a min-max error bar."""
    positions = np.arange(len(summary))
    median = summary["median"].to_numpy(dtype=float) * scale
    error = [median - summary["low"].to_numpy(dtype=float) * scale,
             summary["high"].to_numpy(dtype=float) * scale - median]
    colours = colours or [PALETTE[i % len(PALETTE)] for i in positions]
    if horizontal:
        ax.barh(positions, median, color=colours, edgecolor="black", linewidth=0.5)
        ax.errorbar(median, positions, xerr=error, fmt="none", ecolor="black", capsize=2)
        ax.set_yticks(positions, labels, fontsize="small")
        ax.invert_yaxis()
    else:
        ax.bar(positions, median, color=colours, edgecolor="black", linewidth=0.5)
        ax.errorbar(positions, median, yerr=error, fmt="none", ecolor="black", capsize=2)
        ax.set_xticks(positions, labels, rotation=30, ha="right", fontsize="small")


def grouped(ax, summary: pd.DataFrame, *, formats: list[str], colours: dict,
            series: list[str], series_column: str | None, dots: bool = False) -> None:
    """One group per format, one mark per series (e.g. cold/warm): bars from zero on a
    linear axis, or dots (hollow for cold) where a log axis is needed."""
    width = 0.8 / max(len(series), 1)
    for s, name in enumerate(series):
        part = summary if series_column is None else summary[summary[series_column] == name]
        for f, fmt in enumerate(formats):
            row = part[part["format"] == fmt]
            if row.empty:
                continue
            median, low, high = (float(row[c].iloc[0]) for c in ("median", "low", "high"))
            x = f + (s - (len(series) - 1) / 2) * width
            if dots:
                ax.plot(x, median, marker="o", markersize=7, color=colours[fmt],
                        markerfacecolor="white" if name == "cold" else colours[fmt])
            else:
                ax.bar(x, median, width * 0.95, color=colours[fmt], edgecolor="black",
                       linewidth=0.5, hatch=CACHE_HATCHES.get(name, ""))
            ax.errorbar(x, median, yerr=[[median - low], [high - median]], fmt="none",
                        ecolor="black", capsize=2, linewidth=0.8)
    ax.set_xticks(range(len(formats)), formats, rotation=30, ha="right")
    ax.set_xlim(-0.6, len(formats) - 0.4)
    if dots:
        log_axis(ax)
    if series_column is not None:
        for name in series:
            # Neutral legend entries: colour belongs to the format, fill/hatch to the series.
            if dots:
                ax.plot([], [], marker="o", linestyle="none", color="grey", label=cache_label(name),
                        markerfacecolor="white" if name == "cold" else "grey")
            else:
                ax.bar([], [], color="lightgrey", edgecolor="black",
                       hatch=CACHE_HATCHES.get(name, ""), label=cache_label(name))


def plot_resident_fraction(df: pd.DataFrame, *, title: str = "") -> Figure:
    """The page-cache residency each case started its repeats with: the evidence that cold
    was cold (near 0) and warm was warm (near 1)."""
    rows = resident_fractions(df)
    if rows.empty:
        return empty_figure("no cache-controlled rows")
    caches = ordered(rows["cache"], ("cold", "warm"))
    fig = Figure(figsize=(6, 3.5), layout="constrained")
    ax = fig.add_subplot()
    for position, cache in enumerate(caches):
        values = rows.loc[rows["cache"] == cache, "resident_fraction"].to_numpy()
        jitter = np.linspace(-0.2, 0.2, len(values)) if len(values) > 1 else np.zeros(1)
        ax.scatter(position + jitter, values, s=10, alpha=0.6,
                   label=f"{cache_label(cache)}: {len(values)} repeats")
    ax.set_xticks(range(len(caches)), [f"{cache_label(c)} cases" for c in caches])
    ax.set_ylim(-0.05, 1.05)
    ax.set_ylabel("fraction of the dataset's files\nin the page cache before the repeat")
    # Named by study: several studies draw this figure, and their titles must tell them apart.
    studies = [name.replace("_", " ") for name in dict.fromkeys(rows["study"])]
    which = f"{', '.join(studies)} stud{'y' if len(studies) == 1 else 'ies'}"
    ax.set_title(title or f"Measured page-cache state before each timed repeat\n({which})")
    legend_below(fig, [ax])
    return fig


# Peak-memory figures show this many cases, the highest first; the rest are counted below.
PEAK_MEMORY_ROWS = 12
# What the two bars of a peak-memory figure count. A memory-mapped file's pages that the
# tree touched count in both: they are page cache the kernel can drop, yet smaps charges them
# to the process, so a mapped read of a whole set peaks at about the set's size.
PSS_LABEL = "PSS: private pages + a share of the pages shared with other processes"
USS_LABEL = "USS: pages only one process maps (summed over the tree)"
MAPPED_PAGES_NOTE = ("memory-mapped reads count the file pages they touched\n"
                     "(page cache the kernel can reclaim) in both bars")


def plot_peak_memory(df: pd.DataFrame, *, label_column: str, title: str,
                     size_column: str | None = None, top: int = PEAK_MEMORY_ROWS) -> Figure:
    """Peak PSS and USS of the whole process tree (median over repeats) for the ``top``
    cases with the highest PSS, highest first, one pair of bars per value of
    ``label_column`` (a readable label the study computes, never a case id). With
    ``size_column`` (bytes), each case's dataset size is marked on its bars. The title's
    second line names the highest case against its dataset; the x label counts the rest.
    Repeats timed too briefly to sample a peak are left out (``results.reliable_peaks``)."""
    sampled = summarise(df, "peak_pss_bytes", [label_column])
    df = reliable_peaks(df)
    pss = summarise(df, "peak_pss_bytes", [label_column])
    uss = summarise(df, "peak_uss_bytes", [label_column])
    if pss.empty and not sampled.empty:
        # Short regions (the ci profile's few batches) sample no peak; say so, draw none.
        return empty_figure(f"all {len(sampled)} cases were timed for under five sampling "
                            "periods: too briefly to sample a peak (see kernel_peak_bytes)")
    if pss.empty:
        return empty_figure("no memory rows")
    merged = pss.merge(uss, on=label_column, suffixes=("_pss", "_uss"))
    merged = merged.sort_values("median_pss", ascending=False, kind="stable")
    sizes = (df.dropna(subset=[size_column]).groupby(label_column)[size_column].median()
             if size_column else pd.Series(dtype=float))
    shown, rest = merged.iloc[:top], merged.iloc[top:]
    mark_drawn([*shown["stat_pss"], *shown["stat_uss"]])
    fig = Figure(figsize=(7.5, 0.42 * len(shown) + 2.2), layout="constrained")
    ax = fig.add_subplot()
    y = np.arange(len(shown))
    ax.barh(y - 0.2, shown["median_pss"] / 1e6, 0.4, label=PSS_LABEL, color="#1f77b4")
    ax.barh(y + 0.2, shown["median_uss"] / 1e6, 0.4, label=USS_LABEL, color="#ff7f0e")
    marked = [(i, sizes[label] / 1e6) for i, label in enumerate(shown[label_column])
              if label in sizes.index]
    if marked:
        ax.plot([m for _, m in marked], [i for i, _ in marked], linestyle="none",
                marker="|", markersize=18, markeredgewidth=2.5, color="black",
                label="the dataset's size on disk")
    ax.set_yticks(y, shown[label_column], fontsize="small")
    ax.invert_yaxis()
    ax.set_xlim(left=0)
    xlabel = f"peak memory of the process tree (MB)\n{MAPPED_PAGES_NOTE}"
    if not rest.empty:
        xlabel += (f"\n{len(rest)} more cases not shown, each below "
                   f"{rest['median_pss'].max() / 1e6:.0f} MB PSS")
    ax.set_xlabel(xlabel)
    highest = shown.iloc[0]
    line = f"Highest: {highest[label_column]}, {highest['median_pss'] / 1e6:.0f} MB PSS"
    if highest[label_column] in sizes.index:
        ratio = highest["median_pss"] / sizes[highest[label_column]]
        line += f", {ratio:.1f}{MULTIPLY} its dataset"
    fig.suptitle(f"{title}\n{line}", fontsize="medium")
    legend_below(fig, [ax], ncols=1)
    return fig


def titled(fig: Figure, question: str, takeaway: str = "") -> None:
    """The figure's title: the question it answers, then a one-line answer computed from
    the rows drawn (the caller's ``takeaway``)."""
    fig.suptitle(f"{question}\n{takeaway}" if takeaway else question, fontsize="medium")


def rates_need_log(values) -> bool:
    """Whether rates spread over more than two decades: only then does a log axis show them
    better than bars from zero, on which a length is a rate and 5% looks like 5%."""
    values = np.asarray([v for v in values if np.isfinite(v) and v > 0], dtype=float)
    return len(values) > 1 and values.max() / values.min() > 100.0


def save_figure(fig: Figure, path_stem: Path | str) -> list[Path]:
    """Write ``<path_stem>.png`` and ``<path_stem>.svg``; returns both paths."""
    stem = Path(path_stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = []
    # A fixed salt and no date: the same results give the same SVG bytes, so a regenerated
    # figure shows in a diff only where it changed (clip-path ids are random otherwise).
    with matplotlib.rc_context({"svg.hashsalt": "storebench"}):
        for suffix, options in ((".png", {"dpi": 150}),
                                (".svg", {"metadata": {"Date": None}})):
            path = stem.with_name(stem.name + suffix)
            fig.savefig(path, bbox_inches="tight", **options)
            paths.append(path)
    return paths


def question_title(fig: Figure, question: str, takeaway: str = "") -> None:
    """The figure's title: the question it answers, then the answer computed from the rows
    (the caller's sentence, never typed in), wrapped to the figure's width."""
    import textwrap

    width = max(40, int(fig.get_figwidth() * 13))
    lines = textwrap.wrap(question, width) + textwrap.wrap(takeaway, int(width * 1.1))
    fig.suptitle("\n".join(lines), fontsize="medium")


def family_handles(colours: dict, labels: dict | None = None) -> list:
    """Legend patches for a colour per family (``{family: colour}``), labelled from
    ``labels`` where given."""
    from matplotlib.patches import Patch

    return [Patch(facecolor=colour, edgecolor="black", linewidth=0.5,
                  label=(labels or {}).get(family, family))
            for family, colour in colours.items()]
