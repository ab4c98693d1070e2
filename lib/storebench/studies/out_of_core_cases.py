"""Cases of the out_of_core study: epochs over a dataset k times larger than the memory the
case may use, so that the page cache cannot hold it.

k maps to "your dataset is k times your RAM": each case runs in a memory budget
(``bench.memory_budget``) of its own baseline plus ``dataset bytes / k``. The baseline is
what the case holds once its reader, loader and workers are up and have delivered a first
batch, so the room above it is what a training job's page cache would have: 1/k of the
dataset. k = 5 is MLPerf Storage's rule (the dataset at least 5x the host's memory); k = 0 is
no cap (the dataset fits), measured in the same kind of cgroup so that every row carries the
same counters. Where no writable memory cgroup exists the case is skipped with the reason
(``runner.CaseSkipped``), never run unconstrained.

Every row records the budget, k, the cgroup's peak, its page cache, major faults, bytes read
from the device, and per epoch (``epoch<n>.<metric>``) the time, throughput and the dataset's
resident fraction at start and end (``mincore``). A ``preloaded`` case that does not fit its
budget is a measured outcome, not a failure: ``PreloadedDataset`` refuses before reading and
the row says ``does_not_fit = 1`` with the bytes it needed and had (status ``ok``: ``skipped``
means "could not be measured here", which is not what happened).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from ..bench.cases import (
    batch_size_bytes,
    check_batch,
    make_sampler,
    open_batches,
    open_options,
)
from ..bench.plan import plan_for
from ..bench.runner import Case, CaseSkipped, Trial
from .grid import DECODE_FOR, batch_size_for, dataset_fields, knob_params, profile_datasets

CASES = "storebench.studies.out_of_core_cases"
STUDY = "out_of_core"
K_VALUES = (0, 2, 5)  # 0: no cap, the dataset fits
DEFAULT_EPOCHS = 3
# Batches delivered before the baseline is taken (and the dataset evicted again), so that
# the loader's working memory (buffers, worker heaps, lazily made state) is in the baseline
# and the room above it is page cache.
BASELINE_BATCHES = 2
# The least room above a lazy loader's baseline: below a few MB the interpreter's own
# allocations during an epoch would exceed the cap and the kernel would kill the case. Only
# tiny sets (the ci profile's 1.5 MB) reach it; ``effective_k`` records the cap really
# applied. A preload gets no floor: it must refuse (``does_not_fit``) whenever 1/k of the
# set is all there is, as on any real set.
MIN_ROOM_BYTES = 4 << 20
MB = 1e6


def _rss_bytes() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


@contextlib.contextmanager
def _budget(case: Case) -> Iterator:
    """An uncapped budget holding this process; CaseSkipped where none can be made."""
    from ..bench.memory_budget import BudgetUnavailable, MemoryBudget

    budget = MemoryBudget(None)
    try:
        budget.__enter__()
    except BudgetUnavailable as err:
        raise CaseSkipped(f"case {case.case_id}: no memory budget: {err.reason}") from err
    try:
        yield budget
    finally:
        budget.__exit__(None, None, None)


def _cap(budget, *, k: int, dataset_bytes: int, baseline_rss: int, min_room: int) -> dict:
    """Cap the budget at what it holds now plus ``dataset_bytes / k``, at least
    ``min_room`` (nothing for k = 0); the metrics that describe the budget."""
    from storebench.cgroups import available_memory

    baseline = budget.charged_bytes()
    metrics = {
        "k": (k, "count"),
        "dataset_bytes": (dataset_bytes, "bytes"),
        "baseline_bytes": (baseline, "bytes"),
        "baseline_rss_bytes": (baseline_rss, "bytes"),
    }
    budget.reset_peak()  # the peak of the capped part only
    if k == 0:
        # No cap: the budget is whatever the host (or an enclosing cgroup) leaves.
        metrics["budget_bytes"] = (baseline_rss + available_memory()[0], "bytes")
        return metrics
    room = max(dataset_bytes // k, min_room)
    budget.set_limit(baseline + room)
    metrics["budget_bytes"] = (baseline_rss + room, "bytes")
    metrics["cgroup_limit_bytes"] = (baseline + room, "bytes")
    metrics["effective_k"] = (dataset_bytes / room, "ratio")
    return metrics


def _params(case: Case) -> tuple[int, int]:
    k, epochs = int(case.param("k", 0)), int(case.param("epochs", DEFAULT_EPOCHS))
    if k < 0 or epochs < 1:
        raise ValueError(f"case {case.case_id}: k must be >= 0 and epochs >= 1, got k={k}, "
                         f"epochs={epochs}")
    return k, epochs


def _budget_metrics(stats, start) -> dict:
    return {
        "cgroup_peak_bytes": (stats.peak_bytes, "bytes"),
        "file_cache_bytes": (stats.file_cache_bytes, "bytes"),
        "major_faults": (stats.major_faults - start.major_faults, "count"),
        "device_read_bytes": (stats.device_read_bytes - start.device_read_bytes, "bytes"),
    }


class _Loader:
    """The case's loader path over ``dataset``, one pass per epoch: a reusable prefetcher is
    iterated again, a one-pass path (a generator) is opened again."""

    def __init__(self, case: Case, dataset, sampler) -> None:
        self.case, self.dataset, self.sampler = case, dataset, sampler
        self.batches, self.close_batches = open_batches(case, dataset, sampler)
        self.used = False

    def epoch(self, epoch: int):
        self.sampler.set_epoch(epoch)
        if self.used and iter(self.batches) is self.batches:
            self.close()
            self.batches, self.close_batches = open_batches(self.case, self.dataset,
                                                            self.sampler)
        self.used = True
        return iter(self.batches)

    def close(self) -> None:
        if self.close_batches is not None:
            self.close_batches()
            self.close_batches = None


def _epochs(case: Case, trial: Trial, budget, loader: _Loader, reader, files, *,
            epochs: int, seconds_limit: float | None) -> dict:
    """Time ``epochs`` passes; per epoch: throughput, residency at start and end, and the
    budget's counters. A pass still running after ``seconds_limit`` is cut short there
    (``epoch<n>.complete`` 0): its rate is what it delivered in that time."""
    from ..bench.cache import resident_fraction

    metrics: dict[str, tuple[float, str]] = {}
    start = budget.stats()
    rates = []
    last = None
    with trial.measure():
        for epoch in range(1, epochs + 1):
            resident_start = resident_fraction(files)
            before = budget.stats()
            samples = delivered = 0
            seen = []
            began = time.perf_counter()
            deadline = began + seconds_limit if seconds_limit else None
            for batch in loader.epoch(epoch - 1):
                n, nbytes, indices = batch_size_bytes(batch)
                samples, delivered = samples + n, delivered + nbytes
                seen.append(np.array(indices))
                last = batch
                if deadline is not None and time.perf_counter() > deadline:
                    break
            seconds = time.perf_counter() - began
            after = budget.stats()
            order = np.sort(np.concatenate(seen)) if seen else np.empty(0, np.int64)
            complete = len(order) == len(reader)
            if not (np.array_equal(order, np.arange(len(reader))) if complete
                    else len(np.unique(order)) == len(order)):
                raise RuntimeError(f"{case.dataset}: epoch {epoch} delivered a sample twice "
                                   f"or missed one ({samples} samples, {len(reader)} in the set)")
            rates.append(samples / seconds)
            metrics |= {
                f"epoch{epoch}.seconds": (seconds, "s"),
                f"epoch{epoch}.samples": (samples, "count"),
                f"epoch{epoch}.complete": (int(complete), "count"),
                f"epoch{epoch}.samples_per_s": (samples / seconds, "samples/s"),
                f"epoch{epoch}.read_MBps": (delivered / seconds / MB, "MB/s"),
                f"epoch{epoch}.resident_start": (resident_start, "ratio"),
                f"epoch{epoch}.resident_end": (resident_fraction(files), "ratio"),
                f"epoch{epoch}.major_faults": (after.major_faults - before.major_faults,
                                               "count"),
                f"epoch{epoch}.device_read_bytes": (
                    after.device_read_bytes - before.device_read_bytes, "bytes"),
                f"epoch{epoch}.file_cache_bytes": (after.file_cache_bytes, "bytes"),
            }
    if reader.is_raw and last is not None and loader.dataset.yields_arrays:
        check_batch(reader, last.indices, last.images, last.labels)
    metrics["samples"] = (len(reader), "count")
    if epochs >= 2:
        metrics["epoch2_over_epoch1"] = (rates[1] / rates[0], "ratio")
    return metrics | _budget_metrics(budget.stats(), start)


def _primed_loader(case: Case, dataset, reader) -> _Loader:
    """The case's loader, made after a first loader has delivered a few batches and been
    closed with the reader's handles: what the interpreter allocated for them stays in its
    heap (and in the baseline), while no page of the dataset stays mapped, which would keep
    it from being evicted."""
    primer = _Loader(case, dataset, make_sampler(case, reader))
    try:
        for count, _ in enumerate(primer.epoch(0), start=1):
            if count >= BASELINE_BATCHES:
                break
    finally:
        primer.close()
    reader.close()  # re-opened on the next read
    return _Loader(case, dataset, make_sampler(case, reader))


def out_of_core_epochs_case(case: Case, trial: Trial) -> dict[str, tuple[float, str]]:
    """``epochs`` (param, default 3) passes over ``case.dataset`` in ``case.access`` order
    through ``case.loader`` (``lazy``, or ``preloaded``) and the loader path
    ``case.prefetcher``, in a memory budget of baseline + dataset bytes / ``k`` (param; 0 =
    no cap), starting cold. Format open options come from params ``open_<option>``; param
    ``epoch_seconds_limit`` cuts a pass short after that many seconds (thrashing paths)."""
    from storebench.formats import open_dataset, read_manifest
    from storebench.loaders import LazyDataset

    from ..bench.cache import evict
    from .grid import dataset_files

    k, epochs = _params(case)
    seconds_limit = case.param("epoch_seconds_limit")
    files = list(case.cache_files) or list(dataset_files(case.dataset))
    dataset_bytes = int(read_manifest(case.dataset)["bytes_apparent"])
    decode = case.param("decode")
    reader = open_dataset(case.dataset, verify=False, **open_options(case))
    loader = dataset = None
    try:
        baseline_rss = _rss_bytes()
        with _budget(case) as budget:
            if case.loader == "preloaded":
                evict(files)
                described = _cap(budget, k=k, dataset_bytes=dataset_bytes,
                                 baseline_rss=baseline_rss, min_room=0)
                start = budget.stats()
                dataset, preload = _preload(reader, decode)
                if dataset is None:
                    return described | preload | _budget_metrics(budget.stats(), start)
            elif case.loader == "lazy":
                dataset = LazyDataset(reader, decode=decode)
                preload = {}
            else:
                raise ValueError(f"case {case.case_id}: loader must be lazy or preloaded")
            loader = _primed_loader(case, dataset, reader)
            evict(files)
            if case.loader == "lazy":
                described = _cap(budget, k=k, dataset_bytes=dataset_bytes,
                                 baseline_rss=baseline_rss, min_room=MIN_ROOM_BYTES)
            try:
                measured = _epochs(case, trial, budget, loader, reader, files, epochs=epochs,
                                   seconds_limit=seconds_limit)
            finally:
                loader.close()
            return described | preload | measured
    finally:
        if loader is not None:
            loader.close()
        if dataset is not None:
            dataset.close()
        reader.close()


def _preload(reader, decode) -> tuple[object | None, dict]:
    """(the PreloadedDataset, its metrics), or (None, the refusal's metrics) when it does not
    fit the memory this process may use."""
    from storebench.cgroups import available_memory
    from storebench.loaders import InsufficientMemoryError, PreloadedDataset

    needed = PreloadedDataset.estimate_bytes(reader)
    began = time.perf_counter()
    try:
        dataset = PreloadedDataset(reader, decode=decode, progress=False)
    except InsufficientMemoryError:
        return None, {
            "does_not_fit": (1, "count"),
            "preload_needed_bytes": (needed, "bytes"),
            "available_bytes": (available_memory()[0], "bytes"),
        }
    return dataset, {
        "does_not_fit": (0, "count"),
        "preload_needed_bytes": (needed, "bytes"),
        "preload_seconds": (time.perf_counter() - began, "s"),
    }


# -- the grid -------------------------------------------------------------------------
# Formats whose full shuffle reads a whole unit of I/O per sample (a Parquet row group):
# 382 samples/s even warm in the formats study; block shuffle is their shuffled order.
BLOCK_ONLY_FORMATS = ("parquet",)
# Knobs that decide out-of-core behaviour, each on the access order where it matters, at
# k = 0 (fits) and the largest k: (format, open options or None for build variants, access).
OPEN_KNOBS = (
    ("memmap", {"open_madvise_random": True}, "shuffle"),
    ("lmdb", {"open_readahead": False}, "shuffle"),
    ("hdf5", {"open_chunk_cache_bytes": 0}, "block_shuffle"),
)
# Build variants (the formats study's KNOB_VARIANTS, where built) and their access order.
VARIANT_ACCESS = {"hdf5": "block_shuffle", "parquet": "block_shuffle",
                  "tfrecord": "block_shuffle"}
PREFETCHER, WORKERS = "thread", 2  # the prefetch study's best path, raw and JPEG
# A thrashing pass is cut short after this long: memmap's default read-around under a k = 5
# cap took over 60 s for one shuffled pass of the small set (0.24 s cold when it fits, 2 s
# with MADV_RANDOM; one batch of 256 took about 5 s and read 1.8 GB). Its rate over the
# first seconds says as much, and bounds the study's time (a pass ends after the batch
# that crosses the limit).
EPOCH_SECONDS_LIMIT = 2.0
PRELOADED_FORMAT = "memmap"


def _case(path: Path, manifest: dict, *, access: str, k: int, repeats: int, timeout_s: float,
          loader: str = "lazy", params: dict | None = None) -> Case:
    decode = DECODE_FOR[manifest["encoding"]]
    return Case(
        function=f"{CASES}:out_of_core_epochs_case", loader=loader, prefetcher=PREFETCHER,
        workers=WORKERS, batch_size=batch_size_for(manifest["num_samples"]), access=access,
        cache="cold", repeats=repeats, warmup=False, timeout_s=timeout_s,
        params={"k": k, "epoch_seconds_limit": EPOCH_SECONDS_LIMIT,
                **({"decode": decode} if decode else {}), **(params or {})},
        **dataset_fields(STUDY, path, manifest),
    )


def out_of_core_grid(
    *, profile: str, data_dir: Path | str, repeats: int | None = None
) -> list[Case]:
    """The out_of_core cases, each 3 epochs from cold under k in ``K_VALUES``, lazy reads
    through two prefetch threads:

    - raw, every format: block shuffle and full shuffle at every k (no full shuffle for
      ``BLOCK_ONLY_FORMATS``); sequential at k = 0 and the largest k only (a cyclic scan
      gets nothing from any cache smaller than the set, so k = 2 adds nothing);
    - JPEG, every format: shuffled (block-shuffled for ``BLOCK_ONLY_FORMATS``) at k = 0 and
      the largest k (decode-bound: the order matters less);
    - knobs (``OPEN_KNOBS``, and the formats study's build variants where built) at k = 0
      and the largest k, each on the order where it matters;
    - ``PreloadedDataset`` of the memmap raw set at every k: it fits at k = 0 only.

    Compact plans (``ci``) keep one raw format (memmap) and one JPEG format (lmdb) and the
    open knobs of those two. ``repeats=None`` means 1: each case is already three epochs,
    and the effects compared here (cache or no cache) are large against run-to-run noise.
    """
    plan = plan_for(profile)
    repeats = 1 if repeats is None else repeats
    timeout_s = plan.timeout_s
    top = max(K_VALUES)
    common = {"repeats": repeats, "timeout_s": timeout_s}
    cases = []
    datasets = profile_datasets(profile, data_dir, variants=True)
    for path, manifest in datasets:
        fmt, encoding = manifest["format"], manifest["encoding"]
        if plan.compact and (fmt, encoding) not in (("memmap", "raw"), ("lmdb", "jpeg")):
            continue
        if knob_params(path, manifest):
            access = VARIANT_ACCESS.get(fmt)
            if access is None or encoding != "raw" or plan.compact:
                continue
            for k in (0, top):
                cases.append(_case(path, manifest, access=access, k=k,
                                   params=knob_params(path, manifest), **common))
            continue
        if encoding == "raw":
            for k in (0, top):
                cases.append(_case(path, manifest, access="sequential", k=k, **common))
            orders = ("block_shuffle",) if fmt in BLOCK_ONLY_FORMATS else (
                "shuffle", "block_shuffle")
            for access in orders:
                for k in K_VALUES:
                    cases.append(_case(path, manifest, access=access, k=k, **common))
            for knob_format, options, access in OPEN_KNOBS:
                if knob_format == fmt:
                    for k in (0, top):
                        cases.append(_case(path, manifest, access=access, k=k,
                                           params=options, **common))
            if fmt == PRELOADED_FORMAT:
                for k in K_VALUES:
                    cases.append(_case(path, manifest, access="block_shuffle", k=k,
                                       loader="preloaded", **common))
        elif encoding == "jpeg":
            access = "block_shuffle" if fmt in BLOCK_ONLY_FORMATS else "shuffle"
            for k in (0, top):
                cases.append(_case(path, manifest, access=access, k=k, **common))
    return cases
