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


# A case's stage (param ``stage``): a screen reads one short window of a pass per epoch
# (``epoch_seconds_limit``) to rank the paths; a whole-epochs case (a finalist) reads a
# warming pass and then one whole timed pass per repeat, the same cgroup and page cache
# carried from each pass to the next (``_WholeEpochs``).
SCREEN = "screen"
WHOLE_EPOCHS = "whole_epochs"
# How often, at most, a pass samples the cgroup's page cache for its peak (each sample reads
# the cgroup's counters and its members' I/O).
CACHE_SAMPLE_S = 0.05


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
    metrics["cache_room_bytes"] = (room, "bytes")
    metrics["effective_k"] = (dataset_bytes / room, "ratio")
    return metrics


def subset_samples(case: Case, total: int) -> int:
    """The samples a case reads: its first ``subset_samples`` (param) where the set has more,
    else all ``total``. The first n samples are the set a build of n samples of the same spec
    holds (a sample depends only on its spec's seed and index), read in place."""
    wanted = case.param("subset_samples")
    if wanted is None:
        return total
    if int(wanted) < 1:
        raise ValueError(f"case {case.case_id}: subset_samples must be positive, got {wanted}")
    return min(int(wanted), total)


def subset_sampler(case: Case, reader, count: int):
    """``make_sampler``'s order over the first ``count`` samples of ``reader`` (all of them:
    the same sampler); a block shuffle keeps the reader's blocks, the last cut at ``count``."""
    from storebench.loaders import BlockShuffleSampler, SequentialSampler, ShuffleSampler

    if count == len(reader):
        return make_sampler(case, reader)
    seed = int(case.param("seed", 0))
    if case.access == "sequential":
        return SequentialSampler(count)
    if case.access == "shuffle":
        return ShuffleSampler(count, seed=seed)
    if case.access == "block_shuffle":
        bounds = np.asarray(reader.blocks(), dtype=np.int64)
        bounds = np.unique(np.append(bounds[bounds < count], count))
        return BlockShuffleSampler(bounds, seed=seed)
    return make_sampler(case, reader)  # raises: an unknown order


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


