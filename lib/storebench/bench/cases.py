"""Case functions: ``fn(case, trial) -> {metric: (value, unit)}``, run inside the worker.

Each opens what it needs itself (handles never cross a process boundary), wraps exactly the
part to be timed in ``with trial.measure():`` and checks after timing that what it read is
the dataset's real bytes, so a fast wrong answer cannot pass as a result. Heavy imports
(torch, tensorflow) belong inside the case functions that need them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from .runner import Case, Trial

MB = 1e6


def build_cost_case(case: Case, trial: Trial) -> dict[str, tuple[float, str]]:
    """What building the dataset cost and how big it is, from its manifest (no timing here:
    the build was timed when it ran, with ``os.sync`` included)."""
    from storebench.formats import read_manifest

    manifest = read_manifest(case.dataset)
    write_seconds = float(manifest["write_seconds"])
    raw = int(manifest["raw_bytes"])
    return {
        "write_seconds": (write_seconds, "s"),
        "write_MBps": (raw / write_seconds / MB, "MB/s"),
        "bytes_apparent": (manifest["bytes_apparent"], "bytes"),
        "bytes_allocated": (manifest["bytes_allocated"], "bytes"),
        "raw_bytes": (raw, "bytes"),
        "size_ratio": (manifest["bytes_apparent"] / raw, "ratio"),
        "file_count": (manifest["file_count"], "count"),
    }


def _check_batch(reader, indices: np.ndarray, images, labels) -> None:
    """Compare a batch with the manifest's per-sample checksums (outside the timed region)."""
    from storebench.formats import CorruptSampleError, sample_checksum
    from storebench.formats.manifest import load_checksums

    expected = load_checksums(reader.root, len(reader))
    for k, index in enumerate(indices):
        if sample_checksum(images[k], int(labels[k])) != int(expected[index]):
            raise CorruptSampleError(
                reader.root, int(index), "benchmark read returned bytes that differ from the build"
            )


def _timed_batched_reads(
    case: Case, trial: Trial, order_for: Callable[[int], np.ndarray]
) -> dict[str, tuple[float, str]]:
    """Read the samples ``order_for(len(dataset))`` names, in batches of ``case.batch_size``
    through ``Reader.read_many`` (raw batches into one reused buffer), without per-sample
    checksum verification, which the last batch gets afterwards instead.

    Params named ``open_<option>`` are passed to ``open_dataset`` as ``<option>`` (e.g.
    ``open_madvise_random=True``).
    """
    from storebench.formats import open_dataset, read_manifest

    batch_size = case.batch_size or 256
    file_bytes = read_manifest(case.dataset)["bytes_apparent"]
    with open_dataset(case.dataset, verify=False, **_open_options(case)) as reader:
        order = order_for(len(reader))
        out = (
            np.empty((min(batch_size, len(order)), *reader.spec.image_shape), dtype=np.uint8)
            if reader.is_raw else None
        )
        samples = returned_bytes = 0
        first_batch_seconds = float("nan")
        with trial.measure() as measurement:
            started = time.perf_counter()
            for start in range(0, len(order), batch_size):
                indices = order[start:start + batch_size]
                full = out is not None and len(indices) == len(out)
                images, labels = reader.read_many(indices, out=out if full else None)
                if samples == 0:
                    first_batch_seconds = time.perf_counter() - started
                samples += len(indices)
                returned_bytes += (
                    images.nbytes if reader.is_raw else sum(len(image) for image in images)
                )
        _check_batch(reader, indices, images, labels)
    if samples != len(order):
        raise RuntimeError(f"{case.dataset}: read {samples} samples, asked for {len(order)}")
    seconds = measurement.wall_seconds
    return {
        "samples": (samples, "count"),
        "samples_per_s": (samples / seconds, "samples/s"),
        "read_MBps": (returned_bytes / seconds / MB, "MB/s"),
        # The whole dataset's bytes per second of reading: for random batches, how much of
        # the file they cost, not what they delivered.
        "file_MBps": (file_bytes / seconds / MB, "MB/s"),
        "time_to_first_batch_s": (first_batch_seconds, "s"),
        "cpu_utilisation": (measurement.cpu_seconds / seconds, "ratio"),
    }


