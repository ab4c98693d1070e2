"""The prefetch study's tables, figures and findings: per dataset, decoder and loader path,
throughput, its speedup over one thread, CPU and memory."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from ...loaders.paths import LOADER_PATHS, path_label
from ...plots import (
    bars,
    empty_figure,
    legend_below,
    linear_axis,
    metric_title,
    path_colour,
    plot_peak_memory,
    summarise,
    titled,
)
from ...results import (
    Results,
    best_row,
    mark_drawn,
    medians_table,
    ordered,
    params_of,
    summary_table,
)
from ...text import DASH, finite, format_ratio, format_value, relative_text
from ..base import FigureSpec
from ..captions import study_caption
from ..shared_rows import build_cost_table


def prefetch_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The study's rows with ``dataset`` (format-encoding), ``decode``, ``start_method``,
    integer ``workers``, ``path`` (registry key with workers and start method) and
    ``label`` (the registry's display label) columns."""
    rows = df[df["study"] == "prefetch"]
    if rows.empty:
        return rows.assign(dataset=[], decode=[], start_method=[], path=[], label=[],
                           transform=[])
    params = params_of(rows)
    workers = rows["workers"].fillna(0).astype(int)
    method = params.map(lambda p: p.get("start_method") or "")
    return rows.assign(
        dataset=rows["format"] + "-" + rows["encoding"],
        decode=params.map(lambda p: p.get("decode") or "none"),
        transform=params.map(lambda p: p.get("transform") or ""),
        workers=workers,
        start_method=method,
        path=[f"{p}/w{w}/{m}" for p, w, m in zip(rows["prefetcher"], workers, method)],
        label=[path_label(p, w, m) for p, w, m in zip(rows["prefetcher"], workers, method)],
    )


def decoded_label(dataset: str, decode: str) -> str:
    return dataset + ("" if decode == "none" else f", {decode} decoder")


def bound_by(decode: str, transform: str) -> str:
    """What a panel's rows spend their time on: decoding, the training crop of arrays
    already decoded, or copying arrays."""
    if decode != "none":
        return "decode-bound"
    return "crop-bound" if transform else "copy-bound"


def transformed(rows: pd.DataFrame) -> bool:
    """Whether the rows read their samples through the standard training transform."""
    return "transform" in rows and bool((rows["transform"] == "train").any())


