"""The targets study: the loaders' performance targets, each measured in one case whose
repeats time every compared path back to back, so each repeat's ratio is fair.

A target is data (``Target``): the dataset it needs, its batch size, workers and params,
the function that measures its paths, which path metrics make the ratio, and the
threshold. ``target_case`` runs any of them; ``summarise_target`` writes the whole-case rows
``target_value`` (median of the per-repeat ratios), ``target_low``/``target_high`` (its 95%
bootstrap interval), ``target_threshold`` and ``target_met`` (1 when the interval's lower end
clears the threshold, else 0), so that a results file alone says whether each target was met.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from ...bench.case import Case
from ...bench.stats import MIN_DECISION_REPEATS
from ...plots import (
    empty_figure,
    family_handles,
    log_axis,
    profile_caption,
    question_title,
    summarise,
)
from ...results import Results, latest_runs, row_sources, stat
from ...text import DASH, format_percent, format_ratio, markdown_table
from ..base import FigureSpec, Study, TargetMeasure, TargetSpec
from ..grid import batch_size_for, dataset_fields, pick, profile_datasets, repeat_fields
from ..targets.cases import TARGETS, get_target

CASES = "storebench.studies.targets.cases"


# -- grid, case, summary ----------------------------------------------------------------
def grid(*, profile: str, data_dir: Path | str, repeats: int | None = None) -> list[Case]:
    """One case per target whose dataset was built (a target whose required format was not
    built is left out)."""
    datasets = profile_datasets(profile, data_dir)
    cases = []
    for target in TARGETS:
        wanted = target.dataset
        picked = pick(datasets, wanted.encoding, wanted.preferred)
        if picked is None or (wanted.required and picked[1]["format"] != wanted.required):
            continue
        path, manifest = picked
        cases.append(Case(
            function=f"{CASES}:target_case", summarise=f"{CASES}:summarise_target",
            loader=target.key, workers=target.workers,
            batch_size=batch_size_for(manifest["num_samples"], target.batch_size),
            access="shuffle", cache="warm", warmup=target.warmup,
            # No time budget: a target is met by its interval's lower end, so it gets every
            # repeat the width rule asks for, and all of them while the interval still holds
            # its threshold; the decision's repeats from the first pass (no top-up repeats a
            # summarised case).
            **repeat_fields(profile, repeats, budget_s=None, threshold=target.threshold,
                            minimum=MIN_DECISION_REPEATS),
            params={"target": target.key, **dict(target.params)},
            **dataset_fields("targets", path, manifest),
        ))
    return cases


# -- findings -----------------------------------------------------------------------------
def targets_table(df: pd.DataFrame) -> pd.DataFrame:
    """One row per target measured: the whole-case ``target_value`` (median of the
    per-repeat ratios), ``target_threshold`` and ``target_met``; min and max of the
    per-repeat ``target_ratio``; by how much it is missed. In ``TARGETS`` order."""
    columns = ["key", "target", "value", "low", "high", "threshold", "met", "shortfall",
               "repeats", "what"]
    rows = latest_runs(df[df["study"] == "targets"])
    rows = rows[rows["status"] == "ok"]
    out = []
    for target in TARGETS:
        mine = rows[rows["loader"] == target.key]
        whole = mine[mine["repeat"] == -1].set_index("metric")["value"]
        if "target_value" not in whole:
            continue
        ratios = mine.loc[(mine["repeat"] >= 0) & (mine["metric"] == "target_ratio"), "value"]
        value, threshold = float(whole["target_value"]), float(whole["target_threshold"])
        # Results before the interval rule carry no target_low/high: their min-max stands in.
        low = whole.get("target_low", ratios.min() if len(ratios) else value)
        high = whole.get("target_high", ratios.max() if len(ratios) else value)
        out.append({
            "key": target.key, "target": target.name, "value": value,
            "low": float(low), "high": float(high),
            "threshold": threshold, "met": bool(whole["target_met"] >= 1),
            "shortfall": max(0.0, 1 - value / threshold), "repeats": int(ratios.size),
            "what": target.description,
        })
    return pd.DataFrame(out, columns=columns)


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


def every_target() -> list[tuple[str, TargetSpec]]:
    """(study, target) for every target a study declares, in the studies' run order."""
    from .. import STUDIES

    return [(study.name, spec) for study in STUDIES.values() for spec in study.targets]


