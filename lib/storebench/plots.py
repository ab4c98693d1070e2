"""Figures from results alone: ``plot_x(df, *, ...) -> Figure``, one function per figure.

Figures are built with ``matplotlib.figure.Figure`` directly (no pyplot, so no global figure
state and no display needed; a notebook displays the returned Figure). Each format keeps
one colour and one position everywhere, taken from the order of the formats registry.
Bars and points are medians over the timed repeats; error bars span min to max.
"""

from __future__ import annotations

import json
import os
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


def _params(df: pd.DataFrame) -> pd.Series:
    return df["params"].map(json.loads)


def default_builds(df: pd.DataFrame) -> pd.DataFrame:
    """Rows about default builds: not a knob variant (no ``dataset_name`` in params)."""
    if df.empty:
        return df
    return df[_params(df).map(lambda p: "dataset_name" not in p)]


def default_open(df: pd.DataFrame) -> pd.DataFrame:
    """Rows of cases that opened their dataset with default options (no ``open_*``)."""
    if df.empty:
        return df
    return df[_params(df).map(lambda p: not any(k.startswith("open_") for k in p))]


def _bars(ax, labels: Sequence[str], summary: pd.DataFrame, *, colours=None,
          horizontal: bool = False) -> None:
    """One bar per row of ``summary`` (median, low, high) with a min-max error bar."""
    positions = np.arange(len(summary))
    median = summary["median"].to_numpy(dtype=float)
    error = [median - summary["low"].to_numpy(dtype=float),
             summary["high"].to_numpy(dtype=float) - median]
    colours = colours or [_PALETTE[i % len(_PALETTE)] for i in positions]
    if horizontal:
        ax.barh(positions, median, color=colours, edgecolor="black", linewidth=0.5)
        ax.errorbar(median, positions, xerr=error, fmt="none", ecolor="black", capsize=2)
        ax.set_yticks(positions, labels, fontsize="small")
        ax.invert_yaxis()
    else:
        ax.bar(positions, median, color=colours, edgecolor="black", linewidth=0.5)
        ax.errorbar(positions, median, yerr=error, fmt="none", ecolor="black", capsize=2)
        ax.set_xticks(positions, labels, rotation=30, ha="right", fontsize="small")


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
    """Build cost per dataset: write time, and bytes on disk relative to the raw pixels
    (default builds; ``plot_knobs`` shows the knob variants)."""
    df = default_builds(df[df["study"] == "formats"] if "study" in df else df)
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
    df = default_builds(df[(df["access"] == "sequential") & (df["loader"] == "reader")])
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


def plot_peak_memory(df: pd.DataFrame, *, study: str | None = None) -> Figure:
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


PREFETCHER_LABELS = {
    "none": "this thread", "thread": "ThreadPrefetcher", "process": "ProcessPrefetcher",
    "torch": "torch DataLoader", "locked_list_baseline": "locked-list baseline",
    "pickled_baseline": "pickled-queue baseline", "tf_data": "tf.data TFRecord AUTOTUNE",
    "tf_generator": "tf.data from_generator (GIL-bound)",
}


def _prefetch_rows(df: pd.DataFrame) -> pd.DataFrame:
    """Prefetch rows with ``dataset`` (format-encoding, decoder) and ``variant`` (prefetcher
    label, workers, start method other than fork) columns."""
    rows = with_params(df)
    decode = rows["param_decode"] if "param_decode" in rows else pd.Series(None, index=rows.index)
    rows["dataset"] = (rows["format"] + "-" + rows["encoding"]
                       + decode.map(lambda d: f" ({d})" if isinstance(d, str) else ""))
    method = rows["param_start_method"] if "param_start_method" in rows else pd.Series(
        None, index=rows.index)
    rows["dataset"] = rows["dataset"].astype(str)
    rows["variant"] = pd.Series([
        PREFETCHER_LABELS.get(prefetcher, prefetcher)
        + ("" if pd.isna(workers) or workers == 0 else f" x{int(workers)}")
        + (f" ({how})" if isinstance(how, str) and how != "fork" else "")
        for prefetcher, workers, how in zip(rows["prefetcher"], rows["workers"], method,
                                            strict=True)
    ], index=rows.index, dtype=str)
    return rows


