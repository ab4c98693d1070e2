"""The lazy_vs_preloaded study's tables, figures, findings and caveats: per loader, access
order and cache state, what reading per access or preloading cost."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from ...formats import traits
from ...plots import (
    CACHE_HATCHES,
    LOADER_COLOURS,
    PALETTE,
    bars,
    empty_figure,
    format_colours,
    legend_below,
    linear_axis,
    log_axis,
    metric_title,
    plot_resident_fraction,
    rates_need_log,
    summarise,
    titled,
)
from ...results import (
    RESIDENT_ROWS_CAPTION,
    MissingResultError,
    Results,
    default_open,
    failed_cases,
    format_order,
    medians_table,
    open_options,
    ordered,
    params_of,
    ratio_interval,
    reliable_peaks,
    resident_fraction_rows,
    select,
    sort_rows,
    stat,
    summary_table,
)
from ...text import (
    ENCODING_NAMES,
    ENCODING_ORDER,
    MULTIPLY,
    cache_label,
    finite,
    format_percent,
    format_ratio,
    format_value,
    relative_text,
    sig,
    signed_bytes,
)
from ..base import FigureSpec
from ..captions import study_caption
from ..shared_cases import ACCESS_ORDERS
from ..shared_rows import build_cost_table, last_epoch, ooc_rows

LOADER_METRICS = ("samples_per_s", "time_to_first_batch_s", "preload_seconds",
                  "peak_pss_bytes", "peak_uss_bytes")


def with_ram_order_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """``rows`` plus, for each preloaded case's epochs in its other orders
    (``<order>.samples_per_s``, ``shared_cases.ram_order_epochs``), rows of ``access`` that
    order and metric ``samples_per_s``: the table reads them as that order's preloaded
    epochs. Their time to first batch and memory are the case's (block-shuffled) epoch's
    and are not copied."""
    names = {f"{order}.samples_per_s": order for order in ACCESS_ORDERS}
    extra = rows[rows["metric"].isin(list(names))]
    if extra.empty:
        return rows
    extra = extra.assign(access=extra["metric"].map(names), metric="samples_per_s")
    return pd.concat([rows, extra], ignore_index=True)


def loader_table(df: pd.DataFrame, *, study: str = "lazy_vs_preloaded") -> pd.DataFrame:
    """Per dataset, loader, access order and cache state: medians of throughput, time to
    first batch, preload time, peak PSS and USS (of repeats long enough to sample a peak,
    ``results.reliable_peaks``); the resident fraction at start; repeats."""
    # Peaks of repeats too short to sample are no peaks (as every peak figure's).
    rows = with_ram_order_rows(reliable_peaks(default_open(df[df["study"] == study])))
    keys = ["encoding", "format", "loader", "access", "cache"]
    table = medians_table(rows, LOADER_METRICS, keys)
    if table.empty:
        return pd.DataFrame(columns=[*keys, *LOADER_METRICS, "resident_fraction", "repeats"])
    basis = summary_table(rows, "samples_per_s", keys).set_index(keys)
    # Groups in the order their throughput rows came, then any that measured none.
    table = table.set_index(keys)
    table = table.reindex(basis.index.append(table.index.difference(basis.index)))
    table["resident_fraction"] = basis["resident_fraction"]
    table["repeats"] = basis["repeats"]
    return sort_rows(table.reset_index())


def lazy_vs_preloaded_findings(df: pd.DataFrame, env: Mapping | None = None, *,
                               profile_bytes: Mapping[str, int] | None = None) -> list[str]:
    """Sentences on preloading vs reading per access, warm and cold, and on how close the
    datasets came to RAM (``env["ram_bytes"]``; ``profile_bytes``: raw bytes of profiles the
    results did not measure, e.g. the opt-in large one)."""
    table = loader_table(df)
    # Every dataset was read block-shuffled by both loaders: compare loaders in that order.
    table = table[table["access"] == "block_shuffle"]
    sentences = []
    for encoding in [e for e in ENCODING_ORDER if e in set(table["encoding"])]:
        name = ENCODING_NAMES.get(encoding, encoding)
        part = table[table["encoding"] == encoding]
        warm = part[part["cache"] == "warm"].pivot_table(
            index="format", columns="loader", values="samples_per_s")
        if {"lazy", "preloaded"} <= set(warm.columns):
            gain = (warm["preloaded"] / warm["lazy"]).dropna()
            if not gain.empty:
                most, least = gain.idxmax(), gain.idxmin()
                sentences.append(
                    f"{name}, warm: the preloaded epoch runs {format_ratio(gain[most])} the lazy "
                    f"one's throughput on {most} and {format_ratio(gain[least])} on {least} "
                    f"({format_value(warm.loc[most, 'preloaded'], 'samples/s')} vs "
                    f"{format_value(warm.loc[most, 'lazy'], 'samples/s')} on {most})."
                )
        cold = part[part["cache"] == "cold"].pivot_table(
            index="format", columns="loader",
            values=["time_to_first_batch_s", "samples_per_s"])
        if ("time_to_first_batch_s", "preloaded") in cold and (
                "time_to_first_batch_s", "lazy") in cold:
            first = cold["time_to_first_batch_s"]
            slowest = (first["preloaded"] / first["lazy"]).idxmax()
            sentences.append(
                f"{name}, guest-cold: preloading delays the first batch to "
                f"{format_value(first.loc[slowest, 'preloaded'], 's')} on {slowest} against "
                f"{format_value(first.loc[slowest, 'lazy'], 's')} when reading lazily "
                f"({format_ratio(first.loc[slowest, 'preloaded'] / first.loc[slowest, 'lazy'])})."
            )
        # Peaks only where a repeat was long enough to sample one (``reliable_peaks``).
        peaks = [c for c in ("peak_pss_bytes", "peak_uss_bytes") if c in part]
        memory = part.pivot_table(index="format", columns="loader", values=peaks,
                                  aggfunc="median") if len(peaks) == 2 else pd.DataFrame()
        if ("peak_pss_bytes", "preloaded") in memory and ("peak_pss_bytes", "lazy") in memory:
            pss, uss = memory["peak_pss_bytes"], memory["peak_uss_bytes"]
            extra = (pss["preloaded"] - pss["lazy"]).median()
            build = build_cost_table(df)
            on_disk = build.loc[build["encoding"] == encoding, "bytes_apparent"].median()
            size_note = (f", against {format_value(on_disk, 'bytes')} of data on disk"
                         if finite(on_disk) else "")
            sentences.append(
                f"{name}: peak PSS of the whole process tree is "
                f"{format_value(pss['preloaded'].median(), 'bytes')} preloaded and "
                f"{format_value(pss['lazy'].median(), 'bytes')} lazy (USS "
                f"{format_value(uss['preloaded'].median(), 'bytes')} and "
                f"{format_value(uss['lazy'].median(), 'bytes')}; medians over formats): "
                f"preloaded minus lazy is {signed_bytes(extra)}{size_note}."
            )
        lazy = part[part["loader"] == "lazy"].pivot_table(
            index="format", columns="cache", values=["samples_per_s", "resident_fraction"])
        if ("samples_per_s", "cold") in lazy and ("samples_per_s", "warm") in lazy:
            penalty = (lazy[("samples_per_s", "warm")] / lazy[("samples_per_s", "cold")]).dropna()
            if not penalty.empty:
                worst = penalty.idxmax()
                sentences.append(
                    f"{name}: a guest-cold cache costs lazy reading most on {worst} "
                    f"({format_ratio(penalty[worst])} slower than warm) and least on "
                    f"{penalty.idxmin()} ({format_ratio(penalty.min())}); guest-cold repeats "
                    f"started with at most "
                    f"{format_percent(lazy[('resident_fraction', 'cold')].max())} "
                    f"of the files resident, warm ones with at least "
                    f"{format_percent(lazy[('resident_fraction', 'warm')].min())}."
                )
    sentences += access_order_findings(df)
    sentences += block_shuffle_tradeoff(df)
    sentences += readahead_findings(df)
    sentences += ram_findings(df, env, profile_bytes=profile_bytes)
    failures = failed_cases(df, study="lazy_vs_preloaded")
    if not failures.empty:
        sentences.append(
            f"{len(failures)} case(s) failed, e.g. {failures['case_id'].iloc[0]}: "
            f"{failures['error'].iloc[0]}")
    return sentences


def ram_findings(df: pd.DataFrame, env: Mapping | None, *,
                 profile_bytes: Mapping[str, int] | None = None) -> list[str]:
    """How close the measured datasets came to the machine's RAM, stated from the data."""
    build = build_cost_table(df)
    if build.empty or not env or not env.get("ram_bytes"):
        return []
    ram = float(env["ram_bytes"])
    largest = build.loc[build["bytes_apparent"].idxmax()]
    fraction = largest["bytes_apparent"] / ram
    sentences = [
        f"The largest dataset measured is {largest['dataset']} at "
        f"{format_value(largest['bytes_apparent'], 'bytes')}, {format_percent(fraction)} of this "
        f"machine's {format_value(ram, 'bytes')} RAM."
    ]
    if fraction < 0.5:
        larger = ""
        if profile_bytes:
            over = {name: size for name, size in profile_bytes.items() if size > ram}
            if over:
                larger = " The " + ", ".join(
                    f"opt-in `{name}` profile ({format_value(size, 'bytes')}, "
                    f"{format_percent(size / ram)} of RAM)" for name, size in over.items()
                ) + " measures it."
        if (df["study"] == "out_of_core").any():
            sentences.append(
                "Every warm case of the in-memory studies fits in the page cache; the "
                "out_of_core study's rows in these results measure what happens past it, "
                "with the RAM left for the page cache capped below the dataset.")
        else:
            sentences.append(
                "So these results do not show what happens as a dataset approaches or passes "
                "RAM: every warm case here fits in the page cache." + larger)
    return sentences