ALL_TARGET_COLUMNS = ["key", "study", "target", "what", "threshold", "is_fraction",
                      "measured", "value", "low", "high", "repeats", "met", "shortfall",
                      "limiting", "calibration", "workload"]


def measured_workload(results: Results, measured: TargetMeasure) -> str:
    """What the rows a target was read from measured (``Results.workload`` of their study
    and encoding); "not recorded" where the results do not say."""
    if not measured.sources:
        return "not recorded"
    study, case_id, _metric = measured.sources[0]
    rows = results.df[(results.df["study"] == study) & (results.df["case_id"] == case_id)]
    encoding = str(rows["encoding"].iloc[0]) if not rows.empty else None
    return results.workload(study, encoding) or "not recorded"


def all_targets_table(results: Results) -> pd.DataFrame:
    """Every target every study declares, measured or not: met when the 95% interval's
    lower end reaches the threshold, over at least ``MIN_DECISION_REPEATS`` repeats;
    ``shortfall``: how far the median is below it."""
    out = []
    for study, spec in every_target():
        measured = spec.measure(results)
        row = {"key": spec.key, "study": study, "target": spec.name,
               "what": spec.description, "threshold": spec.threshold,
               "is_fraction": spec.is_fraction, "measured": measured is not None,
               "value": np.nan, "low": np.nan, "high": np.nan, "repeats": 0, "met": False,
               "shortfall": np.nan, "limiting": spec.unmeasured,
               "calibration": spec.calibration, "workload": ""}
        if measured is not None:
            row.update(value=measured.value, low=measured.low, high=measured.high,
                       workload=measured_workload(results, measured),
                       repeats=measured.repeats, limiting=measured.limiting,
                       met=bool(measured.repeats >= MIN_DECISION_REPEATS
                                and np.isfinite(measured.low)
                                and measured.low >= spec.threshold),
                       shortfall=max(0.0, 1 - measured.value / spec.threshold))
        out.append(row)
    return pd.DataFrame(out, columns=ALL_TARGET_COLUMNS)


def _text_for(is_fraction: bool) -> Callable[[float], str]:
    return format_percent if is_fraction else format_ratio


def _value_text(key: str) -> Callable[[float], str]:
    return _text_for(get_target(key).is_fraction)


def _interval_text(fmt: Callable[[float], str], row) -> str:
    if not row["measured"]:
        return (f"not measured: {row['limiting']}" if row["limiting"]
                else "not measured in these results")
    if not np.isfinite(row["low"]) or row["repeats"] < MIN_DECISION_REPEATS:
        return (f"{fmt(row['value'])} (no interval: fewer than {MIN_DECISION_REPEATS} "
                f"repeats, n={row['repeats']})")
    return (f"{fmt(row['value'])} ({fmt(row['low'])}{DASH}{fmt(row['high'])}, "
            f"n={row['repeats']})")


def target_verdict(row) -> str:
    """``met``, ``unmet`` (the median misses, or the interval reaches below over enough
    repeats), ``undecided`` (the median clears it on too few repeats) or ``not measured``."""
    if not row["measured"]:
        return "not measured"
    if row["met"]:
        return "met"
    if row["shortfall"] > 0 or row["repeats"] >= MIN_DECISION_REPEATS:
        return "unmet"
    return "undecided"


def _met_text(row) -> str:
    verdict = target_verdict(row)
    few = f"; n={row['repeats']}" if row["repeats"] < MIN_DECISION_REPEATS else ""
    if verdict in ("not measured", "met"):
        return {"met": "yes"}.get(verdict, verdict)
    if verdict == "undecided":
        return f"**undecided** (the median clears it{few})"
    if row["shortfall"] > 0:
        return f"**no** ({format_percent(row['shortfall'])} short{few})"
    return "**no** (the interval reaches below)"


