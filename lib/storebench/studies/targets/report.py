"""The targets study's own table, findings and figure of the paths each target compares, and
the targets it declares (``OWN_TARGETS``). Every study's targets together are
``storebench.report.targets``'s."""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd
from matplotlib.figure import Figure

from ...plots import (
    empty_figure,
    family_handles,
    log_axis,
    profile_caption,
    question_title,
    summarise,
)
from ...results import Results, latest_runs, row_sources
from ...text import DASH, format_percent, format_ratio
from ..base import FigureSpec, TargetMeasure, TargetSpec
from ..shared_rows import dram_copy_GBps, median_of_latest, target_result
from .cases import TARGETS, get_target


def targets_table(df: pd.DataFrame) -> pd.DataFrame:
    """One row per target measured: the whole-case ``target_value`` (median of the
    per-repeat ratios), ``target_threshold`` and ``target_met``; min and max of the
    per-repeat ``target_ratio``; by how much it is missed. In ``TARGETS`` order."""
    out = []
    for target in TARGETS:
        found = target_result(df, target.key)
        if found is not None:
            out.append({**found, "target": target.name, "what": target.description})
    return pd.DataFrame(out, columns=["key", "target", "value", "low", "high", "threshold",
                                      "met", "shortfall", "repeats", "what"])


def _own_target(key: str) -> Callable[[Results], TargetMeasure | None]:
    def measure(results: Results) -> TargetMeasure | None:
        table = targets_table(results.df)
        row = table[table["key"] == key]
        if row.empty:
            return None
        row = row.iloc[0]
        median = median_of_latest(results.df, key)
        rows = latest_runs(results.df[results.df["study"] == "targets"])
        ratios = rows[(rows["loader"] == key) & (rows["metric"] == "target_ratio")
                      & (rows["repeat"] >= 0) & (rows["status"] == "ok")]
        return TargetMeasure(
            value=float(row["value"]), low=float(row["low"]), high=float(row["high"]),
            repeats=int(row["repeats"]), sources=row_sources(ratios),
            limiting=(_bare_take_text(median, key) + _row_group_text(median)).strip())

    return measure


OWN_TARGETS = tuple(
    TargetSpec(key=target.key, name=target.name, description=target.description,
               threshold=target.threshold, is_fraction=target.is_fraction,
               measure=_own_target(target.key), calibration=True)
    for target in TARGETS)


def _value_text(key: str) -> Callable[[float], str]:
    return format_percent if get_target(key).is_fraction else format_ratio


def _bare_take_text(median, key: str) -> str:
    """For a gather target: what a bare one-thread ``take_rows`` of the same batches reached
    in the same repeats, which splits a one-thread shortfall into the access pattern's own
    limit and the loader's cost, and what the gather split over threads reached (nothing for
    other targets, or results without them). ``median``: ``median_of_latest``'s."""
    prefix = get_target(key).numerator[0].partition(".")[0]
    bare = median(f"{prefix}.bare_take_fraction_of_dram_copy")
    share = median(f"{prefix}.fraction_of_bare_take")
    text = ""
    if bare is not None and share is not None:
        text = (f" A bare one-thread take_rows of the same batches from the same array reaches "
                f"{format_percent(bare)} of the copy: the access pattern's own limit for one "
                f"thread; the one-thread loader gather delivers {format_percent(share)} of "
                "that.")
    numpy_take = median(f"{prefix}.numpy_take_fraction_of_dram_copy")
    if numpy_take is not None:
        text += (f" NumPy's np.take of the same batches, one row at a time, reaches "
                 f"{format_percent(numpy_take)}.")
    one, split = (median(f"{name}.fraction_of_dram_copy")
                  for name in (prefix, f"{prefix}_threads"))
    threads = median("threads")
    if one is not None and split is not None and threads is not None:
        text += (f" Gathered by one thread it reaches {format_percent(one)} of the copy, split "
                 f"over {threads:.0f} threads (one per core) {format_percent(split)}.")
    prefetched = median(f"{prefix}_prefetched.fraction_of_dram_copy")
    if prefetched is not None and threads is not None:
        text += (f" Through a ThreadPrefetcher with {threads:.0f} workers, kept from epoch to "
                 f"epoch, it reaches {format_percent(prefetched)}.")
    helped = median(f"{prefix}_consumer_reads.fraction_of_dram_copy")
    if helped is not None and threads is not None:
        workers = max(1, round(threads) - 1)
        text += (f" With {workers} worker{'s' if workers > 1 else ''} and the consumer reading "
                 f"a batch itself rather than wait for one, it reaches "
                 f"{format_percent(helped)}.")
    free = median(f"{prefix}.bare_take_threads_fraction_of_dram_copy")
    split_share = median(f"{prefix}_threads.fraction_of_bare_take_threads")
    if free is not None and split_share is not None and threads is not None:
        text += (f" {threads:.0f} free-running threads, each taking every "
                 f"{_ordinal(threads)} batch whole with no hand-off per batch, reach "
                 f"{format_percent(free)} of the copy: the access pattern's own limit at "
                 f"{threads:.0f} threads; the split gather, whose parts meet at every batch, "
                 f"delivers {format_percent(split_share)} of that.")
    return text


