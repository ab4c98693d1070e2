"""The gpu_feed study's table, figure, findings and caveats: per compute time and path, the
accelerator's utilisation and where its idle time went."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from ...loaders.paths import path_label
from ...plots import (
    empty_figure,
    legend_below,
    log_axis,
    profile_caption,
    question_title,
    summarise,
)
from ...results import Results, best_row, latest_runs, medians_table, summary_table
from ...text import (
    MULTIPLY,
    bullets,
    format_percent,
    format_percent_beside,
    format_ratio,
    format_value,
    grid_value,
    machine_text,
    sig,
)
from ..base import FigureSpec

# The bar: AU >= 95% whenever the path's own rate is >= 1.25x the accelerator's.
FED_AU = 0.95
FED_HEADROOM = 1.25


# The copy mode of a prefetcher that page-locks its own slots (pin_memory=True).
PINNED_SLOTS = "pinned slots, sync"


def copy_mode(params: Mapping) -> str:
    if params.get("pin_memory"):
        return PINNED_SLOTS
    if params.get("non_blocking"):
        return "pinned, non_blocking"
    if params.get("pinned"):
        return "pinned, sync"
    return "pageable, sync"


FEED_METRICS = ("accelerator_utilisation", "stall_fraction", "wait_for_data_fraction",
                "host_copy_fraction", "host_overhead_fraction", "h2d_GBps", "h2d_device_GBps",
                "samples_per_s")


def feed_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The study's rows with ``compute_ms``, ``copy`` (mode), ``feed_loader`` (registry
    key, workers), ``path`` (registry key, workers, copy mode) and ``label`` columns."""
    rows = df[df["study"] == "gpu_feed"]
    if rows.empty:
        return rows.assign(compute_ms=[], copy=[], feed_loader=[], path=[], label=[])
    params = rows["params"].map(json.loads)
    workers = rows["workers"].fillna(0).astype(int)
    copies = params.map(copy_mode)
    labels = [path_label(p, w, m.get("start_method"))
              for p, w, m in zip(rows["prefetcher"], workers, params)]
    return rows.assign(
        compute_ms=params.map(lambda p: float(p.get("compute_ms", 0.0))),
        copy=copies,
        feed_loader=[f"{p}/w{w}" for p, w in zip(rows["prefetcher"], workers)],
        path=[f"{p}/w{w}/{c}" for p, w, c in zip(rows["prefetcher"], workers, copies)],
        label=[f"{label}, {c}" if c != "pageable, sync" else label
               for label, c in zip(labels, copies)],
    )


def feed_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per compute time and path: medians of AU, stall (and its split where measured),
    host-to-device GB/s and samples/s; the repeats; and whether the path's own rate (at
    0 ms) gives ``FED_HEADROOM`` over the accelerator's rate."""
    rows = feed_rows(df)
    keys = ["compute_ms", "path", "label", "prefetcher", "feed_loader", "copy"]
    columns = [*keys, *FEED_METRICS, "repeats", "path_rate_over_accelerator"]
    if rows.empty:
        return pd.DataFrame(columns=columns)
    table = medians_table(rows, FEED_METRICS, keys)
    if table.empty:  # every row failed or was skipped
        return pd.DataFrame(columns=columns)
    # The repeats of the first metric measured: a repeat measures them all.
    first = next(metric for metric in FEED_METRICS if table[metric].notna().any())
    table = table.set_index(keys)
    table["repeats"] = summary_table(rows, first, keys).set_index(keys)["repeats"]
    table = table.reset_index()
    own_rate = table[table["compute_ms"] == 0].set_index("path")["samples_per_s"]
    batch = rows.groupby("path")["batch_size"].first()
    with np.errstate(divide="ignore"):
        accelerator_rate = batch.reindex(table["path"]).to_numpy(dtype=float) / (
            table["compute_ms"].to_numpy(dtype=float) / 1000.0)
        table["path_rate_over_accelerator"] = (
            own_rate.reindex(table["path"]).to_numpy(dtype=float) / accelerator_rate)
    return table.sort_values(["compute_ms", "path"], kind="stable").reset_index(
        drop=True)[columns]


