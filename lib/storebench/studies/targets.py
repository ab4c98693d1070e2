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

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from ..bench.runner import Case, Trial
from ..bench.stats import median_interval
from ..plots import PALETTE, empty_figure, log_axis, profile_caption, summarise
from ..results import Results, latest_runs, stat
from ..text import DASH, format_percent, format_ratio, markdown_table
from .base import FigureSpec, Study
from .grid import batch_size_for, dataset_fields, pick, profile_datasets, repeat_fields

MB = 1e6
CASES = "storebench.studies.targets"

# What a measure function returns: {path: Measurement} and extra metrics.
Measured = tuple[dict, dict]


@dataclass(frozen=True)
class TargetDataset:
    """The dataset a target reads: the first built ``encoding`` set in ``preferred`` format
    order; ``required``: only that format will do."""

    encoding: str
    preferred: tuple[str, ...]
    required: str | None = None


@dataclass(frozen=True)
class Target:
    """``max(numerator metrics) / denominator metric`` of one repeat must reach
    ``threshold``; ``denominator=None``: the numerator metric is itself the figure (a
    fraction of the same run's DRAM read bandwidth). ``measure(reader, case)`` times the
    target's paths and returns ``({path: Measurement}, {metric: (value, unit)})``."""

    key: str
    name: str
    description: str
    dataset: TargetDataset
    measure: Callable[..., Measured]
    numerator: tuple[str, ...]
    denominator: str | None
    threshold: float
    batch_size: int = 256
    workers: int | None = None
    params: tuple[tuple[str, object], ...] = ()

    @property
    def is_fraction(self) -> bool:
        return self.denominator is None


# -- measure functions --------------------------------------------------------------------
def _gather(reader, case: Case, *, path: str) -> Measured:
    """Shuffled batch assembly into one buffer, from RAM (``preloaded``) or from the warm
    memmap (``memmap``), against the same run's DRAM copy bandwidth: a gather reads and
    writes every byte, as a copy does, so a copy is its honest limit."""
    from storebench.loaders import LazyDataset, PreloadedDataset, throughput

    if path == "preloaded":
        dataset = PreloadedDataset(reader, progress=False)
    else:
        # Warm data: map its pages first (MADV_POPULATE_READ), as a training job's later
        # epochs find them; otherwise one page fault per 4 KiB is timed too.
        reader.populate()
        dataset = LazyDataset(reader)
    measured, copy = throughput.gather_against_copy(
        dataset, batch_size=case.batch_size or 256, rounds=int(case.param("rounds", 20)))
    return {path: measured}, {
        "dram_copy_GBps": (copy.bytes_per_second / 1e9, "GB/s"),
        f"{path}.fraction_of_dram_copy": (measured.bytes_per_second / copy.bytes_per_second,
                                          "ratio"),
    }


def measure_preloaded_gather(reader, case: Case) -> Measured:
    return _gather(reader, case, path="preloaded")


def measure_memmap_gather(reader, case: Case) -> Measured:
    return _gather(reader, case, path="memmap")


def _registry_paths(dataset, sampler_for: Callable[[], object], case: Case,
                    paths: Mapping[str, str]) -> dict:
    """Time each loader path of the registry (``{metric prefix: LOADER_PATHS name}``) over
    the same order, workers and start method, one after the other."""
    from storebench.loaders import throughput
    from storebench.loaders.paths import PathOptions, get_loader_path

    options = PathOptions(batch_size=case.batch_size or 256, workers=case.workers or 2,
                          start_method=case.param("start_method"),
                          seed=int(case.param("seed", 0)), root=case.dataset)
    measured = {}
    for prefix, name in paths.items():
        batches, close = get_loader_path(name).open(dataset, sampler_for(), options)
        try:
            measured[prefix] = throughput.measure(iter(batches), name=prefix, warmup_batches=2,
                                                  max_batches=case.param("max_batches"))
        finally:
            if close is not None:
                close()
    return measured


