"""The gpu_decode study's tables, figures and findings: device decode against the CPU, and
the cores one accelerator needs at the model's rate."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from ...loaders.paths import path_label
from ...plots import legend_below, question_title
from ...results import Results, medians_table, ok_repeats, select, stat
from ...text import format_percent, format_value
from ..base import FigureSpec
from .grid import BATCH_SIZE, EMULATED_DEMAND, FUNCTIONS, NAME

EMULATED_SOURCE = "emulated: MLPerf Storage's ResNet-50 rate per H100"
# The cases' ``demand_source`` param: what their demand is, as the text above says it.
DEMAND_SOURCES = {"emulated": EMULATED_SOURCE, "resnet50": "ResNet-50 step, measured"}
# MLPerf Storage counts a run as keeping the accelerator fed at >= 90% utilisation.
AU_THRESHOLD = 0.9


def decode_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The study's rows with ``family`` (a key of ``FUNCTIONS``), ``library``, ``decode``
    and ``label`` columns."""
    rows = df[df["study"] == NAME]
    if rows.empty:
        return rows.assign(family=[], library=[], decode=[], label=[])
    by_function = {fn.removesuffix("_case"): family for family, fn in FUNCTIONS.items()}
    params = rows["params"].map(json.loads)
    family = rows["case_id"].str.partition(":")[0].map(by_function)
    return rows.assign(
        family=family,
        library=params.map(lambda p: p.get("library", "")),
        decode=params.map(lambda p: p.get("decode", "")),
        label=[_label(f, p, prefetcher, workers) for f, p, prefetcher, workers
               in zip(family, params, rows["prefetcher"], rows["workers"])],
    )


def _label(family: str, params: dict, prefetcher: str, workers) -> str:
    if family == "device":
        library = params.get("library", "")
        if library == "dali":
            return f"DALI mixed, hw_decoder_load={params.get('hw_decoder_load')}"
        return {"nvimgcodec": "nvImageCodec", "torchvision": "torchvision.io (nvJPEG)"}.get(
            library, library)
    if family == "demand":
        return "ResNet-50 training step"
    if family == "cpu":
        decode = "reduced-size" if params.get("decode") == "reduced" else "whole-image"
        return f"simplejpeg {decode}, {path_label(prefetcher)}"
    return ""


def skipped_reasons(df: pd.DataFrame, family: str) -> list[str]:
    """The distinct reasons the family's cases were skipped (latest runs), case ids cut."""
    rows = decode_rows(df)
    rows = rows[(rows["family"] == family) & (rows["status"] == "skipped")]
    return sorted({error.partition(": ")[2] if error.startswith("case ") else error
                   for error in rows["error"]})


def device_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per device decode path: medians of images/s, CPU cores busy, device memory and the
    differences from its CPU fallback and from our decode."""
    rows = decode_rows(df)
    return medians_table(rows[rows["family"] == "device"], (
        "samples_per_s", "cpu_cores_busy", "device_used_bytes", "fallback_mean_diff_levels",
        "fallback_max_diff_levels", "ours_mean_diff_levels"), ["label"])


def cores_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per CPU decode, prefetcher and worker count: medians of delivered samples/s, CPU
    cores busy, AU against the demand, and the demand itself."""
    rows = decode_rows(df)
    rows = rows.assign(workers=rows["workers"].fillna(0).astype(int))
    return medians_table(rows[rows["family"] == "cpu"], (
        "samples_per_s", "cpu_cores_busy", "accelerator_utilisation", "demand_samples_per_s"),
        ["label", "decode", "prefetcher", "workers"])


def model_demand(df: pd.DataFrame) -> float | None:
    """The ResNet-50 step's median samples/s, None where it was not measured."""
    rows = decode_rows(df)
    picked = select(rows[rows["family"] == "demand"], "samples_per_s")
    return None if picked.empty else stat(picked, "samples_per_s").median