class _CachePeak:
    """The most page cache the budget held, sampled at most every ``CACHE_SAMPLE_S`` while
    a pass delivers batches and at each pass's end."""

    def __init__(self, budget) -> None:
        self.budget, self.peak, self.sampled = budget, 0, -math.inf

    def sample(self, *, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self.sampled >= CACHE_SAMPLE_S:
            self.peak = max(self.peak, self.budget.stats().file_cache_bytes)
            self.sampled = now


def _run_epoch(case: Case, budget, loader: _Loader, reader, files, *, epoch: int,
               count: int, seconds_limit: float | None, overrun: float | None,
               resident_start: float, cache: _CachePeak) -> tuple[dict, float, float, object]:
    """One pass over the first ``count`` samples: its metrics (unprefixed), its rate, the
    residency at its end and its last batch. A pass still running after ``seconds_limit``
    is cut short there (``complete`` 0)."""
    from ...bench.cache import resident_fraction

    before = budget.stats()
    samples = delivered = 0
    seen = []
    last = None
    began = time.monotonic()
    deadline = began + seconds_limit if seconds_limit else None
    batches = loader.epoch(epoch - 1, until=deadline, overrun=overrun)
    try:
        for batch in batches:
            n, nbytes, indices = batch_size_bytes(batch)
            samples, delivered = samples + n, delivered + nbytes
            seen.append(np.array(indices))
            last = batch
            cache.sample()
            if deadline is not None and time.monotonic() > deadline:
                break
        # Before the loader stops: stopping a pass cut short waits for the batches still
        # being read, which deliver nothing to this epoch.
        seconds = time.monotonic() - began
    finally:
        close = getattr(batches, "close", None)
        if close is not None:
            close()
    after = budget.stats()
    cache.sample(force=True)
    order = np.sort(np.concatenate(seen)) if seen else np.empty(0, np.int64)
    complete = len(order) == count
    if not (np.array_equal(order, np.arange(count)) if complete
            else len(np.unique(order)) == len(order)):
        raise RuntimeError(f"{case.dataset}: epoch {epoch} delivered a sample twice or missed "
                           f"one ({samples} samples, {count} in the set it reads)")
    resident_end = resident_fraction(files)
    metrics = {
        "seconds": (seconds, "s"),
        "samples": (samples, "count"),
        "complete": (int(complete), "count"),
        "samples_per_s": (samples / seconds, "samples/s"),
        "read_MBps": (delivered / seconds / MB, "MB/s"),
        "resident_start": (resident_start, "ratio"),
        "resident_end": (resident_end, "ratio"),
        "major_faults": (after.major_faults - before.major_faults, "count"),
        "device_read_bytes": (after.device_read_bytes - before.device_read_bytes, "bytes"),
        "file_cache_bytes": (after.file_cache_bytes, "bytes"),
    }
    return metrics, samples / seconds, resident_end, last


def _prefixed(epoch: int, metrics: dict) -> dict:
    return {f"epoch{epoch}.{name}": value for name, value in metrics.items()}


def _cache_fill(peak: float, described: dict) -> dict:
    """The page cache's peak, and the fraction of the room the cap left for it that it
    filled, where capped (``cache_fill``: 1 is the cap reached)."""
    out = {"file_cache_peak_bytes": (peak, "bytes")}
    room = described.get("cache_room_bytes")
    if room:
        out["cache_fill"] = (peak / room[0], "ratio")
    return out


def _check_last_batch(reader, loader: _Loader, last) -> None:
    if reader.is_raw and last is not None and loader.dataset.yields_arrays:
        reader.check_batch(last.indices, last.images, last.labels,
                           problem=DIFFERS_FROM_BUILD)


def _epochs(case: Case, trial: Trial, budget, loader: _Loader, reader, files, *,
            epochs: int, seconds_limit: float | None, capped: bool,
            count: int | None = None) -> dict:
    """Time ``epochs`` passes (``_run_epoch``) of the first ``count`` samples (all);
    per epoch: throughput, residency at start and end, and the budget's counters;
    ``capped`` (under a memory cap) also cuts the batches in hand (``CUT_SLICE_SAMPLES``)."""
    from ...bench.cache import resident_fraction

    count = len(reader) if count is None else count
    metrics: dict[str, tuple[float, str]] = {}
    overrun = CUT_OVERRUN_OF_LIMIT * seconds_limit if capped and seconds_limit else None
    start = budget.stats()
    cache = _CachePeak(budget)
    rates = []
    last = None
    # An epoch starts with what the previous one ended with (nothing runs in between but
    # the loader's restart), so each residency is measured once.
    resident = resident_fraction(files)
    with trial.measure():
        for epoch in range(1, epochs + 1):
            measured, rate, resident, last = _run_epoch(
                case, budget, loader, reader, files, epoch=epoch, count=count,
                seconds_limit=seconds_limit, overrun=overrun, resident_start=resident,
                cache=cache)
            rates.append(rate)
            metrics |= _prefixed(epoch, measured)
    _check_last_batch(reader, loader, last)
    metrics["samples"] = (count, "count")
    if epochs >= 2:
        metrics["epoch2_over_epoch1"] = (rates[1] / rates[0], "ratio")
    return metrics | _budget_metrics(budget.stats(), start) | {
        "file_cache_peak_bytes": (cache.peak, "bytes")}


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


def _primed_loader(case: Case, dataset, reader, budget=None, *,
                   count: int | None = None) -> tuple[_Loader, int | None]:
    """The case's loader, made after a first loader has delivered a few batches and been
    closed with the reader's handles: what the interpreter allocated for them stays in its
    heap (and in the baseline), while no page of the dataset stays mapped, which would keep
    it from being evicted. With ``budget``, also what the first loader held while it read
    (``held_besides_page_cache``): memory it hands back when closed (its batch slots, a
    reader's buffers) and takes again when the next loader reads is not in what the budget
    holds afterwards, and a cap set on that alone left the next loader less than its room for
    page cache. ``count``: the loaders read the first ``count`` samples (all)."""
    reads = len(reader) if count is None else count
    primer = _Loader(case, dataset, subset_sampler(case, reader, reads))
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
    return _Loader(case, dataset, subset_sampler(case, reader, reads)), primed


def out_of_core_epochs_case(case: Case, trial: Trial) -> dict[str, tuple[float, str]]:
    """``epochs`` (param, default 2) passes over ``case.dataset`` in ``case.access`` order
    through ``case.loader`` (``lazy``, or ``preloaded``) and the loader path
    ``case.prefetcher``, in a memory budget of baseline + dataset bytes / ``k`` (param; 0 =
    no cap), starting cold, or with the whole set read into the page cache first (param
    ``cached``, k = 0 only: the rate a decoding path keeps out of core is compared with
    it). Samples are decoded (param ``decode``) and transformed (param ``transform``) or
    delivered as stored. Format open options come from params ``open_<option>``; param
    ``epoch_seconds_limit`` cuts a pass short after that many seconds (thrashing paths).
    Param ``subset_samples`` reads the set's first that many samples (``subset_samples``)
    and scales the cap to their share of the stored bytes; param ``stage`` =
    ``WHOLE_EPOCHS`` times one whole pass per repeat after a warming one (``_WholeEpochs``)."""
    if case.param("stage") == WHOLE_EPOCHS:
        with trial.kept("whole_epochs", lambda: _whole_epochs(case)) as run:
            return run.timed_epoch(trial)
    from storebench.formats import open_dataset
    from storebench.loaders import LazyDataset

    from ...bench.cache import evict, prewarm

    k, epochs = _params(case)
    cached = _cached(case, k)
    seconds_limit = case.param("epoch_seconds_limit")
    decode, transform = case.param("decode"), sample_transform(case)
    reader = open_dataset(case.dataset, verify=False, **open_options(case))
    files, dataset_bytes, count, described_set = _read_set(case, reader)
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
            loader, primed = _primed_loader(case, dataset, reader, budget if lazy else None,
                                            count=count)
            evict(files)
            if cached:
                prewarm(files)
            if lazy:
                described = _cap(budget, k=k, dataset_bytes=dataset_bytes,
                                 baseline_rss=baseline_rss, min_room=MIN_ROOM_BYTES,
                                 primed_bytes=primed)
            try:
                measured = _epochs(case, trial, budget, loader, reader, files, epochs=epochs,
                                   seconds_limit=seconds_limit, capped=k > 0, count=count)
            finally:
                loader.close()
            fill = _cache_fill(measured["file_cache_peak_bytes"][0], described)
            return described | described_set | preload | measured | fill
    finally:
        release(reader, dataset=dataset, close=loader.close if loader is not None else None)


def _cached(case: Case, k: int) -> bool:
    cached = bool(case.param("cached", False))
    if cached and k:
        raise ValueError(f"case {case.case_id}: param cached needs k = 0 (no cap), got k={k}")
    return cached


def _read_set(case: Case, reader) -> tuple[list, int, int, dict]:
    """(the files whose cache state the case controls, the stored bytes of what it reads
    (the subset's share of the set's), how many samples it reads, the metrics that say
    so where it reads a subset)."""
    from storebench.formats import read_manifest

    from ..shared_cases import dataset_files

    files = list(case.cache_files) or list(dataset_files(case.dataset))
    total = int(read_manifest(case.dataset)["bytes_apparent"])
    count = subset_samples(case, len(reader))
    if count == len(reader):
        return files, total, count, {}
    return files, total * count // len(reader), count, {
        "set_samples": (len(reader), "count"), "set_bytes": (total, "bytes")}