def measure_process_vs_torch(reader, case: Case) -> Measured:
    from storebench.loaders import LazyDataset, ShuffleSampler

    dataset = LazyDataset(reader)
    return _registry_paths(dataset, lambda: ShuffleSampler(len(dataset), seed=0), case,
                           {"process_prefetcher": "process",
                            "torch_dataloader": "torch"}), {}


def measure_process_vs_pickled(reader, case: Case) -> Measured:
    from storebench.loaders import LazyDataset, ShuffleSampler

    dataset = LazyDataset(reader)
    return _registry_paths(dataset, lambda: ShuffleSampler(len(dataset), seed=0), case,
                           {"process_prefetcher": "process",
                            "pickled_baseline": "pickled_baseline"}), {}


def measure_thread_decode(reader, case: Case) -> Measured:
    """Decoding with the GIL-releasing decoder from RAM (a ``PreloadedDataset`` isolates
    decode from I/O): one thread, then ``ThreadPrefetcher`` and ``ProcessPrefetcher`` with
    one worker per core; the best of the two over (cores x the one-thread rate)."""
    import os

    from storebench.loaders import PreloadedDataset, ShuffleSampler

    decode = "simplejpeg" if reader.spec.encoding == "jpeg" else "pil"
    dataset = PreloadedDataset(reader, decode=decode, progress=False)
    measured = _registry_paths(dataset, lambda: ShuffleSampler(len(dataset), seed=0), case,
                               {"serial": "none", "thread_prefetcher": "thread",
                                "process_prefetcher": "process"})
    cores = len(os.sched_getaffinity(0))
    best = max(measured["thread_prefetcher"].samples_per_second,
               measured["process_prefetcher"].samples_per_second)
    return measured, {
        "cores": (float(cores), "count"),
        "best_prefetcher.fraction_of_cores": (
            best / (cores * measured["serial"].samples_per_second), "ratio"),
    }


def measure_block_shuffle(reader, case: Case) -> Measured:
    """One block-shuffled epoch (``read_many`` per batch) vs ``random_samples`` per-sample
    reads at random indices (``reader[i]``)."""
    from storebench.loaders import (
        BatchSampler,
        BlockShuffleSampler,
        LazyDataset,
        throughput,
    )

    dataset = LazyDataset(reader)
    order = BatchSampler(BlockShuffleSampler.from_reader(reader, seed=0), case.batch_size or 256)
    # No untimed block pass first: both measurements see the same (warm) cache state.
    epoch = throughput.measure((dataset.get_batch(idx) for idx in order),
                               name="block_shuffled_epoch", warmup_batches=0)
    picks = np.random.default_rng(0).integers(0, len(reader),
                                              size=int(case.param("random_samples", 200)))
    started = time.perf_counter()
    nbytes = 0
    for i in picks:
        image, _ = reader[int(i)]
        nbytes += len(image) if isinstance(image, bytes) else image.nbytes
    random_access = throughput.Measurement("random_row_access", len(picks), nbytes,
                                           time.perf_counter() - started, len(picks))
    return {"block_shuffled_epoch": epoch, "random_row_access": random_access}, {}


def measure_tfrecord(reader, case: Case) -> Measured:
    """TFRecord shards through tf.data (AUTOTUNE) vs our PyTorch paths over the same shards
    (``ProcessPrefetcher`` and a DataLoader, simplejpeg decoding)."""
    from storebench.loaders import BlockShuffleSampler, LazyDataset

    decode = {"raw": None, "jpeg": "simplejpeg", "png": "pil"}[reader.spec.encoding]
    dataset = LazyDataset(reader, decode=decode)
    measured = _registry_paths(None, lambda: None, case, {"tf_data_autotune": "tf_data"})
    measured.update(_registry_paths(
        dataset, lambda: BlockShuffleSampler.from_reader(reader, seed=0), case,
        {"torch_process_prefetcher": "process", "torch_dataloader": "torch"}))
    return measured, {}