ACCESS_ORDER = ("sequential", "block_shuffle", "shuffle")


def access_order_table(df: pd.DataFrame, *, loader: str = "lazy") -> pd.DataFrame:
    """Per raw-array dataset and cache state: one-thread epoch throughput of ``loader`` in
    each access order of the lazy_vs_preloaded study (medians), and each order against
    sequential."""
    table = loader_table(df)
    table = table[(table["encoding"] == "raw") & (table["loader"] == loader)]
    columns = ["format", "cache", *ACCESS_ORDER, "block_shuffle_vs_sequential",
               "shuffle_vs_sequential", "resident_fraction"]
    if table.empty:
        return pd.DataFrame(columns=columns)
    wide = table.pivot_table(index=["format", "cache"], columns="access",
                             values="samples_per_s")
    resident = table.groupby(["format", "cache"])["resident_fraction"].median()
    out = pd.DataFrame({order: wide.get(order) for order in ACCESS_ORDER})
    out["resident_fraction"] = resident
    out = out.reset_index()
    for order in ("block_shuffle", "shuffle"):
        out[f"{order}_vs_sequential"] = out[order] / out["sequential"]
    out = out.sort_values("cache", key=lambda c: c.map({"cold": 0, "warm": 1}),
                          kind="stable")
    return sort_rows(out)[columns]