def sequential_read_case(case: Case, trial: Trial) -> dict[str, tuple[float, str]]:
    """Every sample in index order (see ``_timed_batched_reads``)."""
    return _timed_batched_reads(case, trial, lambda count: np.arange(count))


def random_read_case(case: Case, trial: Trial) -> dict[str, tuple[float, str]]:
    """``random_samples`` samples (param; default every sample) at shuffled indices (see
    ``_timed_batched_reads``): what a format's unit of I/O (chunk, row group, shard) costs a
    random batch."""

    def shuffled(count: int) -> np.ndarray:
        wanted = min(int(case.param("random_samples", count)), count)
        return np.random.default_rng(int(case.param("seed", 0))).permutation(count)[:wanted]

    return _timed_batched_reads(case, trial, shuffled)


def dataset_files(dataset: Path | str) -> tuple[str, ...]:
    """The data files of a built dataset, from its manifest (what cache control acts on)."""
    from storebench.formats import read_manifest

    root = Path(dataset)
    return tuple(str(root / name) for name in read_manifest(root)["files"])


# -- loader cases ----------------------------------------------------------------------
# Grid vocabulary of the loader studies (the Case fields' values):
#   loader:     "lazy" (LazyDataset, reads per access) | "preloaded" (PreloadedDataset)
#   access:     "sequential" | "shuffle" | "block_shuffle"
#   prefetcher: "none" (this thread) | "thread" | "process" (ours) | "torch" (DataLoader) |
#               "locked_list_baseline" | "pickled_baseline" (the naive ones, labelled) |
#               "tf_data" (native TFRecord pipeline, AUTOTUNE; TensorFlow decodes) |
#               "tf_generator" (tf.data from_generator over our dataset: GIL-bound)
# params: "decode" (None | "simplejpeg" | "pil" | "tf"), "start_method", "seed",
#         "max_batches", "shuffle_buffer" (tf_data), "open_<option>" (format open options).
LOADER_KINDS = ("lazy", "preloaded")
ACCESS_ORDERS = ("sequential", "shuffle", "block_shuffle")
PREFETCHERS = ("none", "thread", "process", "torch", "locked_list_baseline",
               "pickled_baseline", "tf_data", "tf_generator")


def _open_options(case: Case) -> dict:
    return {
        name.removeprefix("open_"): value
        for name, value in case.params
        if name.startswith("open_") and name != "open_verify"
    }


def _sampler(case: Case, reader):
    from storebench.loaders import BlockShuffleSampler, SequentialSampler, ShuffleSampler

    seed = int(case.param("seed", 0))
    if case.access == "sequential":
        return SequentialSampler(len(reader))
    if case.access == "shuffle":
        return ShuffleSampler(len(reader), seed=seed)
    if case.access == "block_shuffle":
        return BlockShuffleSampler.from_reader(reader, seed=seed)
    raise ValueError(f"case {case.case_id}: access must be one of {ACCESS_ORDERS}")


def _dataset(case: Case, reader):
    from storebench.loaders import LazyDataset, PreloadedDataset

    if case.prefetcher == "tf_data":
        return None  # TensorFlow reads and decodes the shards itself
    decode = case.param("decode")
    if case.loader == "lazy":
        return LazyDataset(reader, decode=decode)
    if case.loader == "preloaded":
        return PreloadedDataset(reader, decode=decode, progress=False)
    raise ValueError(f"case {case.case_id}: loader must be one of {LOADER_KINDS}")