def feed_devices(df: pd.DataFrame) -> pd.DataFrame:
    """Where the cases copied to, from their params: one row per (device, device_name,
    emulated). Cases from before these params existed count as emulated copies to the CPU."""
    rows = latest_runs(df[df["study"] == "gpu_feed"])
    columns = ["device", "device_name", "emulated"]
    if rows.empty:
        return pd.DataFrame(columns=columns)
    params = rows["params"].map(json.loads)
    found = pd.DataFrame({
        "device": params.map(lambda p: p.get("device", "cpu")),
        "device_name": params.map(lambda p: p.get("device_name", p.get("device", "cpu"))),
        "emulated": params.map(lambda p: bool(p.get("emulated", True))),
    })
    return found.drop_duplicates().reset_index(drop=True)


def feed_device_text(df: pd.DataFrame) -> str:
    """What the feed numbers are: real CUDA copies, or host copies into an emulated
    device."""
    devices = feed_devices(df)
    if devices.empty:
        return "No accelerator-feed results."
    real = devices[~devices["emulated"]]
    if not real.empty:
        names = ", ".join(sorted(set(real["device_name"])))
        return (f"Copies went to {names} (a real CUDA device, timed with CUDA events); the "
                "model's compute is emulated (a fixed time per batch, as MLPerf Storage does).")
    return ("No CUDA device took part (every feed row says emulated): the accelerator is "
            "emulated (a fixed compute time per batch, as MLPerf Storage does) and the "
            "host-to-device copy is a memcpy into a preallocated CPU tensor, so pinned and "
            "non_blocking copies were not measured.")


def latest_cuda_run(root: Path | str) -> Results | None:
    """The newest run stored under ``root`` (one folder per run, as ``results/gpu-runs``
    keeps them) whose feed copies went to a real CUDA device; None where there is none."""
    root = Path(root)
    if not root.is_dir():
        return None
    found = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        try:
            results = Results.load(folder)
        except FileNotFoundError:
            continue
        devices = feed_devices(results.df)
        if not devices.empty and not devices["emulated"].any():
            found.append((str(results.env.get("run_id") or folder.name), results))
    return max(found, key=lambda run: run[0])[1] if found else None