TARGETS: tuple[Target, ...] = (
    Target("preloaded_gather_vs_dram", "preloaded gather vs DRAM copy",
           "shuffled batch assembly from PreloadedDataset / same-run DRAM copy",
           TargetDataset("raw", ("memmap",), "memmap"), measure_preloaded_gather,
           ("preloaded.fraction_of_dram_copy",), None, 0.85),
    Target("memmap_gather_vs_dram", "memmap gather vs DRAM copy",
           "shuffled batch assembly from the warm memmap / same-run DRAM copy",
           TargetDataset("raw", ("memmap",), "memmap"), measure_memmap_gather,
           ("memmap.fraction_of_dram_copy",), None, 0.75),
    Target("process_vs_torch", "ProcessPrefetcher vs torch DataLoader",
           "decoded arrays, same worker count", TargetDataset("raw", ("memmap", "lmdb")),
           measure_process_vs_torch, ("process_prefetcher.samples_per_s",),
           "torch_dataloader.samples_per_s", 1.0, workers=2,
           params=(("start_method", "fork"),)),
    Target("process_vs_pickled", "ProcessPrefetcher vs pickled baseline",
           "shared memory vs pickled batches through a multiprocessing.Queue",
           TargetDataset("raw", ("memmap", "lmdb")), measure_process_vs_pickled,
           ("process_prefetcher.samples_per_s",), "pickled_baseline.samples_per_s", 3.0,
           workers=2, params=(("start_method", "fork"),)),
    Target("thread_vs_serial_decode", "best prefetcher decode vs cores x one thread",
           "GIL-releasing JPEG decoder from RAM: the faster of ThreadPrefetcher and "
           "ProcessPrefetcher (one worker per core) / (cores x one thread)",
           TargetDataset("jpeg", ("lmdb", "hdf5", "rawfiles")), measure_thread_decode,
           ("best_prefetcher.fraction_of_cores",), None, 0.85, batch_size=64,
           workers=2, params=(("start_method", "fork"),)),
    Target("block_vs_random_parquet", "block-shuffled vs random Parquet rows",
           "row groups shuffled as blocks vs per-sample random row access",
           TargetDataset("raw", ("parquet",), "parquet"), measure_block_shuffle,
           ("block_shuffled_epoch.samples_per_s",), "random_row_access.samples_per_s",
           200.0),
    Target("torch_vs_tf_data", "our best PyTorch path vs tf.data over TFRecord",
           "ProcessPrefetcher or torch DataLoader (the faster) vs tf.data AUTOTUNE",
           TargetDataset("jpeg", ("tfrecord",), "tfrecord"), measure_tfrecord,
           ("torch_process_prefetcher.samples_per_s", "torch_dataloader.samples_per_s"),
           "tf_data_autotune.samples_per_s", 1.0, workers=2,
           params=(("start_method", "fork"),)),
)


def get_target(key: str) -> Target:
    for target in TARGETS:
        if target.key == key:
            return target
    raise KeyError(f"unknown target {key!r}; targets are {[t.key for t in TARGETS]}")


def target_ratio(target: Target, metrics: Mapping[str, float]) -> float:
    """One repeat's figure from its path metrics (``{metric: value}``)."""
    missing = [m for m in (*target.numerator, target.denominator) if m and m not in metrics]
    if missing:
        raise KeyError(f"target {target.key}: the case did not measure {missing}")
    top = max(float(metrics[m]) for m in target.numerator)
    if target.denominator is None:
        return top
    below = float(metrics[target.denominator])
    if below <= 0:
        raise ValueError(f"target {target.key}: {target.denominator} is {below}, no ratio")
    return top / below