def _batches(case: Case, dataset, sampler):
    """An iterable of batches for the case's prefetcher, and how to close it."""
    from storebench.loaders import (
        BaselineLockedListPrefetcher,
        BaselinePickledQueuePrefetcher,
        BatchSampler,
        ProcessPrefetcher,
        ThreadPrefetcher,
        batch_buffer,
    )

    batch_size = case.batch_size or 256
    workers = case.workers or 0
    start_method = case.param("start_method")
    seed = int(case.param("seed", 0))
    if case.prefetcher == "tf_data":
        from storebench.loaders.tf_adapter import tfrecord_pipeline

        pipeline = tfrecord_pipeline(case.dataset, batch_size=batch_size,
                                     shuffle_buffer=int(case.param("shuffle_buffer", 4096)),
                                     seed=seed, deterministic=False)
        return pipeline, None
    order = BatchSampler(sampler, batch_size)
    if case.prefetcher == "none":
        shape = dataset.sample_shape
        out = batch_buffer(batch_size, shape, dataset.sample_dtype) if shape else None
        return (dataset.get_batch(idx, out=out) for idx in order), None
    if case.prefetcher == "thread":
        loader = ThreadPrefetcher(dataset, order, workers=workers)
        return loader, loader.close
    if case.prefetcher == "process":
        loader = ProcessPrefetcher(dataset, order, workers=workers, start_method=start_method)
        return loader, loader.close
    if case.prefetcher == "locked_list_baseline":
        loader = BaselineLockedListPrefetcher(dataset, order)
        return loader, loader.close
    if case.prefetcher == "tf_generator":
        import tensorflow as tf

        from storebench.loaders.tf_adapter import gil_bound_generator_dataset

        return gil_bound_generator_dataset(dataset, order).prefetch(tf.data.AUTOTUNE), None
    if case.prefetcher == "pickled_baseline":
        loader = BaselinePickledQueuePrefetcher(dataset, order, workers=workers,
                                                start_method=start_method)
        return loader, loader.close
    if case.prefetcher == "torch":
        from storebench.loaders.torch_adapter import torch_dataloader

        loader = torch_dataloader(dataset, batch_size=batch_size, sampler=sampler,
                                  num_workers=workers, multiprocessing_context=start_method,
                                  seed=seed)
        return loader, None
    raise ValueError(f"case {case.case_id}: prefetcher must be one of {PREFETCHERS}")


def _batch_size_bytes(batch) -> tuple[int, int, np.ndarray | None]:
    """(samples, image bytes, indices or None) of a Batch or an (images, labels) pair."""
    from storebench.loaders import Batch

    if isinstance(batch, Batch):
        return len(batch), batch.nbytes, batch.indices
    images, labels = batch
    n = int(labels.shape[0])
    if hasattr(images, "element_size"):  # a torch tensor
        return n, int(images.numel() * images.element_size()), None
    if hasattr(images, "numpy") and not isinstance(images, np.ndarray):  # a tf.Tensor
        return n, int(np.prod(images.shape)) * images.dtype.size, None
    if isinstance(images, np.ndarray):
        return n, int(images.nbytes), None
    return n, int(sum(len(x) for x in images)), None


def loader_epoch_case(case: Case, trial: Trial) -> dict[str, tuple[float, str]]:
    """One epoch (or ``max_batches`` batches) through reader -> dataset -> sampler ->
    prefetcher, timed from before the dataset is made: a preload counts in
    ``time_to_first_batch_s`` and is also reported alone as ``preload_seconds``; an epoch's
    own time is ``epoch_seconds`` and the throughput figures use it."""
    from storebench.formats import open_dataset

    max_batches = case.param("max_batches")
    reader = open_dataset(case.dataset, verify=False, **_open_options(case))
    close = dataset = None
    samples = delivered = batches = 0
    seen: list[np.ndarray] = []
    try:
        with trial.measure() as measurement:
            started = time.perf_counter()
            dataset = _dataset(case, reader)
            ready = time.perf_counter()
            loader, close = _batches(case, dataset, _sampler(case, reader))
            first = float("nan")
            for batch in loader:
                n, nbytes, indices = _batch_size_bytes(batch)
                if batches == 0:
                    first = time.perf_counter() - started
                samples, delivered, batches = samples + n, delivered + nbytes, batches + 1
                if indices is not None:
                    seen.append(np.array(indices))
                if max_batches is not None and batches >= max_batches:
                    break
            ended = time.perf_counter()
    finally:
        if close is not None:
            close()
        if dataset is not None:
            dataset.close()
        reader.close()
    if max_batches is None:
        if samples != len(reader):
            raise RuntimeError(f"{case.dataset}: an epoch delivered {samples} samples, "
                               f"the dataset has {len(reader)}")
        if seen and not np.array_equal(np.sort(np.concatenate(seen)), np.arange(len(reader))):
            raise RuntimeError(f"{case.dataset}: an epoch did not deliver every sample once")
    epoch = ended - ready
    return {
        "samples": (samples, "count"),
        "samples_per_s": (samples / epoch, "samples/s"),
        "read_MBps": (delivered / epoch / MB, "MB/s"),
        "time_to_first_batch_s": (first, "s"),
        "epoch_seconds": (epoch, "s"),
        "preload_seconds": (ready - started, "s"),
        "cpu_utilisation": (measurement.cpu_seconds / measurement.wall_seconds, "ratio"),
    }


