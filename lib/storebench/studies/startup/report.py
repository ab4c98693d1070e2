"""The startup study's figure and findings: time to first batch, bytes pickled per worker and
worker memory growth, per index kind and path."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from ...plots import empty_figure
from ...results import Results, select, stat
from ...text import MULTIPLY, format_ratio
from ..base import FigureSpec
from .grid import BATCH_SIZE, NAME, WORKERS

KIND_LABELS = {"arrays": "NumPy arrays (ours)", "lists": "Python lists (ImageFolder)"}
KIND_COLOURS = {"arrays": "C0", "lists": "C1"}


PATH_LABELS = {"thread": "ThreadPrefetcher", "process": "ProcessPrefetcher",
               "torch": "torch DataLoader"}
FIRST_BATCH = "time_to_first_batch_s"
PICKLED = "pickled_bytes_per_worker"
GROWTH = "worker_uss_growth_bytes"
PEAKS = ("cgroup_peak_bytes", "maxrss_sum_bytes")  # kernel-measured first


def startup_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The study's rows with ``index_kind``, ``start_method``, ``epoch`` and ``label``."""
    from ...results import params_of

    rows = df[df["study"] == NAME].copy()
    if rows.empty:
        return rows.assign(index_kind="", start_method="", epoch=False, label="")
    params = params_of(rows)
    rows["index_kind"] = params.map(lambda p: p.get("index_kind", ""))
    rows["start_method"] = params.map(lambda p: p.get("start_method") or "")
    rows["epoch"] = params.map(lambda p: bool(p.get("epoch", False)))
    rows["label"] = [path_text(p, m) for p, m in zip(rows["prefetcher"], rows["start_method"])]
    return rows


def path_text(path: str, method: str) -> str:
    """``"torch DataLoader ×2, spawn"``."""
    text = f"{PATH_LABELS.get(path, path)} {MULTIPLY}{WORKERS}"
    return f"{text}, {method}" if method else text


def entries(df: pd.DataFrame) -> int | None:
    values = select(startup_rows(df), "index_entries")["value"]
    return int(values.max()) if not values.empty else None


def medians(rows: pd.DataFrame, metric: str) -> dict[tuple[str, str], object]:
    """(label, index kind) -> Stat of ``metric`` over ``rows``."""
    out = {}
    for (label, kind), mine in rows.groupby(["label", "index_kind"], sort=False):
        if not select(mine, metric).empty:
            out[(label, kind)] = stat(mine, metric)
    return out


def peak_metric(rows: pd.DataFrame) -> str | None:
    return next((m for m in PEAKS if not select(rows, m).empty), None)


def _bars(ax, found: dict, labels: list[str], scale: float, title: str) -> None:
    y = np.arange(len(labels))
    for offset, kind in ((-0.2, "arrays"), (0.2, "lists")):
        values = [found[(label, kind)].median / scale if (label, kind) in found else np.nan
                  for label in labels]
        ax.barh(y + offset, values, height=0.38, color=KIND_COLOURS[kind],
                label=KIND_LABELS[kind])
    ax.set_yticks(y, labels, fontsize="x-small")
    ax.invert_yaxis()
    ax.set_title(title, fontsize="small")