# -- grid, case, summary ----------------------------------------------------------------
def grid(*, profile: str, data_dir: Path | str, repeats: int | None = None) -> list[Case]:
    """One case per target whose dataset was built (a target whose required format was not
    built is left out)."""
    repeats = repeat_fields(profile, repeats)
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
            access="shuffle", cache="warm", **repeats,
            params={"target": target.key, **dict(target.params)},
            **dataset_fields("targets", path, manifest),
        ))
    return cases


def target_case(case: Case, trial: Trial) -> dict[str, tuple[float, str]]:
    """One performance target (``case.param("target")``): every path it compares is
    measured in this one call, so the repeat's ``target_ratio`` is fair."""
    from storebench.formats import open_dataset

    target = get_target(case.param("target"))
    with open_dataset(case.dataset, verify=False) as reader, trial.measure():
        measured, extra = target.measure(reader, case)
    metrics = {}
    for path, m in measured.items():
        metrics[f"{path}.samples_per_s"] = (m.samples_per_second, "samples/s")
        metrics[f"{path}.read_MBps"] = (m.bytes_per_second / MB, "MB/s")
    metrics.update(extra)
    values = {name: value for name, (value, _) in metrics.items()}
    metrics["target_ratio"] = (target_ratio(target, values), "ratio")
    return metrics


def summarise_target(case, records: Sequence[Mapping]) -> dict[str, tuple[float, str]]:
    """The whole-case rows of a target case: the median of its repeats' ``target_ratio``,
    the threshold, and whether the median meets it."""
    target = get_target(case.param("target"))
    ratios = [float(r["value"]) for r in records if r["metric"] == "target_ratio"]
    if not ratios:
        raise ValueError(f"case {case.case_id}: no repeat reported target_ratio")
    value, low, high = median_interval(ratios)
    return {
        "target_value": (value, "ratio"),
        "target_low": (low, "ratio"),
        "target_high": (high, "ratio"),
        "target_threshold": (target.threshold, "ratio"),
        "target_met": (1.0 if low >= target.threshold else 0.0, "count"),
    }


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


def _value_text(key: str) -> Callable[[float], str]:
    return format_percent if get_target(key).is_fraction else format_ratio


def targets_markdown(df: pd.DataFrame) -> str:
    table = targets_table(df)
    if table.empty:
        return "No target was measured."
    text = [_value_text(key) for key in table["key"]]
    shown = pd.DataFrame({
        "target": table["target"],
        "measured (median, 95% interval)": [
            f"{fmt(v)} ({fmt(lo)}{DASH}{fmt(hi)}, n={n})"
            for fmt, v, lo, hi, n in zip(text, table["value"], table["low"], table["high"],
                                         table["repeats"])],
        "threshold": [f"\u2265 {fmt(t)}" for fmt, t in zip(text, table["threshold"])],
        "met": ["yes" if met else (f"no ({format_percent(short)} short)" if short > 0
                                   else "no (interval reaches below)")
                for met, short in zip(table["met"], table["shortfall"])],
    })
    return markdown_table(shown)


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
        sentences.append(
            f"{row['target']} ({row['what']}): {fmt(row['value'])} (median of "
            f"{row['repeats']} paired repeats, 95% interval "
            f"{fmt(row['low'])}{DASH}{fmt(row['high'])}); threshold {fmt(row['threshold'])}, "
            f"{verdict}.")
    return sentences


# -- figures -----------------------------------------------------------------------------
def plot_target_ratios(df: pd.DataFrame) -> Figure:
    """Each target's measured value against its threshold, as value / threshold on one log
    axis (1 = just met); green when met, red when missed; bars span min-max of repeats."""
    table = targets_table(df)
    if table.empty:
        return empty_figure("no target rows")
    fig = Figure(figsize=(7, 0.45 * len(table) + 1.4), layout="constrained")
    ax = fig.add_subplot()
    y = np.arange(len(table))
    relative = table["value"] / table["threshold"]
    colours = ["#2ca02c" if met else "#d62728" for met in table["met"]]
    ax.barh(y, relative, color=colours, edgecolor="black", linewidth=0.5)
    ax.errorbar(relative, y, xerr=[relative - table["low"] / table["threshold"],
                                   table["high"] / table["threshold"] - relative],
                fmt="none", ecolor="black", capsize=2)
    ax.axvline(1.0, color="black", linewidth=1.2)
    labels = [f"{row['target']}\n{_value_text(row['key'])(row['value'])} vs "
              f"\u2265 {_value_text(row['key'])(row['threshold'])}"
              for _, row in table.iterrows()]
    ax.set_yticks(y, labels, fontsize="small")
    ax.invert_yaxis()
    log_axis(ax, "x")
    ax.set_xlabel("measured / threshold (right of the line: met)")
    fig.suptitle("Performance targets (green: met; red: missed)", fontsize="medium")
    return fig