def plot_prefetch_scaling(df: pd.DataFrame, *, metric: str = "samples_per_s") -> Figure:
    """Throughput against worker count for the prefetchers swept over workers (fork), one
    line per prefetcher, one panel per dataset and decoder."""
    rows = _prefetch_rows(df)
    swept = rows[rows["prefetcher"].isin(["thread", "process", "none"])
                 & ~rows["variant"].str.contains("(", regex=False)]
    return plot_metric_lines(swept, metric=metric, x="workers", series="prefetcher",
                             panels="dataset", title="Prefetchers: throughput vs workers",
                             log_y=True)


def plot_prefetch_paths(df: pd.DataFrame, *, metric: str = "samples_per_s") -> Figure:
    """Every prefetch path (ours, the naive baselines, torch DataLoader, tf.data) side by
    side, one panel per dataset and decoder; log axis."""
    rows = _prefetch_rows(df)
    rows = rows[rows["metric"] == metric]
    if rows.empty:
        return _empty_figure(f"no prefetch rows with {metric}")
    datasets = list(dict.fromkeys(rows["dataset"]))
    heights = [rows.loc[rows["dataset"] == d, "variant"].nunique() for d in datasets]
    fig = Figure(figsize=(8, 0.32 * sum(heights) + 1.2 * len(datasets)), layout="constrained")
    axes = fig.subplots(len(datasets), 1, squeeze=False, height_ratios=heights)[:, 0]
    for ax, dataset in zip(axes, datasets, strict=True):
        summary = summarise(rows[rows["dataset"] == dataset], metric, ["variant", "prefetcher"])
        colours = [_PALETTE[list(PREFETCHER_LABELS).index(p) % len(_PALETTE)]
                   if p in PREFETCHER_LABELS else "grey" for p in summary["prefetcher"]]
        _bars(ax, list(summary["variant"]), summary, colours=colours, horizontal=True)
        ax.set_xscale("log")
        ax.set_title(dataset, fontsize="medium")
    axes[-1].set_xlabel(f"{metric} ({_unit(rows, metric)})")
    fig.suptitle("Prefetch paths (median, min-max of repeats)")
    return fig


def plot_decoders(df: pd.DataFrame) -> Figure:
    """GIL-holding vs GIL-releasing decoding: serial, 2 threads and 2 processes for each
    JPEG decoder, as speedup over serial decoding with the same decoder."""
    rows = _prefetch_rows(df)
    rows = rows[(rows["metric"] == "samples_per_s") & rows["dataset"].str.contains("(", regex=False)
                & rows["variant"].isin(["this thread", "ThreadPrefetcher x2",
                                        "ProcessPrefetcher x2"])]
    decoders = sorted(set(rows["param_decode"].dropna()) - {"tf"}) if not rows.empty else []
    if not decoders:
        return _empty_figure("no decoder rows")
    summary = summarise(rows, "samples_per_s", ["param_decode", "variant"])
    serial = summary[summary["variant"] == "this thread"].set_index("param_decode")["median"]
    fig = Figure(figsize=(7, 3.8), layout="constrained")
    ax = fig.add_subplot()
    variants = ["this thread", "ThreadPrefetcher x2", "ProcessPrefetcher x2"]
    width = 0.8 / len(variants)
    for v, variant in enumerate(variants):
        for d, decode in enumerate(decoders):
            row = summary[(summary["param_decode"] == decode) & (summary["variant"] == variant)]
            if row.empty or decode not in serial:
                continue
            base = serial[decode]
            median, low, high = (float(row[c].iloc[0]) / base for c in ("median", "low", "high"))
            x = d + (v - (len(variants) - 1) / 2) * width
            ax.bar(x, median, width * 0.95, color=_PALETTE[v], edgecolor="black", linewidth=0.5,
                   label=variant if d == 0 else None)
            ax.errorbar(x, median, yerr=[[median - low], [high - median]], fmt="none",
                        ecolor="black", capsize=2)
    ax.axhline(1.0, color="grey", linestyle=":", linewidth=0.8)
    names = {"pil": "PIL (holds the GIL)", "simplejpeg": "simplejpeg (releases the GIL)"}
    ax.set_xticks(range(len(decoders)), [names.get(d, d) for d in decoders])
    ax.set_ylabel("throughput / serial decode")
    ax.legend(fontsize="small")
    fig.suptitle("JPEG decoders under threads and processes")
    return fig


ACCESS_ORDER = ("sequential", "block_shuffle", "shuffle")