def access_order_findings(df: pd.DataFrame) -> list[str]:
    """Per cache state: which format loses most and least by shuffling (lazy, raw arrays)
    and what block shuffle wins back."""
    table = access_order_table(df).dropna(subset=["sequential", "shuffle"])
    sentences = []
    for cache, part in table.groupby("cache", sort=False):
        loss = part.set_index("format")["shuffle_vs_sequential"]
        worst, best = loss.idxmin(), loss.idxmax()
        text = (f"Raw arrays, {cache}, read lazily by one thread: a full shuffle runs at "
                f"{format_ratio(loss[worst])} of sequential throughput on {worst} "
                f"(the worst) and {format_ratio(loss[best])} on {best}")
        block = part.set_index("format")["block_shuffle_vs_sequential"].dropna()
        if worst in block:
            text += (f"; block shuffle brings {worst} to {format_ratio(block[worst])} of "
                     "sequential")
        sentences.append(text + ".")
    return sentences


def block_shuffle_tradeoff(df: pd.DataFrame) -> list[str]:
    """Per raw-array format with more than one block, warm, read lazily by one thread: what
    block shuffle gains in throughput over a full shuffle (the ratio's 95% interval), and
    what it gives up in spread: distinct blocks per batch against a uniform permutation's,
    and the rank correlation with storage order (``shuffle.*`` metrics)."""
    rows = default_open(df[df["study"] == "lazy_vs_preloaded"])
    where = {"loader": "lazy", "encoding": "raw", "cache": "warm"}
    sentences = []
    for fmt in ordered(set(select(rows, "shuffle.distinct_blocks_ratio", **where)["format"]),
                       format_order()):
        try:
            block, full = (stat(rows, "samples_per_s", format=fmt, access=access, **where)
                           for access in ("block_shuffle", "shuffle"))
            spread, blocks, uniform = (
                stat(rows, f"shuffle.{metric}", format=fmt, access="block_shuffle",
                     **where).median
                for metric in ("distinct_blocks_ratio", "distinct_blocks_per_batch",
                               "uniform_distinct_blocks_per_batch"))
            correlation = {access: stat(rows, "shuffle.storage_rank_correlation", format=fmt,
                                        access=access, **where).median
                           for access in ("block_shuffle", "shuffle")}
        except MissingResultError:
            continue
        ratio, low, high = ratio_interval(block, full)
        interval = (f"95% interval {format_ratio(low)}\u2013{format_ratio(high)}"
                    if finite(low) else f"n = {block.count} and {full.count}: no interval")
        sentences.append(
            f"{fmt}-raw, warm, one thread: block shuffle runs {format_ratio(ratio)} the full "
            f"shuffle's throughput ({interval}); in exchange a batch draws on {blocks:.1f} "
            f"blocks against {uniform:.1f} for a uniform permutation "
            f"({format_percent(spread)} of its spread), and the order's rank correlation with "
            f"storage order is {correlation['block_shuffle']:.2f} (full shuffle: "
            f"{correlation['shuffle']:.2f}).")
    return sentences