def targets_markdown(results: Results, *, calibration: bool | None = None) -> str:
    """A table of every target any study declares, met or not, with the workload each was
    measured on: the machine-calibration targets only (``calibration``), the others only
    (False, the README's), or all (None)."""
    table = all_targets_table(results)
    if calibration is not None:
        table = table[table["calibration"] == calibration]
    if table.empty:
        return "No target is declared."
    shown = pd.DataFrame({
        "target": table["target"],
        "workload": table["workload"],
        "measured (median, 95% interval)": [
            _interval_text(_text_for(row["is_fraction"]), row) for _, row in table.iterrows()],
        "threshold": [f"\u2265 {_text_for(f)(t)}" for f, t in zip(table["is_fraction"],
                                                                table["threshold"])],
        "met": [_met_text(row) for _, row in table.iterrows()],
    })
    return markdown_table(shown)


def median_of_latest(df: pd.DataFrame, key: str):
    """``median(metric)``: the median of a target's ``metric`` over its latest run's
    repeats, None where the rows have none."""
    rows = latest_runs(df[(df["study"] == "targets") & (df["loader"] == key)])

    def median(metric: str) -> float | None:
        values = rows.loc[rows["metric"] == metric, "value"]
        return None if values.empty else float(values.median())

    return median


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


# -- figures -----------------------------------------------------------------------------
def _unmet_caption(table: pd.DataFrame) -> str:
    """One wrapped line per unmet target: what its rows show limits it."""
    import textwrap

    lines = []
    for _, row in table.iterrows():
        if target_verdict(row) != "unmet":
            continue
        why = row["limiting"] or "no limiting factor measured"
        lines += textwrap.wrap(f"{row['target']} (unmet): {why}", 120)
    return "\n".join(lines)


VERDICT_COLOURS = {"met": "#2ca02c", "unmet": "#d62728", "undecided": "#aaaaaa",
                   "not measured": "#ffffff"}


def dram_copy_GBps(df: pd.DataFrame, key: str) -> float | None:
    """The median DRAM copy bandwidth a gather target ``key`` was held to (the faster of
    one thread and one per core, timed in the same repeats); None for other targets."""
    rows = latest_runs(df[(df["study"] == "targets") & (df["loader"] == key)])
    rows = rows[(rows["metric"] == "dram_copy_GBps") & (rows["repeat"] >= 0)]
    return float(rows["value"].median()) if not rows.empty else None


def _target_label(row, df: pd.DataFrame | None) -> str:
    fmt = _text_for(row["is_fraction"])
    measured = fmt(row["value"]) if row["measured"] else "—"
    copy = dram_copy_GBps(df, row["key"]) if df is not None else None
    of = f" of a {copy:.1f} GB/s DRAM copy" if copy else ""
    return f"{row['target']}\n{measured}{of} vs ≥ {fmt(row['threshold'])}"