class _WholeEpochs:
    """A whole-epochs case's run, kept across its repeats (``Trial.kept``): the budget, its
    cap and the loader stay, so each repeat's pass finds what the one before left cached,
    as a training job's epochs do. ``timed_epoch`` reads one whole pass and reports it as
    ``epoch<DEFAULT_EPOCHS>.*`` (a pass after the warming one, ``epoch1.*``, which the
    first repeat reports), with ``timed_epoch`` its place in the run."""

    def __init__(self, case: Case, budget, loader: _Loader, reader, files, *, count: int,
                 described: dict) -> None:
        self.case, self.budget, self.loader, self.reader = case, budget, loader, reader
        self.files, self.count, self.described = files, count, described
        self.cache = _CachePeak(budget)
        self.epoch = 0
        self.resident = math.nan
        self.warming: dict = {}
        self.warming_rate = math.nan

    def warm(self) -> None:
        from ...bench.cache import resident_fraction

        start = self.budget.stats()
        self.epoch = 1
        measured, self.warming_rate, self.resident, _ = self._pass(resident_fraction(self.files))
        self.warming = _prefixed(1, measured) | {
            "warming_device_read_bytes": (self.budget.stats().device_read_bytes
                                          - start.device_read_bytes, "bytes")}

    def _pass(self, resident_start: float):
        found = _run_epoch(self.case, self.budget, self.loader, self.reader, self.files,
                           epoch=self.epoch, count=self.count, seconds_limit=None,
                           overrun=None, resident_start=resident_start, cache=self.cache)
        if not found[0]["complete"][0]:
            raise RuntimeError(f"{self.case.dataset}: whole epoch {self.epoch} delivered "
                               f"{found[0]['samples'][0]} of {self.count} samples")
        return found

    def timed_epoch(self, trial: Trial) -> dict:
        first, self.warming = self.warming, {}
        self.epoch += 1
        start = self.budget.stats()
        with trial.measure():
            measured, rate, self.resident, last = self._pass(self.resident)
        _check_last_batch(self.reader, self.loader, last)
        return self.described | first | _prefixed(DEFAULT_EPOCHS, measured) | {
            "timed_epoch": (self.epoch, "count"),
            "samples": (self.count, "count"),
            "epoch2_over_epoch1": (rate / self.warming_rate, "ratio"),
        } | _budget_metrics(self.budget.stats(), start) | _cache_fill(self.cache.peak,
                                                                       self.described)