def feed_findings(df: pd.DataFrame, *, per_compute_time: bool = True) -> list[str]:
    """AU per path at each compute time with the stall split (unless ``per_compute_time``
    is False); whether AU reaches ``FED_AU`` wherever the path's own rate gives
    ``FED_HEADROOM`` over the accelerator's; pinned/non_blocking against pageable copies
    when measured."""
    table = feed_table(df)
    if table.empty:
        return []
    sentences = [feed_device_text(df), *_read_ahead_caveat(df)]
    busy = table[table["compute_ms"] > 0]
    for compute_ms, part in busy.groupby("compute_ms") if per_compute_time else ():
        described = "; ".join(
            f"{row['label']} {format_percent(row['accelerator_utilisation'])} (waiting for "
            f"data {format_percent(row['wait_for_data_fraction'])}, host copy "
            f"{format_percent(row['host_copy_fraction'])}, host overhead "
            f"{format_percent(row['host_overhead_fraction'])})"
            for _, row in part.iterrows())
        sentences.append(f"At {grid_value(compute_ms)} ms of compute per batch, accelerator "
                         f"utilisation is: {described}.")
    fed = busy[busy["path_rate_over_accelerator"] >= FED_HEADROOM]
    if not fed.empty:
        short = fed[fed["accelerator_utilisation"] < FED_AU]
        verdict = ("all reach" if short.empty else
                   f"{len(short)} of {len(fed)} fall short of")
        pairs = f"{len(fed)} pair{'s' if len(fed) != 1 else ''} of path and compute time"
        sentences.append(
            f"Where a path alone delivers at least {sig(FED_HEADROOM)}{MULTIPLY} the "
            f"accelerator's rate ({pairs}), {verdict} "
            f"{format_percent(FED_AU)} AU (lowest: "
            f"{format_percent_beside(fed['accelerator_utilisation'].min(), FED_AU)}).")
    zero = table[table["compute_ms"] == 0]
    if not zero.empty:
        fastest = best_row(zero, "samples_per_s")
        sentences.append(
            f"With no compute the feed itself runs at "
            f"{format_value(fastest['samples_per_s'], 'samples/s')} ({fastest['label']}, "
            f"{format_value(fastest['h2d_GBps'], 'GB/s')} copied).")
    gain = _pinned_over_pageable(table, "h2d_GBps")
    if gain is not None:
        sentence = (f"From the loader's memory to the device, pinned copies (the host copy "
                    f"into the page-locked buffer counted) run at {format_ratio(gain)} the "
                    "rate of pageable ones")
        dma = _pinned_over_pageable(table, "h2d_device_GBps")
        if dma is not None:
            sentence += f"; the device copy alone at {format_ratio(dma)}"
        sentences.append(sentence + " (medians over loaders and compute times).")
    in_place = _in_place_by_loader(table)
    staged = _pinned_over_pageable(table, "h2d_GBps", mode=PINNED_SLOTS, base="pinned, sync")
    if in_place:
        ratios = [f"{format_ratio(ratio)} for {label}" for label, ratio in in_place]
        listed = ratios[0] if len(ratios) == 1 else (
            f"{', '.join(ratios[:-1])} and {ratios[-1]}")
        sentence = (
            "Where the prefetcher writes each batch into memory it page-locked itself "
            "(pin_memory=True), the feeder copies each batch from where it lies. Over compute "
            f"times (medians), that runs at {listed} the rate of the same loader's pageable "
            "copies")
        if staged is not None:
            sentence += (f", and at {format_ratio(staged)} that of pinned copies through a "
                         "staging buffer (the median over the loaders measured both ways)")
        sentences.append(sentence + ".")
    return sentences


def _in_place_by_loader(table: pd.DataFrame) -> list[tuple[str, float]]:
    """(loader label, median over compute times of its pinned-slot copies' ``h2d_GBps``
    over its pageable ones') for each loader measured both ways."""
    found = []
    for _, part in table.groupby("feed_loader", sort=True):
        ratio = _pinned_over_pageable(part, "h2d_GBps", mode=PINNED_SLOTS)
        pageable = part[part["copy"] == "pageable, sync"]
        if ratio is not None and not pageable.empty:
            found.append((pageable["label"].iloc[0], ratio))
    return found


def _read_ahead_caveat(df: pd.DataFrame) -> list[str]:
    """For runs timed from the third batch whatever the loader had read ahead (their rows
    have no ``warmup_batches``): what that overstates."""
    rows = feed_rows(df)
    ahead = rows[(rows["workers"].fillna(0) > 0) & (rows["status"] == "ok")]
    timed_after = set(ahead.loc[ahead["metric"] == "warmup_batches", "case_id"])
    if ahead.empty or set(ahead["case_id"]) <= timed_after:
        return []
    return ["These prefetcher rows were timed from the third batch, before the batches the "
            "workers had read ahead were used up: where a path is slower than the "
            "accelerator, its AU and samples/s are overstated and its waiting for data "
            "understated (later runs time past them: warmup_batches)."]