def gpu_feed_case(case: Case, trial: Trial) -> dict[str, tuple[float, str]]:
    """The case's loader feeding an accelerator through ``GpuFeeder`` to the device named by
    the ``device`` param (``"cuda"`` or ``"cpu"``; the study records in ``emulated`` whether a
    real accelerator receives the copies), driven by an ``EmulatedAccelerator`` taking
    ``compute_ms`` per batch: accelerator utilisation, stall fraction and host-to-device
    GB/s."""
    from storebench.formats import open_dataset
    from storebench.loaders import EmulatedAccelerator, GpuFeeder, run_feed

    device = case.param("device", "cpu")
    reader = open_dataset(case.dataset, verify=False, **_open_options(case))
    accelerator = EmulatedAccelerator(float(case.param("compute_ms", 0.0)) / 1000.0)
    close = dataset = None
    try:
        dataset = _dataset(case, reader)
        loader, close = _batches(case, dataset, _sampler(case, reader))
        feeder = GpuFeeder(loader, device=device, pinned=bool(case.param("pinned", False)),
                           non_blocking=bool(case.param("non_blocking", False)))
        if feeder.uses_cuda == bool(case.param("emulated", True)):
            raise RuntimeError(f"case {case.case_id}: says emulated={case.param('emulated')} "
                               f"but copies go to {feeder.device}")
        with trial.measure():
            result = run_feed(feeder, accelerator, warmup_batches=int(case.param("warmup", 2)),
                              max_batches=case.param("max_batches"),
                              device=str(feeder.device))
        stats = feeder.stats()
    finally:
        if close is not None:
            close()
        if dataset is not None:
            dataset.close()
        reader.close()
    copy = stats["copy_seconds"]
    return {
        "samples": (result.samples, "count"),
        "samples_per_s": (result.samples_per_second, "samples/s"),
        "accelerator_utilisation": (result.au, "ratio"),
        "stall_fraction": (result.stall_fraction, "ratio"),
        "h2d_GBps": (stats["bytes"] / copy / 1e9 if copy > 0 else 0.0, "GB/s"),
        "epoch_seconds": (result.wall_seconds, "s"),
    }


def _measurement_metrics(results: dict) -> dict[str, tuple[float, str]]:
    metrics = {}
    for path, m in results.items():
        metrics[f"{path}.samples_per_s"] = (m.samples_per_second, "samples/s")
        metrics[f"{path}.read_MBps"] = (m.bytes_per_second / MB, "MB/s")
    return metrics