def _ordinal(count: float) -> str:
    number = int(round(count))
    if number == 2:
        return "other"
    suffix = "th" if 10 <= number % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(
        number % 10, "th")
    return f"{number}{suffix}"


def _row_group_text(median) -> str:
    """For the Parquet target: the share of each side's time spent reading row groups, the
    rows per group (which bound the ratio: a random read costs one group, the epoch reads
    each once) and the ratio had the epoch cost only its reads (nothing for other targets,
    or results without them). ``median``: ``median_of_latest``'s."""
    block, random, per_group, reads_only = (median(m) for m in (
        "block_shuffled_epoch.row_group_read_fraction",
        "random_row_access.row_group_read_fraction", "rows_per_row_group", "reads_only_ratio"))
    if None in (block, random, per_group, reads_only):
        return ""
    return (f" Reading row groups takes {format_percent(block)} of the block-shuffled epoch "
            f"and {format_percent(random)} of the random reads; with {per_group:.0f} rows "
            f"per group, had the epoch cost only its reads the ratio would be "
            f"{format_ratio(reads_only)}. The rest of the epoch (the gather into the batch, "
            "per-batch bookkeeping) is what keeps it below that.")


def targets_findings(df: pd.DataFrame) -> list[str]:
    """One sentence per target: value, interval, threshold, met (the interval's lower end
    clears it) or by how much the median misses it."""
    sentences = []
    for _, row in targets_table(df).iterrows():
        fmt = _value_text(row["key"])
        if row["met"]:
            verdict = "met (the interval's lower end clears it)"
        elif row["shortfall"] > 0:
            verdict = f"missed by {format_percent(row['shortfall'])}"
        else:
            verdict = "not met: the median clears it, the interval's lower end does not"
        median = median_of_latest(df, row["key"])
        sentences.append(
            f"{row['target']} ({row['what']}): {fmt(row['value'])} (median of "
            f"{row['repeats']} paired repeats, 95% interval "
            f"{fmt(row['low'])}{DASH}{fmt(row['high'])}); threshold {fmt(row['threshold'])}, "
            f"{verdict}." + _bare_take_text(median, row["key"]) + _row_group_text(median))
    return sentences


# What each path a target times is, in words (its metric prefix is a code name).
PATH_LABELS = {
    "preloaded": "one thread gathers from RAM",
    "preloaded_threads": "a thread per core gathers from RAM",
    "preloaded_prefetched": "ThreadPrefetcher, a worker per core (RAM)",
    "preloaded_consumer_reads": "ThreadPrefetcher, the consumer reads too (RAM)",
    "memmap": "one thread gathers from the memmap",
    "memmap_threads": "a thread per core gathers from the memmap",
    "memmap_prefetched": "ThreadPrefetcher, a worker per core (memmap)",
    "memmap_consumer_reads": "ThreadPrefetcher, the consumer reads too (memmap)",
    "process_prefetcher": "ProcessPrefetcher",
    "thread_prefetcher": "ThreadPrefetcher",
    "torch_dataloader": "torch DataLoader",
    "pickled_baseline": "process pool returning pickled batches",
    "serial_cpu0": "one thread decoding, pinned to core 0",
    "serial_cpu1": "one thread decoding, pinned to core 1",
    "block_shuffled_epoch": "block-shuffled epoch",
    "random_row_access": "random row reads",
    "tf_data_autotune": "tf.data AUTOTUNE",
    "torch_thread_prefetcher": "ThreadPrefetcher into PyTorch",
    "torch_process_prefetcher": "ProcessPrefetcher into PyTorch",
}


ROLE_COLOURS = {"target": "#1f77b4", "baseline": "#ff7f0e", "denominator": "#d9d9d9"}


