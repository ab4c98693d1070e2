"""The formats study's tables, figures and findings: build cost, sequential reads cold and
warm, what each build knob changes, and what ``verify=True`` costs."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from ...formats import traits
from ...formats.traits import KNOB_EFFECTS
from ...plots import (
    bars,
    empty_figure,
    format_colours,
    grouped,
    legend_below,
    linear_axis,
    metric_title,
    plot_peak_memory,
    plot_resident_fraction,
    summarise,
    titled,
)
from ...results import (
    RESIDENT_ROWS_CAPTION,
    Results,
    Stat,
    best_row,
    cold_repeats,
    dataset_names,
    default_builds,
    format_order,
    ordered,
    resident_fraction_rows,
    row_sources,
    select,
    sort_rows,
    stat,
    summary_table,
)
from ...text import (
    ENCODING_NAMES,
    ENCODING_ORDER,
    MULTIPLY,
    bullets,
    cache_label,
    faster_sentence,
    format_percent,
    format_ratio,
    format_value,
    sig,
)
from ..base import FigureSpec
from ..captions import study_caption
from ..shared_rows import build_cost_table

MB = 1e6


def cold_warm_table(df: pd.DataFrame, *, metric: str = "samples_per_s",
                    study: str = "formats", loader: str | None = "reader",
                    access: str | None = "sequential") -> pd.DataFrame:
    """Per dataset (knob variants included, by name): ``metric`` cold and warm (medians),
    the cold case's first repeat apart (``cold_first``: a cache below the guest may serve
    the later ones, ``results.cold_repeats``), warm/cold, the resident fraction each
    started with, and the repeats."""
    rows = df[df["study"] == study]
    if loader is not None:
        rows = rows[rows["loader"] == loader]
    if access is not None:
        rows = rows[rows["access"] == access]
    rows = rows.assign(dataset=dataset_names(rows))
    summary = summary_table(rows, metric, ["encoding", "format", "dataset", "cache"])
    columns = ["encoding", "format", "dataset", "cold", "cold_first", "warm",
               "warm_over_cold", "cold_resident", "warm_resident", "repeats"]
    if summary.empty:
        return pd.DataFrame(columns=columns)
    values = summary.pivot_table(index=["encoding", "format", "dataset"], columns="cache",
                                 values="median")
    resident = summary.pivot_table(index=["encoding", "format", "dataset"], columns="cache",
                                   values="resident_fraction")
    repeats = summary.groupby(["encoding", "format", "dataset"])["repeats"].min()
    table = pd.DataFrame({
        "cold": values.get("cold"), "warm": values.get("warm"),
        "cold_resident": resident.get("cold"), "warm_resident": resident.get("warm"),
        "repeats": repeats,
    }).reset_index()
    table["warm_over_cold"] = table["warm"] / table["cold"]
    firsts = cold_repeats(rows, metric).merge(
        rows[["case_id", "dataset"]].drop_duplicates(), on="case_id")
    table["cold_first"] = table["dataset"].map(firsts.set_index("dataset")["first"])
    return sort_rows(table[columns])


def formats_findings(df: pd.DataFrame) -> list[str]:
    """Sentences on build cost and sequential reads, per encoding, from the formats study."""
    sentences = []
    # Formats are compared as built by default; the knob variants have their own findings.
    df = default_builds(df)
    build = build_cost_table(df)
    reads = cold_warm_table(df)
    raw_size = {}
    for encoding in [e for e in ENCODING_ORDER if e in set(build["encoding"])]:
        part = build[build["encoding"] == encoding]
        name = ENCODING_NAMES.get(encoding, encoding)
        small = best_row(part, "size_ratio", lowest=True)
        large = best_row(part, "size_ratio")
        raw_size[encoding] = small
        sentences.append(
            f"{name}: smallest on disk is {small['format']} at "
            f"{sig(small['size_ratio'])}{MULTIPLY} the raw pixel bytes "
            f"({format_value(small['bytes_apparent'], 'bytes')}); largest is {large['format']} "
            f"at {sig(large['size_ratio'])}{MULTIPLY} "
            f"({format_value(large['bytes_apparent'], 'bytes')})."
        )
        fast = best_row(part, "write_seconds", lowest=True)
        slow = best_row(part, "write_seconds")
        sentences.append(
            f"{name}: fastest to write is {fast['format']} "
            f"({format_value(fast['write_seconds'], 's')}, "
            f"{format_value(fast['write_MBps'], 'MB/s')} of raw pixels); slowest is "
            f"{slow['format']} ({format_value(slow['write_seconds'], 's')}, "
            f"{format_ratio(slow['write_seconds'] / fast['write_seconds'])} longer)."
        )
        many = best_row(part, "file_count")
        few = best_row(part, "file_count", lowest=True)
        overhead = part["bytes_allocated"] / part["bytes_apparent"]
        worst = part.loc[overhead.idxmax()]
        sentences.append(
            f"{name}: {many['format']} writes {format_value(many['file_count'], 'count')} "
            f"files, {few['format']} {format_value(few['file_count'], 'count')}; "
            f"{worst['format']} allocates the most beyond its apparent size "
            f"({sig(overhead.max())}{MULTIPLY} its apparent bytes)."
        )
        readings = reads[reads["encoding"] == encoding].dropna(subset=["warm"])
        cold = readings.dropna(subset=["cold"])
        for cache, rows, condition in (("warm", readings, "warm, sequentially"),
                                       ("cold", cold, "guest-cold, sequentially")):
            if len(rows) < 2:
                continue
            best = best_row(rows, cache)
            worst_read = best_row(rows, cache, lowest=True)
            # Sequential reads only: the random reads of the same sets are another question.
            where = {"study": "formats", "loader": "reader", "encoding": encoding,
                     "cache": cache, "access": "sequential"}
            sentence = name + ": " + faster_sentence(
                best["format"], worst_read["format"],
                stat(df, "samples_per_s", format=best["format"], **where),
                stat(df, "samples_per_s", format=worst_read["format"], **where),
                condition=condition)
            if cache == "cold":
                sentence += (
                    f"; guest-cold repeats started with at most "
                    f"{format_percent(cold['cold_resident'].max())} of the files resident, "
                    f"warm ones with at least {format_percent(readings['warm_resident'].min())}"
                )
            sentences.append(sentence + ".")
    if "raw" in raw_size:
        base = raw_size["raw"]["size_ratio"]
        for encoding in ("png", "jpeg"):
            if encoding in raw_size:
                sentences.append(
                    f"Stored as {ENCODING_NAMES[encoding]}, samples take "
                    f"{format_percent(raw_size[encoding]['size_ratio'] / base)} of the bytes "
                    f"of the smallest raw layout ({raw_size[encoding]['format']}, "
                    f"{raw_size['raw']['format']})."
                )
    return sentences


def knobs_table(formats: Mapping[str, object]) -> pd.DataFrame:
    """Each format's build knobs (with defaults) and open options, from the registry."""
    rows = []
    for name, module in formats.items():
        knobs = getattr(module, "DEFAULT_KNOBS", {})
        rows.append({
            "format": name,
            "encodings": ", ".join(getattr(module, "ENCODINGS", ())),
            "build knobs (default)": ", ".join(f"{k}={v!r}" for k, v in knobs.items()) or "none",
            "open options": ", ".join(getattr(module, "OPEN_OPTIONS", ())) or "none",
        })
    return pd.DataFrame(rows)