def demand_line(df: pd.DataFrame) -> tuple[float, str]:
    """The rate the accelerator consumes and what it is: the model's, or the emulated one
    the cores curve fed."""
    measured = model_demand(df)
    if measured is not None:
        return measured, DEMAND_SOURCES["resnet50"]
    rows = decode_rows(df)
    fed = ok_repeats(rows[rows["family"] == "cpu"])
    if not fed.empty:
        source = json.loads(fed["params"].iloc[-1]).get("demand_source", "emulated")
        return (float(stat(fed, "demand_samples_per_s").median),
                DEMAND_SOURCES.get(source, source))
    return EMULATED_DEMAND, EMULATED_SOURCE


def latest_device_run(root: Path | str) -> Results | None:
    """The newest run stored under ``root`` (one folder per run, as ``results/gpu-runs``
    keeps them) with a device case of this study measured; None where there is none."""
    root = Path(root)
    found = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else ():
        try:
            results = Results.load(folder)
        except FileNotFoundError:
            continue
        rows = ok_repeats(decode_rows(results.df))
        if rows["family"].isin(["device", "demand"]).any():
            found.append((str(results.env.get("run_id") or folder.name), results))
    return max(found, key=lambda run: run[0])[1] if found else None


def not_measured_figure(reason: str) -> Figure:
    """A figure that says what was not measured and why, instead of empty axes."""
    fig = Figure(figsize=(8, 2.4))
    ax = fig.add_subplot()
    ax.axis("off")
    ax.text(0.5, 0.5, textwrap.fill(f"not measured: {reason}", 90), ha="center", va="center",
            fontsize="medium", wrap=True)
    return fig


def _reasons_text(df: pd.DataFrame, family: str) -> str:
    return "; ".join(skipped_reasons(df, family)) or "no rows in these results"


def _why_not(df: pd.DataFrame, family: str, what: str) -> str:
    return f"{what}: {_reasons_text(df, family)}"


def _curve_styles(table: pd.DataFrame) -> dict[str, dict]:
    colours = {"full": "#1f77b4", "reduced": "#ff7f0e"}
    # Two prefetchers that deliver alike draw on top of each other: the thread's line is
    # dashed, with smaller square markers, so both stay visible.
    styles = {"thread": {"linestyle": "--", "marker": "s", "markersize": 4},
              "process": {"linestyle": "-", "marker": "o", "markersize": 8}}
    return {label: {"color": colours.get(decode, "black"),
                    **styles.get(p, {"linestyle": ":", "marker": "^"})}
            for label, decode, p in table[["label", "decode", "prefetcher"]].drop_duplicates(
                ).itertuples(index=False)}


def _by_cores(table: pd.DataFrame, metric: str, *, height: float):
    """A figure of ``metric`` against the CPU cores decoding, one line per decode and
    prefetcher: (figure, its axes)."""
    fig = Figure(figsize=(8, height), layout="constrained")
    ax = fig.add_subplot()
    for label, style in _curve_styles(table).items():
        part = table[table["label"] == label].sort_values("workers")
        ax.plot(part["workers"], part[metric], label=label, **style)
    counts = sorted(set(table["workers"]))
    if len(counts) >= 3:  # doubling core counts (1, 2, 4, 8...) sit evenly on a log axis
        ax.set_xscale("log", base=2)
    ax.set_xticks(counts, [str(c) for c in counts])
    ax.minorticks_off()
    ax.set_xlabel("CPU cores decoding (prefetch workers)")
    return fig, ax


def plot_cores(df: pd.DataFrame) -> Figure:
    """Delivered samples/s against the CPU cores decoding (workers), one line per decode
    and prefetcher, with the accelerator's demand drawn across."""
    table = cores_table(df)
    if table.empty:
        return not_measured_figure(_why_not(df, "cpu", "the CPU decode curve"))
    demand, source = demand_line(df)
    fig, ax = _by_cores(table, "samples_per_s", height=4.5)
    ax.axhline(demand, color="#d62728", linewidth=1.5,
               label=f"demand: {format_value(demand, 'samples/s')} ({source})")
    ax.set_ylabel("delivered samples/s")
    ax.set_ylim(bottom=0)
    legend_below(fig, [ax], fontsize="small", ncols=2)
    question_title(fig, "How many CPU cores does one accelerator need to decode its JPEGs "
                        "(375\u00d7500)?", cores_takeaway(table, demand))
    return fig


