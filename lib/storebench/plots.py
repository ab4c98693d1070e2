"""Figures from results alone: ``plot_x(df, *, ...) -> Figure``, one function per figure.

Figures are built with ``matplotlib.figure.Figure`` directly (no pyplot, so no global figure
state and no display needed; a notebook displays the returned Figure). Each format keeps
one colour and one position everywhere, taken from the order of the formats registry.
Bars and points are medians over the timed repeats; error bars span min to max.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

ENCODING_ORDER = ("raw", "png", "jpeg")
CACHE_HATCHES = {"cold": "//", "warm": "", "": ""}
_PALETTE = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf",
)
MB_PER_GB = 1000.0


def default_format_order() -> list[str]:
    """The formats registry's order (the formats package is imported on first use)."""
    from storebench.formats import FORMATS

    return list(FORMATS)


def ordered(values, order: Sequence[str]) -> list[str]:
    """``values`` sorted by ``order``; unknown values after, alphabetically."""
    rank = {name: i for i, name in enumerate(order)}
    return sorted(set(values), key=lambda v: (rank.get(v, len(rank)), str(v)))


def format_colours(formats: Sequence[str], order: Sequence[str] | None = None) -> dict:
    """A stable colour per format: the registry position decides it, not what is plotted."""
    order = list(order) if order is not None else default_format_order()
    full = ordered(list(order) + list(formats), order)
    return {name: _PALETTE[i % len(_PALETTE)] for i, name in enumerate(full)}


def summarise(df: pd.DataFrame, metric: str, by: Sequence[str]) -> pd.DataFrame:
    """Median, min, max and count of ``metric`` over the ok timed repeats, per group."""
    rows = df[(df["metric"] == metric) & (df["status"] == "ok") & (df["repeat"] >= 0)]
    grouped = rows.groupby(list(by), dropna=False, sort=False)["value"]
    summary = grouped.agg(median="median", low="min", high="max", count="count")
    return summary.reset_index()


def _unit(df: pd.DataFrame, metric: str) -> str:
    units = df.loc[df["metric"] == metric, "unit"].unique()
    return str(units[0]) if len(units) else ""


def _empty_figure(message: str) -> Figure:
    fig = Figure(figsize=(6, 2))
    ax = fig.add_subplot()
    ax.axis("off")
    ax.text(0.5, 0.5, message, ha="center", va="center")
    return fig