def _process_prefetch_paths(dataset, paths: tuple[str, ...], *, workers: int, batch_size: int,
                            start_method: str | None, max_batches: int | None,
                            seed: int = 0, warmup_batches: int = 2) -> dict:
    """Decoded arrays through each of ``paths`` (``process_prefetcher``,
    ``torch_dataloader``, ``pickled_baseline``), same workers, start method and order."""
    from storebench.loaders import (
        BaselinePickledQueuePrefetcher,
        BatchSampler,
        ProcessPrefetcher,
        ShuffleSampler,
        throughput,
    )

    def order() -> BatchSampler:
        return BatchSampler(ShuffleSampler(len(dataset), seed=seed), batch_size)

    def torch_loader():
        from storebench.loaders.torch_adapter import torch_dataloader

        return torch_dataloader(dataset, batch_size=batch_size,
                                sampler=ShuffleSampler(len(dataset), seed=seed),
                                num_workers=workers, multiprocessing_context=start_method,
                                seed=seed)

    makers = {
        "process_prefetcher": lambda: ProcessPrefetcher(dataset, order(), workers=workers,
                                                        start_method=start_method),
        "torch_dataloader": torch_loader,
        "pickled_baseline": lambda: BaselinePickledQueuePrefetcher(
            dataset, order(), workers=workers, start_method=start_method),
    }
    results = {}
    for path in paths:
        loader = makers[path]()
        try:
            results[path] = throughput.measure(iter(loader), name=path,
                                               warmup_batches=warmup_batches,
                                               max_batches=max_batches)
        finally:
            close = getattr(loader, "close", None)
            if close is not None:
                close()
    return results


def target_case(case: Case, trial: Trial) -> dict[str, tuple[float, str]]:
    """One performance target (``case.param("target")``, see ``bench.targets``): every path
    it compares is measured in this one call, so the repeat's ``target_ratio`` is fair."""
    from storebench.formats import open_dataset
    from storebench.loaders import LazyDataset, PreloadedDataset, throughput

    from .targets import get_target, target_ratio

    target = get_target(case.param("target"))
    workers = case.workers or 2
    batch_size = case.batch_size or 256
    start_method = case.param("start_method")
    max_batches = case.param("max_batches")
    extra: dict[str, tuple[float, str]] = {}
    with open_dataset(case.dataset, verify=False) as reader, trial.measure():
        if target.kind == "batch_assembly":
            (path,) = target.paths
            if path == "preloaded":
                dataset = PreloadedDataset(reader, progress=False)
            else:
                # Warm data: map its pages first (MADV_POPULATE_READ), as a training job's
                # later epochs find them; otherwise one page fault per 4 KiB is timed too.
                reader.populate()
                dataset = LazyDataset(reader)
            results = {path: throughput.shuffled_batch_assembly(
                dataset, batch_size=batch_size, num_batches=max_batches, name=path)}
            dram = throughput.dram_read_bandwidth(nbytes=int(case.param("dram_bytes", 1 << 28)),
                                                  repeats=3)
            extra = {"dram_read_GBps": (dram / 1e9, "GB/s"),
                     f"{path}.fraction_of_dram_read": (results[path].bytes_per_second / dram,
                                                       "ratio")}
        elif target.kind == "process_prefetch":
            results = _process_prefetch_paths(
                LazyDataset(reader), target.paths, workers=workers, batch_size=batch_size,
                start_method=start_method, max_batches=max_batches)
        elif target.kind == "thread_decode":
            decode = "simplejpeg" if reader.spec.encoding == "jpeg" else "pil"
            dataset = PreloadedDataset(reader, decode=decode, progress=False)
            results = throughput.target_thread_decode(dataset, workers=workers,
                                                      batch_size=batch_size,
                                                      max_batches=max_batches)
        elif target.kind == "block_shuffle":
            results = throughput.target_block_shuffle(
                reader, batch_size=batch_size,
                random_samples=int(case.param("random_samples", 200)))
        elif target.kind == "tfrecord":
            results = throughput.target_tfrecord(case.dataset, batch_size=batch_size,
                                                 workers=workers, start_method=start_method,
                                                 max_batches=max_batches)
        else:
            raise ValueError(f"case {case.case_id}: target {target.key} has unknown kind "
                             f"{target.kind!r}")
    metrics = {**_measurement_metrics(results), **extra}
    values = {name: value for name, (value, _) in metrics.items()}
    metrics["target_ratio"] = (target_ratio(target, values), "ratio")
    return metrics