def plot_startup(df: pd.DataFrame) -> Figure:
    """Start-up (time to first batch, last worker's start, bytes pickled per worker) per path
    and start method, and memory over an epoch under fork (kernel peak, each worker's private
    growth), for an index held as arrays and as lists; linear axes."""
    rows = startup_rows(df)
    first = rows[~rows["epoch"]]
    if select(first, FIRST_BATCH).empty:
        return empty_figure("no startup rows")
    labels = list(dict.fromkeys(first["label"]))
    epoch = rows[rows["epoch"]]
    peak = peak_metric(epoch)
    fig = Figure(figsize=(13, 0.45 * len(labels) + 5), layout="constrained")
    top, bottom = fig.subfigures(2, 1, height_ratios=[len(labels) + 2, 4])
    axes = top.subplots(1, 3, sharey=True)
    _bars(axes[0], medians(first, FIRST_BATCH), labels, 1.0, "time to first batch (s)")
    _bars(axes[1], medians(first, "last_worker_start_s"), labels, 1.0,
          "last worker started after (s)")
    _bars(axes[2], medians(first, PICKLED), labels, 1e6, "bytes pickled per worker (MB)")
    for ax in axes:
        ax.set_xlim(left=0)
    lower = bottom.subplots(1, 2)
    mem_labels = list(dict.fromkeys(epoch["label"]))
    if peak is not None:
        what = "kernel peak, memory cgroup" if peak == PEAKS[0] else "summed ru_maxrss"
        _bars(lower[0], medians(epoch, peak), mem_labels, 1e6,
              f"peak memory over the epoch (MB, {what})")
        _bars(lower[1], medians(epoch, GROWTH), mem_labels, 1e6,
              "each worker's private memory growth over the epoch (MB, USS)")
    else:
        for ax in lower:
            ax.axis("off")
    handles, names = axes[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="outside lower center", ncols=2, fontsize="small")
    count = entries(df)
    fig.suptitle(f"How long to the first batch, and how much memory, with an index of "
                 f"{count:,} entries held as NumPy arrays or Python lists? (2 workers, batch "
                 f"{BATCH_SIZE}; memory: a whole epoch under fork)", fontsize="medium")
    return fig


def _comparisons(rows: pd.DataFrame, metric: str) -> list[str]:
    """Per path: ``"<path>: <lists> with lists, <arrays> with arrays (lists/arrays 1.6×)"``."""
    found = medians(rows, metric)
    out = []
    for label in dict.fromkeys(rows["label"]):
        arrays, lists = found.get((label, "arrays")), found.get((label, "lists"))
        if arrays is None or lists is None:
            continue
        ratio = lists.median / arrays.median if arrays.median > 0 else float("nan")
        out.append(f"{label}: {lists} with lists, {arrays} with arrays"
                   + (f" (lists/arrays {format_ratio(ratio)})" if np.isfinite(ratio) else ""))
    return out



FIGURES = (
    FigureSpec("startup_index", "Time to first batch, workers' start and bytes pickled per "
               "worker for an ImageNet-size index as arrays or lists, and memory over an "
               "epoch under fork.", lambda results: plot_startup(results.df)),
)

def findings(results: Results) -> list[str]:
    rows = startup_rows(results.df)
    first, epoch = rows[~rows["epoch"]], rows[rows["epoch"]]
    count = entries(results.df)
    if count is None:
        return []
    out = []
    for metric, what, part in (
            (FIRST_BATCH, "time to the first batch", first),
            ("last_worker_start_s", "the last worker began its first batch after", first),
            (PICKLED, "bytes pickled per worker (spawn, forkserver)",
             first[first["start_method"].isin(["spawn", "forkserver"])])):
        found = _comparisons(part, metric)
        if found:
            out.append(f"An index of {count:,} entries, {what}: " + "; ".join(found) + ".")
    growth = medians(epoch, GROWTH)
    for label in dict.fromkeys(epoch["label"]):
        arrays, lists = growth.get((label, "arrays")), growth.get((label, "lists"))
        if arrays is None or lists is None:
            continue
        shown = lists.median - arrays.median > max(abs(arrays.median), 1 << 20)
        out.append(
            f"Copy-on-read, {label}, one epoch of the index: each worker's private memory "
            f"grew by {lists} with lists and {arrays} with arrays; the effect is "
            + ("shown" if shown else "ruled out (within 1 MB or the arrays' own growth)")
            + ".")
    peak = peak_metric(epoch)
    if peak is not None:
        what = ("the kernel's peak (memory cgroup)" if peak == PEAKS[0]
                else "summed ru_maxrss (no memory cgroup here)")
        found = _comparisons(epoch, peak)
        if found:
            out.append(f"Peak memory over an epoch of the index, {what}: "
                       + "; ".join(found) + ".")
    return out