def readahead_table(df: pd.DataFrame) -> pd.DataFrame:
    """The readahead knobs of the memory-mapped formats (lazy, cold, shuffled epoch): per
    setting, throughput (median, spread) and time to first batch."""
    rows = select(df[df["study"] == "lazy_vs_preloaded"])
    rows = rows[rows["params"].map(lambda text: bool(open_options(text)))]
    columns = ["format", "option", "setting", "samples_per_s", "low", "high", "repeats",
               "time_to_first_batch_s", "resident_fraction"]
    if rows.empty:
        return pd.DataFrame(columns=columns)
    options = rows["params"].map(open_options)
    rows = rows.assign(option=options.map(lambda o: next(iter(o))),
                       setting=options.map(lambda o: str(next(iter(o.values())))))
    keys = ["format", "option", "setting"]
    table = summary_table(rows, "samples_per_s", keys).rename(
        columns={"median": "samples_per_s"}).set_index(keys)
    table = table.join(medians_table(rows, ("time_to_first_batch_s",), keys).set_index(keys))
    return sort_rows(table.reset_index())[columns]


def readahead_findings(df: pd.DataFrame) -> list[str]:
    """Each readahead knob on against off, cold and shuffled, from the same study."""
    table = readahead_table(df)
    sentences = []
    for (fmt, option), part in table.groupby(["format", "option"], sort=False):
        by = part.set_index("setting")["samples_per_s"]
        if {"True", "False"} <= set(by.index):
            sentences.append(
                f"{fmt}, guest-cold, shuffled: {option}=True runs "
                f"{relative_text(by['True'] / by['False'])} {option}=False "
                f"({format_value(by['True'], 'samples/s')} vs "
                f"{format_value(by['False'], 'samples/s')}).")
    return sentences


LOADERS = ("lazy", "preloaded")
CACHES = ("cold", "warm")