def plot_access_orders(df: pd.DataFrame, *, loader: str = "lazy") -> Figure:
    """One-thread epoch throughput of each raw-array dataset in each access order, read by
    ``loader``, cold and warm (one panel each); log axis."""
    rows = default_open(df[(df["encoding"] == "raw") & (df["loader"] == loader)
                           & (df["metric"] == "samples_per_s")])
    if rows.empty:
        return _empty_figure("no access-order rows")
    caches = ordered(rows["cache"], ("cold", "warm"))
    formats = ordered(rows["format"], default_format_order())
    orders = ordered(rows["access"], ACCESS_ORDER)
    fig = Figure(figsize=(5 * len(caches), 4), layout="constrained")
    axes = fig.subplots(1, len(caches), squeeze=False, sharey=True)[0]
    width = 0.8 / len(orders)
    for ax, cache in zip(axes, caches, strict=True):
        summary = summarise(rows[rows["cache"] == cache], "samples_per_s", ["format", "access"])
        for o, order in enumerate(orders):
            for f, fmt in enumerate(formats):
                row = summary[(summary["format"] == fmt) & (summary["access"] == order)]
                if row.empty:
                    continue
                median, low, high = (float(row[c].iloc[0]) for c in ("median", "low", "high"))
                x = f + (o - (len(orders) - 1) / 2) * width
                ax.bar(x, median, width * 0.95, color=_PALETTE[o], edgecolor="black",
                       linewidth=0.5, label=order if f == 0 else None)
                ax.errorbar(x, median, yerr=[[median - low], [high - median]], fmt="none",
                            ecolor="black", capsize=2, linewidth=0.8)
        ax.set_xticks(range(len(formats)), formats, rotation=30, ha="right")
        ax.set_yscale("log")
        ax.set_title(f"{cache} page cache")
        ax.legend(fontsize="small")
    axes[0].set_ylabel("samples/s")
    fig.suptitle(f"Access order, raw arrays, {loader} loader, one thread")
    return fig


def plot_readahead(df: pd.DataFrame) -> Figure:
    """The memory-mapped formats' readahead knobs (open options) on and off: throughput of
    a cold, shuffled, lazy epoch."""
    rows = df[df["metric"] == "samples_per_s"]
    options = _params(rows).map(lambda p: {k.removeprefix("open_"): v for k, v in p.items()
                                           if k.startswith("open_")}) if not rows.empty else None
    if rows.empty or not options.map(bool).any():
        return _empty_figure("no readahead rows")
    rows = rows[options.map(bool)].assign(
        setting=options[options.map(bool)].map(
            lambda o: ", ".join(f"{k}={v}" for k, v in o.items())))
    rows = rows.assign(label=rows["format"] + ": " + rows["setting"])
    summary = summarise(rows, "samples_per_s", ["label", "format"])
    colours = format_colours(summary["format"].unique())
    fig = Figure(figsize=(7, 0.45 * len(summary) + 1.2), layout="constrained")
    ax = fig.add_subplot()
    _bars(ax, list(summary["label"]), summary,
          colours=[colours[f] for f in summary["format"]], horizontal=True)
    ax.set_xscale("log")
    ax.set_xlabel("samples/s (cold, shuffled, lazy, one thread)")
    fig.suptitle("Readahead knobs of the memory-mapped formats")
    return fig


KNOB_PANELS = (
    ("size_ratio", None, None, "bytes on disk / raw"),
    ("samples_per_s", "sequential", "warm", "sequential, warm (samples/s)"),
    ("samples_per_s", "sequential", "cold", "sequential, cold (samples/s)"),
    ("samples_per_s", "shuffle", "cold", "random batches, cold (samples/s)"),
)