def knob_settings(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` (formats rows) plus ``dataset``, ``knob`` and ``setting`` columns: for a variant
    its knob and value from params; for a default build of a format that has variants, each
    varied knob at its default (from the formats registry), so both sides of a knob compare.
    A default build appears once per knob varied."""
    from storebench.formats import get_format

    rows = df[df["study"] == "formats"]
    if rows.empty:
        return rows.assign(dataset=[], knob=[], setting=[])
    params = rows["params"].map(json.loads)
    rows = rows.assign(dataset=dataset_names(rows))
    knobs = params.map(lambda p: [(k.removeprefix("knob_"), v) for k, v in p.items()
                                  if k.startswith("knob_")])
    variants = rows[knobs.map(bool)]
    varied = {(f, e, k) for f, e, ks in zip(variants["format"], variants["encoding"],
                                            knobs[variants.index]) for k, _ in ks}
    parts = [variants.assign(knob=knobs[variants.index].map(lambda ks: ks[0][0]),
                             setting=knobs[variants.index].map(lambda ks: str(ks[0][1])))]
    defaults = rows[~knobs.map(bool)]
    for fmt, encoding, knob in sorted(varied):
        base = defaults[(defaults["format"] == fmt) & (defaults["encoding"] == encoding)]
        value = get_format(fmt).DEFAULT_KNOBS.get(knob)
        parts.append(base.assign(knob=knob, setting=f"{value} (default)"))
    return pd.concat(parts, ignore_index=True)


def setting_rank(setting: str) -> tuple:
    """Numeric knob settings in numeric order (``"64 (default)"`` between 1 and 1024), then
    the rest with the default first."""
    head = str(setting).split(" ")[0]
    try:
        return (0, float(head), "")
    except ValueError:
        return (1, 0.0 if "(default)" in str(setting) else 1.0, str(setting))


KNOB_METRICS = (("size_ratio", None, None), ("write_seconds", None, None),
                ("samples_per_s", "sequential", "warm"), ("samples_per_s", "sequential", "cold"),
                ("samples_per_s", "shuffle", "cold"), ("samples_per_s", "shuffle", "warm"))


def knob_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per format, encoding, knob and setting: bytes on disk over raw, write time, and
    samples/s of sequential reads (warm, cold) and random batches (cold, and warm when
    measured): medians."""
    rows = knob_settings(select(df))
    keys = ["format", "encoding", "knob", "setting"]
    names = {("samples_per_s", "sequential", "warm"): "sequential_warm",
             ("samples_per_s", "sequential", "cold"): "sequential_cold",
             ("samples_per_s", "shuffle", "cold"): "random_cold",
             ("samples_per_s", "shuffle", "warm"): "random_warm"}
    columns = [*keys, "size_ratio", "write_seconds", *names.values()]
    if rows.empty:
        return pd.DataFrame(columns=columns)
    table = pd.DataFrame(index=pd.MultiIndex.from_frame(rows[keys].drop_duplicates()))
    for metric, access, cache in KNOB_METRICS:
        part = rows[rows["metric"] == metric]
        if access is not None:
            part = part[(part["access"] == access) & (part["cache"] == cache)]
        column = names.get((metric, access, cache), metric)
        table[column] = part.groupby(keys)["value"].median()
    table = table.reset_index()
    for column in columns:
        if column not in table:
            table[column] = np.nan
    table = table.sort_values("setting", key=lambda c: c.map(setting_rank), kind="stable")
    return sort_rows(table.sort_values(["format", "encoding", "knob"], kind="stable"))[columns]


def knob_findings(df: pd.DataFrame) -> list[str]:
    """Per varied knob: its settings on the figure that knob is about (the format's
    ``TRAITS.knob_metrics``),
    plus sequential warm reads, all from the formats study."""
    table = knob_table(df)
    sentences = []
    for (fmt, encoding, knob), part in table.groupby(["format", "encoding", "knob"],
                                                     sort=False):
        column = traits(fmt).knob_metrics.get(knob, "sequential_warm")
        what = KNOB_EFFECTS[column]
        unit = "ratio" if column == "size_ratio" else "samples/s"
        shown = part.dropna(subset=[column])
        if len(shown) < 2:
            continue
        values = "; ".join(
            f"{row['setting']}: {format_value(row[column], unit)}"
            + (f"{MULTIPLY}" if unit == "ratio" else "") for _, row in shown.iterrows())
        text = f"{fmt} ({ENCODING_NAMES.get(encoding, encoding)}) {knob}, {what}: {values}"
        warm = part.dropna(subset=["sequential_warm"])
        if column != "sequential_warm" and len(warm) >= 2:
            fast, slow = best_row(warm, "sequential_warm"), best_row(warm, "sequential_warm",
                                                               lowest=True)
            text += (f"; sequential warm reads are fastest with {fast['setting']}, "
                     f"{format_ratio(fast['sequential_warm'] / slow['sequential_warm'])} "
                     f"those with {slow['setting']}")
        sentences.append(text + ".")
    return sentences


def build_cost_takeaway(table: pd.DataFrame) -> str:
    """The build-cost figure's answer: the encoding whose largest layout allocates the most
    disk per sample over its smallest, and by how much."""
    spreads = []
    for encoding, part in table.groupby("encoding", sort=False):
        per_sample = part.set_index("dataset")["allocated_per_sample"].dropna()
        if len(per_sample) >= 2:
            spreads.append((per_sample.max() / per_sample.min(), encoding,
                            per_sample.idxmax(), per_sample.idxmin()))
    if not spreads:
        return ""
    ratio, encoding, large, small = max(spreads)
    return f"Per sample, {large} allocates {format_ratio(ratio)} the disk of {small}"


def _per_sample(df: pd.DataFrame, row: pd.Series) -> float:
    """A build-cost row's allocated bytes per sample: over the build's sample count where
    its row has one (``samples``), else over the profile's pixel bytes per sample where the
    profile is known, else as ``allocated_per_sample`` counts samples."""
    import data_gen

    if select(df, "samples")["case_id"].isin(set(select(df, "raw_bytes")["case_id"])).any():
        return allocated_per_sample(df, str(row["dataset"])).median
    try:
        spec = data_gen.get_profile(_profile_of(df)).spec_for(str(row["encoding"]))
    except KeyError:
        return allocated_per_sample(df, str(row["dataset"])).median
    return float(row["bytes_allocated"]) * float(np.prod(spec.image_shape)) / float(
        row["raw_bytes"])


def _profile_of(df: pd.DataFrame) -> str:
    profiles = [p for p in dict.fromkeys(df.get("profile", pd.Series(dtype=str))) if p]
    return str(profiles[0]) if profiles else ""


def plot_build_cost(df: pd.DataFrame, *, workloads: Mapping | None = None) -> Figure:
    """Build cost per built dataset, knob variants included: disk allocated per sample (kB,
    with the whole set's MB written on each bar) and write time, one row of panels per
    encoding; a dotted line marks one sample's raw pixel bytes where it fits the axis."""
    table = build_cost_table(df)
    table = table[table["bytes_allocated"].notna()]
    if table.empty:
        return empty_figure("no build-cost rows")
    table = table.assign(allocated_per_sample=[
        _per_sample(df, row) for _, row in table.iterrows()])
    table = table.assign(pixels_per_sample=table["allocated_per_sample"]
                         * table["raw_bytes"] / table["bytes_allocated"])
    encodings = ordered(table["encoding"], ENCODING_ORDER)
    colours = format_colours(table["format"].unique())
    heights = [int((table["encoding"] == e).sum()) + 1.5 for e in encodings]
    fig = Figure(figsize=(7.5, 0.3 * sum(heights) + 1.6), layout="constrained")
    axes = fig.subplots(len(encodings), 2, squeeze=False, height_ratios=heights,
                        width_ratios=(3, 2))
    for row, encoding in enumerate(encodings):
        part = table[table["encoding"] == encoding]
        y = np.arange(len(part))
        colour = [colours[f] for f in part["format"]]
        size, write = axes[row]
        kb = part["allocated_per_sample"].to_numpy(dtype=float) / 1e3
        size.barh(y, kb, color=colour, edgecolor="black", linewidth=0.5)
        for i, (value, total) in enumerate(zip(kb, part["bytes_allocated"], strict=True)):
            size.text(value, i, f" {value:.1f} kB ({total / MB:.0f} MB)", va="center",
                      fontsize="small")
        size.set_xlim(0, kb.max() * 1.6)
        pixels = float(part["pixels_per_sample"].median()) / 1e3
        if pixels <= kb.max() * 1.6:
            size.axvline(pixels, color="grey", linestyle=":", linewidth=1.2,
                         label="one sample's raw pixel bytes")
        size.set_yticks(y, part["dataset"])
        size.invert_yaxis()
        caption = study_caption(df[df["encoding"] == encoding], encoding, workloads, width=90)
        size.set_title(f"{caption}; pixels {pixels:.1f} kB per sample", fontsize="small",
                       loc="left")
        write.barh(y, part["write_seconds"], color=colour, edgecolor="black", linewidth=0.5)
        write.set_yticks(y, [])
        write.invert_yaxis()
        write.set_xlim(left=0)
    axes[-1][0].set_xlabel("disk allocated per sample (kB)\n(whole set in MB)")
    axes[-1][1].set_xlabel("write time, one build (s)")
    legend_below(fig, axes[:, 0])
    titled(fig, "What does each layout cost on disk and to write?",
           build_cost_takeaway(table))
    return fig


def plot_sequential_read(df: pd.DataFrame, *, metric: str = "file_MBps",
                         limits: Mapping | None = None,
                         workloads: Mapping | None = None) -> Figure:
    """Full sequential read through the Reader, cold and warm, per format and encoding.
    With ``limits`` (env.json's), the same run's cold sequential and page-cache read limits
    are drawn as lines when the metric is in MB/s."""
    df = default_builds(df[(df["access"] == "sequential") & (df["loader"] == "reader")])
    encodings = ordered(df.loc[df["metric"] == metric, "encoding"], ENCODING_ORDER)
    if not encodings:
        return empty_figure(f"no sequential-read rows with {metric}")
    colours = format_colours(df["format"].unique())
    fig = Figure(figsize=(3.8 * len(encodings), 4.2), layout="constrained")
    axes = fig.subplots(1, len(encodings), squeeze=False)[0]
    for ax, encoding in zip(axes, encodings, strict=True):
        part = df[df["encoding"] == encoding]
        formats = ordered(part.loc[part["metric"] == metric, "format"], format_order())
        summary = summarise(part, metric, ["format", "cache"])
        caches = ordered(summary["cache"], ("cold", "warm"))
        grouped(ax, summary, formats=formats, colours=colours, series=caches,
                series_column="cache", dots=True)
        if limits and metric.endswith("MBps"):
            for key, label, style in (("cold_seq_read_GBps", "guest-cold read limit", "--"),
                                      ("page_cache_read_GBps", "page-cache limit", ":")):
                if isinstance(limits.get(key), int | float):
                    ax.axhline(limits[key] * 1000.0, color="black", linestyle=style,
                               linewidth=0.9, label=label)
        ax.set_title(study_caption(part, encoding, workloads, width=45), fontsize="medium")
        ax.set_ylabel(metric_title(metric) if ax is axes[0] else "")
    # One legend for every panel, below them, where it covers no point.
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=len(labels),
               fontsize="small")
    fig.suptitle("\n".join(["Which format reads a whole set fastest, front to back, "
                            "undecoded, guest-cold (hollow) and warm? "
                            f"({metric_title(metric)}: median, min-max of repeats)",
                            *sequential_read_takeaway(df, metric)]),
                 fontsize="medium")
    return fig


def sequential_read_takeaway(df: pd.DataFrame, metric: str) -> list[str]:
    """The sequential-read figure's answer, a line per encoding: the fastest format warm and
    cold and how far ahead of the slowest each is (medians of the rows drawn)."""
    medians = (df[df["metric"] == metric].groupby(["encoding", "cache", "format"])["value"]
               .median())
    parts = []
    for encoding in ordered(medians.index.get_level_values("encoding"), ENCODING_ORDER):
        said = []
        for cache in ("warm", "cold"):
            if (encoding, cache) not in medians.index.droplevel("format"):
                continue
            rates = medians.loc[(encoding, cache)]
            said.append(f"{cache_label(cache)} {rates.idxmax()} "
                        f"({format_ratio(rates.max() / rates.min())} the slowest)")
        if said:
            parts.append(f"{ENCODING_NAMES.get(encoding, encoding)}, fastest: "
                         + "; ".join(said) + ".")
    return parts


KNOB_AXIS_TITLES = {
    "random_cold": "random batches, guest-cold\n(samples per second)",
    "sequential_cold": "sequential read, guest-cold\n(samples per second)",
    "sequential_warm": "sequential read, warm\n(samples per second)",
    "size_ratio": "bytes on disk / raw pixel bytes",
}


def knob_takeaway(table: pd.DataFrame) -> str:
    """The knob figure's answer: the knob whose settings differ most on the measure it is
    about (best over worst)."""
    best = None
    for (fmt, encoding, knob), part in table.groupby(["format", "encoding", "knob"],
                                                     sort=False):
        column = traits(fmt).knob_metrics.get(knob, "sequential_warm")
        values = part.set_index("setting")[column].dropna()
        if len(values) < 2:
            continue
        low_is_good = column == "size_ratio"
        good = values.idxmin() if low_is_good else values.idxmax()
        bad = values.idxmax() if low_is_good else values.idxmin()
        ratio = values.max() / values.min()
        if best is None or ratio > best[0]:
            best = (ratio, f"{fmt} ({encoding}) {knob}", good, bad, KNOB_EFFECTS[column])
    if best is None:
        return ""
    ratio, what, good, bad, effect = best
    return f"Biggest effect: {what}, {good} against {bad}: {format_ratio(ratio)} on {effect}"


def plot_knobs(df: pd.DataFrame, *, workloads: Mapping | None = None) -> Figure:
    """What each varied build knob changes, one panel per (format, encoding, knob): bars per
    setting (the default build included) on the measure that knob is about (the format's
    ``TRAITS.knob_metrics``, as in ``knob_findings``)."""
    rows = knob_settings(df)
    if rows.empty or not (rows["setting"].map(lambda s: "(default)" not in s)).any():
        return empty_figure("no knob variants")
    table = knob_table(df)
    groups = list(dict.fromkeys(zip(table["format"], table["encoding"], table["knob"],
                                    strict=True)))
    columns = min(3, len(groups))
    lines = -(-len(groups) // columns)
    fig = Figure(figsize=(2.6 * columns + 0.4, 2.7 * lines + 1.0), layout="constrained")
    axes = fig.subplots(lines, columns, squeeze=False)
    for ax in axes.flat[len(groups):]:
        ax.axis("off")
    select_of = {"size_ratio": ("size_ratio", None, None),
                 "sequential_warm": ("samples_per_s", "sequential", "warm"),
                 "sequential_cold": ("samples_per_s", "sequential", "cold"),
                 "random_cold": ("samples_per_s", "shuffle", "cold")}
    for ax, (fmt, encoding, knob) in zip(axes.flat, groups, strict=False):
        column = traits(fmt).knob_metrics.get(knob, "sequential_warm")
        metric, access, cache = select_of[column]
        part = rows[(rows["format"] == fmt) & (rows["encoding"] == encoding)
                    & (rows["knob"] == knob) & (rows["metric"] == metric)]
        if access is not None:
            part = part[(part["access"] == access) & (part["cache"] == cache)]
        summary = summarise(part, metric, ["setting"]).sort_values(
            "setting", key=lambda c: c.map(setting_rank), kind="stable")
        bars(ax, [s.replace(" (default)", "\n(default)") for s in summary["setting"]],
             summary, colours=[format_colours([fmt])[fmt]] * len(summary))
        ax.set_xticklabels(ax.get_xticklabels(), rotation=0, ha="center")
        linear_axis(ax)
        ax.set_title(f"{fmt}, {knob}\n{study_caption(part, encoding, workloads, width=40)}",
                     fontsize="small")
        ax.set_ylabel(KNOB_AXIS_TITLES[column], fontsize="small")
    titled(fig, "Which build knob changes what it is meant to? (median, min-max)",
           knob_takeaway(table))
    return fig


def _memory_labels(df: pd.DataFrame) -> pd.DataFrame:
    rows = df[df["metric"].isin(["peak_pss_bytes", "peak_uss_bytes"])]
    return rows.assign(label=dataset_names(rows) + ", " + rows["access"].replace(
        {"shuffle": "random batches"}) + ", " + rows["cache"])


def plot_formats_memory(df: pd.DataFrame) -> Figure:
    """Peak memory of the read cases that peak highest, labelled by dataset, access and
    cache state, each with its dataset's size."""
    sizes = build_cost_table(df).set_index("dataset")["bytes_apparent"]
    rows = _memory_labels(default_builds(df))
    rows = rows.assign(dataset_bytes=dataset_names(rows).map(sizes))
    return plot_peak_memory(rows, label_column="label", size_column="dataset_bytes",
                            title="Which read cases of the formats need the most memory?")


FIGURES = (
    FigureSpec("formats_build_cost", "Build cost and bytes on disk per format",
               lambda r: plot_build_cost(r.study("formats"),
                                         workloads=r.workloads.get("formats"))),
    FigureSpec("formats_sequential_read",
               "Sequential read, guest-cold vs warm, against the machine's limits",
               lambda r: plot_sequential_read(r.study("formats"), limits=r.limits,
                                              workloads=r.workloads.get("formats"))),
    FigureSpec("formats_sequential_read_samples", "Sequential read in samples per second",
               lambda r: plot_sequential_read(r.study("formats"), metric="samples_per_s",
                                              workloads=r.workloads.get("formats"))),
    FigureSpec("formats_knobs", "What each build knob changes",
               lambda r: plot_knobs(r.study("formats"),
                                    workloads=r.workloads.get("formats"))),
    FigureSpec("formats_resident_fraction", "Page-cache state before each repeat",
               lambda r: plot_resident_fraction(r.study("formats")),
               rows=lambda r: resident_fraction_rows(r.study("formats")),
               rows_caption=RESIDENT_ROWS_CAPTION),
    FigureSpec("formats_peak_memory", "Peak memory per read case",
               lambda r: plot_formats_memory(r.study("formats"))),
)


def dataset_stat(df: pd.DataFrame, dataset: str, metric: str) -> Stat:
    """``metric`` of one build, by its dataset name (knob variants included)."""
    rows = select(df, metric)
    return stat(rows[dataset_names(rows) == dataset], metric)


def allocated_per_sample(df: pd.DataFrame, dataset: str) -> Stat:
    """The bytes a build allocates on disk per sample: allocated bytes over its samples
    (its build row's ``samples``; for results without it, its raw pixel bytes over one
    sample's, from the profile's synthetic image shape)."""
    import data_gen

    allocated = dataset_stat(df, dataset, "bytes_allocated")
    rows = select(df, "raw_bytes")
    rows = rows[dataset_names(rows) == dataset]
    raw = float(rows["value"].median())
    counted = select(df, "samples")  # the build case's own count, not a read's
    counted = counted[counted["case_id"].isin(set(rows["case_id"]))]
    if not counted.empty:
        samples = float(counted["value"].median())
        return Stat(allocated.median / samples, allocated.low / samples,
                    allocated.high / samples, allocated.count, "bytes",
                    tuple(v / samples for v in allocated.values),
                    derived_from=allocated.sources + row_sources(counted))
    try:
        spec = data_gen.get_profile(str(rows["profile"].iloc[0])).spec_for(
            str(rows["encoding"].iloc[0]))
        samples = raw / float(np.prod(spec.image_shape))
    except KeyError:  # an imported set of mixed sizes: the samples a whole read delivered
        read = select(df, "samples", format=str(rows["format"].iloc[0]),
                      encoding=str(rows["encoding"].iloc[0]))
        samples = float(read["value"].max()) if not read.empty else math.nan
    return Stat(allocated.median / samples, allocated.low / samples,
                allocated.high / samples, allocated.count, "bytes",
                tuple(v / samples for v in allocated.values),
                derived_from=allocated.sources + row_sources(rows))


def verify_cost_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per default build read warm and sequentially: the median ``verify_time_ratio`` (the
    pass with per-sample checksums over the same reads without, repeat-paired), its
    interval and repeats."""
    rows = default_builds(df[(df["study"] == "formats") & (df["loader"] == "reader")
                             & (df["access"] == "sequential") & (df["cache"] == "warm")])
    return sort_rows(summary_table(rows, "verify_time_ratio", ["encoding", "format"]))


def _ratio_with_interval(row: pd.Series) -> str:
    return (f"{format_ratio(row['median'])} (95% interval {format_ratio(row['low'])}"
            f"\u2013{format_ratio(row['high'])})")


def verify_cost_findings(df: pd.DataFrame) -> list[str]:
    """Per encoding: what checking every sample's CRC32C (``verify=True``, the default)
    cost warm sequential reads, the cheapest and the dearest format."""
    table = verify_cost_table(df)
    sentences = []
    for encoding in [e for e in ENCODING_ORDER if e in set(table["encoding"])]:
        part = table[table["encoding"] == encoding].dropna(subset=["median"])
        if part.empty:
            continue
        cheapest, dearest = best_row(part, lowest=True), best_row(part)
        spread = (f"{_ratio_with_interval(cheapest)} on {cheapest['format']} to "
                  f"{_ratio_with_interval(dearest)} on {dearest['format']}"
                  if len(part) > 1
                  else f"{_ratio_with_interval(cheapest)} on {cheapest['format']}")
        sentences.append(
            f"{ENCODING_NAMES.get(encoding, encoding)}: checking every sample's CRC32C "
            f"(verify=True, the default) made a warm sequential read take {spread} the time "
            f"of the same read without (medians of repeat-paired ratios, "
            f"{int(part['repeats'].min())}+ repeats)."
        )
    return sentences


def findings(results: Results) -> list[str]:
    df = results.study("formats")
    return formats_findings(df) + verify_cost_findings(df) + knob_findings(df)


def readme_text(results: Results, place) -> str:
    sentences = verify_cost_findings(results.study("formats"))
    if not sentences:
        return ""
    return ("**What `verify=True` costs** (the `formats` study; see "
            "[Integrity](docs/integrity.md))\n\n" + bullets(sentences))