def loader_medians(df: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Median, min and max of ``metric`` per encoding, format, loader and cache."""
    return summarise(df[df["metric"] == metric], metric,
                     ["encoding", "format", "loader", "cache"])


def plot_loaders(df: pd.DataFrame, *, metric: str, question: str, takeaway: str = "",
                 scale: float = 1.0, unit: str = "",
                 sizes: Mapping[str, float] | None = None,
                 workloads: Mapping | None = None) -> Figure:
    """``metric`` per format, one panel per encoding: a mark per loader (colour) and cache
    (hatched bar or hollow dot: cold), medians with min-max bars. Bars from zero on a
    linear axis; dots on a log axis only in a panel whose values span over two decades.
    ``sizes`` (per encoding, in the metric's unit) are drawn as a dashed line."""
    summary = loader_medians(df, metric)
    if summary.empty:
        return empty_figure(f"no rows with {metric}")
    encodings = ordered(summary["encoding"], ENCODING_ORDER)
    fig = Figure(figsize=(2.6 * len(encodings) + 0.8, 4.0), layout="constrained")
    axes = fig.subplots(1, len(encodings), squeeze=False)[0]
    series = [(loader, cache) for loader in LOADERS for cache in CACHES]
    width = 0.8 / len(series)
    for ax, encoding in zip(axes, encodings, strict=True):
        part = summary[summary["encoding"] == encoding]
        formats = ordered(part["format"], format_order())
        dots = rates_need_log(part["median"])
        for s, (loader, cache) in enumerate(series):
            mine = part[(part["loader"] == loader) & (part["cache"] == cache)]
            for f, fmt in enumerate(formats):
                row = mine[mine["format"] == fmt]
                if row.empty:
                    continue
                median, low, high = (float(row[c].iloc[0]) * scale
                                     for c in ("median", "low", "high"))
                x = f + (s - (len(series) - 1) / 2) * width
                colour = LOADER_COLOURS[loader]
                if dots:
                    ax.plot(x, median, marker="o", markersize=6, color=colour,
                            markerfacecolor="white" if cache == "cold" else colour)
                else:
                    ax.bar(x, median, width * 0.95, color=colour, edgecolor="black",
                           linewidth=0.4, hatch=CACHE_HATCHES[cache])
                ax.errorbar(x, median, yerr=[[median - low], [high - median]], fmt="none",
                            ecolor="black", capsize=1.5, linewidth=0.7)
        ax.set_xticks(range(len(formats)), formats, rotation=40, ha="right")
        if dots:
            log_axis(ax)
        else:
            ax.set_ylim(bottom=0)
            linear_axis(ax)
        if sizes and finite(sizes.get(encoding, float("nan"))):
            ax.axhline(sizes[encoding] * scale, color="black", linestyle="--", linewidth=1,
                       label="the dataset's size on disk (median of the formats)")
        ax.set_title(study_caption(df[df["encoding"] == encoding], encoding, workloads,
                                   width=40), fontsize="small")
    _loader_legend(fig, axes, series, dots=any(ax.get_yscale() == "log" for ax in axes))
    axes[0].set_ylabel(unit or metric_title(metric))
    titled(fig, question, takeaway)
    return fig


def _loader_legend(fig: Figure, axes, series, *, dots: bool) -> None:
    """One legend below the panels: per loader and cache its bar (hatched: cold) and, where
    a panel is on a log axis, its dot (hollow: cold); then any reference line drawn."""
    from matplotlib.legend_handler import HandlerTuple
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles, labels = [], []
    for loader, cache in series:
        colour = LOADER_COLOURS[loader]
        bar = Patch(facecolor=colour, edgecolor="black", hatch=CACHE_HATCHES[cache])
        dot = Line2D([], [], marker="o", linestyle="none", color=colour,
                     markerfacecolor="white" if cache == "cold" else colour)
        handles.append((bar, dot) if dots else bar)
        labels.append(f"{loader}, {cache_label(cache)} page cache")
    for handle, label in zip(*axes[0].get_legend_handles_labels(), strict=True):
        handles.append(handle)
        labels.append(label)
    fig.legend(handles, labels, loc="outside lower center", ncols=2, fontsize="small",
               handler_map={tuple: HandlerTuple(ndivide=None)})


def loader_ratio_takeaway(df: pd.DataFrame, metric: str, *, cache: str, verb: str) -> str:
    """Per encoding, the median over formats of preloaded over lazy ``metric`` in ``cache``:
    ``"warm, preloaded over lazy: raw 7.4x, png 1.05x"``."""
    summary = loader_medians(df, metric)
    summary = summary[summary["cache"] == cache]
    parts = []
    for encoding in ordered(summary["encoding"], ENCODING_ORDER):
        by = summary[summary["encoding"] == encoding].pivot_table(
            index="format", columns="loader", values="median")
        if set(LOADERS) <= set(by.columns):
            ratio = (by["preloaded"] / by["lazy"]).dropna()
            if not ratio.empty:
                parts.append(f"{encoding} {format_ratio(float(ratio.median()))}")
    if not parts:
        return ""
    return f"{cache_label(cache)}, preloaded {verb} lazy (median over formats): {', '.join(parts)}"


def plot_throughput(df: pd.DataFrame, *, workloads: Mapping | None = None) -> Figure:
    rows = block_shuffled(df)
    return plot_loaders(rows, metric="samples_per_s", workloads=workloads,
                        question="Does preloading make a block-shuffled epoch faster? "
                                 f"(one thread{transform_note(rows)})",
                        takeaway=loader_ratio_takeaway(rows, "samples_per_s", cache="warm",
                                                       verb="over"))


def plot_first_batch(df: pd.DataFrame, *, workloads: Mapping | None = None) -> Figure:
    rows = block_shuffled(df)
    return plot_loaders(rows, metric="time_to_first_batch_s", workloads=workloads,
                        question="How long until the first batch? (a preload counts)",
                        takeaway=loader_ratio_takeaway(rows, "time_to_first_batch_s",
                                                       cache="cold", verb="over"))


def plot_loader_memory(df: pd.DataFrame, *, workloads: Mapping | None = None) -> Figure:
    """Peak PSS of each loader, with each encoding's dataset size marked (the median of its
    default builds' apparent bytes); the takeaway: preloaded peaks over that size. Repeats
    timed too briefly to sample a peak are left out, as in every peak figure
    (``results.reliable_peaks``); where that leaves none, the figure says so."""
    sampled = block_shuffled(df)
    rows = reliable_peaks(sampled)
    if (rows["metric"] == "peak_pss_bytes").sum() == 0 and (
            sampled["metric"] == "peak_pss_bytes").any():
        return empty_figure("every repeat was timed for under five sampling periods: too "
                            "briefly to sample a peak (see kernel_peak_bytes)")
    build = build_cost_table(df)
    build = build[build["dataset"] == build["format"] + "-" + build["encoding"]]
    sizes = build.groupby("encoding")["bytes_apparent"].median().to_dict()
    summary = loader_medians(rows, "peak_pss_bytes")
    preloaded = summary[(summary["loader"] == "preloaded")
                        & summary["encoding"].isin(list(sizes))]
    takeaway = ""
    if not preloaded.empty:
        ratio = preloaded["median"] / preloaded["encoding"].map(sizes)
        low, high = preloaded.loc[ratio.idxmin()], preloaded.loc[ratio.idxmax()]
        takeaway = (f"Preloaded peaks at {sig(ratio.min(), 2)}{MULTIPLY} "
                    f"({low['format']}-{low['encoding']}) to {sig(ratio.max(), 2)}{MULTIPLY} "
                    f"({high['format']}-{high['encoding']}) its dataset's size")
    return plot_loaders(rows, metric="peak_pss_bytes", scale=1e-6, sizes=sizes,
                        workloads=workloads,
                        unit="peak PSS of the process tree (MB)", takeaway=takeaway,
                        question="How much memory does preloading cost, against the "
                                 "dataset's size?")


def plot_access_orders(df: pd.DataFrame, *, loader: str = "lazy",
                       workloads: Mapping | None = None) -> Figure:
    """One-thread epoch throughput of each raw-array dataset in each access order, read by
    ``loader``, cold and warm (one panel each); log axis."""
    rows = default_open(df[(df["encoding"] == "raw") & (df["loader"] == loader)
                           & (df["metric"] == "samples_per_s")])
    if rows.empty:
        return empty_figure("no access-order rows")
    caches = ordered(rows["cache"], ("cold", "warm"))
    formats = ordered(rows["format"], format_order())
    orders = ordered(rows["access"], ACCESS_ORDER)
    fig = Figure(figsize=(5 * len(caches), 4), layout="constrained")
    axes = fig.subplots(1, len(caches), squeeze=False, sharey=True)[0]
    width = 0.8 / len(orders)
    # Bars from zero on a linear axis, a log axis only where rates span two decades.
    log = rates_need_log(summarise(rows, "samples_per_s", ["format", "access", "cache"])
                         ["median"])
    labelled = set()
    for ax, cache in zip(axes, caches, strict=True):
        summary = summarise(rows[rows["cache"] == cache], "samples_per_s", ["format", "access"])
        for o, order in enumerate(orders):
            for f, fmt in enumerate(formats):
                row = summary[(summary["format"] == fmt) & (summary["access"] == order)]
                if row.empty:
                    continue
                median, low, high = (float(row[c].iloc[0]) for c in ("median", "low", "high"))
                x = f + (o - (len(orders) - 1) / 2) * width
                # Each order's first bar drawn names it: a format may lack some orders.
                ax.bar(x, median, width * 0.95, color=PALETTE[o], edgecolor="black",
                       linewidth=0.5,
                       label=None if order in labelled else order.replace("_", " "))
                labelled.add(order)
                ax.errorbar(x, median, yerr=[[median - low], [high - median]], fmt="none",
                            ecolor="black", capsize=2, linewidth=0.8)
        ax.set_xticks(range(len(formats)), formats, rotation=30, ha="right")
        if log:
            log_axis(ax)
        else:
            ax.set_ylim(bottom=0)
            linear_axis(ax)
        ax.set_title(f"{cache_label(cache)} page cache")
    legend_below(fig, axes)
    axes[0].set_ylabel(metric_title("samples_per_s"))
    fig.suptitle(f"Access order, {loader} loader, one thread{transform_note(rows)}\n"
                 f"{study_caption(rows, 'raw', workloads, width=100)}")
    return fig


def transform_note(rows: pd.DataFrame) -> str:
    """``", through the training crop"`` where the rows read their samples through the
    standard training transform (an ImageNet-like set's), else nothing."""
    if rows.empty or not params_of(rows).map(lambda p: p.get("transform") == "train").any():
        return ""
    return ", through the training crop"


def out_of_core_readahead(df: pd.DataFrame, k: int | None = None) -> tuple[pd.DataFrame, int]:
    """The out_of_core study's rows of the readahead knobs at ``k`` (default: its largest):
    each format's ``out_of_core_options`` case and its default case in the same access
    order, labelled as ``plot_readahead`` labels its own (``"lmdb: readahead=True"``), and
    that k."""
    rows = ooc_rows(df)
    rows = rows[(rows["loader"] == "lazy") & (rows["encoding"] == "raw")]
    rows = rows[rows["metric"] == f"epoch{last_epoch(rows)}.samples_per_s"]
    if rows.empty:
        return rows.assign(label=[]), 0
    k = int(rows["k"].max()) if k is None else k
    parts = []
    for fmt in ordered(rows["format"], format_order()):
        option = traits(fmt).readahead_option
        for options, access in traits(fmt).out_of_core_options:
            if set(options) != {option} or not isinstance(options[option], bool):
                continue
            value = options[option]
            mine = rows[(rows["format"] == fmt) & (rows["access"] == access) & (rows["k"] == k)]
            for setting, shown in (("default", not value), (f"{option}={value}", value)):
                parts.append(mine[mine["setting"] == setting].assign(
                    label=f"{fmt}: {option}={shown}"))
    if not parts:
        return rows.assign(label=[]), k
    return pd.concat(parts), k


def readahead_takeaway(fits: pd.DataFrame, larger: pd.DataFrame, k: int) -> str:
    """Per format, the default setting over the other, where the set fits and at ``k``."""
    parts = []
    for fmt in ordered(fits["format"], format_order()):
        option = traits(fmt).readahead_option
        default = {o: not v for options, _ in traits(fmt).out_of_core_options
                   for o, v in options.items() if o == option}
        if option not in default:
            continue
        on, off = f"{fmt}: {option}={default[option]}", f"{fmt}: {option}={not default[option]}"
        ratios = [by["median"].get(on, np.nan) / by["median"].get(off, np.nan)
                  for by in (fits.set_index("label"), larger.set_index("label"))]
        if all(map(finite, ratios)):
            fast, slow = (f"{format_ratio(r)} faster" if r >= 1 else
                          f"{format_ratio(1 / r)} slower" for r in ratios)
            parts.append(f"{fmt} {fast} when it fits, {slow} at k = {k}")
    if not parts:
        return ""
    return "The default setting: " + "; ".join(parts)


def plot_readahead(df: pd.DataFrame, *, workloads: Mapping | None = None) -> Figure:
    """The memory-mapped formats' readahead knobs (open options) on and off: throughput of
    a cold, shuffled, lazy epoch where the set fits (this study), and, where the
    out_of_core study's rows are in ``df``, the same knobs with the set k times the memory
    left for it (its largest k): the reversal."""
    rows = df[(df["study"] == "lazy_vs_preloaded") & (df["metric"] == "samples_per_s")]
    options = params_of(rows).map(lambda p: {k.removeprefix("open_"): v for k, v in p.items()
                                           if k.startswith("open_")}) if not rows.empty else None
    larger, k = out_of_core_readahead(df)
    if rows.empty or not options.map(bool).any():
        # This study measured no knob here (its ImageNet-like grid has none): where the set
        # fits, the out_of_core study's uncapped rows of the same knobs.
        uncapped, _ = out_of_core_readahead(df, k=0)
        if uncapped.empty:
            return empty_figure("no readahead rows")
        metric = str(uncapped["metric"].iloc[0])
        fits = summarise(uncapped, metric, ["label", "format"])
        title = (f"fits in RAM (the out_of_core study, no cap):\nepoch {metric[5]}, "
                 "two threads")
    else:
        rows = rows[options.map(bool)].assign(
            setting=options[options.map(bool)].map(
                lambda o: ", ".join(f"{k}={v}" for k, v in o.items())))
        rows = rows.assign(label=rows["format"] + ": " + rows["setting"])
        fits = summarise(rows, "samples_per_s", ["label", "format"])
        title = (f"fits in RAM ({study_caption(rows, 'raw', workloads, width=50)}):"
                 "\nguest-cold, one thread")
    panels = [(fits, title, "samples_per_s")]
    if not larger.empty:
        metric = str(larger["metric"].iloc[0])
        panels.append((summarise(larger, metric, ["label", "format"]).set_index("label")
                       .reindex(fits["label"]).reset_index().dropna(subset=["median"]),
                       f"k = {k}: the set is {k}{MULTIPLY} the memory left\n"
                       f"for it; epoch {metric[5]}, two threads", metric))
    colours = format_colours(fits["format"].unique())
    fig = Figure(figsize=(3.6 * len(panels) + 2.2, 0.5 * len(fits) + 2.0),
                 layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False, sharey=True)[0]
    for ax, (summary, title, _) in zip(axes, panels, strict=True):
        bars(ax, list(summary["label"]), summary,
             colours=[colours[f] for f in summary["format"]], horizontal=True)
        for i, (value, high) in enumerate(zip(summary["median"], summary["high"],
                                              strict=True)):
            ax.text(max(value, high), i, f" {format_value(value, 'samples/s').split(' ')[0]}",
                    va="center", fontsize="small")
        # Linear from zero: on a log axis a bar's length would not be its rate.
        linear_axis(ax, "x")
        ax.set_xlim(0, float(summary["high"].max()) * 1.3)
        ax.set_title(title, fontsize="small")
        ax.set_xlabel("samples per second")
    if not axes[0].yaxis_inverted():  # each panel inverted the shared axis once
        axes[0].invert_yaxis()
    titled(fig, "Does read-ahead help a shuffled read of a memory-mapped set?",
           readahead_takeaway(fits, panels[-1][0], k) if len(panels) > 1 else "")
    return fig


def block_shuffled(df: pd.DataFrame) -> pd.DataFrame:
    """The block-shuffled, default-open rows: the loader comparison every dataset has."""
    return default_open(df[df["access"] == "block_shuffle"])


FIGURES = (
    FigureSpec("lazy_vs_preloaded_throughput", "Lazy vs preloaded loading",
               lambda r: plot_throughput(r.study("lazy_vs_preloaded"),
                                         workloads=r.workloads.get("lazy_vs_preloaded"))),
    FigureSpec("lazy_vs_preloaded_first_batch", "Time to the first batch",
               lambda r: plot_first_batch(r.study("lazy_vs_preloaded"),
                                          workloads=r.workloads.get("lazy_vs_preloaded"))),
    FigureSpec("lazy_vs_preloaded_peak_memory", "Peak memory, lazy vs preloaded",
               lambda r: plot_loader_memory(
                   pd.concat([r.study("lazy_vs_preloaded"), r.study("formats")]),
                   workloads=r.workloads.get("lazy_vs_preloaded"))),
    FigureSpec("lazy_vs_preloaded_access_orders", "Access orders",
               lambda r: plot_access_orders(r.study("lazy_vs_preloaded"),
                                            workloads=r.workloads.get("lazy_vs_preloaded"))),
    FigureSpec("lazy_vs_preloaded_readahead", "Readahead knobs on and off",
               lambda r: plot_readahead(
                   pd.concat([r.study("lazy_vs_preloaded"), r.study("out_of_core")]),
                   workloads=r.workloads.get("lazy_vs_preloaded"))),
    FigureSpec("lazy_vs_preloaded_resident_fraction", "Page-cache state before each repeat",
               lambda r: plot_resident_fraction(r.study("lazy_vs_preloaded")),
               rows=lambda r: resident_fraction_rows(r.study("lazy_vs_preloaded")),
               rows_caption=RESIDENT_ROWS_CAPTION),
)


def findings(results: Results) -> list[str]:
    import data_gen

    over = {name: p.raw_bytes for name, p in data_gen.PROFILES.items()}
    return lazy_vs_preloaded_findings(results.df, results.env, profile_bytes=over)


def caveats(results: Results) -> list[str]:
    return ram_findings(results.df, results.env)