def _pinned_over_pageable(table: pd.DataFrame, metric: str, *, mode: str = "pinned, sync",
                          base: str = "pageable, sync") -> float | None:
    """The median, over loaders and compute times, of ``mode`` copies' ``metric`` over
    ``base`` ones' (pinned sync over pageable by default), pairing only the loaders and
    compute times measured both ways; None where there is no such pair."""
    # Per loader and worker count: two counts of the same loader are two loaders here.
    copies = table.pivot_table(index=["compute_ms", "feed_loader"], columns="copy", values=metric)
    if mode not in copies or base not in copies:
        return None
    ratios = (copies[mode] / copies[base]).dropna()
    return float(ratios.median()) if not ratios.empty else None


# One colour per copy mode, the same in every panel and run: the panels are the loaders.
COPY_COLOURS = {"pageable, sync": "#1f77b4", "pinned, sync": "#ff7f0e",
                "pinned, non_blocking": "#2ca02c", PINNED_SLOTS: "#9467bd"}
TIME_PARTS = (("accelerator_utilisation", "#2ca02c", "computing"),
              ("wait_for_data_fraction", "#d62728", "waiting for data"),
              ("host_copy_fraction", "#ff7f0e", "host copy"),
              ("host_overhead_fraction", "#7f7f7f", "host overhead"))
# Compute times whose AUs spread wider than this across paths get a time split.
AU_SPREAD = 0.05


def loader_label(row) -> str:
    """The feeding loader of a table row, without its copy mode."""
    return row["label"].removesuffix(f", {row['copy']}")


def feed_demand(df: pd.DataFrame) -> pd.DataFrame:
    """Per path and compute time > 0: the accelerator's demand (batch / compute time,
    samples/s), the median AU, its range, and the path's own rate (its 0 ms row)."""
    rows = feed_rows(df)
    busy = rows[rows["compute_ms"] > 0]
    table = feed_table(df)
    if busy.empty or table.empty:
        return pd.DataFrame(columns=["path", "compute_ms", "demand", "median", "low", "high",
                                     "own_rate", "label", "loader", "copy"])
    au = summarise(busy, "accelerator_utilisation", ["path", "compute_ms"])
    batch = rows.groupby("path")["batch_size"].first()
    own = table[table["compute_ms"] == 0].set_index("path")["samples_per_s"]
    info = table.drop_duplicates("path").set_index("path")
    au["demand"] = batch.reindex(au["path"]).to_numpy(dtype=float) / (au["compute_ms"] / 1e3)
    au["own_rate"] = own.reindex(au["path"]).to_numpy(dtype=float)
    au["label"] = info["label"].reindex(au["path"]).to_numpy()
    au["copy"] = info["copy"].reindex(au["path"]).to_numpy()
    au["loader"] = [loader_label(row) for _, row in au.iterrows()]
    return au.sort_values(["path", "demand"]).reset_index(drop=True)


def median_repeat_parts(df: pd.DataFrame, compute_ms: float) -> pd.DataFrame:
    """Per path at ``compute_ms``: the time split of the repeat whose AU is the median (a
    repeat's parts sum to one; medians of each part need not)."""
    rows = feed_rows(df)
    rows = rows[(rows["compute_ms"] == compute_ms) & (rows["repeat"] >= 0)
                & (rows["status"] == "ok")]
    wide = rows.pivot_table(index=["label", "repeat"], columns="metric", values="value")
    if wide.empty or "accelerator_utilisation" not in wide:
        return pd.DataFrame()
    picked = {}
    for label, part in wide.groupby(level="label", sort=False):
        au = part["accelerator_utilisation"]
        picked[label] = part.loc[(au - au.median()).abs().idxmin()]
    out = pd.DataFrame.from_dict(picked, orient="index")
    return out.reindex(columns=[m for m, _, _ in TIME_PARTS]).fillna(0.0)


