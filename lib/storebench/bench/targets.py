"""The loaders issue's performance targets: what is compared, and the threshold, in one place.

Each target is one case of the ``targets`` study (``case.loader`` is the target's ``key``):
the case measures the target's paths in the same call, repeat after repeat, and returns the
paths' metrics (``<path>.samples_per_s`` ...) plus the repeat's ``target_ratio``. Its
``summarise`` function (``summarise_target``) then writes the whole-case rows
``target_value`` (median of the per-repeat ratios), ``target_threshold`` and ``target_met``
(1 or 0), so that a results file alone says whether each target was met.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Target:
    """``max(numerator paths) / denominator`` must reach ``threshold``, per repeat of one
    case. ``denominator=None``: the numerator metric is itself the figure (a fraction of the
    same run's DRAM read bandwidth). ``kind`` names the measurement (``cases.target_case``),
    ``paths`` the loader paths it runs."""

    key: str
    kind: str
    name: str
    paths: tuple[str, ...]
    numerator: tuple[str, ...]
    denominator: str | None
    threshold: float
    description: str


TARGETS: tuple[Target, ...] = (
    Target("preloaded_gather_vs_dram", "batch_assembly", "preloaded gather vs DRAM read",
           ("preloaded",), ("preloaded.fraction_of_dram_read",), None, 0.5,
           "shuffled batch assembly from PreloadedDataset / same-run DRAM read"),
    Target("memmap_gather_vs_dram", "batch_assembly", "memmap gather vs DRAM read",
           ("memmap",), ("memmap.fraction_of_dram_read",), None, 0.5,
           "shuffled batch assembly from memmap / same-run DRAM read"),
    Target("process_vs_torch", "process_prefetch", "ProcessPrefetcher vs torch DataLoader",
           ("process_prefetcher", "torch_dataloader"), ("process_prefetcher.samples_per_s",),
           "torch_dataloader.samples_per_s", 1.0, "decoded arrays, same worker count"),
    Target("process_vs_pickled", "process_prefetch", "ProcessPrefetcher vs pickled baseline",
           ("process_prefetcher", "pickled_baseline"), ("process_prefetcher.samples_per_s",),
           "pickled_baseline.samples_per_s", 3.0,
           "shared memory vs pickled batches through a multiprocessing.Queue"),
    Target("thread_vs_serial_decode", "thread_decode", "ThreadPrefetcher vs serial decode",
           ("serial", "thread_prefetcher"), ("thread_prefetcher.samples_per_s",),
           "serial.samples_per_s", 1.8, "GIL-releasing JPEG decoder, 2 threads on 2 cores"),
    Target("block_vs_random_parquet", "block_shuffle", "block-shuffled vs random Parquet rows",
           ("block_shuffled_epoch", "random_row_access"),
           ("block_shuffled_epoch.samples_per_s",), "random_row_access.samples_per_s", 200.0,
           "row groups shuffled as blocks vs per-sample random row access"),
    Target("torch_vs_tf_data", "tfrecord", "our best PyTorch path vs tf.data over TFRecord",
           ("tf_data_autotune", "torch_process_prefetcher", "torch_dataloader"),
           ("torch_process_prefetcher.samples_per_s", "torch_dataloader.samples_per_s"),
           "tf_data_autotune.samples_per_s", 1.0,
           "ProcessPrefetcher or torch DataLoader (the faster) vs tf.data AUTOTUNE"),
)
TARGET_KINDS = tuple(dict.fromkeys(t.kind for t in TARGETS))


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


def summarise_target(case, records: Sequence[Mapping]) -> dict[str, tuple[float, str]]:
    """The whole-case rows of a target case: the median of its repeats' ``target_ratio``,
    the threshold, and whether the median meets it."""
    target = get_target(case.param("target"))
    ratios = [float(r["value"]) for r in records if r["metric"] == "target_ratio"]
    if not ratios:
        raise ValueError(f"case {case.case_id}: no repeat reported target_ratio")
    value = statistics.median(ratios)
    return {
        "target_value": (value, "ratio"),
        "target_threshold": (target.threshold, "ratio"),
        "target_met": (1.0 if value >= target.threshold else 0.0, "count"),
    }