@contextlib.contextmanager
def _whole_epochs(case: Case) -> Iterator[_WholeEpochs]:
    """A whole-epochs case's run, set up as a screen's lazy case is (the primed loader, the
    set evicted, or cached where param ``cached``, the cap) and warmed by one whole pass."""
    from storebench.formats import open_dataset
    from storebench.loaders import LazyDataset

    from ...bench.cache import evict, prewarm

    k, _ = _params(case)
    cached = _cached(case, k)
    if case.loader != "lazy":
        raise ValueError(f"case {case.case_id}: whole epochs need loader 'lazy', got "
                         f"{case.loader!r}")
    reader = open_dataset(case.dataset, verify=False, **open_options(case))
    files, dataset_bytes, count, described_set = _read_set(case, reader)
    loader = dataset = None
    try:
        baseline_rss = _rss_bytes()
        with _budget(case) as budget:
            dataset = LazyDataset(reader, decode=case.param("decode"),
                                  transform=sample_transform(case))
            loader, primed = _primed_loader(case, dataset, reader, budget, count=count)
            try:
                evict(files)
                if cached:
                    prewarm(files)
                described = _cap(budget, k=k, dataset_bytes=dataset_bytes,
                                 baseline_rss=baseline_rss, min_room=MIN_ROOM_BYTES,
                                 primed_bytes=primed)
                run = _WholeEpochs(case, budget, loader, reader, files, count=count,
                                   described=described | described_set)
                run.warm()
                yield run
            finally:
                loader.close()
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