def plot_target_ratios(table: pd.DataFrame, df: pd.DataFrame | None = None) -> Figure:
    """Every declared target's median against its threshold, as median / threshold on a
    linear axis (1 = the threshold), with its 95% interval; green when met (the interval's
    lower end reaches the threshold), red when not, grey when undecided, an empty bar when
    not measured. A gather target's label names its DRAM copy denominator (from ``df``, the
    rows). Below: what limits each unmet target. ``table``: ``all_targets_table``'s."""
    if table.empty:
        return empty_figure("no target declared")
    caption = _unmet_caption(table)
    caption_lines = caption.count("\n") + 1 if caption else 0
    fig = Figure(figsize=(9, 0.55 * len(table) + 2.4 + 0.16 * caption_lines),
                 layout="constrained")
    ax = fig.add_subplot()
    y = np.arange(len(table))
    relative = (table["value"] / table["threshold"]).to_numpy(dtype=float)
    verdicts = [target_verdict(row) for _, row in table.iterrows()]
    ax.barh(y, np.nan_to_num(relative), color=[VERDICT_COLOURS[v] for v in verdicts],
            edgecolor="black", linewidth=0.5)
    low = (table["low"] / table["threshold"]).to_numpy(dtype=float)
    high = (table["high"] / table["threshold"]).to_numpy(dtype=float)
    # An interval over fewer repeats than a decision needs is not drawn.
    bounded = (np.isfinite(low) & np.isfinite(high)
               & (table["repeats"].to_numpy() >= MIN_DECISION_REPEATS))
    ax.errorbar(relative[bounded], y[bounded],
                xerr=[relative[bounded] - low[bounded], high[bounded] - relative[bounded]],
                fmt="none", ecolor="black", capsize=2)
    for row_y, (_, row) in zip(y, table.iterrows()):
        if not row["measured"]:
            ax.text(0.02, row_y, "not measured in these results", va="center",
                    fontsize="x-small", color="grey", transform=ax.get_yaxis_transform())
    ax.axvline(1.0, color="black", linewidth=1.2)
    ax.set_yticks(y, [_target_label(row, df) for _, row in table.iterrows()],
                  fontsize="small")
    ax.invert_yaxis()
    ax.set_xlim(0, max(1.2, float(np.nanmax(np.append(high[bounded], relative))) * 1.05)
                if np.isfinite(relative).any() else 1.5)
    ax.set_xlabel("median / threshold, with its 95% interval (1 = the threshold)")
    counts = {v: verdicts.count(v) for v in VERDICT_COLOURS if v in verdicts}
    names = {"met": f"met (interval's lower end ≥ threshold, n ≥ {MIN_DECISION_REPEATS})",
             "unmet": "unmet", "undecided": f"undecided (n < {MIN_DECISION_REPEATS})",
             "not measured": "not measured"}
    # Under the axis title: constrained layout makes room for an axes' legend.
    ax.legend(handles=family_handles({v: VERDICT_COLOURS[v] for v in counts},
                                     {v: f"{names[v]}: {counts[v]}" for v in counts}),
              loc="upper center", bbox_to_anchor=(0.5, -0.09), ncols=3, fontsize="small",
              frameon=False)
    unmet = [row["target"] for _, row in table.iterrows() if target_verdict(row) == "unmet"]
    question_title(fig, "Which performance targets are met?",
                   f"{counts.get('met', 0)} of {len(table)} met"
                   + (f"; unmet: {', '.join(unmet)}." if unmet else "."))
    if caption:
        fig.text(0.01, 0.0, caption, fontsize="x-small", va="bottom", ha="left")
        fig.get_layout_engine().set(rect=(0, 0.16 * caption_lines / fig.get_figheight(),
                                          1, 1 - 0.16 * caption_lines / fig.get_figheight()))
    return fig


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
    FigureSpec("targets_met", "Every performance target against its threshold: met, unmet "
               "or undecided",
               lambda r: plot_target_ratios(all_targets_table(r), r.df)),
    FigureSpec("targets_paths", "The paths each target compares, with the DRAM copy the "
               "gathers are held to",
               lambda r: plot_targets(r.df)),
)


def guide(results: Results) -> list:
    """TFRecord shards: tf.data's pipeline vs our PyTorch paths, paired in one case."""
    from ...guide import Candidate, choose

    rows = results.df[(results.df["study"] == "targets")
                      & (results.df["loader"] == "torch_vs_tf_data")]
    labels = {"tf_data_autotune": "tf.data AUTOTUNE (TensorFlow decodes)",
              "torch_thread_prefetcher": "ThreadPrefetcher \u00d72 (simplejpeg)",
              "torch_process_prefetcher": "ProcessPrefetcher \u00d72 (simplejpeg)",
              "torch_dataloader": "torch DataLoader \u00d72 (simplejpeg)"}
    # Every path the case measured is a candidate; the labels only say how to read them.
    paths = [m.removesuffix(".samples_per_s") for m in dict.fromkeys(rows["metric"])
             if m.endswith(".samples_per_s")]
    candidates = []
    for path in paths:
        try:
            candidates.append(Candidate(path, labels.get(path, path.replace("_", " ")),
                                        stat(rows, f"{path}.samples_per_s")))
        except LookupError:
            continue
    if not candidates:
        return []
    return [choose("targets", "JPEG in TFRecord shards, 2 workers: tf.data or a PyTorch path? "
                   f"({profile_caption(rows)})", "samples_per_s", candidates)]


def findings(results: Results) -> list[str]:
    return targets_findings(results.df)



def readme_text(results: Results, place) -> str:
    return ("**Performance targets** (the targets measured on small synthetic sets calibrate "
            "the machine: [methodology](docs/methodology.md#machine-calibration))\n\n"
            + targets_markdown(results, calibration=False))


STUDY = Study(
    name="targets",
    question="Do the loaders reach their performance targets?",
    grid=grid,
    figures=FIGURES,
    findings=findings,
    guide=guide,
    notebook="05_findings.ipynb",
    readme_figures=("targets_met",),
    readme_text=readme_text,
    synthetic_only=True,
    targets=OWN_TARGETS,
)