def prefetch_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per dataset, decoder and path: throughput (median, spread, Stat), its speedup over
    one thread on the same dataset and decoder, CPU utilisation and peak PSS."""
    rows = prefetch_rows(df)
    keys = ["dataset", "decode", "transform", "path", "label", "prefetcher", "workers"]
    columns = [*keys, "samples_per_s", "low", "high", "repeats", "stat", "speedup",
               "cpu_utilisation", "peak_pss_bytes"]
    if rows.empty:
        return pd.DataFrame(columns=columns)
    table = summary_table(rows, "samples_per_s", keys).rename(
        columns={"median": "samples_per_s"}).set_index(keys)
    table = table.join(medians_table(rows, ("cpu_utilisation", "peak_pss_bytes"),
                                     keys).set_index(keys)).reset_index()
    serial = table[table["prefetcher"] == "none"].set_index(["dataset", "decode"])[
        "samples_per_s"]
    table["speedup"] = [row["samples_per_s"] / serial.get((row["dataset"], row["decode"]),
                                                          np.nan)
                        for _, row in table.iterrows()]
    return table[columns]


def _path(table: pd.DataFrame, prefetcher: str, workers: int,
          start_method: str | None = None) -> pd.Series | None:
    default = LOADER_PATHS[prefetcher].start_method
    key = f"{prefetcher}/w{workers}/{start_method or default or ''}"
    found = table[table["path"] == key]
    return None if found.empty else found.iloc[0]


# Pairs compared in sentences: (ours, theirs) as (prefetcher, workers, start method).
COMPARED_PAIRS = (
    (("process", 2, None), ("torch", 2, None)),
    (("process", 2, None), ("pickled_baseline", 2, None)),
    (("thread", 1, None), ("locked_list_baseline", 1, None)),
    (("thread", 2, None), ("process", 2, None)),
    (("thread", 2, None), ("thread", 1, None)),
    (("thread", 2, None), ("tf_generator", 0, None)),
    (("process", 2, "spawn"), ("process", 2, None)),
)


def prefetch_findings(df: pd.DataFrame) -> list[str]:
    """Per dataset and decoder: the fastest path against one thread, then fixed pairs of
    paths (``COMPARED_PAIRS``) where both were measured; the worker sweep; decoders."""
    table = prefetch_table(df)
    sentences = []
    for (dataset, decode), part in table.groupby(["dataset", "decode"], sort=False):
        label = decoded_label(dataset, decode)
        kind = bound_by(decode, part["transform"].iloc[0])
        if transformed(part):
            kind += ", each sample through the training crop"
        best = best_row(part, "samples_per_s")
        serial = part[part["prefetcher"] == "none"]
        if not serial.empty:
            alone = format_value(serial["samples_per_s"].iloc[0], "samples/s")
            sentences.append(
                f"{label} ({kind}, {len(part)} paths): one thread delivers {alone}; the "
                f"fastest path is {best['label']} at "
                f"{format_value(best['samples_per_s'], 'samples/s')} "
                f"({format_ratio(best['speedup'])} one thread, median of {best['repeats']} "
                f"repeats, {format_value(best['low'], 'samples/s')}{DASH}"
                f"{format_value(best['high'], 'samples/s')}).")
        for ours, theirs in COMPARED_PAIRS:
            a, b = _path(part, *ours), _path(part, *theirs)
            if a is None or b is None:
                continue
            sentences.append(
                f"{label}: {a['label']} is {relative_text(a['samples_per_s'] / b['samples_per_s'])}"
                f" {b['label']} ({format_value(a['samples_per_s'], 'samples/s')}"
                f" vs {format_value(b['samples_per_s'], 'samples/s')}).")
    sentences += worker_sweep_findings(table)
    sentences += threads_vs_processes_findings(table)
    sentences += decoder_findings(table)
    return sentences


def worker_sweep_findings(table: pd.DataFrame) -> list[str]:
    """Where throughput peaks over worker counts for thread and process prefetchers, and
    what the largest count (oversubscribing a small machine's cores) reaches of the peak."""
    sentences = []
    swept = table[table["prefetcher"].isin(["thread", "process"])
                  & ~table["path"].str.endswith("/spawn")]
    for (dataset, decode, prefetcher), part in swept.groupby(
            ["dataset", "decode", "prefetcher"], sort=False):
        if part["workers"].nunique() < 3:
            continue
        peak = best_row(part, "samples_per_s")
        most = part.loc[part["workers"].idxmax()]
        sentences.append(
            f"{decoded_label(dataset, decode)}: {LOADER_PATHS[prefetcher].label} peaks at "
            f"{int(peak['workers'])} worker(s) "
            f"({format_value(peak['samples_per_s'], 'samples/s')}); {int(most['workers'])} "
            f"workers reach {format_ratio(most['samples_per_s'] / peak['samples_per_s'])} of "
            "that peak.")
    return sentences


DECODER_PATHS = (("none", 0, None), ("thread", 2, None), ("process", 2, None))
# The decoders compared, in figure order ("auto": an import's mixed JPEG/PNG set).
# "reduced": simplejpeg decoding at the smallest DCT scale that covers the training crop;
# "window": libjpeg-turbo decoding only the crop's window, resized into the batch.
DECODER_ORDER = ("pil", "simplejpeg", "reduced", "window", "auto")


def decoder_table(df: pd.DataFrame) -> pd.DataFrame:
    """The JPEG set's one-thread, 2-thread and 2-process throughput with each decoder, and
    each path's speedup over one thread with the same decoder."""
    table = prefetch_table(df)
    table = table[table["decode"].isin(DECODER_ORDER)]
    keys = {f"{p}/w{w}/{m or LOADER_PATHS[p].start_method or ''}" for p, w, m in DECODER_PATHS}
    columns = ["dataset", "decode", "path", "label", "samples_per_s", "low", "high", "speedup",
               "stat"]
    return table[table["path"].isin(keys)][columns].reset_index(drop=True)


def decoder_findings(table: pd.DataFrame) -> list[str]:
    """How two threads scale each decoder, from ``prefetch_table``."""
    sentences = []
    decoders = table[table["decode"].isin(DECODER_ORDER)]
    for dataset, part in decoders.groupby("dataset", sort=False):
        threads = {decode: _path(rows, "thread", 2)
                   for decode, rows in part.groupby("decode")}
        if all(threads.get(d) is not None for d in ("pil", "simplejpeg")):
            sentences.append(decoder_scaling_sentence(dataset, part, threads))
        sentences += reduced_decode_findings(dataset, part)
    return sentences


def cpu_ms_per_sample(row: pd.Series) -> float:
    """CPU time the path's whole process tree spent per sample delivered, in ms."""
    return float(row["cpu_utilisation"]) / float(row["samples_per_s"]) * 1e3


def time_text(ms: float) -> str:
    """``"0.47 ms"``, or ``"8.2 µs"`` under a tenth of a millisecond."""
    return f"{ms:.2f} ms" if ms >= 0.1 else f"{ms * 1e3:.1f} \u00b5s"


def decoder_scaling_sentence(dataset: str, part: pd.DataFrame, threads: Mapping) -> str:
    """How much a second thread gains each decoder, and what the rows say of why: the CPU
    one and two threads spend per sample and the cores two keep busy (both decoders
    release the GIL while they decode; the rest of each sample's work does not scale)."""
    serial = {d: _path(part[part["decode"] == d], "none", 0) for d in ("pil", "simplejpeg")}
    gains = {d: threads[d]["speedup"] for d in ("pil", "simplejpeg")}
    more, less = sorted(gains, key=lambda d: gains[d], reverse=True)
    text = (f"{dataset}: two threads speed up {more} decoding "
            f"{format_ratio(gains[more])} over one thread and {less} "
            f"{format_ratio(gains[less])}.")
    measured = [serial[d] is not None and not pd.isna(serial[d]["cpu_utilisation"])
                and not pd.isna(threads[d]["cpu_utilisation"]) for d in serial]
    if not all(measured):
        return text
    one = {d: cpu_ms_per_sample(serial[d]) for d in serial}
    two = {d: cpu_ms_per_sample(threads[d]) for d in serial}
    busy = {d: float(threads[d]["cpu_utilisation"]) for d in serial}
    return (text + f" CPU per sample, one thread then two: {more} {time_text(one[more])} "
            f"then {time_text(two[more])} ({two[more] / one[more] - 1:+.0%}), {less} "
            f"{time_text(one[less])} then {time_text(two[less])} "
            f"({two[less] / one[less] - 1:+.0%}); two threads keep {busy[more]:.2f} and "
            f"{busy[less]:.2f} cores busy." + (
                " On as many busy cores, the decoder whose second thread costs less extra CPU "
                "per sample gains more." if abs(busy[more] - busy[less]) <= 0.1 * max(
                    busy.values()) else ""))


def threads_vs_processes_findings(table: pd.DataFrame) -> list[str]:
    """Why threads or processes win on each panel, from the rows: CPU spent per sample
    delivered and cores kept busy by two of each (``cpu_utilisation``)."""
    sentences = []
    for (dataset, decode), part in table.groupby(["dataset", "decode"], sort=False):
        thread, process = _path(part, "thread", 2), _path(part, "process", 2)
        if thread is None or process is None or pd.isna(
                [thread["cpu_utilisation"], process["cpu_utilisation"]]).any():
            continue
        cpu = {"thread": cpu_ms_per_sample(thread), "process": cpu_ms_per_sample(process)}
        busy = {"thread": float(thread["cpu_utilisation"]),
                "process": float(process["cpu_utilisation"])}
        winner, loser = ((thread, process) if thread["samples_per_s"] >= process["samples_per_s"]
                         else (process, thread))
        why = []
        if cpu["process"] > cpu["thread"] * 1.05:
            why.append(f"processes spend {time_text(cpu['process'] - cpu['thread'])} more CPU "
                       "per sample, handing every batch from the workers to the consumer")
        if busy["thread"] < busy["process"] - 0.2:
            why.append(f"threads keep only {busy['thread']:.2f} cores busy against "
                       f"{busy['process']:.2f}: what holds the GIL runs one thread at a time")
        sentences.append(
            f"{decoded_label(dataset, decode)}: {winner['label']} delivers "
            f"{format_value(winner['samples_per_s'], 'samples/s')} against "
            f"{format_value(loser['samples_per_s'], 'samples/s')} for {loser['label']}; "
            f"CPU per sample: threads {time_text(cpu['thread'])}, processes "
            f"{time_text(cpu['process'])}" + (f" ({'; '.join(why)})." if why else "."))
    return sentences


# The partial decodes set against the full simplejpeg decode, as the findings word them.
PARTIAL_DECODES = {
    "reduced": "decoding each JPEG at the smallest DCT scale that covers its training crop "
               "(decode='reduced')",
    "window": "decoding only each JPEG's crop window and resizing it into the batch "
              "(decode='window')",
}


def reduced_decode_findings(dataset: str, part: pd.DataFrame) -> list[str]:
    """The reduced-size and crop-window decodes against the full simplejpeg decode on the
    same paths."""
    sentences = []
    for decode, what in PARTIAL_DECODES.items():
        for prefetcher, workers in (("none", 0), ("thread", 2), ("process", 2)):
            full, partial = (_path(part[part["decode"] == d], prefetcher, workers)
                             for d in ("simplejpeg", decode))
            if full is None or partial is None:
                continue
            sentences.append(
                f"{dataset}, {partial['label']}: {what} runs "
                f"{relative_text(partial['samples_per_s'] / full['samples_per_s'])} the full "
                f"simplejpeg decode ({format_value(partial['samples_per_s'], 'samples/s')} vs "
                f"{format_value(full['samples_per_s'], 'samples/s')}).")
    return sentences


def tf_data_findings(df: pd.DataFrame) -> list[str]:
    """tf.data's native TFRecord pipeline against our best path on the same JPEG samples,
    and the GIL-bound from_generator path against one thread."""
    table = prefetch_table(df)
    sentences = []
    native = table[table["prefetcher"] == "tf_data"]
    ours = table[(table["decode"] == "simplejpeg")
                 & table["prefetcher"].map(lambda p: LOADER_PATHS.get(p) is not None
                                           and LOADER_PATHS[p].family == "storebench")]
    if not native.empty and not ours.empty:
        tf_row, best = native.iloc[0], best_row(ours, "samples_per_s")
        what = "decodes and crops" if tf_row["transform"] else "decodes"
        sentences.append(
            f"The same JPEG samples: {tf_row['label']} over {tf_row['dataset']} (TensorFlow "
            f"{what}) delivers {format_value(tf_row['samples_per_s'], 'samples/s')}; our "
            f"best, {best['label']} over {best['dataset']} with simplejpeg, "
            f"{format_value(best['samples_per_s'], 'samples/s')} "
            f"({format_ratio(best['samples_per_s'] / tf_row['samples_per_s'])} tf.data).")
    for _, row in table[table["prefetcher"] == "tf_generator"].iterrows():
        sentences.append(
            f"{row['label']} over {decoded_label(row['dataset'], row['decode'])}: "
            f"{format_value(row['samples_per_s'], 'samples/s')}, "
            f"{format_ratio(row['speedup'])} one thread without TensorFlow.")
    return sentences


def _with_native_tf_data(rows: pd.DataFrame) -> pd.DataFrame:
    """tf.data's native pipeline reads the TFRecord copy of the JPEG set and decodes with
    TensorFlow: shown in the panel of the same JPEG samples decoded with simplejpeg."""
    native = rows["prefetcher"] == "tf_data"
    jpeg = rows[(rows["encoding"] == "jpeg") & (rows["decode"] == "simplejpeg")]
    if not native.any() or jpeg.empty:
        return rows
    moved = rows[native].assign(
        label=[f"{label} (over {d}, TensorFlow decodes{' and crops' if crop else ''})"
               for label, d, crop in zip(rows.loc[native, "label"], rows.loc[native, "dataset"],
                                         rows.loc[native, "transform"])],
        dataset=jpeg["dataset"].iloc[0], decode="simplejpeg")
    return pd.concat([rows[~native], moved])


def plot_prefetch_scaling(df: pd.DataFrame, *, workloads: Mapping | None = None) -> Figure:
    """Throughput against worker count for our thread and process prefetchers (fork), one
    panel per dataset and decoder whose worker count was swept (two counts or more: one
    point is no sweep); one thread as a dashed line for reference."""
    rows = prefetch_rows(df)
    rows = rows[rows["metric"] == "samples_per_s"]
    swept = rows[rows["prefetcher"].isin(["thread", "process"])]
    if swept.empty:
        return empty_figure("no prefetch rows")
    counts = swept.groupby(["dataset", "decode"], sort=False)["workers"].nunique()
    panels = [panel for panel in dict.fromkeys(zip(swept["dataset"], swept["decode"]))
              if counts[panel] > 1]
    if not panels:
        return empty_figure("no worker count was swept")
    fig = Figure(figsize=(3.6 * len(panels), 3.6), layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (dataset, decode) in zip(axes, panels, strict=True):
        part = rows[(rows["dataset"] == dataset) & (rows["decode"] == decode)]
        for prefetcher in ("thread", "process"):
            swept = part[(part["prefetcher"] == prefetcher)
                         & ~part["path"].str.endswith("/spawn")]
            summary = summarise(swept, "samples_per_s", ["workers"]).sort_values("workers")
            if summary.empty:
                continue
            median = summary["median"].to_numpy(dtype=float)
            ax.errorbar(summary["workers"].astype(int), median,
                        yerr=[median - summary["low"].to_numpy(dtype=float),
                              summary["high"].to_numpy(dtype=float) - median],
                        marker="o", capsize=2, color=path_colour(prefetcher),
                        label=LOADER_PATHS[prefetcher].label)
        serial = summarise(part[part["prefetcher"] == "none"], "samples_per_s", ["path"])
        if not serial.empty:
            ax.axhline(float(serial["median"].iloc[0]), color=path_colour("none"),
                       linestyle="--", linewidth=1, label=LOADER_PATHS["none"].label)
        ax.set_ylim(bottom=0)
        linear_axis(ax)
        ax.set_xlabel("workers")
        ax.set_xticks(sorted(part.loc[part["prefetcher"].isin(["thread", "process"]),
                                      "workers"].unique()))
        encoding = part["encoding"].iloc[0]
        ax.set_title(f"{decoded_label(dataset, decode)}\n"
                     f"{study_caption(part, encoding, workloads, width=45)}",
                     fontsize="small")
    legend_below(fig, axes, fontsize="x-small")
    axes[0].set_ylabel(metric_title("samples_per_s"))
    fig.suptitle("Our prefetchers against worker count (warm, shuffled; median, min-max)")
    return fig


def plot_prefetch_paths(df: pd.DataFrame, *, workloads: Mapping | None = None) -> Figure:
    """Every loader path (ours, the frameworks', the naive baselines) side by side, one
    panel per dataset and decoder; log axis; colour by path from the registry."""
    rows = prefetch_rows(df)
    rows = rows[rows["metric"] == "samples_per_s"]
    if rows.empty:
        return empty_figure("no prefetch rows")
    rows = _with_native_tf_data(rows)
    panels = list(dict.fromkeys(zip(rows["dataset"], rows["decode"])))
    heights = [rows.loc[(rows["dataset"] == d) & (rows["decode"] == c), "path"].nunique()
               for d, c in panels]
    fig = Figure(figsize=(7.5, 0.27 * sum(heights) + 0.9 * len(panels) + 0.8),
                 layout="constrained")
    axes = fig.subplots(len(panels), 1, squeeze=False, height_ratios=heights)[:, 0]
    order = list(LOADER_PATHS)
    best = []
    for ax, (dataset, decode) in zip(axes, panels, strict=True):
        part = rows[(rows["dataset"] == dataset) & (rows["decode"] == decode)]
        summary = summarise(part, "samples_per_s", ["label", "prefetcher", "workers"])
        summary = summary.sort_values(
            ["prefetcher", "workers"], key=lambda c: c.map(
                lambda v: order.index(v) if v in order else v), kind="stable")
        bars(ax, list(summary["label"]), summary,
             colours=[path_colour(p) for p in summary["prefetcher"]], horizontal=True)
        # Bars from zero on a linear axis: a bar's length is its rate, so 5% looks like 5%.
        linear_axis(ax, "x")
        ax.set_xlim(0, float(summary["high"].max()) * 1.05)
        top = summary.loc[summary["median"].idxmax()]
        serial = summary.loc[summary["prefetcher"] == "none", "median"]
        gain = top["median"] / serial.iloc[0] if not serial.empty else np.nan
        encoding = part["encoding"].iloc[0]
        ax.set_title(f"{decoded_label(dataset, decode)} "
                     f"({study_caption(part, encoding, workloads, width=90)})"
                     + (f"\nfastest: {top['label']}, {format_ratio(gain)} one thread"
                        if finite(gain) else ""), fontsize="medium")
        best.append((gain, top["label"], decoded_label(dataset, decode)))
    axes[-1].set_xlabel(metric_title("samples_per_s") + " (warm, shuffled)")
    gains = [b for b in best if finite(b[0])]
    takeaway = ""
    if gains:
        low, high = min(gains), max(gains)
        takeaway = (f"The fastest path gains {format_ratio(low[0])} ({low[2]}) to "
                    f"{format_ratio(high[0])} ({high[2]}) over one thread")
    titled(fig, "Which loader path delivers most samples per second? (median, min-max)",
           takeaway)
    return fig


def plot_decoders(df: pd.DataFrame, *, workloads: Mapping | None = None) -> Figure:
    """The JPEG decoders: one thread, 2 threads and 2 processes for
    each JPEG decoder, as speedup over one thread with the same decoder."""
    table = decoder_table(df)
    decoders = ordered(table["decode"], DECODER_ORDER)
    if table.empty:
        return empty_figure("no decoder rows")
    labels = list(dict.fromkeys(table.sort_values("path")["label"]))
    mark_drawn(table["stat"])  # a bar each, of prefetch_table's many paths
    fig = Figure(figsize=(7, 3.8), layout="constrained")
    ax = fig.add_subplot()
    width = 0.8 / len(labels)
    for v, label in enumerate(labels):
        for d, decode in enumerate(decoders):
            row = table[(table["decode"] == decode) & (table["label"] == label)]
            if row.empty:
                continue
            base = float(row["samples_per_s"].iloc[0]) / float(row["speedup"].iloc[0])
            median, low, high = (float(row[c].iloc[0]) / base
                                 for c in ("samples_per_s", "low", "high"))
            x = d + (v - (len(labels) - 1) / 2) * width
            prefetcher = row["path"].iloc[0].split("/")[0]
            ax.bar(x, median, width * 0.95, color=path_colour(prefetcher), edgecolor="black",
                   linewidth=0.5, label=label if d == 0 else None)
            ax.errorbar(x, median, yerr=[[median - low], [high - median]], fmt="none",
                        ecolor="black", capsize=2)
    ax.axhline(1.0, color="grey", linestyle=":", linewidth=0.8)
    names = {"pil": "PIL\n(holds the GIL)", "simplejpeg": "simplejpeg\n(releases the GIL)",
             "reduced": "reduced-size DCT\n(simplejpeg, the\ncrop's scale)",
             "window": "crop window only\n(libjpeg-turbo, resized\ninto the batch)",
             "auto": "auto (simplejpeg\nfor JPEG, else PIL)"}
    ax.set_xticks(range(len(decoders)), [names.get(d, d) for d in decoders], fontsize="small")
    ax.set_ylabel("throughput / one thread, same decoder")
    # Outside the axes: inside, the best corner can still hide a whisker.
    legend_below(fig, [ax], ncols=3)
    rows = prefetch_rows(df)
    jpeg = rows[rows["decode"].isin(decoders)]
    crop = ", each through the training crop" if transformed(jpeg) else ""
    encoding = str(jpeg["encoding"].iloc[0]) if not jpeg.empty else None
    fig.suptitle(f"JPEG decoders under threads and processes{crop}\n"
                 f"{study_caption(jpeg, encoding, workloads, width=100)}", fontsize="medium")
    return fig


def plot_prefetch_memory(df: pd.DataFrame) -> Figure:
    """Peak memory of the loader paths that peak highest, each with its dataset's size
    (from the formats study's build rows, where ``df`` holds them)."""
    rows = prefetch_rows(df)
    sizes = build_cost_table(df).set_index("dataset")["bytes_apparent"]
    rows = rows.assign(label=[f"{decoded_label(d, c)}: {label}" for d, c, label in
                              zip(rows["dataset"], rows["decode"], rows["label"])],
                       dataset_bytes=rows["dataset"].map(sizes))
    return plot_peak_memory(rows, label_column="label", size_column="dataset_bytes",
                            title="Which loader paths need the most memory?")


FIGURES = (
    FigureSpec("prefetch_paths", "Thread vs process vs framework loader paths",
               lambda r: plot_prefetch_paths(r.df, workloads=r.workloads.get("prefetch"))),
    FigureSpec("prefetch_scaling", "Our prefetchers against worker count",
               lambda r: plot_prefetch_scaling(r.df, workloads=r.workloads.get("prefetch"))),
    FigureSpec("prefetch_decoders", "PIL vs simplejpeg (and its reduced-size decode)",
               lambda r: plot_decoders(r.df, workloads=r.workloads.get("prefetch"))),
    FigureSpec("prefetch_peak_memory", "Peak memory of each loader path",
               lambda r: plot_prefetch_memory(r.df)),
)


def findings(results: Results) -> list[str]:
    return prefetch_findings(results.df) + tf_data_findings(results.df)