def plot_targets(df: pd.DataFrame) -> Figure:
    """Each target's compared paths, as each path's throughput over the target's slowest
    path (one row per target, one log axis), so seven targets read at README width."""
    rows = df[(df["study"] == "targets") & df["metric"].str.endswith(".samples_per_s")]
    rows = rows.assign(path=rows["metric"].str.removesuffix(".samples_per_s"))
    table = targets_table(df)
    keys = [k for k in table["key"] if k in set(rows["loader"])]
    if not keys:
        return empty_figure("no target rows")
    fig = Figure(figsize=(7.5, 0.75 * len(keys) + 1.6), layout="constrained")
    ax = fig.add_subplot()
    ticks, labels = [], []
    y = 0.0
    for key in keys:
        mine = rows[rows["loader"] == key]
        paths = list(dict.fromkeys(mine["path"]))
        stats = {p: summarise(mine[mine["path"] == p], f"{p}.samples_per_s", ["path"])
                 for p in paths}
        stats = {p: s for p, s in stats.items() if not s.empty}
        if len(stats) < 2:
            continue  # a one-path target (a fraction of DRAM bandwidth) is in targets_met
        base = min(float(s["median"].iloc[0]) for s in stats.values())
        for i, (p, s) in enumerate(stats.items()):
            median = float(s["median"].iloc[0]) / base
            low, high = float(s["low"].iloc[0]) / base, float(s["high"].iloc[0]) / base
            ax.barh(y, median, height=0.8, color=PALETTE[i % len(PALETTE)], edgecolor="black",
                    linewidth=0.4)
            ax.errorbar(median, y, xerr=[[median - low], [high - median]], fmt="none",
                        ecolor="black", capsize=2)
            ticks.append(y)
            labels.append(f"{get_target(key).name}: {p.replace('_', ' ')}" if i == 0
                          else p.replace("_", " "))
            y += 1
        y += 0.6
    ax.set_yticks(ticks, labels, fontsize="x-small")
    ax.invert_yaxis()
    log_axis(ax, "x")
    ax.set_xlabel("throughput relative to the target's slowest path (samples/s ratio)")
    fig.suptitle("The paths each performance target compares, measured in the same case\n"
                 f"({profile_caption(rows)})", fontsize="medium")
    return fig


FIGURES = (
    FigureSpec("targets_met", "The performance targets against their thresholds",
               lambda r: plot_target_ratios(r.df)),
    FigureSpec("targets_paths", "The paths each target compares",
               lambda r: plot_targets(r.df)),
)


def guide(results: Results) -> list:
    """TFRecord shards: tf.data's pipeline vs our PyTorch paths, paired in one case."""
    from ..guide import Candidate, choose

    rows = results.df[(results.df["study"] == "targets")
                      & (results.df["loader"] == "torch_vs_tf_data")]
    labels = {"tf_data_autotune": "tf.data AUTOTUNE (TensorFlow decodes)",
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


STUDY = Study(
    name="targets",
    question="Do the loaders reach their performance targets?",
    grid=grid,
    figures=FIGURES,
    findings=findings,
    guide=guide,
    notebook="05_findings.ipynb",
    synthetic_only=True,
)