ROLE_NAMES = {"target": "the paths the target is about",
              "baseline": "the path it is held to",
              "denominator": "DRAM copy of the same bytes (the gathers' denominator)"}


def path_label(path: str) -> str:
    return PATH_LABELS.get(path, path.replace("_", " "))


def _role(key: str, path: str) -> str:
    target = get_target(key)
    held_to = target.denominator.split(".")[0] if target.denominator else ""
    return "baseline" if path == held_to or path.startswith("serial_") else "target"


def _target_bars(df: pd.DataFrame, rows: pd.DataFrame, key: str) -> list[tuple]:
    """(label, role, median, low, high) per path of target ``key``, over its slowest path;
    a gather target's DRAM copy last, in the same units."""
    mine = rows[rows["loader"] == key]
    stats = {p: summarise(mine[mine["path"] == p], f"{p}.samples_per_s", ["path"])
             for p in dict.fromkeys(mine["path"])}
    stats = {p: s for p, s in stats.items() if not s.empty}
    if len(stats) < 2:
        return []
    slowest = min(stats, key=lambda p: float(stats[p]["median"].iloc[0]))
    base = float(stats[slowest]["median"].iloc[0])
    out = [(path_label(p), _role(key, p), *(float(s[c].iloc[0]) / base
                                             for c in ("median", "low", "high")))
           for p, s in stats.items()]
    copy = dram_copy_GBps(df, key)
    read = summarise(df[(df["study"] == "targets") & (df["loader"] == key)],
                     f"{slowest}.read_MBps", ["loader"])
    if copy and not read.empty:
        value = copy * 1e3 / float(read["median"].iloc[0])
        out.append((f"DRAM copy, {copy:.1f} GB/s", "denominator", value, value, value))
    return out


def plot_targets(df: pd.DataFrame) -> Figure:
    """Each target's compared paths, as each path's throughput over the target's slowest
    path (one group per target, one log axis), the gathers' DRAM copy among them; the
    target's own paths blue, the path it is held to orange."""
    rows = df[(df["study"] == "targets") & df["metric"].str.endswith(".samples_per_s")]
    rows = rows.assign(path=rows["metric"].str.removesuffix(".samples_per_s"))
    table = targets_table(df)
    groups = [(k, _target_bars(df, rows, k)) for k in table["key"] if k in set(rows["loader"])]
    groups = [(k, bars) for k, bars in groups if bars]
    if not groups:
        return empty_figure("no target rows")
    count = sum(len(bars) for _, bars in groups)
    fig = Figure(figsize=(9, 0.3 * count + 0.45 * len(groups) + 2.0), layout="constrained")
    ax = fig.add_subplot()
    ticks, labels, y = [], [], 0.0
    widest = max(((k, max(b[2] for b in bars if b[1] != "denominator")) for k, bars in groups),
                 key=lambda pair: pair[1])
    for key, bars in groups:
        ax.text(0.0, y - 0.75, get_target(key).name, fontsize="small", fontweight="bold",
                transform=ax.get_yaxis_transform(), va="center", ha="left")
        y += 0.4
        for label, role, median, low, high in bars:
            ax.barh(y, median, height=0.8, color=ROLE_COLOURS[role], edgecolor="black",
                    linewidth=0.4, hatch="//" if role == "denominator" else "")
            if role != "denominator":
                ax.errorbar(median, y, xerr=[[median - low], [high - median]], fmt="none",
                            ecolor="black", capsize=2)
            ticks.append(y)
            labels.append(label)
            y += 1
        y += 0.9
    ax.set_yticks(ticks, labels, fontsize="x-small")
    ax.set_ylim(y - 0.6, -1.2)
    log_axis(ax, "x")
    ax.set_xlabel("samples per second over the target's slowest path (ratio; whiskers: the "
                  "repeats' range)")
    fig.legend(handles=family_handles(ROLE_COLOURS, ROLE_NAMES), loc="outside lower center",
               ncols=2, fontsize="small")
    question_title(fig, "How far apart are the paths each performance target compares? "
                        f"({profile_caption(rows)}; all paths of a target in one case)",
                   f"The widest gap: {get_target(widest[0]).name}, "
                   f"{format_ratio(widest[1])}. The targets of other studies are in "
                   "targets_met.")
    return fig


FIGURES = (
    FigureSpec("targets_paths", "The paths each target compares, with the DRAM copy the "
               "gathers are held to",
               lambda r: plot_targets(r.df)),
)


def findings(results: Results) -> list[str]:
    return targets_findings(results.df)