def feed_takeaway(demand: pd.DataFrame) -> str:
    """The highest demand every path fed at ``FED_AU``, and each loader's best own rate."""
    if demand.empty:
        return ""
    fed = demand.groupby("demand")["median"].min()
    fed = fed[fed >= FED_AU]
    own = demand.groupby("loader")["own_rate"].max().sort_values()
    text = (f"Every path kept the accelerator {format_percent(FED_AU)} busy up to "
            f"{format_value(float(fed.index.max()), 'samples/s')}" if not fed.empty else
            f"No demand measured kept every path {format_percent(FED_AU)} busy")
    return text + "; alone, the paths read " + ", ".join(
        f"{loader} {format_value(rate, 'samples/s')}" for loader, rate in own.items()) + "."


def _demand_panel(ax, part: pd.DataFrame, span: tuple[float, float]) -> None:
    """Measured AU against demand per copy mode, and the path's own rate as the ceiling
    (dotted: AU = min(1, own rate / demand))."""
    grid = np.geomspace(*span, 60)
    for copy, mine in part.groupby("copy", sort=False):
        colour = COPY_COLOURS.get(copy, "grey")
        mine = mine.sort_values("demand")
        ax.errorbar(mine["demand"], mine["median"],
                    yerr=[mine["median"] - mine["low"], mine["high"] - mine["median"]],
                    marker="o", color=colour, capsize=2, label=copy)
        rate = float(mine["own_rate"].iloc[0])
        if np.isfinite(rate) and rate > 0:
            ax.plot(grid, np.minimum(1.0, rate / grid), linestyle=":", color=colour)
    ax.axhline(FED_AU, color="grey", linewidth=0.6)
    ax.set_title(part["loader"].iloc[0], fontsize="small")
    ax.set_ylim(-0.02, 1.05)
    log_axis(ax, "x")
    ax.set_xlim(*span)