def _grouped(ax, summary: pd.DataFrame, *, formats: list[str], colours: dict,
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
        ax.set_yscale("log")
    if series_column is not None:
        for name in series:
            # Neutral legend entries: colour belongs to the format, fill/hatch to the series.
            if dots:
                ax.plot([], [], marker="o", linestyle="none", color="grey", label=name,
                        markerfacecolor="white" if name == "cold" else "grey")
            else:
                ax.bar([], [], color="lightgrey", edgecolor="black",
                       hatch=CACHE_HATCHES.get(name, ""), label=name)


def plot_build_cost(df: pd.DataFrame, *, format_order: Sequence[str] | None = None) -> Figure:
    """Build cost per dataset: write time, and bytes on disk relative to the raw pixels."""
    df = df[df["study"] == "formats"] if "study" in df else df
    encodings = ordered(df.loc[df["metric"] == "write_seconds", "encoding"], ENCODING_ORDER)
    if not encodings:
        return _empty_figure("no build-cost rows")
    colours = format_colours(df["format"].unique(), format_order)
    order = list(format_order) if format_order is not None else default_format_order()
    panels = (("write_seconds", "write time (s)"), ("size_ratio", "bytes on disk / raw bytes"))
    fig = Figure(figsize=(4 * len(encodings), 6), layout="constrained")
    axes = fig.subplots(len(panels), len(encodings), squeeze=False)
    for col, encoding in enumerate(encodings):
        part = df[df["encoding"] == encoding]
        formats = ordered(part.loc[part["metric"] == "write_seconds", "format"], order)
        for row, (metric, label) in enumerate(panels):
            ax = axes[row][col]
            summary = summarise(part, metric, ["format"])
            _grouped(ax, summary, formats=formats, colours=colours, series=[""],
                     series_column=None)
            if metric == "size_ratio":
                ax.axhline(1.0, color="grey", linewidth=0.8, linestyle=":")
            ax.set_ylabel(label if col == 0 else "")
            if row == 0:
                ax.set_title(f"{encoding} samples")
    fig.suptitle("Build cost")
    return fig


def plot_sequential_read(
    df: pd.DataFrame,
    *,
    metric: str = "file_MBps",
    limits: dict | None = None,
    format_order: Sequence[str] | None = None,
) -> Figure:
    """Full sequential read through the Reader, cold and warm, per format and encoding.

    With ``limits`` (env.json's), the cold sequential and page-cache read limits of the same
    run are drawn as lines when the metric is in MB/s.
    """
    df = df[(df["access"] == "sequential") & (df["loader"] == "reader")]
    encodings = ordered(df.loc[df["metric"] == metric, "encoding"], ENCODING_ORDER)
    if not encodings:
        return _empty_figure(f"no sequential-read rows with {metric}")
    colours = format_colours(df["format"].unique(), format_order)
    order = list(format_order) if format_order is not None else default_format_order()
    unit = _unit(df, metric)
    fig = Figure(figsize=(4 * len(encodings), 4), layout="constrained")
    axes = fig.subplots(1, len(encodings), squeeze=False)[0]
    for ax, encoding in zip(axes, encodings, strict=True):
        part = df[df["encoding"] == encoding]
        formats = ordered(part.loc[part["metric"] == metric, "format"], order)
        summary = summarise(part, metric, ["format", "cache"])
        caches = ordered(summary["cache"], ("cold", "warm"))
        _grouped(ax, summary, formats=formats, colours=colours, series=caches,
                 series_column="cache", dots=True)
        if limits and unit == "MB/s":
            for key, label, style in (("cold_seq_read_GBps", "cold read limit", "--"),
                                      ("page_cache_read_GBps", "page-cache limit", ":")):
                if isinstance(limits.get(key), int | float):
                    ax.axhline(limits[key] * MB_PER_GB, color="black", linestyle=style,
                               linewidth=0.9, label=label)
        ax.set_title(f"{encoding} samples")
        ax.set_ylabel(f"{metric} ({unit})" if ax is axes[0] else "")
        ax.legend(fontsize="small")
    fig.suptitle("Sequential read through the Reader (median, min-max of repeats)")
    return fig


def plot_resident_fraction(df: pd.DataFrame, *, study: str | None = None) -> Figure:
    """The page-cache residency each case started its repeats with: the evidence that cold
    was cold (near 0) and warm was warm (near 1)."""
    if study is not None:
        df = df[df["study"] == study]
    rows = df[(df["repeat"] >= 0) & df["resident_fraction"].notna() & (df["cache"] != "")]
    rows = rows.drop_duplicates(["run_id", "case_id", "repeat"])
    if rows.empty:
        return _empty_figure("no cache-controlled rows")
    fig = Figure(figsize=(6, 3.5), layout="constrained")
    ax = fig.add_subplot()
    for position, cache in enumerate(ordered(rows["cache"], ("cold", "warm"))):
        values = rows.loc[rows["cache"] == cache, "resident_fraction"].to_numpy()
        jitter = np.linspace(-0.2, 0.2, len(values)) if len(values) > 1 else np.zeros(1)
        ax.scatter(position + jitter, values, s=10, alpha=0.6, label=f"{cache} (n={len(values)})")
    ax.set_xticks(range(len(ordered(rows["cache"], ("cold", "warm")))),
                  ordered(rows["cache"], ("cold", "warm")))
    ax.set_ylim(-0.05, 1.05)
    ax.set_ylabel("resident fraction before the repeat")
    ax.set_title("Measured page-cache state" + (f" ({study})" if study else ""))
    ax.legend(fontsize="small")
    return fig


def plot_peak_memory(df: pd.DataFrame, *, study: str | None = None,
                     group: Sequence[str] = ("format", "encoding", "loader", "prefetcher",
                                             "workers", "cache")) -> Figure:
    """Peak PSS and USS of the whole process tree per case (median over repeats)."""
    if study is not None:
        df = df[df["study"] == study]
    pss = summarise(df, "peak_pss_bytes", ["case_id"])
    uss = summarise(df, "peak_uss_bytes", ["case_id"])
    if pss.empty:
        return _empty_figure("no memory rows")
    merged = pss.merge(uss, on="case_id", suffixes=("_pss", "_uss"))
    fig = Figure(figsize=(8, 0.3 * len(merged) + 1.5), layout="constrained")
    ax = fig.add_subplot()
    y = np.arange(len(merged))
    ax.barh(y - 0.2, merged["median_pss"] / 1e6, 0.4, label="PSS", color="#1f77b4")
    ax.barh(y + 0.2, merged["median_uss"] / 1e6, 0.4, label="USS", color="#ff7f0e")
    ax.set_yticks(y, merged["case_id"], fontsize="x-small")
    ax.invert_yaxis()
    ax.set_xlabel("peak memory of the process tree (MB)")
    ax.set_title("Peak memory" + (f" ({study})" if study else ""))
    ax.legend(fontsize="small")
    return fig


def plot_metric_lines(
    df: pd.DataFrame,
    *,
    metric: str,
    x: str,
    series: str,
    panels: str = "format",
    title: str = "",
    log_y: bool = False,
    format_order: Sequence[str] | None = None,
) -> Figure:
    """``metric`` against a numeric grid column (e.g. workers), one line per ``series``
    value (e.g. prefetcher), one panel per ``panels`` value; medians with min-max bars."""
    rows = df[df["metric"] == metric]
    if rows.empty:
        return _empty_figure(f"no rows with {metric}")
    order = list(format_order) if format_order is not None else default_format_order()
    panel_values = ordered(rows[panels], order if panels == "format" else ())
    unit = _unit(rows, metric)
    fig = Figure(figsize=(4 * len(panel_values), 3.5), layout="constrained")
    axes = fig.subplots(1, len(panel_values), squeeze=False, sharey=True)[0]
    for ax, panel in zip(axes, panel_values, strict=True):
        summary = summarise(rows[rows[panels] == panel], metric, [series, x])
        for name in ordered(summary[series].astype(str), ()):
            line = summary[summary[series].astype(str) == name].sort_values(x)
            xs = line[x].astype(float).to_numpy()
            median = line["median"].to_numpy()
            ax.errorbar(xs, median, yerr=[median - line["low"], line["high"] - median],
                        marker="o", capsize=2, label=name or "(none)")
        ax.set_title(str(panel))
        ax.set_xlabel(x)
        if log_y:
            ax.set_yscale("log")
        ax.legend(fontsize="small")
    axes[0].set_ylabel(f"{metric} ({unit})")
    if title:
        fig.suptitle(title)
    return fig


def with_params(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` plus one ``param_<name>`` column per key of the ``params`` JSON objects."""
    parsed = df["params"].map(json.loads)
    names = sorted({name for params in parsed for name in params})
    out = df.copy()
    for name in names:
        out[f"param_{name}"] = parsed.map(lambda p, name=name: p.get(name))
    return out


def plot_by_format(
    df: pd.DataFrame,
    *,
    metric: str,
    series: Sequence[str],
    title: str = "",
    format_order: Sequence[str] | None = None,
) -> Figure:
    """``metric`` per format (one panel per encoding, log axis), one mark per combination
    of the ``series`` columns (e.g. loader and cache); medians with min-max bars."""
    rows = df[df["metric"] == metric].copy()
    if rows.empty:
        return _empty_figure(f"no rows with {metric}")
    rows["series"] = rows[list(series)].astype(str).agg("/".join, axis=1)
    order = list(format_order) if format_order is not None else default_format_order()
    colours = format_colours(rows["format"].unique(), format_order)
    encodings = ordered(rows["encoding"], ENCODING_ORDER)
    fig = Figure(figsize=(4.5 * len(encodings), 4), layout="constrained")
    axes = fig.subplots(1, len(encodings), squeeze=False)[0]
    markers = "osD^vP*X"
    for ax, encoding in zip(axes, encodings, strict=True):
        part = rows[rows["encoding"] == encoding]
        formats = ordered(part["format"], order)
        summary = summarise(part, metric, ["format", "series"])
        names = sorted(summary["series"].unique())
        width = 0.8 / max(len(names), 1)
        for s, name in enumerate(names):
            marker = markers[s % len(markers)]
            for f, fmt in enumerate(formats):
                row = summary[(summary["format"] == fmt) & (summary["series"] == name)]
                if row.empty:
                    continue
                median, low, high = (float(row[c].iloc[0]) for c in ("median", "low", "high"))
                x = f + (s - (len(names) - 1) / 2) * width
                ax.errorbar(x, median, yerr=[[median - low], [high - median]], fmt=marker,
                            color=colours[fmt], ecolor="black", capsize=2, markersize=6)
            ax.plot([], [], marker, color="grey", label=name)
        ax.set_xticks(range(len(formats)), formats, rotation=30, ha="right")
        ax.set_yscale("log")
        ax.set_title(f"{encoding} samples")
        ax.legend(fontsize="x-small")
    axes[0].set_ylabel(f"{metric} ({_unit(rows, metric)})")
    if title:
        fig.suptitle(title)
    return fig


def plot_prefetch_scaling(df: pd.DataFrame, *, metric: str = "samples_per_s") -> Figure:
    """Throughput against worker count, one line per prefetcher (and start method), one
    panel per dataset."""
    rows = with_params(df)
    method = rows.get("param_start_method")
    rows["variant"] = rows["prefetcher"]
    if method is not None:
        spawned = method.isin(["spawn", "forkserver"])
        rows.loc[spawned, "variant"] = rows["prefetcher"] + " (" + method[spawned] + ")"
    rows["dataset"] = rows["format"] + "-" + rows["encoding"]
    return plot_metric_lines(rows, metric=metric, x="workers", series="variant",
                             panels="dataset", title="Prefetchers: throughput vs workers",
                             log_y=True)


def plot_feed(df: pd.DataFrame) -> Figure:
    """Accelerator utilisation and stall fraction against the emulated compute time per
    batch, one line per prefetcher (and copy mode)."""
    rows = with_params(df)
    if "param_compute_ms" not in rows or rows.empty:
        return _empty_figure("no feed rows")
    rows["compute_ms"] = rows["param_compute_ms"].astype(float)
    def flag(name: str) -> pd.Series:
        column = rows.get(f"param_{name}")
        if column is None:
            return pd.Series(False, index=rows.index)
        return column.map(lambda value: value is True)

    copy_mode = np.where(flag("non_blocking"), " async", np.where(flag("pinned"), " pinned", ""))
    rows["variant"] = rows["prefetcher"] + "/w" + rows["workers"].astype(str) + copy_mode
    fig = Figure(figsize=(9, 3.5), layout="constrained")
    axes = fig.subplots(1, 2)
    for ax, metric in zip(axes, ("accelerator_utilisation", "stall_fraction"), strict=True):
        summary = summarise(rows, metric, ["variant", "compute_ms"])
        for name in sorted(summary["variant"].unique()):
            line = summary[summary["variant"] == name].sort_values("compute_ms")
            median = line["median"].to_numpy()
            ax.errorbar(line["compute_ms"], median,
                        yerr=[median - line["low"], line["high"] - median],
                        marker="o", capsize=2, label=name)
        ax.set_xlabel("emulated compute per batch (ms)")
        ax.set_ylabel(metric.replace("_", " "))
        ax.set_ylim(-0.02, 1.02)
        ax.legend(fontsize="small")
    fig.suptitle("Feeding the accelerator")
    return fig


def plot_targets(df: pd.DataFrame) -> Figure:
    """Each target's compared paths side by side (samples/s, medians with min-max)."""
    rows = df[df["metric"].str.endswith(".samples_per_s")].copy()
    if rows.empty:
        return _empty_figure("no target rows")
    rows["path"] = rows["metric"].str.removesuffix(".samples_per_s")
    targets = list(dict.fromkeys(rows["loader"]))
    fig = Figure(figsize=(3.5 * len(targets), 3.8), layout="constrained")
    axes = fig.subplots(1, len(targets), squeeze=False)[0]
    for ax, target in zip(axes, targets, strict=True):
        summary = pd.concat([
            summarise(rows[(rows["loader"] == target) & (rows["path"] == path)],
                      f"{path}.samples_per_s", ["path"])
            for path in dict.fromkeys(rows.loc[rows["loader"] == target, "path"])
        ])
        x = np.arange(len(summary))
        median = summary["median"].to_numpy()
        ax.bar(x, median, color=[_PALETTE[i % len(_PALETTE)] for i in x], edgecolor="black",
               linewidth=0.5)
        ax.errorbar(x, median, yerr=[median - summary["low"], summary["high"] - median],
                    fmt="none", ecolor="black", capsize=2)
        ax.set_xticks(x, summary["path"], rotation=30, ha="right", fontsize="small")
        ax.set_title(target)
    axes[0].set_ylabel("samples/s")
    fig.suptitle("Performance targets: paths compared in the same run")
    return fig


def save_figure(fig: Figure, path_stem: Path | str) -> list[Path]:
    """Write ``<path_stem>.png`` and ``<path_stem>.svg``; returns both paths."""
    stem = Path(path_stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = []
    for suffix, options in ((".png", {"dpi": 150}), (".svg", {})):
        path = stem.with_name(stem.name + suffix)
        fig.savefig(path, bbox_inches="tight", **options)
        paths.append(path)
    return paths


FigureFunction = Callable[[pd.DataFrame, dict], Figure]

# study -> (figure name, how to draw it from the study's rows and env.json's limits)
FIGURES: dict[str, tuple[tuple[str, FigureFunction], ...]] = {
    "formats": (
        ("formats_build_cost", lambda df, limits: plot_build_cost(df)),
        ("formats_sequential_read", lambda df, limits: plot_sequential_read(df, limits=limits)),
        ("formats_sequential_read_samples",
         lambda df, limits: plot_sequential_read(df, metric="samples_per_s")),
        ("formats_resident_fraction",
         lambda df, limits: plot_resident_fraction(df, study="formats")),
        ("formats_peak_memory", lambda df, limits: plot_peak_memory(df, study="formats")),
    ),
    "lazy_vs_preloaded": (
        ("lazy_vs_preloaded_throughput",
         lambda df, limits: plot_by_format(df, metric="samples_per_s", series=["loader", "cache"],
                                           title="Lazy vs preloaded: epoch throughput")),
        ("lazy_vs_preloaded_first_batch",
         lambda df, limits: plot_by_format(df, metric="time_to_first_batch_s",
                                           series=["loader", "cache"],
                                           title="Lazy vs preloaded: time to first batch")),
        ("lazy_vs_preloaded_peak_memory",
         lambda df, limits: plot_by_format(df, metric="peak_pss_bytes",
                                           series=["loader", "cache"],
                                           title="Lazy vs preloaded: peak PSS of the tree")),
        ("lazy_vs_preloaded_resident_fraction",
         lambda df, limits: plot_resident_fraction(df, study="lazy_vs_preloaded")),
    ),
    "prefetch": (
        ("prefetch_scaling", lambda df, limits: plot_prefetch_scaling(df)),
        ("prefetch_peak_memory", lambda df, limits: plot_peak_memory(df, study="prefetch")),
    ),
    "gpu_feed": (
        ("gpu_feed_utilisation", lambda df, limits: plot_feed(df)),
    ),
    "targets": (
        ("targets_paths", lambda df, limits: plot_targets(df)),
    ),
}


def plot_all(results_dir: Path | str) -> list[Path]:
    """Regenerate every figure from ``<results_dir>/*.csv`` and ``env.json`` alone, into
    ``<results_dir>/figures/``; returns the files written. A study without a figure list
    gets the generic residency and memory figures."""
    from storebench.bench.schema import read_results

    results_dir = Path(results_dir)
    csvs = sorted(results_dir.glob("*.csv"))
    if not csvs:
        raise FileNotFoundError(f"{results_dir}: no results (*.csv) to plot")
    env_path = results_dir / "env.json"
    limits = json.loads(env_path.read_text()).get("limits", {}) if env_path.exists() else {}
    written: list[Path] = []
    for csv_path in csvs:
        df = read_results(csv_path)
        for study in ordered(df["study"], list(FIGURES)):
            rows = df[df["study"] == study]
            figures = FIGURES.get(study) or (
                (f"{study}_resident_fraction",
                 lambda df, limits, study=study: plot_resident_fraction(df, study=study)),
                (f"{study}_peak_memory",
                 lambda df, limits, study=study: plot_peak_memory(df, study=study)),
            )
            for name, draw in figures:
                written += save_figure(draw(rows, limits), results_dir / "figures" / name)
    return written