def cores_takeaway(table: pd.DataFrame, demand: float) -> str:
    """The fewest cores at which a decode and prefetcher delivered ``demand``, per decode."""
    reached = table[table["samples_per_s"] >= demand].sort_values("workers")
    if reached.empty:
        most = int(table["workers"].max())
        return (f"No path measured reached {format_value(demand, 'samples/s')} with up to "
                f"{most} cores.")
    first = reached.drop_duplicates("decode")
    return "Demand met with " + "; ".join(
        f"{row['label']} at {int(row['workers'])} cores" for _, row in first.iterrows()) + "."


def plot_gpu_vs_cpu(df: pd.DataFrame) -> Figure:
    """Images/s of every device decode path beside CPU decode at one core and at the most
    cores measured, each bar labelled with the CPU cores it kept busy; device paths not
    measured are named with the reason."""
    device = device_table(df)
    cores = cores_table(df)
    bars = [(row["label"] + " (GPU)", row["samples_per_s"], row["cpu_cores_busy"], "#2ca02c")
            for _, row in device.iterrows()]
    for label, part in cores.groupby("label", sort=False):
        for workers in sorted({part["workers"].min(), part["workers"].max()}):
            row = part[part["workers"] == workers].iloc[0]
            bars.append((f"{label} \u00d7{workers} (CPU)", row["samples_per_s"],
                         row["cpu_cores_busy"], "#1f77b4"))
    if not bars:
        return not_measured_figure(_why_not(df, "device", "decode on the device"))
    fig = Figure(figsize=(9, 1.2 + 0.45 * len(bars)), layout="constrained")
    ax = fig.add_subplot()
    y = np.arange(len(bars))
    ax.barh(y, [b[1] for b in bars], color=[b[3] for b in bars], edgecolor="black",
            linewidth=0.4)
    for k, (_, rate, busy, _) in enumerate(bars):
        ax.text(rate, k, f" {format_value(rate, 'samples/s')}, {busy:.1f} cores busy",
                va="center", fontsize="x-small")
    ax.set_yticks(y, [b[0] for b in bars], fontsize="small")
    ax.set_ylim(len(bars) - 0.5, -0.5)
    ax.set_xlim(0, max(b[1] for b in bars) * 1.45)
    ax.set_xlabel("images/s (decode, crop and flip on the GPU; decode on the CPU)")
    best = max(bars, key=lambda b: b[1])
    takeaway = (f"Fastest: {best[0]}, {format_value(best[1], 'samples/s')} with "
                f"{best[2]:.1f} CPU cores busy.")
    if device.empty:
        takeaway += f" GPU decode not measured: {_reasons_text(df, 'device')}"
    question_title(fig, "Does JPEG decode on the GPU beat decode on the CPU, and how many CPU "
                        "cores does each keep busy?", takeaway)
    return fig


def plot_au(df: pd.DataFrame) -> Figure:
    """AU against the CPU cores decoding, at the model's rate (measured, else emulated),
    one line per decode and prefetcher, with the 90% bar."""
    table = cores_table(df)
    if table.empty or table["accelerator_utilisation"].isna().all():
        return not_measured_figure(_why_not(df, "cpu", "accelerator utilisation"))
    demand, source = demand_line(df)
    fig, ax = _by_cores(table, "accelerator_utilisation", height=4.2)
    ax.axhline(AU_THRESHOLD, color="grey", linestyle=":",
               label=f"{format_percent(AU_THRESHOLD)} AU")
    ax.set_ylim(-0.02, 1.05)
    ax.set_ylabel("accelerator utilisation")
    legend_below(fig, [ax], fontsize="small", ncols=2)
    busy = table[table["accelerator_utilisation"] >= AU_THRESHOLD].sort_values("workers")
    question_title(fig, f"How busy is the accelerator at {format_value(demand, 'samples/s')} "
                        f"({source}), by CPU cores decoding?",
                   (f"{format_percent(AU_THRESHOLD)} AU first at {int(busy['workers'].iloc[0])} "
                    f"cores ({busy['label'].iloc[0]})." if not busy.empty else
                    f"No path measured reached {format_percent(AU_THRESHOLD)} AU."))
    return fig