def plot_feed(df: pd.DataFrame) -> Figure:
    """Accelerator utilisation against the accelerator's demand (batch over emulated
    compute per batch), one panel per loader, one colour per copy mode; dotted: each
    path's own rate (its 0 ms row) over the demand, where AU must fall. Below, only at the
    compute times where the paths' AUs differ: the median repeat's time split (it sums to
    one)."""
    demand = feed_demand(df)
    if demand.empty:
        return empty_figure("no feed rows with compute")
    # Slowest loader first: the panels read as more and more headroom.
    loaders = list(demand.groupby("loader")["own_rate"].max().sort_values().index)
    uneven = [t for t, part in demand.groupby("compute_ms")
              if part["median"].max() - part["median"].min() > AU_SPREAD]
    splits = []
    for t in uneven:
        parts = median_repeat_parts(df, t)
        short = parts[parts["accelerator_utilisation"] < FED_AU]
        if not short.empty:
            splits.append((t, short.sort_values("accelerator_utilisation"),
                           len(parts) - len(short)))
    columns = min(len(loaders), 4)
    panel_rows = -(-len(loaders) // columns)
    bar_heights = [0.22 * len(parts) + 0.8 for _, parts, _ in splits]
    fig = Figure(figsize=(11, 2.9 * panel_rows + sum(bar_heights) + 1.6),
                 layout="constrained")
    top, bottom = (fig.subfigures(2, 1, height_ratios=(2.9 * panel_rows, sum(bar_heights)))
                   if splits else (fig, None))
    axes = top.subplots(panel_rows, columns, sharey=True, squeeze=False).ravel()
    highest = max(float(demand["demand"].max()), float(demand["own_rate"].max())) * 2
    span = (float(demand["demand"].min()) / 2, highest)
    for ax, loader in zip(axes, loaders):
        _demand_panel(ax, demand[demand["loader"] == loader], span)
        ax.set_xlabel("accelerator demand (samples/s)", fontsize="small")
    for ax in axes[len(loaders):]:
        ax.set_visible(False)
    for ax in axes[::columns]:
        ax.set_ylabel("accelerator utilisation")
    axes[0].plot([], [], linestyle=":", color="grey",
                 label="AU = the path's own rate (its 0 ms row) / demand")
    legend_below(top, list(axes), fontsize="small")
    if splits:
        bars = bottom.subplots(len(splits), 1, height_ratios=bar_heights, squeeze=False)[:, 0]
        for ax, (t, parts, fed) in zip(bars, splits):
            _time_split(ax, parts, t, fed)
        legend_below(bottom, list(bars), fontsize="small")
    devices = feed_devices(df)
    real = sorted(set(devices.loc[~devices["emulated"], "device_name"]))
    where = (f"copies to {', '.join(real)}" if real
             else "no CUDA device: copies into CPU memory, accelerator emulated")
    question_title(fig, "Up to what demand does each loader keep the accelerator busy? "
                        f"({where}; {feed_caption(feed_rows(df))})",
                   feed_takeaway(demand))
    return fig


def feed_caption(rows: pd.DataFrame) -> str:
    """What the rows fed: ``"raw 224×224×3 arrays, batch 256"`` from their params
    (``sample_shape``), else the profile's caption (rows from before the param)."""
    params = rows["params"].map(json.loads) if not rows.empty else pd.Series(dtype=object)
    shapes = sorted({p["sample_shape"] for p in params if p.get("sample_shape")})
    if not shapes:
        return profile_caption(rows)
    batches = sorted({int(b) for b in rows["batch_size"].dropna()})
    sizes = ", ".join(shape.replace("x", MULTIPLY) for shape in shapes)
    return (f"{', '.join(sorted(set(rows['encoding'])))} {sizes} arrays as stored, batch "
            f"{', '.join(str(b) for b in batches)}")


def _time_split(ax, parts: pd.DataFrame, compute_ms: float, fed: int) -> None:
    """The time split of the paths below ``FED_AU`` at ``compute_ms`` (``fed``: how many
    others reached it)."""
    y = np.arange(len(parts))
    left = np.zeros(len(parts))
    for metric, colour, name in TIME_PARTS:
        values = parts[metric].to_numpy(dtype=float)
        ax.barh(y, values, left=left, color=colour, label=name, edgecolor="black",
                linewidth=0.4)
        left += values
    ax.set_yticks(y, list(parts.index), fontsize="x-small")
    ax.set_ylim(len(parts) - 0.4, -0.6)
    ax.set_xlim(0, 1.0)
    ax.set_title(f"{grid_value(compute_ms)} ms of compute per batch: where the wall time "
                 f"went, paths below {format_percent(FED_AU)} AU (the median repeat; "
                 f"{fed} other paths reached it)", fontsize="small")
    ax.set_xlabel("fraction of wall time")


FIGURES = (
    FigureSpec("gpu_feed_utilisation", "Accelerator utilisation against the accelerator's "
               "demand, and where the time went where the paths differ",
               lambda r: plot_feed(r.df)),
)


def findings(results: Results) -> list[str]:
    return feed_findings(results.df)


def cuda_feed_text(cuda_runs_dir: Path, place) -> str:
    """The newest stored feed run on a real CUDA device (``latest_cuda_run``): its machine,
    findings (AU per compute time is in its figure) and figure, as README markdown; empty
    where there is none."""
    run = latest_cuda_run(cuda_runs_dir)
    if run is None:
        return ""
    parts = [f"**On a real GPU** (the `gpu_feed` study in `{place.relative(run.directory)}`; "
             f"machine: {machine_text(run.env)})", "",
             bullets(feed_findings(run.df, per_compute_time=False)).rstrip("\n")]
    png = run.directory / "figures" / "gpu_feed_utilisation.png"
    if png.exists():
        caption = next(spec.caption for spec in FIGURES if spec.name == "gpu_feed_utilisation")
        parts += ["", f"![{caption}, on a CUDA device]({place.relative(png)})"]
    return "\n".join(parts)


def readme_text(results: Results, place) -> str:
    return cuda_feed_text(place.results_dir.parent / "gpu-runs", place)


def caveats(results: Results) -> list[str]:
    return [feed_device_text(results.df)] if not feed_devices(results.df).empty else []