def plot_knobs(df: pd.DataFrame) -> Figure:
    """What each varied build knob changes: one row of panels per (format, encoding, knob),
    bars per setting (the default build included) for size, sequential and random reads."""
    from storebench.findings import setting_rank
    from storebench.formats import get_format

    rows = df[df["study"] == "formats"] if "study" in df else df
    if rows.empty:
        return _empty_figure("no knob variants")
    params = _params(rows)
    knobs = params.map(lambda p: [(k.removeprefix("knob_"), v) for k, v in p.items()
                                  if k.startswith("knob_")])
    variants = rows[knobs.map(bool)].assign(
        knob=knobs[knobs.map(bool)].map(lambda ks: ks[0][0]),
        setting=knobs[knobs.map(bool)].map(lambda ks: str(ks[0][1])))
    if variants.empty:
        return _empty_figure("no knob variants")
    groups = list(dict.fromkeys(zip(variants["format"], variants["encoding"], variants["knob"],
                                    strict=True)))
    plain = rows[~knobs.map(bool)]
    fig = Figure(figsize=(3.2 * len(KNOB_PANELS), 2.6 * len(groups)), layout="constrained")
    axes = fig.subplots(len(groups), len(KNOB_PANELS), squeeze=False)
    for g, (fmt, encoding, knob) in enumerate(groups):
        default = get_format(fmt).DEFAULT_KNOBS.get(knob)
        base = plain[(plain["format"] == fmt) & (plain["encoding"] == encoding)].assign(
            knob=knob, setting=f"{default} (default)")
        mine = variants[(variants["format"] == fmt) & (variants["encoding"] == encoding)
                        & (variants["knob"] == knob)]
        both = pd.concat([base, mine], ignore_index=True)
        for c, (metric, access, cache, label) in enumerate(KNOB_PANELS):
            ax = axes[g][c]
            part = both[both["metric"] == metric]
            if access is not None:
                part = part[(part["access"] == access) & (part["cache"] == cache)]
            summary = summarise(part, metric, ["setting"])
            if summary.empty:
                ax.axis("off")
                continue
            summary = summary.sort_values("setting", key=lambda c: c.map(setting_rank),
                                          kind="stable")
            _bars(ax, list(summary["setting"]), summary)
            ax.set_title(label, fontsize="small")
        axes[g][0].set_ylabel(f"{fmt}-{encoding}\n{knob}")
    fig.suptitle("What each format's build knobs change (median, min-max of repeats)")
    return fig


def plot_target_ratios(df: pd.DataFrame) -> Figure:
    """Each performance target's measured value (the rows' ``target_value``, with the
    per-repeat ``target_ratio`` spread) against its ``target_threshold``; green when met."""
    whole = df[(df["repeat"] == -1) & (df["status"] == "ok")]
    values = whole[whole["metric"] == "target_value"].drop_duplicates("loader", keep="last")
    if values.empty:
        return _empty_figure("no target rows")
    threshold = whole[whole["metric"] == "target_threshold"].groupby("loader")["value"].last()
    met = whole[whole["metric"] == "target_met"].groupby("loader")["value"].last()
    spread = summarise(df, "target_ratio", ["loader"]).set_index("loader")
    targets = list(values["loader"])
    fig = Figure(figsize=(8, 0.5 * len(targets) + 1.5), layout="constrained")
    ax = fig.add_subplot()
    for y, target in enumerate(targets):
        value = float(values.loc[values["loader"] == target, "value"].iloc[0])
        colour = "#2ca02c" if met.get(target, 0) >= 1 else "#d62728"
        ax.barh(y, value, color=colour, edgecolor="black", linewidth=0.5)
        if target in spread.index:
            low, high = spread.loc[target, "low"], spread.loc[target, "high"]
            ax.errorbar(value, y, xerr=[[value - low], [high - value]], fmt="none",
                        ecolor="black", capsize=2)
        if target in threshold.index:
            ax.plot([threshold[target]] * 2, [y - 0.4, y + 0.4], color="black", linewidth=2)
    ax.plot([], [], color="black", linewidth=2, label="threshold")
    ax.set_yticks(range(len(targets)), targets, fontsize="small")
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("measured ratio (green: met, red: missed)")
    ax.legend(fontsize="small")
    fig.suptitle("Performance targets against their thresholds")
    return fig


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
    emulated = rows.get("param_emulated", pd.Series(True, index=rows.index)).fillna(True)
    names = rows.get("param_device_name", pd.Series("cpu", index=rows.index)).fillna("cpu")
    real = sorted(set(names[emulated.map(lambda e: e is False)]))
    where = (f"copies to {', '.join(real)}" if real
             else "no CUDA device: copies into CPU memory, accelerator emulated")
    fig.suptitle(f"Feeding the accelerator ({where})")
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