FIGURES = (
    FigureSpec("gpu_decode_cores", "CPU cores per accelerator: delivered samples/s against "
               "the cores decoding, with the accelerator's demand", lambda r: plot_cores(r.df)),
    FigureSpec("gpu_decode_gpu_vs_cpu", "JPEG decode on the GPU against decode on the CPU, "
               "with the CPU cores each kept busy", lambda r: plot_gpu_vs_cpu(r.df)),
    FigureSpec("gpu_decode_au", "Accelerator utilisation at the model's rate against the "
               "CPU cores decoding", lambda r: plot_au(r.df)),
)


def device_findings(df: pd.DataFrame) -> list[str]:
    table = device_table(df)
    if table.empty:
        return [f"Decode on the device was not measured: {_reasons_text(df, 'device')}."]
    described = "; ".join(
        f"{row['label']} {format_value(row['samples_per_s'], 'samples/s')} with "
        f"{row['cpu_cores_busy']:.1f} CPU cores busy and "
        f"{format_value(row['device_used_bytes'], 'bytes')} of device memory in use "
        f"(mean difference from its CPU fallback {row['fallback_mean_diff_levels']:.2f} grey "
        f"levels, from our decode {row['ours_mean_diff_levels']:.2f})"
        for _, row in table.iterrows())
    sentences = [f"Decoding, cropping and flipping on the device: {described}."]
    reasons = skipped_reasons(df, "device")
    if reasons:
        sentences.append(f"Not measured on the device: {'; '.join(reasons)}.")
    return sentences


def cores_findings(df: pd.DataFrame) -> list[str]:
    table = cores_table(df)
    if table.empty:
        return [f"The CPU decode curve was not measured: {_reasons_text(df, 'cpu')}."]
    demand, source = demand_line(df)
    sentences = []
    for label, part in table.groupby("label", sort=False):
        part = part.sort_values("workers")
        fed = part[part["accelerator_utilisation"] >= AU_THRESHOLD]
        most = part.iloc[-1]
        if fed.empty:
            sentences.append(
                f"{label}: no core count measured kept the accelerator at "
                f"{format_value(demand, 'samples/s')} ({source}) {format_percent(AU_THRESHOLD)} "
                f"busy; {int(most['workers'])} cores delivered "
                f"{format_value(most['samples_per_s'], 'samples/s')} (AU "
                f"{format_percent(most['accelerator_utilisation'])}).")
        else:
            first = fed.iloc[0]
            sentences.append(
                f"{label}: {int(first['workers'])} cores keep the accelerator at "
                f"{format_value(demand, 'samples/s')} ({source}) at least "
                f"{format_percent(AU_THRESHOLD)} busy (AU "
                f"{format_percent(first['accelerator_utilisation'])}, "
                f"{format_value(first['samples_per_s'], 'samples/s')} delivered alone).")
    return sentences


def findings(results: Results) -> list[str]:
    df = results.df
    measured = model_demand(df)
    if measured is None:
        demand = [f"The ResNet-50 step was not measured: "
                  f"{_reasons_text(df, 'demand')}; the cores curve "
                  f"fed an accelerator emulated at {format_value(demand_line(df)[0], 'samples/s')} "
                  f"({EMULATED_SOURCE})."]
    else:
        demand = [f"ResNet-50 training steps (bf16 autocast, channels_last, batch {BATCH_SIZE}) "
                  f"ran at {format_value(measured, 'samples/s')} on data already on the device: "
                  "the rate each feed path must sustain."]
    return [*demand, *device_findings(df), *cores_findings(df)]
