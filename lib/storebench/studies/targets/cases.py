"""The performance targets as data (``Target``, ``TARGETS``), their measure functions and the
case functions that run them, apart from the study's figures and findings so that a case
worker imports only what it runs. The grid lives in ``storebench.studies.targets.grid``."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ...bench.case import Case, Trial
from ...bench.stats import median_interval

MB = 1e6
# Rounds of a gather target's repeat (each: the copies, then every path's pass over the
# set). More rounds do not narrow the spread, which follows the copy's fast and slow
# stretches of whole repeats (results/targets-runs/README.md).
GATHER_ROUNDS = 12

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
    # The case's untimed run of ``measure`` before its repeats: off where ``measure`` warms
    # up inside (a whole extra run adds nothing), on where it times its first pass on
    # purpose (Parquet) and for tf.data, whose first repeat reads high without it.
    warmup: bool = False

    @property
    def is_fraction(self) -> bool:
        return self.denominator is None


# -- measure functions --------------------------------------------------------------------
def _gather(reader, case: Case, *, path: str) -> Measured:
    """Shuffled batch assembly into one buffer, from RAM (``preloaded``) or from the warm
    memmap (``memmap``), against the same run's DRAM copy bandwidth: a gather reads and
    writes every byte, as a copy does, so a copy is its honest limit.

    Gathered by one thread (``<path>``), split over one thread per core (``<path>_threads``,
    ``gather_threads``), through a ``ThreadPrefetcher`` with one worker per core
    (``<path>_prefetched``): each worker gathers whole batches into a slot of its own, so the
    threads do not meet inside a batch; and through one with a worker fewer whose consumer
    reads a batch itself rather than wait for one (``<path>_consumer_reads``), so no core
    sleeps on a hand-off. The prefetchers are made once and run one whole pass per round, as
    a training job's loader runs its epochs: a pass that ends keeps its workers and slots,
    and submits nothing until the next one, so none of its work falls in the copies' turn.
    The copy is the faster of one thread and one per core, so the threaded gathers are held
    to what the same threads copy. Where a shortfall goes: a bare one-thread ``take_rows`` of
    the same batches, and the same batches taken by one free-running thread per core with no
    hand-off per batch (``gather_against_copy``); NumPy's ``np.take`` of them, for the
    gather the loaders replaced (``storebench.gather``)."""
    from storebench.loaders import LazyDataset, PreloadedDataset, ThreadPrefetcher, throughput

    if path == "preloaded":
        dataset = PreloadedDataset(reader, progress=False)
    else:
        # Warm data: map its pages first (MADV_POPULATE_READ), as a training job's later
        # epochs find them; otherwise one page fault per 4 KiB is timed too.
        reader.populate()
        dataset = LazyDataset(reader)
    cores = len(os.sched_getaffinity(0))
    batch_size = case.batch_size or 256
    rows = dataset.images if path == "preloaded" else reader.images
    with contextlib.ExitStack() as stack:
        split = dataset.with_gather_threads(cores)
        stack.callback(split.close)
        epochs = {}
        for name, workers, consumer_reads in ((f"{path}_prefetched", cores, False),
                                              (f"{path}_consumer_reads", max(1, cores - 1),
                                               True)):
            passes = _Passes(ThreadPrefetcher, dataset, workers=workers, batch_size=batch_size,
                             consumer_reads=consumer_reads)
            stack.callback(passes.close)
            epochs[name] = passes.run
        timed = throughput.gather_against_copy(
            {path: dataset, f"{path}_threads": split}, batch_size=batch_size,
            rounds=int(case.param("rounds", GATHER_ROUNDS)), rows=rows, copy_threads=cores,
            epochs=epochs)
    copy = timed["copy"].bytes_per_second
    # Where a shortfall goes: the bare take_rows of the same batches from the same array is
    # the access pattern's own limit; the rest (gather over bare) is the loader's cost.
    extra = {
        "threads": (float(cores), "count"),
        "dram_copy_GBps": (copy / 1e9, "GB/s"),
        "dram_copy_1_thread_GBps": (timed["copy_1_thread"].bytes_per_second / 1e9, "GB/s"),
        f"{path}.bare_take_fraction_of_dram_copy": (timed["bare_take"].bytes_per_second / copy,
                                                    "ratio"),
        f"{path}.numpy_take_fraction_of_dram_copy": (
            timed["numpy_take"].bytes_per_second / copy, "ratio"),
        f"{path}.fraction_of_bare_take": (
            timed[path].bytes_per_second / timed["bare_take"].bytes_per_second, "ratio"),
    }
    gathers = (path, f"{path}_threads", *epochs)
    for name in gathers:
        extra[f"{name}.fraction_of_dram_copy"] = (timed[name].bytes_per_second / copy, "ratio")
    # The split gather's own mark: the same batches taken by as many free-running threads,
    # with no hand-off per batch (absent on one core).
    free = timed.get(f"bare_take_{cores}_threads")
    if free is not None:
        extra[f"{path}.bare_take_threads_fraction_of_dram_copy"] = (
            free.bytes_per_second / copy, "ratio")
        extra[f"{path}_threads.fraction_of_bare_take_threads"] = (
            timed[f"{path}_threads"].bytes_per_second / free.bytes_per_second, "ratio")
    return {name: timed[name] for name in gathers}, extra


class _Passes:
    """One prefetcher (``kind(dataset, batches, batch_size=..., **options)``), made once;
    ``run(order)`` is one whole pass over a round's batches, every one of which must arrive
    whole, and returns the samples and image bytes delivered."""

    def __init__(self, kind, dataset, *, batch_size: int, **options) -> None:
        self.batch_size = batch_size
        # The prefetcher iterates this list afresh on each pass; each round puts its order in.
        self._order: list[np.ndarray] = []
        self._prefetcher = kind(dataset, self._order, batch_size=batch_size, **options)

    def run(self, order: list[np.ndarray]) -> tuple[int, int]:
        self._order[:] = order
        delivered, nbytes = _delivered(self._prefetcher)
        if delivered != len(order) * self.batch_size:
            raise RuntimeError(f"the prefetcher delivered {delivered} samples of "
                               f"{len(order) * self.batch_size}")
        return delivered, nbytes

    def close(self) -> None:
        self._prefetcher.close()


def _delivered(batches) -> tuple[int, int]:
    """The samples and image bytes of every batch of ``batches``, iterated whole."""
    samples = nbytes = 0
    for batch in batches:
        samples += len(batch)
        nbytes += batch.nbytes
    return samples, nbytes


def measure_preloaded_gather(reader, case: Case) -> Measured:
    return _gather(reader, case, path="preloaded")


def measure_memmap_gather(reader, case: Case) -> Measured:
    return _gather(reader, case, path="memmap")


def _registry_paths(dataset, sampler_for: Callable[[], object], case: Case,
                    paths: Mapping[str, str]) -> dict:
    """Time each loader path of the registry (``{metric prefix: LOADER_PATHS name}``) over
    the same order, workers and start method, one after the other, past its read-ahead."""
    from storebench.loaders import throughput
    from storebench.loaders.paths import PathOptions, get_loader_path

    options = PathOptions(batch_size=case.batch_size or 256, workers=case.workers or 2,
                          start_method=case.param("start_method"),
                          seed=int(case.param("seed", 0)), root=case.dataset)
    from ..steady import read_ahead_batches

    measured = {}
    for prefix, name in paths.items():
        batches, close = get_loader_path(name).open(dataset, sampler_for(), options)
        try:
            # Timed from the hand-out of batch D, D the path's read-ahead: the steady state
            # only (``studies.steady``), none of what it read while its workers started.
            # tf.data's shuffle buffer holds the whole set before its first batch, so one
            # epoch has no steady state: it skips one batch, as before (the prefetch
            # study's tf_data rows repeat its pipeline).
            skip = 1 if name == "tf_data" else read_ahead_batches(
                batches, prefetcher=name, batch_size=options.batch_size)
            measured[prefix] = throughput.measure(iter(batches), name=prefix,
                                                  warmup_batches=skip + 1,
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
    decode from I/O): one thread on each usable core in turn (``serial_cpu<k>``, the thread
    pinned there), and ``ThreadPrefetcher`` and ``ProcessPrefetcher`` with ``case.workers``
    (default: one per core); the best of the two over the sum of the one-thread rates, which
    is cores x the mean one-thread rate: what the cores decode, each alone.

    All of them run the same shuffled batches interleaved (``throughput.interleaved_passes``:
    ``rounds`` slices, each read by every pass in turn; ``max_batches`` caps the batches
    timed). Timed one after the other, whole, and on whichever core the scheduler gave it,
    the one-thread rate and the prefetchers' saw different machines: on a shared VM the
    one-thread rate of one case's repeats spread by a third (``results/targets-runs``), and
    the two cores' one-thread rates differ, which one is faster changing from run to run. The
    prefetchers are made once, with their workers started in the warm-up, and run one whole
    pass per slice, as a training job's loader runs its epochs."""
    from storebench.loaders import (
        BatchSampler,
        PreloadedDataset,
        ProcessPrefetcher,
        ShuffleSampler,
        ThreadPrefetcher,
        throughput,
    )
    from storebench.loaders.batching import batch_buffer

    decode = "simplejpeg" if reader.spec.encoding == "jpeg" else "pil"
    dataset = PreloadedDataset(reader, decode=decode, progress=False)
    cores = len(os.sched_getaffinity(0))
    workers = case.workers or cores
    batch_size = case.batch_size or 64
    sampler = ShuffleSampler(len(dataset), seed=int(case.param("seed", 0)))
    order = [np.asarray(idx) for idx in BatchSampler(sampler, batch_size, drop_last=True)]
    warmup = 2 * workers
    if case.param("max_batches") is not None:
        order = order[:warmup + int(case.param("max_batches"))]
    rounds = max(1, min(int(case.param("rounds", 4)), (len(order) - warmup) // workers))
    out = batch_buffer(batch_size, dataset.sample_shape, dataset.sample_dtype)

    usable = sorted(os.sched_getaffinity(0))

    with contextlib.ExitStack() as stack:
        thread = _Passes(ThreadPrefetcher, dataset, workers=workers, batch_size=batch_size)
        stack.callback(thread.close)
        process = _Passes(ProcessPrefetcher, dataset, workers=workers, batch_size=batch_size,
                          start_method=case.param("start_method"))
        stack.callback(process.close)
        measured = throughput.interleaved_passes(
            {**{f"serial_cpu{cpu}": throughput.pinned_pass(dataset, cpu, usable, out)
                for cpu in usable},
             "thread_prefetcher": thread.run, "process_prefetcher": process.run},
            order, rounds=rounds, warmup_batches=warmup, multiple=workers)
    best = max(measured["thread_prefetcher"].samples_per_second,
               measured["process_prefetcher"].samples_per_second)
    one_thread = [measured[f"serial_cpu{cpu}"].samples_per_second for cpu in usable]
    return measured, {
        "cores": (float(cores), "count"),
        "serial.mean_samples_per_s": (float(np.mean(one_thread)), "samples/s"),
        "best_prefetcher.fraction_of_cores": (best / sum(one_thread), "ratio"),
    }


def measure_block_shuffle(reader, case: Case) -> Measured:
    """One block-shuffled epoch (``read_many`` per batch) vs ``random_samples`` per-sample
    reads at random indices (``reader[i]``), interleaved: the epoch's batches and the random
    reads are each cut into ``rounds`` slices, timed alternately and summed, so that both
    sides of the ratio see the same machine state (timed back to back, the ratio of one
    case's repeats spread over more than half its median on this project's machine). The random
    reads go through a second reader of the same files: a reader keeps the row group it read
    last, and random reads between two slices must not evict the one the epoch is in.

    Raw batches are written into one reused buffer, as the prefetchers write theirs into
    their slots: a fresh 3 MiB array per batch pays for its allocation's first touch, a cost
    of the measuring loop, not of the reads it compares.

    Where the time goes: each side's share spent reading row groups
    (``*.row_group_read_fraction``, from ``ParquetReader.row_group_reads``), the epoch's row
    group reads and the mean rows per group, and ``reads_only_ratio``: the ratio had the
    epoch cost only its row-group reads. The rows per group bound the ratio (a random read
    costs one group, a block-shuffled epoch reads each group once); the epoch's time outside
    its reads (the gather into the batch, per-batch bookkeeping) is what keeps it below."""
    from storebench.buffers import batch_empty
    from storebench.formats import open_dataset
    from storebench.loaders import BatchSampler, BlockShuffleSampler, LazyDataset, throughput

    dataset = LazyDataset(reader)
    batch_size = case.batch_size or 256
    order = [np.asarray(idx) for idx in
             BatchSampler(BlockShuffleSampler.from_reader(reader, seed=0), batch_size)]
    out = batch_empty((batch_size, *reader.spec.image_shape)) if reader.is_raw else None
    picks = np.random.default_rng(0).integers(0, len(reader),
                                              size=int(case.param("random_samples", 200)))
    rounds = max(1, min(int(case.param("rounds", 8)), len(order), len(picks)))
    # No untimed block pass first: both measurements see the same (warm) cache state.
    block_s = random_s = 0.0
    samples = block_bytes = random_bytes = 0
    block_reads_before = reader.row_group_reads
    with open_dataset(reader.root, verify=reader.verify) as random_reader:
        for k in range(rounds):
            started = time.perf_counter()
            for idx in order[k * len(order) // rounds:(k + 1) * len(order) // rounds]:
                batch = dataset.get_batch(idx, out=out)
                samples += len(idx)
                block_bytes += batch.images.nbytes
            block_s += time.perf_counter() - started
            started = time.perf_counter()
            for i in picks[k * len(picks) // rounds:(k + 1) * len(picks) // rounds].tolist():
                image, _ = random_reader[i]
                random_bytes += len(image) if isinstance(image, bytes) else image.nbytes
            random_s += time.perf_counter() - started
        random_reads = random_reader.row_group_reads
    block_reads = tuple(now - before for now, before in
                        zip(reader.row_group_reads, block_reads_before, strict=True))
    ratio = (samples / block_s) / (len(picks) / random_s)
    return {
        "block_shuffled_epoch": throughput.Measurement("block_shuffled_epoch", samples,
                                                       block_bytes, block_s, len(order)),
        "random_row_access": throughput.Measurement("random_row_access", len(picks),
                                                    random_bytes, random_s, len(picks)),
    }, {
        "rounds": (float(rounds), "count"),
        "rows_per_row_group": (len(reader) / (len(reader.blocks()) - 1), "count"),
        "block_shuffled_epoch.row_group_reads": (float(block_reads[0]), "count"),
        "block_shuffled_epoch.row_group_read_fraction": (block_reads[1] / block_s, "ratio"),
        "random_row_access.row_group_read_fraction": (random_reads[1] / random_s, "ratio"),
        "reads_only_ratio": (ratio * block_s / block_reads[1], "ratio"),
    }


def measure_tfrecord(reader, case: Case) -> Measured:
    """TFRecord shards through tf.data (AUTOTUNE) vs our PyTorch paths over the same shards
    (``ThreadPrefetcher``, ``ProcessPrefetcher`` and a DataLoader, simplejpeg decoding)."""
    from storebench.loaders import BlockShuffleSampler, LazyDataset

    decode = {"raw": None, "jpeg": "simplejpeg", "png": "pil"}[reader.spec.encoding]
    dataset = LazyDataset(reader, decode=decode)
    measured = _registry_paths(None, lambda: None, case, {"tf_data_autotune": "tf_data"})
    measured.update(_registry_paths(
        dataset, lambda: BlockShuffleSampler.from_reader(reader, seed=0), case,
        {"torch_thread_prefetcher": "thread", "torch_process_prefetcher": "process",
         "torch_dataloader": "torch"}))
    return measured, {}


TARGETS: tuple[Target, ...] = (
    Target("preloaded_gather_vs_dram", "preloaded gather vs DRAM copy",
           "shuffled batch assembly from PreloadedDataset: one thread, split over one per "
           "core, a ThreadPrefetcher with one worker per core, or one with a worker fewer "
           "whose consumer reads too (the fastest) / same-run DRAM copy (the faster of one "
           "thread and one per core)",
           TargetDataset("raw", ("memmap",), "memmap"), measure_preloaded_gather,
           ("preloaded.fraction_of_dram_copy", "preloaded_threads.fraction_of_dram_copy",
            "preloaded_prefetched.fraction_of_dram_copy",
            "preloaded_consumer_reads.fraction_of_dram_copy"), None, 0.85),
    Target("memmap_gather_vs_dram", "memmap gather vs DRAM copy",
           "shuffled batch assembly from the warm memmap: one thread, split over one per "
           "core, a ThreadPrefetcher with one worker per core, or one with a worker fewer "
           "whose consumer reads too (the fastest) / same-run DRAM copy (the faster of one "
           "thread and one per core)",
           TargetDataset("raw", ("memmap",), "memmap"), measure_memmap_gather,
           ("memmap.fraction_of_dram_copy", "memmap_threads.fraction_of_dram_copy",
            "memmap_prefetched.fraction_of_dram_copy",
            "memmap_consumer_reads.fraction_of_dram_copy"), None, 0.75),
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
    Target("thread_vs_serial_decode", "best prefetcher decode vs cores \u00d7 one thread",
           "GIL-releasing JPEG decoder from RAM: the faster of ThreadPrefetcher and "
           "ProcessPrefetcher (one worker per core) / the sum of one thread's rate pinned "
           "to each core, interleaved",
           TargetDataset("jpeg", ("lmdb", "hdf5", "rawfiles")), measure_thread_decode,
           ("best_prefetcher.fraction_of_cores",), None, 0.85, batch_size=64,
           workers=2, params=(("start_method", "fork"),)),
    Target("block_vs_random_parquet", "block-shuffled vs random Parquet rows",
           "row groups shuffled as blocks vs per-sample random row access",
           TargetDataset("raw", ("parquet",), "parquet"), measure_block_shuffle,
           ("block_shuffled_epoch.samples_per_s",), "random_row_access.samples_per_s",
           200.0, warmup=True),
    Target("torch_vs_tf_data", "our best PyTorch path vs tf.data over TFRecord",
           "ThreadPrefetcher, ProcessPrefetcher or torch DataLoader (the fastest) vs tf.data "
           "AUTOTUNE",
           TargetDataset("jpeg", ("tfrecord",), "tfrecord"), measure_tfrecord,
           ("torch_thread_prefetcher.samples_per_s", "torch_process_prefetcher.samples_per_s",
            "torch_dataloader.samples_per_s"),
           "tf_data_autotune.samples_per_s", 1.0, workers=2,
           params=(("start_method", "fork"),), warmup=True),
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