def block_shuffled(df: pd.DataFrame) -> pd.DataFrame:
    """The block-shuffled, default-open rows: the loader comparison every dataset has."""
    return default_open(df[df["access"] == "block_shuffle"])


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
        ("formats_knobs", lambda df, limits: plot_knobs(df)),
        ("formats_resident_fraction",
         lambda df, limits: plot_resident_fraction(df, study="formats")),
        ("formats_peak_memory", lambda df, limits: plot_peak_memory(df, study="formats")),
    ),
    "lazy_vs_preloaded": (
        ("lazy_vs_preloaded_throughput",
         lambda df, limits: plot_by_format(block_shuffled(df), metric="samples_per_s",
                                           series=["loader", "cache"],
                                           title="Lazy vs preloaded: epoch throughput "
                                                 "(block-shuffled)")),
        ("lazy_vs_preloaded_first_batch",
         lambda df, limits: plot_by_format(block_shuffled(df), metric="time_to_first_batch_s",
                                           series=["loader", "cache"],
                                           title="Lazy vs preloaded: time to first batch")),
        ("lazy_vs_preloaded_peak_memory",
         lambda df, limits: plot_by_format(block_shuffled(df), metric="peak_pss_bytes",
                                           series=["loader", "cache"],
                                           title="Lazy vs preloaded: peak PSS of the tree")),
        ("lazy_vs_preloaded_access_orders", lambda df, limits: plot_access_orders(df)),
        ("lazy_vs_preloaded_readahead", lambda df, limits: plot_readahead(df)),
        ("lazy_vs_preloaded_resident_fraction",
         lambda df, limits: plot_resident_fraction(df, study="lazy_vs_preloaded")),
    ),
    "prefetch": (
        ("prefetch_scaling", lambda df, limits: plot_prefetch_scaling(df)),
        ("prefetch_paths", lambda df, limits: plot_prefetch_paths(df)),
        ("prefetch_decoders", lambda df, limits: plot_decoders(df)),
        ("prefetch_peak_memory", lambda df, limits: plot_peak_memory(df, study="prefetch")),
    ),
    "gpu_feed": (
        ("gpu_feed_utilisation", lambda df, limits: plot_feed(df)),
    ),
    "targets": (
        ("targets_paths", lambda df, limits: plot_targets(df)),
        ("targets_met", lambda df, limits: plot_target_ratios(df)),
    ),
}


def _figures_for(study: str) -> tuple[tuple[str, FigureFunction], ...]:
    """The study's figure list; a study without one gets the generic residency and memory
    figures."""
    return FIGURES.get(study) or (
        (f"{study}_resident_fraction",
         lambda df, limits: plot_resident_fraction(df, study=study)),
        (f"{study}_peak_memory", lambda df, limits: plot_peak_memory(df, study=study)),
    )


def _draw_figures(csv_path: str, study: str, names: Sequence[str], limits: dict,
                  figures_dir: str) -> list[Path]:
    """Draw and save ``names`` of ``study`` from one results file (a unit of work that a
    worker process can take: everything it needs is a path or plain data)."""
    from storebench.bench.schema import read_results

    df = read_results(csv_path)
    rows = df[df["study"] == study]
    wanted = dict(_figures_for(study))
    written: list[Path] = []
    for name in names:
        written += save_figure(wanted[name](rows, limits), Path(figures_dir) / name)
    return written


def plot_all(results_dir: Path | str, *, workers: int | None = None) -> list[Path]:
    """Regenerate every figure from ``<results_dir>/*.csv`` and ``env.json`` alone, into
    ``<results_dir>/figures/``; returns the files written.

    Rendering (PNG and SVG) is CPU-bound and nothing is measured meanwhile, so the figures
    are drawn by ``workers`` processes (default: up to two, one per core)."""
    from storebench.bench.schema import read_results

    results_dir = Path(results_dir)
    csvs = sorted(results_dir.glob("*.csv"))
    if not csvs:
        raise FileNotFoundError(f"{results_dir}: no results (*.csv) to plot")
    env_path = results_dir / "env.json"
    limits = json.loads(env_path.read_text()).get("limits", {}) if env_path.exists() else {}
    figures_dir = str(results_dir / "figures")
    workers = workers if workers is not None else min(2, os.cpu_count() or 1)
    jobs = []
    for csv_path in csvs:
        studies = read_results(csv_path)["study"]
        for study in ordered(studies, list(FIGURES)):
            names = [name for name, _ in _figures_for(study)]
            # A study's figures in ``workers`` shares, so that each share reads the file once.
            for share in range(min(workers, len(names))):
                jobs.append((str(csv_path), study, names[share::workers], limits, figures_dir))
    if workers <= 1 or len(jobs) <= 1:
        return [path for job in jobs for path in _draw_figures(*job)]
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=workers) as pool:
        done = list(pool.map(_draw_figures, *zip(*jobs, strict=True)))
    return [path for paths in done for path in paths]
