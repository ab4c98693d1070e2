"""One study's rows as another study reads them too: the formats study's build costs, the
out_of_core study's rows labelled by cache budget and setting, and a performance target's
rows (the targets study's cases). Read here so that a study folder needs no other's."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..results import dataset_names, latest_runs, params_of, select, sort_rows

# -- the formats study's build costs -----------------------------------------------------
BUILD_METRICS = ("write_seconds", "write_MBps", "bytes_apparent", "bytes_allocated",
                 "raw_bytes", "size_ratio", "file_count")


def build_cost_table(df: pd.DataFrame) -> pd.DataFrame:
    """One row per built dataset: write time and rate, bytes apparent and allocated, bytes
    on disk relative to the raw pixels, and file count."""
    rows = select(df[df["study"] == "formats"])
    rows = rows[rows["metric"].isin(BUILD_METRICS)]
    if rows.empty:
        return pd.DataFrame(columns=["encoding", "format", "dataset", *BUILD_METRICS])
    rows = rows.assign(dataset=dataset_names(rows))
    table = rows.pivot_table(index=["encoding", "format", "dataset"], columns="metric",
                             values="value", aggfunc="median").reset_index()
    table.columns.name = None
    for metric in BUILD_METRICS:
        if metric not in table:
            table[metric] = np.nan
    return sort_rows(table[["encoding", "format", "dataset", *BUILD_METRICS]])


# -- the out_of_core study's rows ---------------------------------------------------------
OUT_OF_CORE = "out_of_core"


def _setting(params: dict) -> str:
    """``"default"``, or the open option or build knob a case changed
    (``"madvise_random=True"``)."""
    changed = {k.removeprefix("open_"): v for k, v in params.items() if k.startswith("open_")}
    changed |= {k.removeprefix("knob_"): v for k, v in params.items() if k.startswith("knob_")}
    return ", ".join(f"{k}={v}" for k, v in sorted(changed.items())) or "default"


def _reads(params: dict, encoding: str) -> str:
    """How a case's samples were delivered: ``"decoded"`` (decoded and, on an ImageNet-like
    set, transformed) or ``"undecoded"`` (as stored: raw arrays always)."""
    return "decoded" if params.get("decode") or params.get("transform") else "undecoded"


def ooc_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The out_of_core study's rows with ``k`` (0: no cap), ``setting``, ``reads``
    (``_reads``), ``cached`` (the set was read into the page cache first) and ``label``
    columns."""
    rows = df[df["study"] == OUT_OF_CORE]
    if rows.empty:
        return rows.assign(k=[], setting=[], reads=[], cached=[], label=[])
    params = params_of(rows)
    settings = params.map(_setting)
    reads = [_reads(p, e) for p, e in zip(params, rows["encoding"])]
    cached = params.map(lambda p: bool(p.get("cached", False)))
    return rows.assign(
        k=params.map(lambda p: int(p.get("k", 0))),
        setting=settings, reads=reads, cached=cached,
        label=[f"{f}-{e}, {a.replace('_', ' ')}" + ("" if s == "default" else f", {s}")
               + ("" if loader == "lazy" else f", {loader}")
               + (", undecoded" if r == "undecoded" and e != "raw" else "")
               + (", cached" if c else "")
               for f, e, a, s, loader, r, c in zip(rows["format"], rows["encoding"],
                                                   rows["access"], settings, rows["loader"],
                                                   reads, cached)],
    )


def last_epoch(rows: pd.DataFrame) -> int:
    """The last epoch out_of_core rows time (``epoch<n>.samples_per_s``; 0 for none): the
    one that finds what the earlier left in the budget's page cache, every later epoch's
    state too."""
    found = rows["metric"].str.extract(r"^epoch(\d+)\.samples_per_s$")[0].dropna()
    return int(found.astype(int).max()) if not found.empty else 0


# -- a performance target's rows (the targets study's cases) ------------------------------
TARGET_COLUMNS = ["key", "value", "low", "high", "threshold", "met", "shortfall", "repeats"]


def target_result(df: pd.DataFrame, key: str) -> dict | None:
    """Target ``key`` as its case's latest run wrote it (``summarise_target``): the
    whole-case ``target_value`` (median of the per-repeat ratios), its interval, threshold,
    whether it was met and by how much it is missed, and the repeats; None where the rows
    have no whole-case value."""
    rows = latest_runs(df[(df["study"] == "targets") & (df["loader"] == key)])
    rows = rows[rows["status"] == "ok"]
    whole = rows[rows["repeat"] == -1].set_index("metric")["value"]
    if "target_value" not in whole:
        return None
    ratios = rows.loc[(rows["repeat"] >= 0) & (rows["metric"] == "target_ratio"), "value"]
    value, threshold = float(whole["target_value"]), float(whole["target_threshold"])
    # Results before the interval rule carry no target_low/high: their min-max stands in.
    low = whole.get("target_low", ratios.min() if len(ratios) else value)
    high = whole.get("target_high", ratios.max() if len(ratios) else value)
    return {"key": key, "value": value, "low": float(low), "high": float(high),
            "threshold": threshold, "met": bool(whole["target_met"] >= 1),
            "shortfall": max(0.0, 1 - value / threshold), "repeats": int(ratios.size)}


def median_of_latest(df: pd.DataFrame, key: str):
    """``median(metric)``: the median of a target's ``metric`` over its latest run's
    repeats, None where the rows have none."""
    rows = latest_runs(df[(df["study"] == "targets") & (df["loader"] == key)])

    def median(metric: str) -> float | None:
        values = rows.loc[rows["metric"] == metric, "value"]
        return None if values.empty else float(values.median())

    return median


def target_workers(df: pd.DataFrame, key: str) -> int | None:
    """The workers target ``key``'s case ran its loaders with, None where it set none."""
    workers = latest_runs(df[(df["study"] == "targets") & (df["loader"] == key)])["workers"]
    workers = workers.dropna()
    return int(workers.iloc[0]) if not workers.empty and workers.iloc[0] else None


def dram_copy_GBps(df: pd.DataFrame, key: str) -> float | None:
    """The median DRAM copy bandwidth a gather target ``key`` was held to (the faster of
    one thread and one per core, timed in the same repeats); None for other targets."""
    rows = latest_runs(df[(df["study"] == "targets") & (df["loader"] == key)])
    rows = rows[(rows["metric"] == "dram_copy_GBps") & (rows["repeat"] >= 0)]
    return float(rows["value"].median()) if not rows.empty else None
