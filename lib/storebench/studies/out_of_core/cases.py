"""The out_of_core study's case function (epochs under a memory cap from a cold cache) and
its helpers, apart from the study's figures and findings so that a case worker imports only
what it runs. The grid lives in ``storebench.studies.out_of_core``."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator

import numpy as np

from ...bench.case import Case, CaseSkipped, Trial
from ..shared_cases import (
    DIFFERS_FROM_BUILD,
    batch_size_bytes,
    make_sampler,
    open_batches,
    open_options,
    release,
    sample_transform,
)

# Epoch 1 starts cold; epoch 2 finds what epoch 1 left in the budget's page cache, which is
# every later epoch's state too (the cache holds the same share of the set after each pass).
DEFAULT_EPOCHS = 2


# Batches delivered before the baseline is taken (and the dataset evicted again), so that
# the loader's working memory (buffers, worker heaps, lazily made state) is in the baseline
# and the room above it is page cache; more where the reader loads whole blocks
# (``priming_batches``).
BASELINE_BATCHES = 2
# Whole blocks a loader can hold at once: one in each reading thread's hands, the reader's
# cached one and the one being loaded.
BLOCKS_HELD_BESIDE_WORKERS = 2


# The least room above a lazy loader's baseline: below it the interpreter's own allocations
# and the kernel's read-around during an epoch exceed the cap and the kernel kills the case
# (4 MiB held 12 kB samples, but a block-shuffled memmap pass of the ci ImageNet-like set,
# batches of 1.2 MB, was killed there; the device's read-around window is 8 MiB). Only tiny
# sets (the ci profiles') reach it; ``effective_k`` records the cap really applied. A
# preload gets no floor: it must refuse (``does_not_fit``) whenever 1/k of the set is all
# there is, as on any real set.
MIN_ROOM_BYTES = 12 << 20


MB = 1e6


# Under a cap (k > 0), a pass cut short by ``epoch_seconds_limit`` also cuts a batch in hand
# that would end more than half the limit past it, on a boundary of this many samples: one
# thrashing batch of 256 can outlast the whole limit, and the pass then ended that long after
# it with one batch delivered. Batches that end within the overrun are read whole, as before:
# cut into slices, a reader that serialises its calls (h5py) interleaves the two workers'
# slices, and the other worker's batch in flight, which never counts, would grow. Without a
# cap no batch thrashes, and none is cut: there, probing the pace on a first slice of each
# worker's first batch lowered shuffled HDF5 rates over the whole pass, measurably.
CUT_SLICE_SAMPLES = 32
CUT_OVERRUN_OF_LIMIT = 0.5


def _rss_bytes() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


@contextlib.contextmanager
def _budget(case: Case) -> Iterator:
    """An uncapped budget holding this process; CaseSkipped where none can be made."""
    from ...bench.memory_budget import BudgetUnavailable, MemoryBudget

    budget = MemoryBudget(None)
    try:
        budget.__enter__()
    except BudgetUnavailable as err:
        raise CaseSkipped(f"case {case.case_id}: no memory budget: {err.reason}") from err
    try:
        yield budget
    finally:
        budget.__exit__(None, None, None)


def _cap(budget, *, k: int, dataset_bytes: int, baseline_rss: int, min_room: int,
         primed_bytes: int | None = None) -> dict:
    """Cap the budget at its baseline plus ``dataset_bytes / k``, at least ``min_room``
    (nothing for k = 0); the metrics that describe the budget. The baseline is what the
    budget holds now or, where more, ``primed_bytes``: the most the primer's loader held
    at once besides page cache (``_primed_loader``)."""
    from storebench.cgroups import available_memory

    charged = budget.charged_bytes()
    baseline = max(charged, primed_bytes or 0)
    metrics = {
        "k": (k, "count"),
        "dataset_bytes": (dataset_bytes, "bytes"),
        "baseline_bytes": (baseline, "bytes"),
        "baseline_charged_bytes": (charged, "bytes"),
        "baseline_rss_bytes": (baseline_rss, "bytes"),
    }
    if primed_bytes is not None:
        metrics["primed_peak_bytes"] = (primed_bytes, "bytes")
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

    def epoch(self, epoch: int, *, until: float | None = None,
              overrun: float | None = None):
        """Epoch ``epoch``'s batches; a prefetcher that can (``iter_until``) starts no
        batch after ``time.monotonic()`` ``until`` and, given ``overrun``, cuts a batch in
        hand that would end more than ``overrun`` seconds past it (on a boundary of
        ``CUT_SLICE_SAMPLES``), so a pass cut short there stops without reading what would
        not count."""
        self.sampler.set_epoch(epoch)
        if self.used and iter(self.batches) is self.batches:
            self.close()
            self.batches, self.close_batches = open_batches(self.case, self.dataset,
                                                            self.sampler)
        self.used = True
        if until is not None and hasattr(self.batches, "iter_until"):
            if overrun is None:
                return self.batches.iter_until(until)
            return self.batches.iter_until(until, slice_samples=CUT_SLICE_SAMPLES,
                                           overrun=overrun)
        return iter(self.batches)

    def close(self) -> None:
        if self.close_batches is not None:
            self.close_batches()
            self.close_batches = None


def _epochs(case: Case, trial: Trial, budget, loader: _Loader, reader, files, *,
            epochs: int, seconds_limit: float | None, capped: bool) -> dict:
    """Time ``epochs`` passes; per epoch: throughput, residency at start and end, and the
    budget's counters. A pass still running after ``seconds_limit`` is cut short there
    (``epoch<n>.complete`` 0): its rate is what it delivered in that time; ``capped``
    (under a memory cap) also cuts the batches in hand (``CUT_SLICE_SAMPLES``)."""
    from ...bench.cache import resident_fraction

    metrics: dict[str, tuple[float, str]] = {}
    overrun = CUT_OVERRUN_OF_LIMIT * seconds_limit if capped and seconds_limit else None
    start = budget.stats()
    rates = []
    last = None
    # An epoch starts with what the previous one ended with (nothing runs in between but
    # the loader's restart), so each residency is measured once.
    resident_end = None
    with trial.measure():
        for epoch in range(1, epochs + 1):
            resident_start = resident_fraction(files) if resident_end is None else resident_end
            before = budget.stats()
            samples = delivered = 0
            seen = []
            began = time.monotonic()
            deadline = began + seconds_limit if seconds_limit else None
            batches = loader.epoch(epoch - 1, until=deadline, overrun=overrun)
            try:
                for batch in batches:
                    n, nbytes, indices = batch_size_bytes(batch)
                    samples, delivered = samples + n, delivered + nbytes
                    seen.append(np.array(indices))
                    last = batch
                    if deadline is not None and time.monotonic() > deadline:
                        break
                # Before the loader stops: stopping a pass cut short waits for the batches
                # still being read, which deliver nothing to this epoch.
                seconds = time.monotonic() - began
            finally:
                close = getattr(batches, "close", None)
                if close is not None:
                    close()
            after = budget.stats()
            order = np.sort(np.concatenate(seen)) if seen else np.empty(0, np.int64)
            complete = len(order) == len(reader)
            if not (np.array_equal(order, np.arange(len(reader))) if complete
                    else len(np.unique(order)) == len(order)):
                raise RuntimeError(f"{case.dataset}: epoch {epoch} delivered a sample twice "
                                   f"or missed one ({samples} samples, {len(reader)} in the set)")
            rates.append(samples / seconds)
            resident_end = resident_fraction(files)
            metrics |= {
                f"epoch{epoch}.seconds": (seconds, "s"),
                f"epoch{epoch}.samples": (samples, "count"),
                f"epoch{epoch}.complete": (int(complete), "count"),
                f"epoch{epoch}.samples_per_s": (samples / seconds, "samples/s"),
                f"epoch{epoch}.read_MBps": (delivered / seconds / MB, "MB/s"),
                f"epoch{epoch}.resident_start": (resident_start, "ratio"),
                f"epoch{epoch}.resident_end": (resident_end, "ratio"),
                f"epoch{epoch}.major_faults": (after.major_faults - before.major_faults,
                                               "count"),
                f"epoch{epoch}.device_read_bytes": (
                    after.device_read_bytes - before.device_read_bytes, "bytes"),
                f"epoch{epoch}.file_cache_bytes": (after.file_cache_bytes, "bytes"),
            }
    if reader.is_raw and last is not None and loader.dataset.yields_arrays:
        reader.check_batch(last.indices, last.images, last.labels,
                           problem=DIFFERS_FROM_BUILD)
    metrics["samples"] = (len(reader), "count")
    if epochs >= 2:
        metrics["epoch2_over_epoch1"] = (rates[1] / rates[0], "ratio")
    return metrics | _budget_metrics(budget.stats(), start)


def held_besides_page_cache(budget) -> int:
    """The most ``budget`` held since its peak was last reset, less the page cache it holds
    now. The page cache only grows while nothing evicts, so what it holds now is at least what
    it held at the peak: this never overstates what its processes held."""
    stats = budget.stats()
    return max(stats.peak_bytes - stats.file_cache_bytes, 0)


def priming_batches(case: Case, reader) -> int:
    """How many batches the primer reads: ``BASELINE_BATCHES``, or, for a reader that loads
    whole blocks, enough to pass through as many of its largest blocks as the loader can
    hold at once. Two batches of a block-shuffled read stay inside one 1,024-row Parquet
    group; the next loader then held two or three more, the baseline had none of them, and
    they came out of the room meant for page cache (results/study-runs/README.md, "Constants
    and their evidence")."""
    if not getattr(reader, "loads_whole_blocks", False):
        return BASELINE_BATCHES
    largest = int(np.diff(reader.blocks()).max())
    blocks = max(1, case.workers or 0) + BLOCKS_HELD_BESIDE_WORKERS
    return max(BASELINE_BATCHES, math.ceil(blocks * largest / (case.batch_size or 256)))


def _primed_loader(case: Case, dataset, reader, budget=None) -> tuple[_Loader, int | None]:
    """The case's loader, made after a first loader has delivered a few batches and been
    closed with the reader's handles: what the interpreter allocated for them stays in its
    heap (and in the baseline), while no page of the dataset stays mapped, which would keep
    it from being evicted. With ``budget``, also what the first loader held while it read
    (``held_besides_page_cache``): memory it hands back when closed (its batch slots, a
    reader's buffers) and takes again when the next loader reads is not in what the budget
    holds afterwards, and a cap set on that alone left the next loader less than its room for
    page cache."""
    primer = _Loader(case, dataset, make_sampler(case, reader))
    primed = None
    try:
        if budget is not None:
            budget.reset_peak()
        wanted = priming_batches(case, reader)
        for count, _ in enumerate(primer.epoch(0), start=1):
            if count >= wanted:
                break
        if budget is not None:
            primed = held_besides_page_cache(budget)
    finally:
        primer.close()
    reader.close()  # re-opened on the next read
    return _Loader(case, dataset, make_sampler(case, reader)), primed


def out_of_core_epochs_case(case: Case, trial: Trial) -> dict[str, tuple[float, str]]:
    """``epochs`` (param, default 2) passes over ``case.dataset`` in ``case.access`` order
    through ``case.loader`` (``lazy``, or ``preloaded``) and the loader path
    ``case.prefetcher``, in a memory budget of baseline + dataset bytes / ``k`` (param; 0 =
    no cap), starting cold, or with the whole set read into the page cache first (param
    ``cached``, k = 0 only: the rate a decoding path keeps out of core is compared with
    it). Samples are decoded (param ``decode``) and transformed (param ``transform``) or
    delivered as stored. Format open options come from params ``open_<option>``; param
    ``epoch_seconds_limit`` cuts a pass short after that many seconds (thrashing paths)."""
    from storebench.formats import open_dataset, read_manifest
    from storebench.loaders import LazyDataset

    from ...bench.cache import evict, prewarm
    from ..shared_cases import dataset_files

    k, epochs = _params(case)
    cached = bool(case.param("cached", False))
    if cached and k:
        raise ValueError(f"case {case.case_id}: param cached needs k = 0 (no cap), got k={k}")
    seconds_limit = case.param("epoch_seconds_limit")
    files = list(case.cache_files) or list(dataset_files(case.dataset))
    dataset_bytes = int(read_manifest(case.dataset)["bytes_apparent"])
    decode, transform = case.param("decode"), sample_transform(case)
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
                dataset, preload = _preload(reader, decode, transform)
                if dataset is None:
                    return described | preload | _budget_metrics(budget.stats(), start)
            elif case.loader == "lazy":
                dataset = LazyDataset(reader, decode=decode, transform=transform)
                preload = {}
            else:
                raise ValueError(f"case {case.case_id}: loader must be lazy or preloaded")
            lazy = case.loader == "lazy"
            loader, primed = _primed_loader(case, dataset, reader, budget if lazy else None)
            evict(files)
            if cached:
                prewarm(files)
            if lazy:
                described = _cap(budget, k=k, dataset_bytes=dataset_bytes,
                                 baseline_rss=baseline_rss, min_room=MIN_ROOM_BYTES,
                                 primed_bytes=primed)
            try:
                measured = _epochs(case, trial, budget, loader, reader, files, epochs=epochs,
                                   seconds_limit=seconds_limit, capped=k > 0)
            finally:
                loader.close()
            return described | preload | measured
    finally:
        release(reader, dataset=dataset, close=loader.close if loader is not None else None)


def _preload(reader, decode, transform) -> tuple[object | None, dict]:
    """(the PreloadedDataset, its metrics), or (None, the refusal's metrics) when it does not
    fit the memory this process may use."""
    from storebench.cgroups import available_memory
    from storebench.loaders import InsufficientMemoryError, PreloadedDataset

    needed = PreloadedDataset.estimate_bytes(reader)
    began = time.perf_counter()
    try:
        dataset = PreloadedDataset(reader, decode=decode, transform=transform, progress=False)
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
